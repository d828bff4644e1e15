-- The claim (leaseq.ops.lease_async): the seed's SKIP LOCKED claim, the pause check and
-- the limits' fast path and admit() path. admit() itself is PL/pgSQL, versioned in the
-- migrations (0021_invariants.sql has its current text; schema.sql shows it whole).


-- name: _claim_candidates
-- The claimable jobs of %(queue)s in claim order (jobs_claimable_idx), pauses left out.
SELECT id
  FROM {schema}.jobs AS c
  WHERE queue_name = %(queue)s
    AND status = 'pending'
    AND NOT blocked
    AND NOT waiting
    -- Jobs with a fairness key are claim_fair_jobs' (jobs_claimable_idx holds none).
    AND fairness_key IS NULL
    AND available_at <= now()
    -- A start deadline passed: never started (the sweep ends it EXPIRED). now() is the
    -- claim's own clock, the one started_at is set from in the same statement.
    AND (expires_at IS NULL OR expires_at > now())
    AND {_not_paused}
  ORDER BY priority DESC, available_at, id

-- name: _not_paused
-- The claim's pause check (candidate alias c; parameter %(queue)s).
-- Nearly free when nothing is paused: the queue check and the two "any task / key pause at
-- all?" guards are uncorrelated (InitPlans, run once per statement); only with such a pause
-- present is each candidate probed by the primary key.
--
-- Why the "WHERE false FOR SHARE" subquery: it locks no row, but naming pauses with a row
-- lock clause makes the statement take ROW SHARE on the table when it is planned, before
-- its snapshot is taken. pause_scope first takes EXCLUSIVE (which conflicts with ROW
-- SHARE), so a pause waits for the claims in flight to commit, and a claim arriving
-- meanwhile waits for the pause to commit and then (READ COMMITTED: the snapshot comes
-- after the plan's locks) sees it. Hence: no claim of a paused scope commits after the
-- pause did. Enqueues and completions never touch pauses and are not slowed.
NOT EXISTS (SELECT 1 FROM {schema}.pauses WHERE false FOR SHARE)
    AND NOT EXISTS (SELECT 1 FROM {schema}.pauses WHERE scope = 'queue' AND value = %(queue)s)
    AND (NOT EXISTS (SELECT 1 FROM {schema}.pauses WHERE scope = 'task')
         OR NOT EXISTS (SELECT 1 FROM {schema}.pauses AS pt
                        WHERE pt.scope = 'task' AND pt.value = c.task))
    AND (c.ordering_key IS NULL
         OR NOT EXISTS (SELECT 1 FROM {schema}.pauses WHERE scope = 'ordering_key')
         OR NOT EXISTS (SELECT 1 FROM {schema}.pauses AS pk
                        WHERE pk.scope = 'ordering_key' AND pk.value = c.ordering_key))

-- name: _claim_returning
-- What both claim statements return per claimed job (alias j): the lease and the job. Each
-- statement adds the last column itself, slot_rows: may the lease hold slot rows, so that
-- its end must take the statements that delete them?
RETURNING j.id, j.lease_token, j.lease_owner, j.task, j.queue_name, j.payload::text,
          j.attempt_count, j.max_attempts, j.priority, j.payload_version,
          j.unknown_failures,
          -- The default ctx.idempotency_key: the id and created_at to the microsecond (UTC),
          -- since an id alone repeats when a failover loses an enqueue and the new primary
          -- hands the id out again (params.default_idempotency_key is its Python twin).
          coalesce(j.idempotency_key, 'leaseq-job-' || j.id || '-'
                   || to_char(j.created_at AT TIME ZONE 'UTC', 'YYYYMMDDHH24MISSUS')),
          j.ordering_key, j.unique_key,
          -- Claimed under limits (Lease.limited; informational: how its end is routed is
          -- slot_rows, the last column).
          {_limits_apply},
          j.has_dependents,
          -- Times as float8 seconds: the clock, then ages (see leases_from_rows).
          date_part('epoch', now()),
          CASE WHEN isfinite(j.created_at) THEN date_part('epoch', now() - j.created_at) END,
          CASE WHEN isfinite(j.available_at)
            THEN date_part('epoch', now() - j.available_at) END

-- name: _limits_apply
-- Could any limit apply to a claim of queue %(queue)s? An uncorrelated test of the small
-- limits table (an InitPlan, run once per statement): with no limit on this queue and no
-- task or key limit anywhere, the claim takes its plain path, as cheap as without limits.
EXISTS (SELECT 1 FROM {schema}.limits
        WHERE left(name, 6) <> 'queue:' OR name IN ('queue:' || %(queue)s, 'queue:*'))

-- name: _claim_set
-- What both claim statements set on a claimed job (alias j), besides its queue slot: the
-- lease (owner, next token, expiry) and the attempt.
status = 'running',
    attempt_count = least(j.attempt_count, 2147483646) + 1,
    lease_owner = %(owner)s,
    lease_token = least(j.lease_token, 9223372036854775806) + 1,
    lease_expires_at = now() + make_interval(secs => %(lease_seconds)s),
    started_at = now(),
    heartbeat_at = now()

-- name: _queue_concurrency
-- The concurrency of %(queue)s's limit: its own, else the queue family's when it has no
-- limit of its own (NULL: none). Uncorrelated InitPlans over the small limits table.
coalesce(
  (SELECT x.concurrency FROM {schema}.limits AS x WHERE x.name = 'queue:' || %(queue)s),
  (SELECT x.concurrency FROM {schema}.limits AS x
    WHERE x.name = 'queue:*'
      AND NOT EXISTS (SELECT 1 FROM {schema}.limits AS e WHERE e.name = 'queue:' || %(queue)s)))

-- name: claim_jobs
-- The seed's claim: lock candidates with SKIP LOCKED and flip them to running in the same
-- statement, so no other worker can take a row between the choice and the update. The
-- ORDER BY matches jobs_claimable_idx, so the scan stops after LIMIT rows. The candidates
-- come back as an array (an InitPlan run once) rather than a joined CTE: a join makes the
-- UPDATE carry a whole-row copy of every candidate for EvalPlanQual, and the rows are
-- already locked by us, so there is nothing to recheck.
--
-- Why it cannot fail because of one row: a stored row may hold what leaseq never writes
-- (by hand-written SQL, a bug, an older version). The counters saturate instead of
-- overflowing, and a time that is not finite gives NULL ages instead of an error, so the
-- batch is claimed whatever one row holds; the client then ends such a row dead, fenced by
-- the lease just taken (leaseq.rows: a token or attempt count at its maximum, a NULL age,
-- a payload Python cannot decode). Ending it here instead would need an event row from
-- this statement, i.e. a CTE around the hot UPDATE, for rows that practically never occur.
-- The payload comes as text and is decoded by the client row by row, for the same reason.
--
-- Pauses ({_not_paused}) are checked here, in the claim itself, so a pause needs no worker
-- memory and holds through restarts and deploys.
--
-- Limits: a claim of a queue no limit can apply to (no limit of its own or of the queue
-- family, no task or key limit anywhere) is the seed's claim: the only addition is one check
-- of the small limits table. Under a queue concurrency limit and nothing else (no rate on
-- it, no task or key limit anywhere, no slot held above it after a lowering, a limit at
-- least the claim's size) it takes the fast path: each job takes slot (id mod concurrency) + 1 on its own row, and
-- jobs_queue_slot_idx (unique per queue and number, version 16) decides: a number still
-- held makes the statement fail (unique_violation, nothing claimed). Any other limit makes
-- it fail at once (claim_needs_admit, SQLSTATE LQ001, nothing locked yet). The client then
-- claims with claim_limited_jobs, and keeps doing so for a while.
--
-- Suspended jobs of the queue that are due are woken first (_wake_due), for the next claim.
WITH {_wake_due}
UPDATE {schema}.jobs AS j
SET {_claim_set},
    -- A job of cost above 1 takes more than one number: claim_limited_jobs's (LQ001).
    queue_slot = CASE WHEN {_limits_apply}
                   THEN CASE WHEN j.cost = 1 THEN (j.id %% {_queue_concurrency})::integer + 1
                             ELSE {schema}.claim_needs_admit_slot() END END
-- The CASE sits in a scalar subquery (an InitPlan, run once): bare, its volatile ELSE
-- made the id test unusable for the primary key, and the UPDATE read the whole table.
WHERE j.id = ANY((SELECT CASE
  -- A fair queue (it has fair_keys rows) is claim_fair_jobs' (LQ010, nothing locked yet).
  WHEN {_queue_is_fair} THEN {schema}.claim_needs_fair()
  WHEN NOT {_limits_apply}
    -- No limit: the seed's claim. The fast path: a limit of at least this claim's size (so
    -- the batch's own numbers cannot collide; the LIMIT stays a plain parameter, which the
    -- planner turns into a short index scan).
    OR ({_queue_concurrency} >= %(limit)s
        AND NOT EXISTS (SELECT 1 FROM {schema}.limits AS o
                        WHERE left(o.name, 6) <> 'queue:'
                           -- A rate, or slots that moved to slot rows (version 30).
                           OR ((o.rate IS NOT NULL OR o.queue_slot_rows)
                               AND o.name IN ('queue:' || %(queue)s, 'queue:*')))
        -- No slot held above the limit (lowered meanwhile): the highest slot held, one
        -- step down jobs_queue_slot_idx.
        AND coalesce((SELECT max(h.queue_slot) FROM {schema}.jobs AS h
                      WHERE h.queue_name = %(queue)s AND h.queue_slot IS NOT NULL), 0)
            <= {_queue_concurrency})
    THEN ARRAY({_claim_candidates} LIMIT %(limit)s FOR UPDATE SKIP LOCKED)
  ELSE {schema}.claim_needs_admit()
END)::bigint[])
{_claim_returning},
          -- slot_rows: this statement never takes slot rows (admit() does, and only
          -- claim_limited_jobs calls it); a queue limit's slot is on the row, which every
          -- statement ending a lease clears.
          false,
          -- Why the job cannot start (its cost above a limit's concurrency): admit()'s.
          NULL::text;

-- name: claim_limited_jobs
-- claim_jobs when limits apply and its fast path cannot be taken (or failed): the same
-- claim with admit() (migration 0016) deciding which candidates get their slots and rate
-- tokens; it also returns each one's queue slot, which the UPDATE writes. Without any limit
-- that could apply it is the seed's claim, so a caller's transaction (the testing kit's
-- drain) can always use this one: it never fails for a slot race of its own making.
WITH {_wake_due}, pick AS MATERIALIZED (
  SELECT CASE WHEN {_queue_is_fair} THEN {schema}.claim_needs_fair()
              WHEN NOT {_limits_apply}
           THEN ARRAY({_claim_candidates} LIMIT %(limit)s FOR UPDATE SKIP LOCKED)
         END AS ids,
         -- A bounded scan of candidates (enough to step over a few full keys, bounded so
         -- the claim stays short), read unlocked in claim order; admit() locks each it tries
         -- (SKIP LOCKED, re-checked), takes their slots and rate tokens and returns the
         -- first %(limit)s that got all of them. The others stay pending in their place (no
         -- attempt charged) and the claim takes later work instead.
         CASE WHEN {_limits_apply} AND NOT {_queue_is_fair}
           THEN {schema}.admit(ARRAY({_claim_candidates} LIMIT least(4 * %(limit)s + 32, 2000)),
                               %(limit)s)
         END AS adm
)
UPDATE {schema}.jobs AS j
SET {_claim_set},
    queue_slot = ((SELECT adm FROM pick)).slots[
                   array_position(((SELECT adm FROM pick)).admitted, j.id)]
WHERE j.id = ANY(coalesce((SELECT ids FROM pick), ((SELECT adm FROM pick)).admitted))
{_claim_returning},
          -- slot_rows as admit() itself reports them (version 21): it reads the limits with
          -- newer snapshots than this statement's, so only it knows whether it took any.
          coalesce(((SELECT adm FROM pick)).slot_rows, false),
          -- Its cost is above the concurrency of a limit of its (version 30): claimed
          -- without slots to be ended dead, with why.
          ((SELECT adm FROM pick)).oversize_why[
            array_position(((SELECT adm FROM pick)).oversize, j.id)];
