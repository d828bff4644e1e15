-- Every statement leaseq sends, named and in one place.
--
-- Format: a block starts with "-- name: NAME"; the comment lines right under it say why
-- the statement looks the way it does. {schema} is replaced by the quoted schema name;
-- %(x)s are psycopg parameters. Every statement that changes a running job is fenced by
-- id + lease_owner + lease_token + "lease_expires_at > now()" (the sweep instead by
-- "lease_expires_at <= now()"), and callers treat fewer rows than asked for as lost leases.
-- All lease arithmetic is done with the database clock (now()); Python only sends intervals.
--
-- Blocks whose name starts with "_" are fragments, not statements: "{_name}" in a statement
-- is replaced by the fragment's text.


-- name: _unique_insert
-- The job row of insert_unique_job and insert_follow_up, under the id the CTE "lock" took
-- with the key (nothing is inserted when the key was not taken). Placed before
-- _key_blocking, which it uses: fragments are expanded in file order.
ins AS (
  INSERT INTO {schema}.jobs
    (id, queue_name, task, payload, priority, base_priority, available_at, max_attempts,
     payload_version, idempotency_key, ordering_key, key_policy, blocked, unique_key,
     unique_for, unique_states, debounce_until, limit_key)
  OVERRIDING SYSTEM VALUE
  SELECT lock.job_id, %(queue)s, %(task)s, %(payload)s::jsonb, %(priority)s, %(priority)s,
         coalesce(%(run_at)s::timestamptz, now() + make_interval(secs => %(delay)s)),
         %(max_attempts)s, %(payload_version)s, %(idempotency_key)s, %(ordering_key)s,
         %(key_policy)s,
         -- As in insert_keyed_job (the caller holds the ordering key's lock).
         %(ordering_key)s::text IS NOT NULL AND EXISTS (
           SELECT 1 FROM {schema}.jobs AS b
           WHERE b.ordering_key = %(ordering_key)s AND {_key_blocking}
         ),
         %(unique_key)s, %(unique_for)s::float8, %(unique_states)s::text[],
         now() + make_interval(secs => %(debounce_max)s::float8), %(limit_key)s
  FROM lock
  RETURNING id, queue_name, available_at, blocked
)

-- name: _unique_release
-- After keyed jobs ended (CTE fin: id, unique_key, status, unique_for, unique_states, only
-- final states): a job that still holds its key keeps it as a window until now() +
-- unique_for when it ended in one of its unique_states, and lets it go otherwise. A job
-- whose key moved to a follow-up (superseded) touches nothing.
key_windows AS (
  UPDATE {schema}.unique_keys AS k
  SET held_until = now() + make_interval(secs => f.unique_for)
  FROM fin AS f
  WHERE k.unique_key = f.unique_key AND k.job_id = f.id AND k.held_until IS NULL
    AND f.unique_for IS NOT NULL AND f.status::text = ANY(f.unique_states)
  RETURNING k.job_id
), key_freed AS (
  DELETE FROM {schema}.unique_keys AS k
  USING fin AS f
  WHERE k.unique_key = f.unique_key AND k.job_id = f.id AND k.held_until IS NULL
    AND NOT coalesce(f.unique_for IS NOT NULL AND f.status::text = ANY(f.unique_states), false)
  RETURNING k.job_id
)

-- name: _slots_release
-- The concurrency slots of the leases a fenced statement just ended (CTE upd: id,
-- lease_token), given back in that same statement. Matched by the lease token, so only the
-- transition that ended the lease that took them can free them: a stale worker's write,
-- refused by the fence, frees nothing, and no slot is ever freed twice.
--
-- Only task and key limits have slot rows (a queue limit's slot is jobs.queue_slot, version
-- 16, cleared by the ending statement itself; its wake-up is _queue_wake).
--
-- Wake-up: a slot freed of a limit that refused a claim lately (limits.refused_at, set by
-- admit(), migration 0013) sends a NOTIFY on the schema's channel, so a worker held back by
-- that limit claims now, not at its next poll: every queue ("*"), since a task or key limit
-- spans queues. RETURNING is computed for every deleted row even though nothing reads this
-- CTE. A limit that never refuses costs one uncorrelated check of the small limits table
-- per statement and sends nothing.
slots_freed AS (
  DELETE FROM {schema}.limit_slots AS s
  USING upd
  -- No slot rows at all (queue limits only: theirs are on the job rows): one uncorrelated
  -- check, and no probe per lease.
  WHERE (SELECT EXISTS (SELECT 1 FROM {schema}.limit_slots))
    AND s.job_id = upd.id AND s.lease_token = upd.lease_token
  RETURNING CASE
    WHEN (SELECT EXISTS (SELECT 1 FROM {schema}.limits
                         WHERE refused_at > now() - interval '5 minutes'))
     AND EXISTS (SELECT 1 FROM {schema}.limits AS b
                 WHERE b.name IN (s.limit_name, regexp_replace(s.limit_name, '[^:]*$', '*'))
                   AND b.refused_at > now() - interval '5 minutes')
    THEN pg_notify('leaseq.' || btrim('{schema}', '"'), '*')::text
  END
)

-- name: _queue_wake
-- (A RETURNING item of the upd that ends leases, alias j.) The wake-up of _slots_release
-- for a queue limit, whose slots are on the job rows (jobs.queue_slot, version 16): a
-- lease of a queue whose limit refused a claim lately sends a NOTIFY for that queue (the
-- same payload twice in a transaction is sent once). When no queue limit refused lately,
-- one uncorrelated check of the small limits table per statement, and nothing is sent.
CASE
  WHEN (SELECT EXISTS (SELECT 1 FROM {schema}.limits
                       WHERE refused_at > now() - interval '5 minutes'
                         AND left(name, 6) = 'queue:'))
   AND EXISTS (SELECT 1 FROM {schema}.limits AS b
               WHERE b.name IN ('queue:' || j.queue_name, 'queue:*')
                 AND b.refused_at > now() - interval '5 minutes')
  THEN pg_notify('leaseq.' || btrim('{schema}', '"'), j.queue_name)::text
END AS queue_woken

-- name: _unique_superseded
-- For ended attempts (CTE d0 with an id column): does each job still hold its unique key?
-- The key rows are locked (FOR UPDATE reads the latest committed version), so a follow-up
-- moving a key concurrently is either seen here or waits until this statement commits.
key_rows AS (
  SELECT k.unique_key, k.job_id
  FROM {schema}.unique_keys AS k
  WHERE k.unique_key IN (
    SELECT j.unique_key FROM {schema}.jobs AS j
    WHERE j.id IN (SELECT d0.id FROM d0) AND j.unique_key IS NOT NULL
  )
  FOR UPDATE
), sup AS (
  SELECT d0.id,
         j.unique_key IS NOT NULL AND NOT EXISTS (
           SELECT 1 FROM key_rows AS r WHERE r.unique_key = j.unique_key AND r.job_id = j.id
         ) AS superseded,
         (SELECT r.job_id FROM key_rows AS r WHERE r.unique_key = j.unique_key) AS holder
  FROM d0 JOIN {schema}.jobs AS j ON j.id = d0.id
)


-- name: _key_blocking
-- Does job b hold up later jobs of its ordering key? (A waiting, blocked job does not.)
((b.status IN ('pending', 'running') AND NOT b.blocked)
 OR (b.status = 'dead' AND b.key_policy = 'block' AND NOT b.key_skipped))

-- name: _job_filter
-- The operator's filter (dead list, bulk replay, purge); a NULL parameter matches all.
status = ANY(%(statuses)s::{schema}.job_status[])
  AND (%(id)s::bigint IS NULL OR id = %(id)s)
  AND (%(queue)s::text IS NULL OR queue_name = %(queue)s)
  AND (%(task)s::text IS NULL OR task = %(task)s)
  AND (%(error_code)s::text IS NULL OR last_error_code = %(error_code)s)
  AND (%(older_than)s::float8 IS NULL
       OR finished_at <= now() - make_interval(secs => %(older_than)s))
  AND (%(newer_than)s::float8 IS NULL
       OR finished_at > now() - make_interval(secs => %(newer_than)s))


-- name: migrate_lock
-- Serialises concurrent `leaseq migrate` runs on one schema; released at commit.
SELECT pg_advisory_xact_lock(hashtextextended(%(key)s, 0));

-- name: create_schema
CREATE SCHEMA IF NOT EXISTS {schema};

-- name: create_version_table
CREATE TABLE IF NOT EXISTS {schema}.schema_version (
  version integer PRIMARY KEY,
  name text NOT NULL,
  applied_at timestamptz NOT NULL DEFAULT now()
);

-- name: applied_versions
SELECT version FROM {schema}.schema_version ORDER BY version;

-- name: record_version
INSERT INTO {schema}.schema_version (version, name) VALUES (%(version)s, %(name)s);

-- name: version_table_exists
-- Asked first, so reading the version of a never-migrated schema is not an error.
SELECT to_regclass(%(table)s) IS NOT NULL;

-- name: schema_version
SELECT max(version) FROM {schema}.schema_version;


-- name: insert_job
-- One round trip: the row and its wake-up go together, so the NOTIFY is delivered only if
-- (and when) the enclosing transaction commits. Jobs scheduled for later wake nobody. Jobs
-- without an ordering key take this plain INSERT (insert_keyed_job has the key logic,
-- which cost single enqueues about 15% even when it did not apply).
INSERT INTO {schema}.jobs
  (queue_name, task, payload, priority, base_priority, available_at, max_attempts,
   payload_version, idempotency_key, key_policy, limit_key)
VALUES (
  %(queue)s, %(task)s, %(payload)s::jsonb, %(priority)s, %(priority)s,
  coalesce(%(run_at)s::timestamptz, now() + make_interval(secs => %(delay)s)),
  %(max_attempts)s, %(payload_version)s, %(idempotency_key)s, %(key_policy)s, %(limit_key)s
)
RETURNING id, CASE WHEN available_at <= now() THEN pg_notify(%(channel)s, queue_name)::text END;

-- name: insert_keyed_job
-- insert_job for a job with an ordering key; the caller holds the key's advisory lock.
WITH ins AS (
  INSERT INTO {schema}.jobs
    (queue_name, task, payload, priority, base_priority, available_at, max_attempts,
     payload_version, idempotency_key, ordering_key, key_policy, blocked, limit_key)
  VALUES (
    %(queue)s, %(task)s, %(payload)s::jsonb, %(priority)s, %(priority)s,
    coalesce(%(run_at)s::timestamptz, now() + make_interval(secs => %(delay)s)),
    %(max_attempts)s, %(payload_version)s, %(idempotency_key)s, %(ordering_key)s,
    %(key_policy)s,
    -- Behind any live (or blocking dead) job of its key: wait. The caller holds the key's
    -- advisory lock (lock_keys), so this answer cannot go stale before the commit.
    EXISTS (
      SELECT 1 FROM {schema}.jobs AS b
      WHERE b.ordering_key = %(ordering_key)s AND {_key_blocking}
    ),
    %(limit_key)s
  )
  RETURNING id, queue_name, available_at
)
SELECT id, CASE WHEN available_at <= now() THEN pg_notify(%(channel)s, queue_name)::text END
FROM ins;

-- name: insert_unique_job
-- A job with a unique key takes the key FIRST, in the same statement as its insert: the
-- primary key of unique_keys decides, in the caller's transaction. A concurrent enqueue of
-- the key waits for this one to commit (then finds it held) or roll back (then inserts).
-- Nothing returned = the key is held: the client reads the holder with unique_holder (a
-- new snapshot) and acts on on_conflict. DO NOTHING, not DO UPDATE ... WHERE: a conflict
-- must not lock the holder's row (that would make its completion wait for the caller's
-- transaction); an ended window is taken over by take_unique_window instead.
WITH lock AS (
  INSERT INTO {schema}.unique_keys AS k (unique_key, job_id, held_until)
  VALUES (%(unique_key)s,
          nextval((SELECT pg_get_serial_sequence('{schema}.jobs', 'id'))::regclass), NULL)
  ON CONFLICT (unique_key) DO NOTHING
  RETURNING k.job_id
), {_unique_insert}
SELECT id,
       CASE WHEN available_at <= now() AND NOT blocked
         THEN pg_notify(%(channel)s, queue_name)::text END
FROM ins;

-- name: take_unique_window
-- insert_unique_job when the key's row is only a window that has ended: take it over,
-- fenced by "still ended" (a concurrent enqueue taking it first leaves nothing here).
WITH lock AS (
  UPDATE {schema}.unique_keys AS k
  SET job_id = nextval((SELECT pg_get_serial_sequence('{schema}.jobs', 'id'))::regclass),
      held_until = NULL
  WHERE k.unique_key = %(unique_key)s AND k.held_until <= now()
  RETURNING k.job_id
), {_unique_insert}
SELECT id,
       CASE WHEN available_at <= now() AND NOT blocked
         THEN pg_notify(%(channel)s, queue_name)::text END
FROM ins;

-- name: unique_holder
-- Who holds a key, read after insert_unique_job found it held. held_until set = only the
-- window of a finished job is left (its row may have been pruned: status NULL).
SELECT k.job_id, k.held_until, j.status::text, k.held_until <= now()
FROM {schema}.unique_keys AS k
LEFT JOIN {schema}.jobs AS j ON j.id = k.job_id
WHERE k.unique_key = %(unique_key)s;

-- name: unique_replace
-- on_conflict="replace" while the holder is pending (never leased): fenced by status, so a
-- claim that locked the row first makes this find it running (and change nothing), and a
-- claim coming later waits for this row. A debounce moves the start to now() + debounce,
-- never past debounce_until; without one, run_at/delay move it only when given.
WITH upd AS (
  UPDATE {schema}.jobs AS j
  SET payload = %(payload)s::jsonb,
      priority = %(priority)s,
      base_priority = %(priority)s,
      available_at = CASE
        WHEN %(debounce)s::float8 IS NOT NULL
          THEN least(now() + make_interval(secs => %(debounce)s::float8),
                     coalesce(j.debounce_until, 'infinity'))
        WHEN %(reschedule)s
          THEN coalesce(%(run_at)s::timestamptz, now() + make_interval(secs => %(delay)s))
        ELSE j.available_at
      END
  WHERE j.id = %(holder)s AND j.status = 'pending' AND j.unique_key = %(unique_key)s
  RETURNING j.id, j.queue_name, j.available_at, j.blocked, j.lease_token, j.attempt_count
), ev AS (
  INSERT INTO {schema}.job_events
    (job_id, event, from_status, to_status, actor, lease_token, attempt, detail)
  SELECT id, 'unique_replaced', 'pending', 'pending', NULL, lease_token, attempt_count,
         'payload replaced by an enqueue of unique key ' || left(%(unique_key)s, 200)
  FROM upd
)
SELECT id,
       CASE WHEN available_at <= now() AND NOT blocked
         THEN pg_notify(%(channel)s, queue_name)::text END
FROM upd;

-- name: insert_follow_up
-- on_conflict="replace" (or a debounce) while the holder runs: a running job is never
-- changed, so a new job with the new payload is queued and the key moves to it, fenced by
-- the holder still holding it live. The holder is now superseded: if its attempt fails it
-- ends cancelled (SUPERSEDED) rather than coming back as a second live job with the key.
WITH lock AS (
  UPDATE {schema}.unique_keys AS k
  SET job_id = nextval((SELECT pg_get_serial_sequence('{schema}.jobs', 'id'))::regclass)
  WHERE k.unique_key = %(unique_key)s AND k.job_id = %(holder)s AND k.held_until IS NULL
  RETURNING k.job_id
), {_unique_insert}, ev AS (
  INSERT INTO {schema}.job_events
    (job_id, event, from_status, to_status, actor, lease_token, attempt, detail)
  SELECT h.id, 'superseded', h.status, h.status, NULL, h.lease_token, h.attempt_count,
         'unique key ' || left(h.unique_key, 200) || ' moved to follow-up job ' || ins.id
  FROM ins JOIN {schema}.jobs AS h ON h.id = %(holder)s
)
SELECT id,
       CASE WHEN available_at <= now() AND NOT blocked
         THEN pg_notify(%(channel)s, queue_name)::text END
FROM ins;

-- name: insert_jobs
-- Bulk form of insert_job: arrays in, one statement. Identity values are assigned in the
-- order unnest produces rows, so sorted ids match the input order. PostgreSQL folds
-- duplicate notifications of one transaction, so one wake-up per queue goes out.
WITH ins AS (
  INSERT INTO {schema}.jobs
    (queue_name, task, payload, priority, base_priority, available_at, max_attempts,
     payload_version, idempotency_key, ordering_key, key_policy, blocked, limit_key)
  SELECT u.queue, u.task, u.payload, u.priority, u.priority,
         coalesce(u.run_at, now() + make_interval(secs => u.delay)), u.max_attempts,
         u.payload_version, u.idempotency_key, u.ordering_key, u.key_policy,
         -- Within the batch only a key's first job may be its head; after that, as in
         -- insert_job, anything live of the key already stored holds it up.
         u.ordering_key IS NOT NULL AND (
           row_number() OVER (PARTITION BY u.ordering_key ORDER BY u.ord) > 1
           OR EXISTS (
             SELECT 1 FROM {schema}.jobs AS b
             WHERE b.ordering_key = u.ordering_key AND {_key_blocking}
           )
         ),
         u.limit_key
  FROM unnest(
    %(queues)s::text[], %(tasks)s::text[], %(payloads)s::jsonb[], %(priorities)s::int[],
    %(run_ats)s::timestamptz[], %(delays)s::float8[], %(max_attempts)s::int[],
    %(payload_versions)s::int[], %(idempotency_keys)s::text[], %(ordering_keys)s::text[],
    %(key_policies)s::text[], %(limit_keys)s::text[]
  ) WITH ORDINALITY
    AS u(queue, task, payload, priority, run_at, delay, max_attempts, payload_version,
         idempotency_key, ordering_key, key_policy, limit_key, ord)
  ORDER BY u.ord
  RETURNING id, queue_name, available_at
)
SELECT id, CASE WHEN available_at <= now() THEN pg_notify(%(channel)s, queue_name)::text END
FROM ins
ORDER BY id;


-- name: reserve_job_ids
-- Bulk enqueue by COPY: take the ids first (so they come back in input order) and the
-- database's clock (so delays count from database time, as everywhere else); the queues'
-- wake-ups go out in the same round trip (delivered only if the transaction commits).
-- The sequence is looked up once, in a scalar subquery: called per row,
-- pg_get_serial_sequence took three quarters of the statement's time.
SELECT now(),
       array_agg(nextval((SELECT pg_get_serial_sequence('{schema}.jobs', 'id'))::regclass)
                 ORDER BY g),
       (SELECT count(pg_notify(%(channel)s, q)) FROM unnest(%(queues)s::text[]) AS q)
FROM generate_series(1, %(n)s) AS g;

-- name: copy_jobs
-- COPY writes the reserved ids into the identity column as given.
COPY {schema}.jobs
  (id, queue_name, task, payload, priority, base_priority, available_at, max_attempts,
   payload_version, idempotency_key, limit_key)
FROM STDIN;


-- name: _claim_candidates
-- (Before _not_paused, which it uses: fragments are expanded in file order.)
-- The claimable jobs of %(queue)s in claim order (jobs_claimable_idx), pauses left out.
SELECT id
  FROM {schema}.jobs AS c
  WHERE queue_name = %(queue)s
    AND status = 'pending'
    AND NOT blocked
    AND NOT waiting
    AND available_at <= now()
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
-- (Before _limits_apply, which it uses: fragments are expanded in file order.)
-- What both claim statements return per claimed job (alias j): the lease and the job.
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
            THEN date_part('epoch', now() - j.available_at) END,
          -- Claimed while task or key limits exist: the lease may hold slot rows
          -- (limit_slots), so its end takes the statements that delete them. A queue
          -- limit's slot is on the row, which every statement ending a lease clears.
          EXISTS (SELECT 1 FROM {schema}.limits WHERE left(name, 6) <> 'queue:')

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
UPDATE {schema}.jobs AS j
SET {_claim_set},
    queue_slot = CASE WHEN {_limits_apply}
                   THEN (j.id %% {_queue_concurrency})::integer + 1 END
-- The CASE sits in a scalar subquery (an InitPlan, run once): bare, its volatile ELSE
-- made the id test unusable for the primary key, and the UPDATE read the whole table.
WHERE j.id = ANY((SELECT CASE
  WHEN NOT {_limits_apply}
    -- No limit: the seed's claim. The fast path: a limit of at least this claim's size (so
    -- the batch's own numbers cannot collide; the LIMIT stays a plain parameter, which the
    -- planner turns into a short index scan).
    OR ({_queue_concurrency} >= %(limit)s
        AND NOT EXISTS (SELECT 1 FROM {schema}.limits AS o
                        WHERE left(o.name, 6) <> 'queue:'
                           OR (o.rate IS NOT NULL
                               AND o.name IN ('queue:' || %(queue)s, 'queue:*')))
        -- No slot held above the limit (lowered meanwhile): the highest slot held, one
        -- step down jobs_queue_slot_idx.
        AND coalesce((SELECT max(h.queue_slot) FROM {schema}.jobs AS h
                      WHERE h.queue_name = %(queue)s AND h.queue_slot IS NOT NULL), 0)
            <= {_queue_concurrency})
    THEN ARRAY({_claim_candidates} LIMIT %(limit)s FOR UPDATE SKIP LOCKED)
  ELSE {schema}.claim_needs_admit()
END)::bigint[])
{_claim_returning};

-- name: claim_limited_jobs
-- claim_jobs when limits apply and its fast path cannot be taken (or failed): the same
-- claim with admit() (migration 0016) deciding which candidates get their slots and rate
-- tokens; it also returns each one's queue slot, which the UPDATE writes. Without any limit
-- that could apply it is the seed's claim, so a caller's transaction (the testing kit's
-- drain) can always use this one: it never fails for a slot race of its own making.
WITH pick AS MATERIALIZED (
  SELECT CASE WHEN NOT {_limits_apply}
           THEN ARRAY({_claim_candidates} LIMIT %(limit)s FOR UPDATE SKIP LOCKED)
         END AS ids,
         -- A bounded scan of candidates (enough to step over a few full keys, bounded so
         -- the claim stays short), read unlocked in claim order; admit() locks each it tries
         -- (SKIP LOCKED, re-checked), takes their slots and rate tokens and returns the
         -- first %(limit)s that got all of them. The others stay pending in their place (no
         -- attempt charged) and the claim takes later work instead.
         CASE WHEN {_limits_apply}
           THEN {schema}.admit(ARRAY({_claim_candidates} LIMIT least(4 * %(limit)s + 32, 2000)),
                               %(limit)s)
         END AS adm
)
UPDATE {schema}.jobs AS j
SET {_claim_set},
    queue_slot = ((SELECT adm FROM pick)).slots[
                   array_position(((SELECT adm FROM pick)).admitted, j.id)]
WHERE j.id = ANY(coalesce((SELECT ids FROM pick), ((SELECT adm FROM pick)).admitted))
{_claim_returning};

-- name: _owned_by_token
-- The fence for a batch of leases; ids must be ascending and unique. Each row's owner and
-- token are found by binary search (width_bucket) over the ids: owners are per job, since
-- every claim has an owner of its own (leaseq.owners). Joining unnest(ids, owners, tokens)
-- instead makes PostgreSQL copy every input row whole for EvalPlanQual and often hash all
-- running jobs: this form drained 1.3-2.2x faster (bench: drain-raw). The arrays sit in
-- scalar subqueries, evaluated once per statement: in a generic plan the driver's
-- int2/int4 arrays would otherwise be cast per row.
j.id = ANY(%(ids)s::bigint[])
  AND j.status = 'running'
  AND j.lease_owner
      = (SELECT %(owners)s::text[])[width_bucket(j.id, (SELECT %(ids)s::bigint[]))]
  AND j.lease_token
      = (SELECT %(tokens)s::bigint[])[width_bucket(j.id, (SELECT %(ids)s::bigint[]))]
  AND j.lease_expires_at > now()

-- name: _failure_events
-- The trail rows of a fenced failure batch, from its upd (status, owner, lease_token,
-- attempt_count, code, class, reason, detail, cancel_asked): the same statement that
-- applied the failures writes them, so the trail cannot miss a transition. "cancel
-- requested" only where a cancel request made it cancelled (a superseded job says why).
INSERT INTO {schema}.job_events
  (job_id, event, from_status, to_status, actor, lease_token, attempt, error_code,
   error_class, detail)
SELECT id,
       CASE status WHEN 'pending' THEN 'retry_scheduled' WHEN 'dead' THEN 'dead'
                   ELSE 'cancelled' END,
       'running', status, owner, lease_token, attempt_count, code, class,
       left(CASE WHEN status = 'cancelled' AND cancel_asked THEN 'cancel requested'
                 ELSE reason END
            || coalesce(': ' || detail, ''), 4000)
FROM upd
RETURNING job_id, to_status::text

-- name: _failure_input
-- The failures of a batch as Python decided them (fail_jobs, fail_keyed_jobs), one row each.
SELECT *
  FROM unnest(
    %(ids)s::bigint[], %(owners)s::text[], %(tokens)s::bigint[],
    %(to_statuses)s::text[], %(delays)s::float8[], %(codes)s::text[], %(details)s::text[],
    %(classes)s::text[], %(reasons)s::text[]
  ) AS d(id, owner, token, to_status, delay, code, detail, class, reason)

-- name: _failure_applied
-- (Before _attempt_ended, which it uses: fragments are expanded in file order.)
-- A failure applied under the whole fence of its lease (owner, token, unexpired).
UPDATE {schema}.jobs AS j
  SET {_attempt_ended},
      last_error_code = d.code,
      last_error_detail = d.detail,
      last_error_class = d.class,
      unknown_failures = j.unknown_failures + (d.class = 'unknown')::int
  FROM d
  WHERE j.id = d.id
    AND j.status = 'running'
    AND j.lease_owner = d.owner
    AND j.lease_token = d.token
    AND j.lease_expires_at > now()

-- name: _attempt_ended
-- The SET block shared by fail_jobs and expire_leases (alias j, decisions d): the next
-- state Python decided (d.to_status, d.delay), except that a pending cancel request turns a
-- retry into cancelled, since nobody wants the job run again. The lease is let go.
status = CASE
    WHEN j.cancel_requested_at IS NOT NULL THEN 'cancelled'
    ELSE d.to_status::{schema}.job_status
  END,
  available_at = CASE
    WHEN j.cancel_requested_at IS NULL AND d.to_status = 'pending'
      THEN now() + make_interval(secs => d.delay)
    ELSE j.available_at
  END,
  finished_at = CASE
    WHEN j.cancel_requested_at IS NULL AND d.to_status = 'pending' THEN NULL
    ELSE now()
  END,
  lease_owner = NULL,
  lease_expires_at = NULL,
  queue_slot = NULL

-- name: heartbeat_jobs
-- Renews many leases in one statement; rows missing from RETURNING lost their lease.
UPDATE {schema}.jobs AS j
SET lease_expires_at = now() + make_interval(secs => %(lease_seconds)s),
    heartbeat_at = now()
WHERE {_owned_by_token}
RETURNING j.id, j.lease_token, j.lease_expires_at, j.cancel_requested_at IS NOT NULL;

-- name: complete_jobs
-- Fenced success for a batch; rows missing from RETURNING were not ours any more, or
-- gained dependents after the claim ("NOT has_dependents": the client then completes them
-- with complete_keyed_jobs, which promotes dependents; the enqueue of a dependent locks
-- this row, so a completion either commits first or sees the flag). A queue limit's slot
-- goes with the lease, and wakes the workers its limit held back lately (_queue_wake).
UPDATE {schema}.jobs AS j
SET status = 'succeeded',
    finished_at = now(),
    lease_owner = NULL,
    lease_expires_at = NULL,
    queue_slot = NULL  -- a queue limit's slot goes with the lease (version 16)
WHERE {_owned_by_token}
  AND NOT j.has_dependents
RETURNING j.id, {_queue_wake};

-- name: complete_limited_jobs
-- complete_jobs for leases claimed under limits (no unique key, no dependents): the fenced
-- update and the release of the lease's slots (_slots_release) in one statement, one round
-- trip, as cheap as the plain completion plus the slot rows. Rows missing from RETURNING
-- were not ours any more, or gained dependents since the claim: the client then tries
-- complete_keyed_jobs, as for complete_jobs.
WITH upd AS (
  UPDATE {schema}.jobs AS j
  SET status = 'succeeded',
      finished_at = now(),
      lease_owner = NULL,
      lease_expires_at = NULL,
      queue_slot = NULL
  WHERE {_owned_by_token}
    AND NOT j.has_dependents
    AND j.unique_key IS NULL
  RETURNING j.id, j.lease_token, {_queue_wake}
), {_slots_release}
SELECT id FROM upd;

-- name: complete_keyed_jobs
-- complete_jobs for leases of jobs with a unique key, claimed under limits, or with
-- dependents (the plain statement stays as it is): the key becomes a window or is let go
-- (see _unique_release) and the lease's limit slots are given back (_slots_release), in
-- the same statement; the client promotes dependents in the same transaction
-- (lock_dependents, promote_dependents).
WITH upd AS (
  UPDATE {schema}.jobs AS j
  SET status = 'succeeded',
      finished_at = now(),
      lease_owner = NULL,
      lease_expires_at = NULL,
      queue_slot = NULL
  WHERE {_owned_by_token}
  RETURNING j.id, j.status, j.lease_token, j.unique_key, j.unique_for, j.unique_states,
            {_queue_wake}
), fin AS (
  SELECT * FROM upd WHERE unique_key IS NOT NULL
), {_unique_release}, {_slots_release}
SELECT id FROM upd;

-- name: fail_jobs
-- Fenced failure for a batch. Python decided each job's next state (retry after a delay,
-- or dead); a pending cancel request overrides a retry, since nobody wants it run again.
-- The event row is written by the same statement, so the trail cannot miss a transition.
WITH d AS (
  {_failure_input}
), upd AS (
  {_failure_applied}
    -- As in complete_jobs: a job with dependents takes fail_keyed_jobs.
    AND NOT j.has_dependents
  RETURNING j.id, j.status, j.lease_token, j.attempt_count, d.owner, d.code, d.detail,
            d.class, d.reason, j.cancel_requested_at IS NOT NULL AS cancel_asked,
            {_queue_wake}
)
{_failure_events};

-- name: fail_limited_jobs
-- fail_jobs for leases claimed under limits (no unique key, no dependents): the same
-- fenced failure and event row, and the lease's slots given back (_slots_release), in one
-- statement. Rows missing from RETURNING are tried with fail_keyed_jobs by the client.
WITH d AS (
  {_failure_input}
), upd AS (
  {_failure_applied}
    AND NOT j.has_dependents
    AND j.unique_key IS NULL
  RETURNING j.id, j.status, j.lease_token, j.attempt_count, d.owner, d.code, d.detail,
            d.class, d.reason, j.cancel_requested_at IS NOT NULL AS cancel_asked,
            {_queue_wake}
), {_slots_release}
{_failure_events};

-- name: fail_keyed_jobs
-- fail_jobs for leases of jobs with a unique key. Two differences: a job whose key moved
-- to a follow-up (superseded) and would be retried ends cancelled with SUPERSEDED instead,
-- and a job that ends releases its key or keeps it as a window (_unique_release), all in
-- this one statement. Also used for rows the claim could not read (a rare path), and
-- for leases claimed under limits: their slots are given back here (_slots_release).
WITH d0 AS (
  {_failure_input}
), {_unique_superseded}, d AS (
  SELECT d0.id, d0.owner, d0.token, d0.delay, d0.detail, d0.class,
         CASE WHEN s.superseded AND d0.to_status = 'pending' THEN 'cancelled'
              ELSE d0.to_status END AS to_status,
         CASE WHEN s.superseded AND d0.to_status = 'pending' THEN '{code:SUPERSEDED}'
              ELSE d0.code END AS code,
         CASE WHEN s.superseded AND d0.to_status = 'pending'
              THEN 'superseded: its unique key moved to job '
                   || coalesce(s.holder::text, '(none)') || ', not retried'
              ELSE d0.reason END AS reason
  FROM d0 LEFT JOIN sup AS s ON s.id = d0.id
), upd AS (
  {_failure_applied}
  RETURNING j.id, j.status, j.lease_token, j.attempt_count, d.owner, d.code, d.detail,
            d.class, d.reason, j.cancel_requested_at IS NOT NULL AS cancel_asked,
            j.unique_key, j.unique_for, j.unique_states, {_queue_wake}
), fin AS (
  SELECT * FROM upd WHERE unique_key IS NOT NULL AND status <> 'pending'
), {_unique_release}, {_slots_release}
{_failure_events};

-- name: release_jobs
-- Gives back leases whose handler never started (shutdown): the attempt is not charged
-- and available_at is kept, so the job keeps its place in line. Its limit slots go too.
WITH upd AS (
  UPDATE {schema}.jobs AS j
  SET status = 'pending',
      attempt_count = j.attempt_count - 1,
      lease_owner = NULL,
      lease_expires_at = NULL,
      queue_slot = NULL
  FROM unnest(%(ids)s::bigint[], %(owners)s::text[], %(tokens)s::bigint[]) AS l(id, owner, token)
  WHERE j.id = l.id
    AND j.status = 'running'
    AND j.lease_owner = l.owner
    AND j.lease_token = l.token
    AND j.lease_expires_at > now()
  RETURNING j.id, j.lease_token, j.attempt_count, l.owner, {_queue_wake}
), {_slots_release}
INSERT INTO {schema}.job_events
  (job_id, event, from_status, to_status, actor, lease_token, attempt)
SELECT id, 'released', 'running', 'pending', owner, lease_token, attempt_count
FROM upd
RETURNING job_id;


-- name: lock_expired_leases
-- First half of the sweep: lock a bounded batch of expired leases. SKIP LOCKED lets
-- several sweepers run at once without waiting on each other or taking the same row.
-- A created_at that is not finite gives no age (NULL) rather than an error.
SELECT id, lease_token, task, attempt_count, max_attempts, unknown_failures,
       CASE WHEN isfinite(created_at) THEN extract(epoch FROM now() - created_at)::float8 END,
       ordering_key
FROM {schema}.jobs
WHERE status = 'running'
  AND lease_expires_at <= now()
ORDER BY lease_expires_at
LIMIT %(limit)s
FOR UPDATE SKIP LOCKED;

-- name: expire_leases
-- Second half of the sweep, same transaction: apply the per-job decisions made in Python
-- by the retry policy (a cancel request turns a retry into cancelled, as in fail_jobs).
-- Still fenced by token and "expired", so it only touches rows the first half locked.
-- Unique keys as in fail_keyed_jobs: a superseded job is not requeued (cancelled,
-- SUPERSEDED), and a job that ends lets its key go or keeps it as a window. The expired
-- leases' limit slots are freed here (_slots_release): a crashed worker's slots come back
-- with the sweep that ends its leases.
WITH d0 AS (
  SELECT *
  FROM unnest(
    %(ids)s::bigint[], %(tokens)s::bigint[], %(to_statuses)s::text[], %(delays)s::float8[],
    %(reasons)s::text[]
  ) AS d(id, token, to_status, delay, reason)
), {_unique_superseded}, d AS (
  SELECT d0.id, d0.token, d0.delay,
         coalesce(s.superseded AND d0.to_status = 'pending', false) AS superseded,
         CASE WHEN s.superseded AND d0.to_status = 'pending' THEN 'cancelled'
              ELSE d0.to_status END AS to_status,
         CASE WHEN s.superseded AND d0.to_status = 'pending'
              THEN 'superseded: its unique key moved to job '
                   || coalesce(s.holder::text, '(none)') || ', not retried'
              ELSE d0.reason END AS reason
  FROM d0 LEFT JOIN sup AS s ON s.id = d0.id
), upd AS (
  UPDATE {schema}.jobs AS j
  SET {_attempt_ended},
      last_error_code = CASE WHEN d.superseded THEN '{code:SUPERSEDED}'
                             ELSE '{code:LEASE_EXPIRED}' END,
      last_error_class = 'transient',
      last_error_detail = 'lease of ' || j.lease_owner || ' expired at ' || j.lease_expires_at
  FROM d
  WHERE j.id = d.id
    AND j.status = 'running'
    AND j.lease_token = d.token
    AND j.lease_expires_at <= now()
  RETURNING j.id, j.status, j.lease_token, j.attempt_count, j.last_error_detail, d.reason,
            d.superseded, j.cancel_requested_at IS NOT NULL AS cancel_asked,
            j.unique_key, j.unique_for, j.unique_states, {_queue_wake}
), fin AS (
  SELECT * FROM upd WHERE unique_key IS NOT NULL AND status <> 'pending'
), {_unique_release}, {_slots_release}
INSERT INTO {schema}.job_events
  (job_id, event, from_status, to_status, actor, lease_token, attempt, error_code,
   error_class, detail)
SELECT id, 'lease_expired', 'running', status, %(actor)s, lease_token, attempt_count,
       CASE WHEN superseded THEN '{code:SUPERSEDED}' ELSE '{code:LEASE_EXPIRED}' END,
       'transient',
       CASE WHEN status = 'cancelled' AND cancel_asked THEN 'cancel requested' ELSE reason END
         || ': ' || last_error_detail
FROM upd
RETURNING job_id, to_status::text;


-- name: cancel_job
-- A pending job is cancelled at once; a running one gets a request its worker sees at the
-- next heartbeat (its lease stays valid, so the worker can still report honestly).
WITH upd AS (
  UPDATE {schema}.jobs
  SET status = CASE WHEN status = 'pending' THEN 'cancelled' ELSE status END,
      finished_at = CASE WHEN status = 'pending' THEN now() ELSE finished_at END,
      waiting = false,
      cancel_requested_at = CASE
        WHEN status = 'running' THEN coalesce(cancel_requested_at, now())
        ELSE cancel_requested_at
      END
  WHERE id = %(id)s AND status IN ('pending', 'running')
  RETURNING id, status, lease_token, attempt_count, unique_key, unique_for, unique_states
), fin AS (
  -- A pending job cancelled here lets its unique key go (or keeps it as a window).
  SELECT * FROM upd WHERE status = 'cancelled' AND unique_key IS NOT NULL
), {_unique_release}
INSERT INTO {schema}.job_events
  (job_id, event, from_status, to_status, actor, lease_token, attempt, detail)
SELECT id,
       CASE status WHEN 'cancelled' THEN 'cancelled' ELSE 'cancel_requested' END,
       CASE status WHEN 'cancelled' THEN 'pending' ELSE 'running' END::{schema}.job_status,
       status, %(actor)s, lease_token, attempt_count, %(reason)s
FROM upd
RETURNING job_id, to_status::text;

-- name: replay_jobs
-- Dead (or, when allowed, cancelled) jobs back to pending under the same ids with a fresh
-- attempt budget, in bounded batches; the previous attempt count stays in the event row.
-- Serves both `replay ID` (filter by id) and bulk replay (filter by queue, task, code, age).
-- Keyed jobs come back blocked; the caller (holding the keys' locks) then runs
-- promote_keys, so a replayed job heads its key again only if it is the earliest pending
-- one and nothing is running.
-- A job with a unique key must re-take it in this statement (free, an expired window, or
-- its own window); when another job holds it, the replay of that job is refused: it stays
-- as it was and a replay_refused event names the holder. Of several jobs of one key in a
-- batch, the first takes it and the others are refused.
-- Rows: (job id, notify, refused, holder, unique key).
WITH prev AS (
  SELECT id, status, attempt_count, ordering_key, unique_key, lease_token
  FROM {schema}.jobs
  WHERE {_job_filter} AND id = ANY(%(ids)s::bigint[])
  ORDER BY id
  LIMIT %(limit)s
  FOR UPDATE SKIP LOCKED
), took AS (
  INSERT INTO {schema}.unique_keys AS k (unique_key, job_id, held_until)
  SELECT DISTINCT ON (unique_key) unique_key, id, NULL::timestamptz
  FROM prev
  WHERE unique_key IS NOT NULL
  ORDER BY unique_key, id
  ON CONFLICT (unique_key) DO UPDATE
  SET job_id = excluded.job_id, held_until = NULL
  WHERE k.job_id = excluded.job_id OR k.held_until <= now()
  RETURNING k.job_id
), refused AS (
  SELECT p.id, p.status, p.attempt_count, p.lease_token, p.unique_key,
         (SELECT k.job_id FROM {schema}.unique_keys AS k
           WHERE k.unique_key = p.unique_key AND k.job_id <> p.id) AS holder
  FROM prev AS p
  WHERE p.unique_key IS NOT NULL AND p.id NOT IN (SELECT job_id FROM took)
), refusal AS (
  INSERT INTO {schema}.job_events
    (job_id, event, from_status, to_status, actor, lease_token, attempt, detail)
  SELECT id, 'replay_refused', status, status, %(actor)s, lease_token, attempt_count,
         left('unique key ' || unique_key || ' is held by '
              || coalesce('job ' || holder, 'another job') || ': ' || %(reason)s, 4000)
  FROM refused
), upd AS (
  UPDATE {schema}.jobs AS j
  SET status = 'pending',
      attempt_count = 0,
      unknown_failures = 0,
      available_at = now(),
      finished_at = NULL,
      cancel_requested_at = NULL,
      key_skipped = false,
      -- promote_keys, run next in the same transaction, decides who heads the key.
      blocked = j.ordering_key IS NOT NULL,
      -- A job with dependencies waits again; the client decides it next, in the same
      -- transaction, after locking its dependencies (as an enqueue does).
      waiting = EXISTS (SELECT 1 FROM {schema}.job_deps AS d WHERE d.job_id = j.id)
  FROM prev
  WHERE j.id = prev.id AND (prev.unique_key IS NULL OR prev.id IN (SELECT job_id FROM took))
  RETURNING j.id, prev.status AS from_status, prev.attempt_count, j.lease_token,
            j.queue_name
), ev AS (
  INSERT INTO {schema}.job_events
    (job_id, event, from_status, to_status, actor, lease_token, attempt, detail)
  SELECT id, 'replayed', from_status, 'pending', %(actor)s, lease_token, attempt_count,
         %(reason)s
  FROM upd
  RETURNING job_id
)
SELECT ev.job_id, pg_notify(%(channel)s, upd.queue_name)::text, false, NULL::bigint,
       NULL::text
FROM ev JOIN upd ON upd.id = ev.job_id
UNION ALL
SELECT id, NULL, true, holder, unique_key FROM refused;

-- name: replay_candidates
-- The next batch a replay would take, with their keys, so the keys can be locked first.
-- Jobs whose replay was refused earlier in this run are passed in %(skip)s.
SELECT id, ordering_key
FROM {schema}.jobs
WHERE {_job_filter} AND NOT (id = ANY(%(skip)s::bigint[]))
ORDER BY id
LIMIT %(limit)s;

-- name: count_jobs
-- How many jobs an operator's filter matches (the dry run of a bulk replay or purge).
SELECT count(*) FROM {schema}.jobs WHERE {_job_filter};

-- name: purge_jobs
-- Deletes dead jobs an operator chose, in bounded batches (ids from replay_candidates, whose
-- ordering keys the caller has locked: a purged dead head must let its key move on, so the
-- caller re-decides those keys' heads in the same transaction). Their audit trail stays,
-- with a final 'purged' row saying who removed them and why.
WITH doomed AS (
  SELECT id, status, lease_token, attempt_count
  FROM {schema}.jobs
  WHERE {_job_filter} AND id = ANY(%(ids)s::bigint[])
  ORDER BY id
  LIMIT %(limit)s
  FOR UPDATE SKIP LOCKED
), gone AS (
  DELETE FROM {schema}.jobs AS j USING doomed WHERE j.id = doomed.id RETURNING j.id
)
INSERT INTO {schema}.job_events
  (job_id, event, from_status, actor, lease_token, attempt, detail)
SELECT doomed.id, 'purged', doomed.status, %(actor)s, doomed.lease_token,
       doomed.attempt_count, %(reason)s
FROM doomed JOIN gone ON gone.id = doomed.id
RETURNING job_id;

-- name: prune_finished
-- Retention: removes succeeded and cancelled jobs older than the cut-off, and their trail,
-- in bounded batches. It locks only finished rows (SKIP LOCKED), which no claim touches,
-- so pruning never delays a claim. It reads jobs_prunable_idx oldest first and stops at
-- the cut-off: a batch reads about the rows it deletes, not the retention window or the
-- backlog (walking the primary key instead made each round's last batch read them all).
-- The deletes take the batch as one array (= ANY), so each is a lookup per id whatever
-- the plan: the worker runs this on its generic plan, which, joining the batch instead,
-- expected a large batch and read the whole jobs table (seq scan or a merge join from the
-- first id) for every 1,000 rows: 0.6-1.1 s a batch at 400k rows, instead of ~10 ms.
WITH doomed AS (
  SELECT id
  FROM {schema}.jobs
  WHERE status IN ('succeeded', 'cancelled')
    AND finished_at < now() - make_interval(secs => %(older_than)s)
  ORDER BY finished_at
  LIMIT %(limit)s
  FOR UPDATE SKIP LOCKED
), batch AS (
  SELECT ARRAY(SELECT id FROM doomed) AS ids
), trail AS (
  DELETE FROM {schema}.job_events AS e WHERE e.job_id = ANY((SELECT ids FROM batch)::bigint[])
), effects AS (
  DELETE FROM {schema}.job_effects AS f WHERE f.job_id = ANY((SELECT ids FROM batch)::bigint[])
)
DELETE FROM {schema}.jobs AS j WHERE j.id = ANY((SELECT ids FROM batch)::bigint[])
RETURNING j.id;


-- name: delete_expired_windows
-- The sweep's upkeep of unique_keys: windows that have ended, a bounded batch at a time
-- (an enqueue takes an expired window over anyway; this only keeps the table small).
DELETE FROM {schema}.unique_keys
WHERE unique_key = ANY(ARRAY(
  SELECT unique_key FROM {schema}.unique_keys
  WHERE held_until <= now()
  ORDER BY held_until
  LIMIT %(limit)s
  FOR UPDATE SKIP LOCKED
))
  AND held_until <= now()
RETURNING unique_key;

-- name: unique_key_of_job
-- jobs show: a job's unique key and who holds it now (NULLs when the job has none).
SELECT j.unique_key, k.job_id, k.held_until
FROM {schema}.jobs AS j
LEFT JOIN {schema}.unique_keys AS k ON k.unique_key = j.unique_key
WHERE j.id = %(id)s;

-- name: lock_keys
-- Serialises everything that can change who is the head of these ordering keys (enqueue,
-- completion, failure, cancel, skip). Keys are locked in sorted order: no deadlocks.
SELECT pg_advisory_xact_lock(hashtextextended('{schema}.key.' || k, 0))
FROM unnest(%(keys)s::text[]) AS k
ORDER BY k;

-- name: try_lock_keys
-- The sweeper already holds row locks, so it must not wait on a key lock (a completion
-- holding the key may be waiting for one of those rows): it takes what it can get now.
SELECT k, pg_try_advisory_xact_lock(hashtextextended('{schema}.key.' || k, 0))
FROM unnest(%(keys)s::text[]) AS k
ORDER BY k;

-- name: promote_keys
-- Re-decide the head of each of these keys after anything changed them (a head finished,
-- a job was replayed or skipped): the head is the key's earliest pending job, unless one of
-- its jobs is running or an earlier one is dead under the "block" policy; every other
-- pending job of the key is blocked. Run under lock_keys, in the transaction that made the
-- change. Each key costs a few index probes, however deep its backlog.
WITH k AS (
  SELECT DISTINCT key FROM unnest(%(keys)s::text[]) AS u(key)
), first AS (
  SELECT k.key,
         (SELECT w.id FROM {schema}.jobs AS w
           WHERE w.ordering_key = k.key AND w.status = 'pending'
           ORDER BY w.id LIMIT 1) AS first_pending
  FROM k
), target AS (
  SELECT f.key,
         CASE WHEN EXISTS (
                SELECT 1 FROM {schema}.jobs AS r
                WHERE r.ordering_key = f.key AND r.status = 'running'
              )
              OR EXISTS (
                SELECT 1 FROM {schema}.jobs AS d
                WHERE d.ordering_key = f.key AND d.id < f.first_pending
                  AND d.status = 'dead' AND d.key_policy = 'block' AND NOT d.key_skipped
              )
           THEN NULL
           ELSE f.first_pending
         END AS head
  FROM first AS f
), unblocked AS (
  UPDATE {schema}.jobs AS j
  SET blocked = false
  FROM target AS t
  WHERE j.id = t.head AND j.blocked
  RETURNING j.id, j.queue_name, j.available_at
), reblocked AS (
  UPDATE {schema}.jobs AS j
  SET blocked = true
  FROM target AS t
  WHERE j.ordering_key = t.key AND j.status = 'pending' AND NOT j.blocked
    AND j.id IS DISTINCT FROM t.head
  RETURNING j.id
)
SELECT id, CASE WHEN available_at <= now() THEN pg_notify(%(channel)s, queue_name)::text END
FROM unblocked
UNION ALL
SELECT id, NULL FROM reblocked;

-- name: job_key
SELECT ordering_key FROM {schema}.jobs WHERE id = %(id)s;

-- name: blocked_keys
-- Keys held up by a dead head under the "block" policy, with the head and the queue behind.
SELECT h.ordering_key, h.id, h.task, h.queue_name, h.last_error_code, h.finished_at,
       (SELECT count(*) FROM {schema}.jobs AS w
         WHERE w.ordering_key = h.ordering_key AND w.status = 'pending' AND w.blocked)
FROM {schema}.jobs AS h
WHERE h.ordering_key IS NOT NULL
  AND h.status = 'dead' AND h.key_policy = 'block' AND NOT h.key_skipped
ORDER BY h.finished_at
LIMIT %(limit)s;

-- name: skip_dead_head
-- An operator lets a key move past its dead head (audited); the head stays dead.
WITH upd AS (
  UPDATE {schema}.jobs
  SET key_skipped = true
  WHERE id = %(id)s AND status = 'dead' AND ordering_key IS NOT NULL AND NOT key_skipped
  RETURNING id, lease_token, attempt_count
)
INSERT INTO {schema}.job_events
  (job_id, event, from_status, to_status, actor, lease_token, attempt, detail)
SELECT id, 'key_skipped', 'dead', 'dead', %(actor)s, lease_token, attempt_count, %(reason)s
FROM upd
RETURNING job_id;

-- name: age_priorities
-- Priority aging, a bounded batch at a time: a job that has been claimable for k whole
-- aging intervals gets base_priority + k (capped), so a flood of higher-priority work can
-- delay it only so long. SKIP LOCKED: rows being claimed are simply left alone.
WITH due AS (
  SELECT id, least(
           32767,
           base_priority + floor(extract(epoch FROM now() - available_at) / %(interval)s)
         )::int AS aged
  FROM {schema}.jobs
  WHERE status = 'pending' AND NOT blocked AND NOT waiting
    AND available_at <= now() - make_interval(secs => %(interval)s)
    -- Ages are computed in numeric and capped before the cast: a very old (or infinite)
    -- available_at must not fail the batch.
    AND isfinite(available_at)
    AND priority < least(
          32767,
          base_priority + floor(extract(epoch FROM now() - available_at) / %(interval)s)
        )
  LIMIT %(limit)s
  FOR UPDATE SKIP LOCKED
)
UPDATE {schema}.jobs AS j
SET priority = due.aged
FROM due
WHERE j.id = due.id
RETURNING j.id;

-- name: effect_get
SELECT name, key, status, attempt, lease_token, started_at, finished_at, result, error
FROM {schema}.job_effects
WHERE job_id = %(id)s AND name = %(name)s AND key = %(key)s;

-- name: effect_start
-- Records "about to perform" in its own short transaction, and only while the lease holds:
-- a worker that lost its lease learns it here, before it acts on the outside world. A row
-- that is not 'done' (failed, or uncertain and judged worth redoing) is taken over.
INSERT INTO {schema}.job_effects (job_id, name, key, status, attempt, lease_token)
SELECT %(id)s, %(name)s, %(key)s, 'started', %(attempt)s, %(token)s
WHERE EXISTS (
  SELECT 1 FROM {schema}.jobs
  WHERE id = %(id)s
    AND status = 'running'
    AND lease_owner = %(owner)s
    AND lease_token = %(token)s
    AND lease_expires_at > now()
)
ON CONFLICT (job_id, name, key) DO UPDATE
SET status = 'started', attempt = excluded.attempt, lease_token = excluded.lease_token,
    started_at = now(), finished_at = NULL, result = NULL, error = NULL
WHERE {schema}.job_effects.status <> 'done'
RETURNING 1;

-- name: effect_finish
-- Records what happened. Not fenced by the lease on purpose: the outcome of a call that
-- was made is the truth about the outside world, worth keeping even from a late worker.
UPDATE {schema}.job_effects
SET status = %(status)s, finished_at = now(), result = %(result)s::jsonb, error = %(error)s
WHERE job_id = %(id)s AND name = %(name)s AND key = %(key)s AND lease_token = %(token)s
RETURNING 1;

-- name: attempts_ended
-- The re-read after a fenced write whose outcome is unknown (its commit was cut by a
-- timeout, e.g. a synchronous commit waiting for a standby, or the connection broke): the
-- attempts of these leases that have ended, and whether this lease's own write ended them.
-- A job still at the lease's token but no longer running was ended under that lease; a job
-- at another token was claimed again, so the write surely did not count. "succeeded" under
-- the token can only be the lease's own completion; a failure is the lease's own when its
-- event names the lease's owner (unique per claim, leaseq.owners), not the sweep.
SELECT j.id, j.status::text,
       j.status = 'succeeded' OR EXISTS (
         SELECT 1 FROM {schema}.job_events AS e
         WHERE e.job_id = l.id AND e.lease_token = l.token AND e.actor = l.owner
           AND e.from_status = 'running')
FROM unnest(%(ids)s::bigint[], %(owners)s::text[], %(tokens)s::bigint[])
  AS l(id, owner, token)
JOIN {schema}.jobs AS j ON j.id = l.id
WHERE j.lease_token = l.token AND j.status <> 'running';

-- name: job_effects
SELECT name, key, status, attempt, lease_token, started_at, finished_at, result, error
FROM {schema}.job_effects
WHERE job_id = %(id)s
ORDER BY started_at, name, key;

-- name: get_job
-- The payload as text: the client decodes it, and shows a row it cannot decode (leaseq.rows).
SELECT id, queue_name, task, payload::text, status::text, priority, available_at, attempt_count,
       max_attempts, lease_owner, lease_token, lease_expires_at, last_error_code,
       last_error_detail, created_at, started_at, heartbeat_at, finished_at,
       cancel_requested_at, payload_version, last_error_class, unknown_failures,
       idempotency_key, unique_key
FROM {schema}.jobs
WHERE id = %(id)s;

-- name: list_jobs
-- Operator listing (dead list, inspection), newest first.
SELECT id, queue_name, task, payload::text, status::text, priority, available_at, attempt_count,
       max_attempts, lease_owner, lease_token, lease_expires_at, last_error_code,
       last_error_detail, created_at, started_at, heartbeat_at, finished_at,
       cancel_requested_at, payload_version, last_error_class, unknown_failures,
       idempotency_key, unique_key
FROM {schema}.jobs
WHERE {_job_filter}
ORDER BY id DESC
LIMIT %(limit)s;

-- name: job_events
SELECT id, job_id, at, event, from_status::text, to_status::text, actor, lease_token,
       attempt, error_code, detail, error_class
FROM {schema}.job_events
WHERE job_id = %(id)s
ORDER BY id;

-- name: queues_have_work
-- Drain mode's stop test: both partial indexes answer it without touching history.
SELECT EXISTS (
  SELECT 1 FROM {schema}.jobs
  WHERE status = 'pending' AND queue_name = ANY(%(queues)s::text[])
) OR EXISTS (
  SELECT 1 FROM {schema}.jobs
  WHERE status = 'running' AND queue_name = ANY(%(queues)s::text[])
);

-- name: queue_stats
-- Per-queue health from the view (partial indexes only: cheap on any history).
SELECT queue_name, ready, scheduled, running, dead, oldest_ready_age, oldest_dead_age,
       near_expiry
FROM {schema}.queue_stats
ORDER BY queue_name;

-- name: recent_throughput
-- Jobs finished per queue in the last %(seconds)s seconds. This one scans finished rows
-- (there is no index on finished_at, to keep completions cheap): for humans, not scrapes.
SELECT queue_name, count(*)
FROM {schema}.jobs
WHERE status IN ('succeeded', 'dead', 'cancelled')
  AND finished_at > now() - make_interval(secs => %(seconds)s)
GROUP BY queue_name;

-- name: database_health
-- The rest of the database metrics: leases waiting for a sweep (running partial index),
-- and what pg_stat_activity says about leaseq's own connections.
SELECT
  (SELECT count(*) FROM {schema}.jobs
    WHERE status = 'running' AND lease_expires_at <= now()),
  (SELECT count(*) FROM pg_stat_activity
    WHERE wait_event_type = 'Lock' AND left(application_name, 6) = 'leaseq'),
  (SELECT coalesce(json_object_agg(application_name, n), '{}'::json)
     FROM (SELECT application_name, count(*) AS n FROM pg_stat_activity
           WHERE left(application_name, 6) = 'leaseq' GROUP BY application_name) AS c);


-- ---------------------------------------------------------------------------------------
-- Pauses (leaseq.ops.pauses_async). The claim's side is the _not_paused fragment above.

-- name: pause_barrier
-- EXCLUSIVE conflicts with the ROW SHARE every claim statement takes on pauses (see
-- _not_paused): this waits until the claims in flight have committed, and claims that
-- arrive meanwhile wait for this transaction, then see its pause. Held until commit.
LOCK TABLE {schema}.pauses IN EXCLUSIVE MODE;

-- name: pause_scope
-- paused_at is clock_timestamp(), read after the barrier, so it is later than the start of
-- every claim that may still commit. An existing pause is kept as it was (its first time,
-- actor and reason); the audit row is written only for a new one.
WITH ins AS (
  INSERT INTO {schema}.pauses (scope, value, paused_at, paused_by, reason)
  VALUES (%(scope)s, %(value)s, clock_timestamp(), %(actor)s, %(reason)s)
  ON CONFLICT (scope, value) DO NOTHING
  RETURNING scope, value, paused_at
), audit AS (
  INSERT INTO {schema}.admin_events (at, actor, action, scope, value, reason)
  SELECT paused_at, %(actor)s, 'pause', scope, value, %(reason)s FROM ins
)
SELECT paused_at FROM ins;

-- name: cancel_running_in_scope
-- pause(cancel_running=True): running jobs of the scope get a cancel request, which their
-- worker sees at the next heartbeat, as with cancel_job; their leases stay valid.
WITH upd AS (
  UPDATE {schema}.jobs
  SET cancel_requested_at = now()
  WHERE status = 'running'
    AND cancel_requested_at IS NULL
    AND CASE %(scope)s
          WHEN 'queue' THEN queue_name = %(value)s
          WHEN 'task' THEN task = %(value)s
          ELSE ordering_key = %(value)s
        END
  RETURNING id, lease_token, attempt_count
)
INSERT INTO {schema}.job_events
  (job_id, event, from_status, to_status, actor, lease_token, attempt, detail)
SELECT id, 'cancel_requested', 'running', 'running', %(actor)s, lease_token, attempt_count,
       %(reason)s
FROM upd
RETURNING job_id;

-- name: resume_scope
-- No barrier: a claim that misses a resume by a moment only runs a little later. The
-- NOTIFY wakes workers at once: a queue's own channel payload, or "*" (never a queue
-- name) for a task or key, which every listener takes as a wake-up.
WITH del AS (
  DELETE FROM {schema}.pauses
  WHERE scope = %(scope)s AND value = %(value)s
  RETURNING scope, value, paused_at
), audit AS (
  INSERT INTO {schema}.admin_events (actor, action, scope, value, reason, detail)
  SELECT %(actor)s, 'resume', scope, value, %(reason)s,
         'paused for ' || date_trunc('second', now() - paused_at)::text
  FROM del
)
SELECT pg_notify(%(channel)s, CASE WHEN scope = 'queue' THEN value ELSE '*' END)::text
FROM del;

-- name: list_pauses
-- paused_for comes from the database clock, like every age leaseq shows.
SELECT scope, value, paused_at, paused_by, reason, paused_for
FROM {schema}.paused_scopes
ORDER BY scope, value;

-- ---- periodic schedules (leaseq.ops.schedules_async, leaseq.worker.maintenance.Ticker) ----

-- name: db_now
SELECT now();

-- name: _schedule_columns
-- A schedule row as leaseq.rows.schedule_from_row reads it, with its last job's status.
s.name, s.task, s.cron, s.every_seconds, s.payload::text, s.tz, s.queue, s.priority,
s.max_attempts, s.catch_up, s.catch_up_max, s.grace_seconds, s.overlap, s.enabled, s.source,
s.last_tick, s.next_tick, s.last_job_id,
(SELECT j.status::text FROM {schema}.jobs AS j WHERE j.id = s.last_job_id) AS last_job_status,
s.skipped_ticks, s.updated_by, s.updated_at, s.created_at

-- name: lock_due_schedule
-- One due schedule, locked for this ticker's transaction; tickers skip each other's rows.
-- A row another ticker just advanced is re-checked against the WHERE after its commit, so
-- it is not due any more. now() is this transaction's clock, which the ticks are computed
-- against (never the worker's).
SELECT {_schedule_columns}, now()
FROM {schema}.schedules AS s
WHERE s.enabled AND s.next_tick <= now()
ORDER BY s.next_tick
LIMIT 1
FOR UPDATE OF s SKIP LOCKED;

-- name: lock_schedule
-- The schedule row's lock: held by whatever creates a schedule's jobs or changes it.
SELECT {_schedule_columns}, now()
FROM {schema}.schedules AS s
WHERE s.name = %(name)s
FOR UPDATE OF s;

-- name: tick_job
-- The tick row and its job in ONE statement: the job is inserted only if the tick row was
-- (ON CONFLICT DO NOTHING), so a tick enqueues at most one job however many tickers
-- computed it. The job id is drawn first so the tick row can name it (a CTE cannot update
-- a row a sibling CTE inserted). For overlap "queue" the job carries the schedule's
-- ordering key and waits behind its predecessor; the caller holds that key's lock.
WITH id AS (
  SELECT nextval(pg_get_serial_sequence('{schema}.jobs', 'id')) AS id
), tick AS (
  INSERT INTO {schema}.schedule_ticks (schedule_name, tick_at, job_id, catch_up, manual)
  SELECT %(name)s, %(tick_at)s, id.id, %(catch_up)s, %(manual)s FROM id
  ON CONFLICT DO NOTHING
  RETURNING job_id
), job AS (
  INSERT INTO {schema}.jobs
    (id, queue_name, task, payload, priority, base_priority, max_attempts, idempotency_key,
     ordering_key, key_policy, blocked)
  OVERRIDING SYSTEM VALUE
  SELECT tick.job_id, s.queue, s.task, s.payload, s.priority, s.priority, s.max_attempts,
         %(idempotency_key)s, %(ordering_key)s::text, 'skip',
         %(ordering_key)s::text IS NOT NULL AND EXISTS (
           SELECT 1 FROM {schema}.jobs AS b
           WHERE b.ordering_key = %(ordering_key)s::text AND {_key_blocking}
         )
  FROM tick JOIN {schema}.schedules AS s ON s.name = %(name)s
  RETURNING id, queue_name
)
SELECT id, pg_notify(%(channel)s, queue_name)::text FROM job;

-- name: skip_tick
-- A tick the overlap policy did not run: recorded with its reason, no job.
INSERT INTO {schema}.schedule_ticks (schedule_name, tick_at, catch_up, skipped)
VALUES (%(name)s, %(tick_at)s, %(catch_up)s, %(reason)s)
ON CONFLICT DO NOTHING
RETURNING 1;

-- name: advance_schedule
-- After the ticks of one round, under the row lock taken by lock_due_schedule.
UPDATE {schema}.schedules
SET last_tick = coalesce(%(last_tick)s, last_tick),
    next_tick = %(next_tick)s,
    last_job_id = coalesce(%(last_job_id)s, last_job_id),
    skipped_ticks = skipped_ticks + %(skipped)s
WHERE name = %(name)s;

-- name: park_schedule
-- A stored schedule whose ticks this code cannot compute (say, written by another version):
-- disabled, so it cannot stall the tickers; the caller audits why.
UPDATE {schema}.schedules
SET enabled = false, updated_by = %(actor)s, updated_at = now()
WHERE name = %(name)s;

-- name: next_tick_in
-- Seconds until the earliest enabled schedule is due (negative: overdue); NULL: none.
SELECT extract(epoch FROM min(next_tick) - now())::float8
FROM {schema}.schedules WHERE enabled;

-- name: upsert_code_schedule
-- A schedule declared in code, at worker start. Its timing and policies follow the code;
-- next_tick moves only when the timing changed (or it was just re-enabled by the code);
-- `enabled` follows the code only when the code's flag changed, so an operator's
-- enable/disable outlasts restarts. A dynamic schedule of the same name is left alone
-- (the caller sees no row and reports it).
INSERT INTO {schema}.schedules AS s
  (name, task, cron, every_seconds, payload, tz, queue, priority, max_attempts, catch_up,
   catch_up_max, grace_seconds, overlap, enabled, declared_enabled, source, next_tick,
   updated_by)
VALUES (%(name)s, %(task)s, %(cron)s, %(every_seconds)s, %(payload)s::jsonb, %(tz)s,
        %(queue)s, %(priority)s, %(max_attempts)s, %(catch_up)s, %(catch_up_max)s,
        %(grace_seconds)s, %(overlap)s, %(enabled)s, %(enabled)s, 'code', %(next_tick)s,
        %(actor)s)
ON CONFLICT (name) DO UPDATE
SET task = excluded.task, payload = excluded.payload, queue = excluded.queue,
    priority = excluded.priority, max_attempts = excluded.max_attempts,
    catch_up = excluded.catch_up, catch_up_max = excluded.catch_up_max,
    grace_seconds = excluded.grace_seconds, overlap = excluded.overlap,
    cron = excluded.cron, every_seconds = excluded.every_seconds, tz = excluded.tz,
    enabled = CASE WHEN s.declared_enabled IS DISTINCT FROM excluded.declared_enabled
                   THEN excluded.enabled ELSE s.enabled END,
    declared_enabled = excluded.declared_enabled,
    next_tick = CASE
      WHEN (s.cron, s.every_seconds, s.tz) IS DISTINCT FROM
           (excluded.cron, excluded.every_seconds, excluded.tz)
        OR (NOT s.enabled AND excluded.enabled
            AND s.declared_enabled IS DISTINCT FROM excluded.declared_enabled)
      THEN excluded.next_tick ELSE s.next_tick END,
    updated_by = CASE WHEN (s.task, s.cron, s.every_seconds, s.payload, s.tz, s.queue,
                            s.priority, s.max_attempts, s.catch_up, s.catch_up_max,
                            s.grace_seconds, s.overlap, s.declared_enabled)
                           IS DISTINCT FROM
                           (excluded.task, excluded.cron, excluded.every_seconds,
                            excluded.payload, excluded.tz, excluded.queue, excluded.priority,
                            excluded.max_attempts, excluded.catch_up, excluded.catch_up_max,
                            excluded.grace_seconds, excluded.overlap,
                            excluded.declared_enabled)
                      THEN excluded.updated_by ELSE s.updated_by END,
    updated_at = now()
WHERE s.source = 'code'
RETURNING name;

-- name: disable_undeclared_schedules
-- Code schedules of this app's tasks that the code no longer declares: disabled, history
-- kept (a later declaration enables them again).
UPDATE {schema}.schedules
SET enabled = false, declared_enabled = false, updated_by = %(actor)s, updated_at = now()
WHERE source = 'code' AND enabled AND task = ANY(%(tasks)s::text[])
  AND name <> ALL(%(names)s::text[])
RETURNING name;

-- name: insert_schedule
-- A dynamic schedule (Client.schedule_add); a name already taken is an error.
INSERT INTO {schema}.schedules
  (name, task, cron, every_seconds, payload, tz, queue, priority, max_attempts, catch_up,
   catch_up_max, grace_seconds, overlap, enabled, source, next_tick, updated_by)
VALUES (%(name)s, %(task)s, %(cron)s, %(every_seconds)s, %(payload)s::jsonb, %(tz)s,
        %(queue)s, %(priority)s, %(max_attempts)s, %(catch_up)s, %(catch_up_max)s,
        %(grace_seconds)s, %(overlap)s, %(enabled)s, 'dynamic', %(next_tick)s, %(actor)s)
ON CONFLICT (name) DO NOTHING
RETURNING name;

-- name: update_schedule
-- Client.schedule_change, under the row lock: every column given (the caller merged the
-- change into the current row).
UPDATE {schema}.schedules
SET task = %(task)s, cron = %(cron)s, every_seconds = %(every_seconds)s,
    payload = %(payload)s::jsonb, tz = %(tz)s, queue = %(queue)s, priority = %(priority)s,
    max_attempts = %(max_attempts)s, catch_up = %(catch_up)s, catch_up_max = %(catch_up_max)s,
    grace_seconds = %(grace_seconds)s, overlap = %(overlap)s, enabled = %(enabled)s,
    next_tick = %(next_tick)s, updated_by = %(actor)s, updated_at = now()
WHERE name = %(name)s;

-- name: delete_schedule
-- Only dynamic schedules are deleted (code ones come back at the next worker start: disable
-- them instead); their tick history goes with them.
WITH gone AS (
  DELETE FROM {schema}.schedules WHERE name = %(name)s AND source = 'dynamic' RETURNING name
)
DELETE FROM {schema}.schedule_ticks AS t USING gone WHERE t.schedule_name = gone.name
RETURNING 1;

-- name: list_schedules
SELECT {_schedule_columns}, now()
FROM {schema}.schedules AS s
WHERE %(name)s::text IS NULL OR s.name = %(name)s
ORDER BY s.name;

-- name: schedule_ticks
SELECT tick_at, job_id, catch_up, manual, skipped, created_at
FROM {schema}.schedule_ticks
WHERE schedule_name = %(name)s
ORDER BY tick_at DESC
LIMIT %(limit)s;

-- name: admin_event
-- The operators' audit trail (schedule changes here; pauses use it too).
INSERT INTO {schema}.admin_events (actor, action, scope, value, reason, detail)
VALUES (%(actor)s, %(action)s, %(scope)s, %(value)s, %(reason)s, %(detail)s);

-- name: admin_events
-- The operators' audit trail, newest first (pauses, schedules, ...), optionally one scope.
SELECT id, at, actor, action, scope, value, reason, detail
FROM {schema}.admin_events
WHERE (%(scope)s::text IS NULL OR scope = %(scope)s)
  AND (%(value)s::text IS NULL OR value = %(value)s)
ORDER BY id DESC
LIMIT %(limit)s;

-- name: prune_schedule_ticks
-- Retention for tick rows: safe to delete, since a tick is only ever inserted at or after
-- its schedule's next_tick, which has moved past every stored one.
WITH doomed AS (
  SELECT t.schedule_name, t.tick_at FROM {schema}.schedule_ticks AS t
  WHERE t.created_at < now() - make_interval(secs => %(older_than)s)
  LIMIT %(limit)s
)
DELETE FROM {schema}.schedule_ticks AS t USING doomed
WHERE t.schedule_name = doomed.schedule_name AND t.tick_at = doomed.tick_at
RETURNING 1;

-- name: schedule_lag
-- The most overdue enabled schedule: seconds past its next tick (0 when none is overdue).
SELECT coalesce(greatest(extract(epoch FROM now() - min(next_tick)), 0), 0)::float8
FROM {schema}.schedules WHERE enabled;
-- name: set_trace_contexts
-- Tracing hooks only: the enqueuing context of jobs just inserted, in the same transaction
-- (a separate statement keeps the hot insert statements free of a column most never use).
UPDATE {schema}.jobs AS j
SET trace_context = jsonb_build_object('create', c.carrier)
FROM unnest(%(ids)s::bigint[], %(carriers)s::jsonb[]) AS c(id, carrier)
WHERE j.id = c.id;

-- name: job_trace_context
SELECT trace_context FROM {schema}.jobs WHERE id = %(id)s;

-- name: record_attempt_trace
-- Tracing hooks only: the failed attempt's span, which the next attempt's span links to.
-- Fenced like every write of an attempt (owner and token): after a failover lost a claim,
-- the token alone can repeat for another lease (docs/ha.md).
UPDATE {schema}.jobs
SET trace_context = coalesce(trace_context, '{}'::jsonb)
    || jsonb_build_object('attempt', %(carrier)s::jsonb)
WHERE id = %(id)s AND lease_owner = %(owner)s AND lease_token = %(token)s;

-- ---------------------------------------------------------------------------------------
-- The web dashboard (leaseq.ops.web_async, leaseq.web). Every statement below runs in a
-- transaction that began with web_statement_timeout, and returns a bounded number of rows.

-- name: web_statement_timeout
-- SET LOCAL takes no parameters; set_config(..., true) is the same, scoped to the
-- transaction, so a slow page is cancelled by the server instead of piling up. Custom
-- plans only: a generic plan of "x IS NULL OR col = x" filters cannot prove a partial
-- index's predicate (status = 'dead'), and the dashboard's few reads plan in microseconds.
SELECT set_config('statement_timeout', %(ms)s, true),
       set_config('plan_cache_mode', 'force_custom_plan', true);

-- name: web_queue_stats
-- The queue_stats view (partial indexes only since migration 14), bounded for a page.
SELECT queue_name, ready, scheduled, running, dead, oldest_ready_age, oldest_dead_age,
       near_expiry
FROM {schema}.queue_stats
ORDER BY queue_name
LIMIT 1000;

-- name: web_throughput
-- Jobs finished per queue and minute over the last hour, among the newest %(window)s jobs
-- only (a primary-key range): there is no index on finished_at (completions stay cheap),
-- so the count is capped rather than a scan of all history. minute 0 is the current one.
SELECT queue_name,
       least(59, floor(extract(epoch FROM now() - finished_at) / 60))::int AS minute,
       count(*)
FROM {schema}.jobs
WHERE id > (SELECT coalesce(max(id), 0) FROM {schema}.jobs) - %(window)s
  AND status IN ('succeeded', 'dead', 'cancelled')
  AND finished_at > now() - interval '1 hour'
GROUP BY 1, 2;

-- name: web_jobs
-- The job list: newest first, keyset-paginated by id (%(before)s: the last id of the
-- previous page). Walks the primary key backwards and stops at LIMIT, so the default page
-- reads a few index entries; a narrow filter reads more of them, bounded by the timeout.
SELECT id, queue_name, task, payload::text, status::text, priority, available_at, attempt_count,
       max_attempts, lease_owner, lease_token, lease_expires_at, last_error_code,
       last_error_detail, created_at, started_at, heartbeat_at, finished_at,
       cancel_requested_at, payload_version, last_error_class, unknown_failures,
       idempotency_key, unique_key
FROM {schema}.jobs
WHERE (%(statuses)s::{schema}.job_status[] IS NULL OR status = ANY(%(statuses)s))
  AND (%(queue)s::text IS NULL OR queue_name = %(queue)s)
  AND (%(task)s::text IS NULL OR task = %(task)s)
  AND (%(error_code)s::text IS NULL OR last_error_code = %(error_code)s)
  AND (%(ordering_key)s::text IS NULL OR ordering_key = %(ordering_key)s)
  AND (%(unique_key)s::text IS NULL OR unique_key = %(unique_key)s)
  AND (%(payload)s::jsonb IS NULL OR payload @> %(payload)s::jsonb)
  AND (%(before)s::bigint IS NULL OR id < %(before)s)
ORDER BY id DESC
LIMIT %(limit)s;

-- name: web_count_dead
-- The dry run of a bulk replay or purge: how many dead jobs the filter matches, counted
-- up to %(cap)s (the dead partial index; the page says "cap+" beyond it).
SELECT count(*) FROM (
  SELECT 1 FROM {schema}.jobs WHERE {_job_filter} LIMIT %(cap)s
) AS capped;

-- name: web_job_ordering_key
SELECT ordering_key FROM {schema}.jobs WHERE id = %(id)s;

-- ---------------------------------------------------------------------------------------
-- Limits (leaseq.ops.limits_async). The claim's side is admit() (migration 0011), the
-- release is _slots_release in the fenced statements.

-- name: set_limit
-- Upsert a limit, audited in admin_events in the same statement. A lower concurrency does
-- not take slots away from running jobs: it applies to the claims that follow.
WITH up AS (
  INSERT INTO {schema}.limits AS l
    (name, concurrency, rate, per_seconds, burst, updated_by, updated_at)
  VALUES (%(name)s, %(concurrency)s, %(rate)s, %(per)s, %(burst)s, %(actor)s, now())
  ON CONFLICT (name) DO UPDATE
  SET concurrency = excluded.concurrency, rate = excluded.rate,
      per_seconds = excluded.per_seconds, burst = excluded.burst,
      updated_by = excluded.updated_by, updated_at = now()
  RETURNING name
), audit AS (
  INSERT INTO {schema}.admin_events (actor, action, scope, value, reason, detail)
  SELECT %(actor)s, 'limit_set', 'limit', left(name, 200), %(reason)s,
         'concurrency ' || coalesce(%(concurrency)s::text, 'none') || ', rate '
         || coalesce(%(rate)s::text || ' per ' || %(per)s::text || 's burst '
                     || %(burst)s::text, 'none')
  FROM up
)
SELECT name FROM up;

-- name: declare_limit
-- A worker declaring its tasks' limits at start: inserted when missing, else left as it
-- is when already equal; a different value is updated and audited (the code changed).
WITH old AS (
  SELECT concurrency, rate, per_seconds, burst FROM {schema}.limits WHERE name = %(name)s
), up AS (
  INSERT INTO {schema}.limits AS l
    (name, concurrency, rate, per_seconds, burst, updated_by, updated_at)
  SELECT %(name)s, %(concurrency)s, %(rate)s, %(per)s, %(burst)s, %(actor)s, now()
  WHERE NOT EXISTS (
    SELECT 1 FROM old
    WHERE old.concurrency IS NOT DISTINCT FROM %(concurrency)s::int
      AND old.rate IS NOT DISTINCT FROM %(rate)s::float8
      AND old.per_seconds = %(per)s::float8 AND old.burst = %(burst)s::int
  )
  ON CONFLICT (name) DO UPDATE
  SET concurrency = excluded.concurrency, rate = excluded.rate,
      per_seconds = excluded.per_seconds, burst = excluded.burst,
      updated_by = excluded.updated_by, updated_at = now()
  RETURNING name
), audit AS (
  INSERT INTO {schema}.admin_events (actor, action, scope, value, reason, detail)
  SELECT %(actor)s, 'limit_set', 'limit', left(name, 200), %(reason)s,
         'declared by a task: concurrency ' || coalesce(%(concurrency)s::text, 'none')
         || ', rate ' || coalesce(%(rate)s::text || ' per ' || %(per)s::text || 's', 'none')
  FROM up
)
SELECT name FROM up;

-- name: remove_limit
WITH del AS (
  DELETE FROM {schema}.limits WHERE name = %(name)s RETURNING name
), audit AS (
  INSERT INTO {schema}.admin_events (actor, action, scope, value, reason)
  SELECT %(actor)s, 'limit_removed', 'limit', left(name, 200), %(reason)s FROM del
)
SELECT name FROM del;

-- name: list_limits
-- Each limit with what it holds: slots in use (a family: over its keys that have no limit
-- of their own), the jobs
-- waiting on it (claimable and pending; a family: those of its keys that have no exact
-- limit of their own, found by a scan of the claimable jobs) and how long until its rate
-- bucket admits one more claim.
SELECT l.name, l.concurrency, l.rate, l.per_seconds, l.burst, l.updated_by, l.updated_at,
       CASE WHEN left(l.name, 6) = 'queue:'
            -- A queue limit's slots are on its running jobs (jobs.queue_slot, version 16).
            THEN (SELECT count(*) FROM {schema}.jobs AS r
                  WHERE r.queue_slot IS NOT NULL
                    AND CASE WHEN l.name = 'queue:*'
                          THEN NOT EXISTS (SELECT 1 FROM {schema}.limits AS e
                                           WHERE e.name = 'queue:' || r.queue_name)
                          ELSE r.queue_name = substr(l.name, 7)
                        END)
            ELSE (SELECT count(*) FROM {schema}.limit_slots AS s
                  WHERE s.limit_name = l.name
                     OR (right(l.name, 2) = ':*'
                         AND left(s.limit_name, length(l.name) - 1)
                             = left(l.name, length(l.name) - 1)
                         AND position(':' IN substr(s.limit_name, length(l.name))) = 0
                         AND NOT EXISTS (SELECT 1 FROM {schema}.limits AS e
                                         WHERE e.name = s.limit_name)))
       END,
       CASE WHEN right(l.name, 2) = ':*'
            THEN (SELECT count(*)
                  FROM {schema}.jobs AS j
                  CROSS JOIN LATERAL (
                    SELECT CASE split_part(l.name, ':', 1)
                             WHEN 'queue' THEN 'queue:' || j.queue_name
                             WHEN 'task' THEN 'task:' || j.task
                             ELSE 'key:' || j.limit_key
                           END AS name
                  ) AS m
                  WHERE j.status = 'pending' AND NOT j.blocked AND NOT j.waiting
                    AND j.available_at <= now()
                    AND regexp_replace(m.name, '[^:]*$', '*') = l.name
                    AND NOT EXISTS (SELECT 1 FROM {schema}.limits AS e WHERE e.name = m.name))
            ELSE (SELECT count(*) FROM {schema}.jobs AS j
                  WHERE j.status = 'pending' AND NOT j.blocked AND NOT j.waiting
                    AND j.available_at <= now()
                    AND CASE split_part(l.name, ':', 1)
                          WHEN 'queue' THEN j.queue_name = substr(l.name, 7)
                          WHEN 'task' THEN j.task = substr(l.name, 6)
                          ELSE j.limit_key = substr(l.name, 5)
                        END)
       END,
       CASE WHEN right(l.name, 2) = ':*' THEN NULL
            ELSE {schema}.rate_wait(l.name, l.rate, l.per_seconds, l.burst, 1) END
FROM {schema}.limits AS l
ORDER BY l.name;

-- name: rate_consume
-- Charge a rate limit's bucket for work done outside jobs (the same bucket claims use).
-- No row: no rate limit of that name (or family).
SELECT {schema}.rate_take(%(name)s, l.rate, l.per_seconds, l.burst, %(cost)s)
FROM {schema}.limits AS l
WHERE l.name IN (%(name)s, regexp_replace(%(name)s, '[^:]*$', '*')) AND l.rate IS NOT NULL
ORDER BY l.name = %(name)s DESC
LIMIT 1;

-- name: rate_available
-- Tokens the bucket would admit now, and seconds until the next one frees up.
SELECT greatest(0, floor(
         (l.per_seconds / l.rate * l.burst
          - greatest(0, coalesce(extract(epoch FROM b.tat - now()), 0)))
         / (l.per_seconds / l.rate) + 1e-9))::int,
       {schema}.rate_wait(%(name)s, l.rate, l.per_seconds, l.burst, 1)
FROM {schema}.limits AS l
LEFT JOIN {schema}.rate_buckets AS b ON b.limit_name = %(name)s
WHERE l.name IN (%(name)s, regexp_replace(%(name)s, '[^:]*$', '*')) AND l.rate IS NOT NULL
ORDER BY l.name = %(name)s DESC
LIMIT 1;

-- name: claim_wait
-- After a claim came back short: are there limits at all (if not, the fetcher stops
-- asking until its next poll), and how long until a rate limit of the first claimable
-- jobs of these queues admits one (NULL: no rate limit holds them back). The worker sleeps
-- until then instead of polling a bucket that cannot admit yet.
SELECT EXISTS (SELECT 1 FROM {schema}.limits),
       (SELECT min(w.wait)
          FROM (SELECT c.queue_name, c.task, c.limit_key
                  FROM {schema}.jobs AS c
                 WHERE c.queue_name = ANY(%(queues)s::text[]) AND c.status = 'pending'
                   AND NOT c.blocked AND NOT c.waiting AND c.available_at <= now()
                 ORDER BY c.priority DESC, c.available_at, c.id
                 LIMIT 50) AS h
          CROSS JOIN LATERAL (
            SELECT max({schema}.rate_wait(x.limit_name, x.rate, x.per_seconds, x.burst, 1))
                     AS wait
            FROM {schema}.limits_of(h.queue_name, h.task, h.limit_key) AS x
            WHERE x.rate IS NOT NULL
          ) AS w
         WHERE EXISTS (SELECT 1 FROM {schema}.limits WHERE rate IS NOT NULL)
           AND w.wait > 0);

-- name: delete_orphan_slots
-- The sweep's safety net: slots whose lease is no longer running (nothing leaseq writes
-- leaves one; a job deleted or changed by hand could). Slots of running leases are never
-- touched, and a slot taken by a claim still in flight is not visible yet.
DELETE FROM {schema}.limit_slots AS s
WHERE NOT EXISTS (
  SELECT 1 FROM {schema}.jobs AS j
  WHERE j.id = s.job_id AND j.status = 'running' AND j.lease_token = s.lease_token
)
RETURNING s.limit_name;
-- Dependencies (leaseq.ops.deps_async; the promotion runs in base_async). A dependent is
-- pending and `waiting` until promote_dependents finds every dependency ended. Promotion
-- runs in the transaction of the fenced transition that ended a dependency, in two
-- statements: lock_dependents locks the waiting dependents (in id order), then
-- promote_dependents decides with a NEW snapshot, taken after those locks. Two
-- dependencies ending at once in two transactions both lock the shared dependent, so the
-- second decides after the first committed and sees both ended: none is left waiting.

-- name: lock_dependency_parents
-- Enqueue of dependents: lock the dependencies named (id order) and mark them as having
-- dependents. A completion of one of them either committed before (then its status is
-- read here, at its latest version) or waits for this transaction and then finds
-- has_dependents set (the plain statements exclude such rows; the client re-runs them
-- with the coordinated ones). Ids missing from the result do not exist.
WITH locked AS (
  SELECT id, has_dependents, status
  FROM {schema}.jobs
  WHERE id = ANY(%(ids)s::bigint[])
  ORDER BY id
  FOR UPDATE
), flag AS (
  UPDATE {schema}.jobs AS j
  SET has_dependents = true
  FROM locked AS l
  WHERE j.id = l.id AND NOT l.has_dependents
)
SELECT id, status::text FROM locked;

-- name: insert_deps
-- The edges of jobs just inserted, and their `waiting` flag (the rows are not visible to
-- any claim before this transaction commits; promote_dependents runs next).
WITH edges AS (
  INSERT INTO {schema}.job_deps (job_id, depends_on, on_dead)
  SELECT * FROM unnest(%(job_ids)s::bigint[], %(depends_on)s::bigint[], %(on_dead)s::text[])
  ON CONFLICT DO NOTHING
)
UPDATE {schema}.jobs SET waiting = true WHERE id = ANY(%(ids)s::bigint[]);

-- name: lock_dependents
-- The waiting dependents of jobs that just ended, locked in id order (see above).
SELECT j.id
FROM {schema}.jobs AS j
WHERE j.id IN (SELECT d.job_id FROM {schema}.job_deps AS d
               WHERE d.depends_on = ANY(%(ids)s::bigint[]))
  AND j.waiting
ORDER BY j.id
FOR UPDATE;

-- name: promote_dependents
-- Readiness derived from the edge rows: a waiting job whose dependencies have all ended
-- becomes claimable ('promoted'); one with a dependency ended dead or cancelled under
-- on_dead 'cancel' ends cancelled at once ('dependency_failed'). A dependency that no
-- longer exists (pruned) counts as ended. The caller locked these rows (lock_dependents)
-- or inserted them in this transaction. Rows: (id, new status, notify).
-- Cost: "any unfinished dependency?" stops at the first one found, scanning from the
-- highest id down (jobs tend to end in id order, so a fan-in of N finds one at once rather
-- than reading N edges at every ending). A failed dependency is looked for only among
-- %(ended)s, the jobs whose ending runs this (an earlier failure was decided when it
-- happened); NULL (enqueue, replay) looks at every dependency. MATERIALIZED: each
-- job's answer is computed once, not once per SET expression that reads it.
WITH c AS MATERIALIZED (
  SELECT j.id,
         NOT EXISTS (
           SELECT 1 FROM (
             SELECT d.depends_on FROM {schema}.job_deps AS d
             WHERE d.job_id = j.id
             ORDER BY d.job_id DESC, d.depends_on DESC
           ) AS d
           JOIN {schema}.jobs AS p ON p.id = d.depends_on
           WHERE p.status IN ('pending', 'running')
         ) AS ready,
         CASE WHEN %(ended)s::bigint[] IS NULL THEN
           (SELECT d.depends_on || ' ended ' || p.status
              FROM {schema}.job_deps AS d
              JOIN {schema}.jobs AS p ON p.id = d.depends_on
             WHERE d.job_id = j.id AND d.on_dead = 'cancel'
               AND p.status IN ('dead', 'cancelled')
             ORDER BY d.depends_on
             LIMIT 1)
         ELSE
           (SELECT d.depends_on || ' ended ' || p.status
              FROM {schema}.job_deps AS d
              JOIN {schema}.jobs AS p ON p.id = d.depends_on
             WHERE d.job_id = j.id AND d.depends_on = ANY(%(ended)s::bigint[])
               AND d.on_dead = 'cancel' AND p.status IN ('dead', 'cancelled')
             ORDER BY d.depends_on
             LIMIT 1)
         END AS culprit
  FROM {schema}.jobs AS j
  WHERE j.id = ANY(%(ids)s::bigint[]) AND j.waiting AND j.status = 'pending'
), upd AS (
  UPDATE {schema}.jobs AS j
  SET waiting = false,
      status = CASE WHEN c.culprit IS NULL THEN 'pending' ELSE 'cancelled' END
               ::{schema}.job_status,
      finished_at = CASE WHEN c.culprit IS NULL THEN NULL ELSE now() END,
      last_error_code = CASE WHEN c.culprit IS NULL THEN j.last_error_code
                             ELSE '{code:DEPENDENCY_FAILED}' END,
      last_error_class = CASE WHEN c.culprit IS NULL THEN j.last_error_class
                              ELSE 'permanent' END,
      last_error_detail = CASE WHEN c.culprit IS NULL THEN j.last_error_detail
                               ELSE 'dependency ' || c.culprit END
  FROM c
  WHERE j.id = c.id AND (c.ready OR c.culprit IS NOT NULL)
  RETURNING j.id, j.status, j.queue_name, j.available_at, j.lease_token, j.attempt_count,
            c.culprit
), ev AS (
  INSERT INTO {schema}.job_events
    (job_id, event, from_status, to_status, actor, lease_token, attempt, error_code,
     error_class, detail)
  SELECT id, CASE WHEN culprit IS NULL THEN 'promoted' ELSE 'dependency_failed' END,
         'pending', status, NULL, lease_token, attempt_count,
         CASE WHEN culprit IS NOT NULL THEN '{code:DEPENDENCY_FAILED}' END,
         CASE WHEN culprit IS NOT NULL THEN 'permanent' END,
         CASE WHEN culprit IS NULL THEN 'all dependencies ended'
              ELSE 'dependency ' || culprit || ' (on_dead cancel)' END
  FROM upd
)
SELECT id, status::text,
       CASE WHEN status = 'pending' AND available_at <= now()
         THEN pg_notify(%(channel)s, queue_name)::text END
FROM upd;

-- name: dependency_ids
-- The dependencies of jobs that wait again (replayed), to be locked before deciding them.
SELECT DISTINCT depends_on FROM {schema}.job_deps WHERE job_id = ANY(%(ids)s::bigint[]);

-- name: replay_dependents
-- replay(with_dependents=True): the jobs cancelled because one of these (just replayed)
-- jobs ended, and transitively theirs, come back pending and waiting, audited as replays;
-- promote_dependents then decides them in the same transaction.
WITH RECURSIVE down(id) AS (
  SELECT d.job_id
  FROM {schema}.job_deps AS d JOIN {schema}.jobs AS j ON j.id = d.job_id
  WHERE d.depends_on = ANY(%(ids)s::bigint[])
    AND j.status = 'cancelled' AND j.last_error_code = '{code:DEPENDENCY_FAILED}'
  UNION
  SELECT d.job_id
  FROM down
  JOIN {schema}.job_deps AS d ON d.depends_on = down.id
  JOIN {schema}.jobs AS j ON j.id = d.job_id
  WHERE j.status = 'cancelled' AND j.last_error_code = '{code:DEPENDENCY_FAILED}'
), locked AS (
  SELECT j.id, j.attempt_count
  FROM {schema}.jobs AS j
  WHERE j.id IN (SELECT id FROM down) AND j.status = 'cancelled'
  ORDER BY j.id
  FOR UPDATE
), upd AS (
  UPDATE {schema}.jobs AS j
  SET status = 'pending',
      waiting = true,
      attempt_count = 0,
      unknown_failures = 0,
      available_at = now(),
      finished_at = NULL,
      cancel_requested_at = NULL
  FROM locked AS l
  WHERE j.id = l.id
  RETURNING j.id, j.lease_token, l.attempt_count
)
INSERT INTO {schema}.job_events
  (job_id, event, from_status, to_status, actor, lease_token, attempt, detail)
SELECT id, 'replayed', 'cancelled', 'pending', %(actor)s, lease_token, attempt_count,
       left('with its dependency: ' || %(reason)s, 4000)
FROM upd
RETURNING job_id;

-- name: job_dependencies
-- jobs show: what a job waits for (or waited for), with their states.
SELECT d.depends_on, d.on_dead, p.status::text
FROM {schema}.job_deps AS d
LEFT JOIN {schema}.jobs AS p ON p.id = d.depends_on
WHERE d.job_id = %(id)s
ORDER BY d.depends_on;

-- name: job_dependents
-- jobs show: the jobs that wait for (or waited for) this one, with their states.
SELECT d.job_id, d.on_dead, j.status::text, j.waiting
FROM {schema}.job_deps AS d
JOIN {schema}.jobs AS j ON j.id = d.job_id
WHERE d.depends_on = %(id)s
ORDER BY d.job_id
LIMIT %(limit)s;

-- name: waiting_stats
-- Metrics: jobs waiting on dependencies and the oldest such wait (partial index on
-- created_at WHERE waiting).
SELECT count(*), coalesce(extract(epoch FROM now() - min(created_at)), 0)::float8
FROM {schema}.jobs
WHERE waiting;

-- ---------------------------------------------------------------------------------------
-- Stored results (leaseq.ops.results_async; tasks with store_result=True).

-- name: store_results
-- In the transaction of the fenced completion, only for the jobs that completion took
-- (the client passes the ids it returned, with their tokens): a stale worker's completion
-- took nothing, so it stores nothing. A re-run after a replay overwrites an older
-- attempt's value, never the reverse (lease_token). The NOTIFY wakes result() waiters.
WITH u AS (
  SELECT *
  FROM unnest(%(ids)s::bigint[], %(tokens)s::bigint[], %(values)s::jsonb[],
              %(ttls)s::float8[]) AS u(id, token, value, ttl)
), ins AS (
  INSERT INTO {schema}.job_results AS r (job_id, value, stored_at, expires_at, lease_token)
  SELECT u.id, u.value, now(), now() + make_interval(secs => u.ttl), u.token
  FROM u
  ON CONFLICT (job_id) DO UPDATE
  SET value = excluded.value, stored_at = excluded.stored_at,
      expires_at = excluded.expires_at, lease_token = excluded.lease_token
  WHERE r.lease_token < excluded.lease_token
  RETURNING r.job_id
)
SELECT job_id, pg_notify(%(channel)s, job_id::text)::text FROM ins;

-- name: job_result
-- A job's outcome for result(): its status (a stored result outlives a pruned job: then
-- 'succeeded'), the stored value unless expired, the last failure. Rows: (status, has
-- value, value, error code, error class, error detail, stored_at).
SELECT coalesce(j.status::text, CASE WHEN r.job_id IS NOT NULL THEN 'succeeded' END),
       r.job_id IS NOT NULL, r.value, j.last_error_code, j.last_error_class,
       j.last_error_detail, r.stored_at
FROM (SELECT %(id)s::bigint AS id) AS k
LEFT JOIN {schema}.jobs AS j ON j.id = k.id
LEFT JOIN {schema}.job_results AS r ON r.job_id = k.id AND r.expires_at > now()
WHERE j.id IS NOT NULL OR r.job_id IS NOT NULL;

-- name: dependency_results
-- ctx.dependency_results(): each dependency's outcome as job_result gives it, leaving
-- out failed dependencies under on_dead 'ignore'.
SELECT d.depends_on,
       coalesce(p.status::text, CASE WHEN r.job_id IS NOT NULL THEN 'succeeded' END),
       r.job_id IS NOT NULL, r.value, p.last_error_code, p.last_error_class,
       p.last_error_detail, r.stored_at
FROM {schema}.job_deps AS d
LEFT JOIN {schema}.jobs AS p ON p.id = d.depends_on
LEFT JOIN {schema}.job_results AS r ON r.job_id = d.depends_on AND r.expires_at > now()
WHERE d.job_id = %(id)s
  AND NOT (d.on_dead = 'ignore' AND p.status IN ('dead', 'cancelled'))
ORDER BY d.depends_on;

-- name: delete_expired_results
-- Result retention, a bounded batch per sweep (independent of job pruning).
DELETE FROM {schema}.job_results
WHERE job_id = ANY(ARRAY(
  SELECT job_id FROM {schema}.job_results
  WHERE expires_at <= now()
  ORDER BY expires_at
  LIMIT %(limit)s
  FOR UPDATE SKIP LOCKED
))
  AND expires_at <= now()
RETURNING job_id;

-- ---------------------------------------------------------------------------------------
-- Batches (leaseq.ops.batches_async; fired from base_async with the dependents). Whoever
-- may change whether a batch is finished locks its row: an enqueue into it, its seal, and
-- every transition that ends one of its jobs (lock_batches_of). fire_batches then decides
-- with a new snapshot, so the last of two members ending at once sees the other's commit,
-- and a seal sees every member that ended before it.

-- name: create_batch
INSERT INTO {schema}.batches (on_success, on_failure, on_finish)
VALUES (%(on_success)s::jsonb, %(on_failure)s::jsonb, %(on_finish)s::jsonb)
RETURNING id;

-- name: lock_open_batch
-- An enqueue into a batch: the batch must still be open (held until this commits, so a
-- seal waits for these jobs and then counts them).
SELECT state FROM {schema}.batches WHERE id = %(id)s FOR UPDATE;

-- name: join_batch
-- Jobs just inserted join the batch; has_dependents routes their endings to the
-- coordinated statements, which fire the batch.
UPDATE {schema}.jobs
SET batch_id = %(batch_id)s, has_dependents = true
WHERE id = ANY(%(ids)s::bigint[]);

-- name: lock_batches_of
-- The unfinished batches of jobs that just ended, locked in id order.
SELECT b.id
FROM {schema}.batches AS b
WHERE b.id IN (SELECT j.batch_id FROM {schema}.jobs AS j
               WHERE j.id = ANY(%(ids)s::bigint[]) AND j.batch_id IS NOT NULL)
  AND b.state <> 'done'
ORDER BY b.id
FOR UPDATE;

-- name: seal_batch
UPDATE {schema}.batches
SET state = 'sealed', sealed_at = now()
WHERE id = %(id)s AND state = 'open'
RETURNING id;

-- name: fire_batches
-- For each sealed batch (locked by the caller) whose members have all ended: its callbacks
-- (success when every member succeeded, failure when any ended dead or cancelled, finish
-- always) become ordinary jobs, each recorded in batch_callbacks first (ON CONFLICT DO
-- NOTHING: at most once per batch and kind), with the batch id and counts in the payload.
WITH b AS (
  SELECT b.id, b.on_success, b.on_failure, b.on_finish,
         count(j.id) AS total,
         count(j.id) FILTER (WHERE j.status = 'succeeded') AS succeeded,
         count(j.id) FILTER (WHERE j.status = 'dead') AS dead,
         count(j.id) FILTER (WHERE j.status = 'cancelled') AS cancelled,
         count(j.id) FILTER (WHERE j.status IN ('pending', 'running')) AS live
  FROM {schema}.batches AS b
  LEFT JOIN {schema}.jobs AS j ON j.batch_id = b.id
  WHERE b.id = ANY(%(ids)s::bigint[]) AND b.state = 'sealed'
  GROUP BY b.id
), due AS (
  SELECT * FROM b WHERE live = 0
), calls AS (
  SELECT due.id AS batch_id, k.kind, k.spec, due.total, due.succeeded, due.dead,
         due.cancelled,
         nextval((SELECT pg_get_serial_sequence('{schema}.jobs', 'id'))::regclass) AS job_id
  FROM due,
       LATERAL (VALUES ('success', due.on_success), ('failure', due.on_failure),
                       ('finish', due.on_finish)) AS k(kind, spec)
  WHERE k.spec IS NOT NULL
    AND (k.kind = 'finish' OR (k.kind = 'success') = (due.dead + due.cancelled = 0))
), cb AS (
  INSERT INTO {schema}.batch_callbacks (batch_id, kind, job_id)
  SELECT batch_id, kind, job_id FROM calls
  ON CONFLICT DO NOTHING
  RETURNING batch_id, kind, job_id
), ins AS (
  INSERT INTO {schema}.jobs
    (id, queue_name, task, payload, priority, base_priority, max_attempts)
  OVERRIDING SYSTEM VALUE
  SELECT cb.job_id, c.spec->>'queue', c.spec->>'task',
         jsonb_build_object('batch_id', c.batch_id, 'kind', c.kind, 'total', c.total,
                            'succeeded', c.succeeded, 'dead', c.dead,
                            'cancelled', c.cancelled, 'payload', c.spec->'payload'),
         (c.spec->>'priority')::int, (c.spec->>'priority')::int,
         (c.spec->>'max_attempts')::int
  FROM cb JOIN calls AS c ON c.batch_id = cb.batch_id AND c.kind = cb.kind
  RETURNING id, queue_name
), done AS (
  UPDATE {schema}.batches AS x
  SET state = 'done', finished_at = now()
  FROM due
  WHERE x.id = due.id
)
SELECT id, pg_notify(%(channel)s, queue_name)::text FROM ins;

-- name: get_batch
-- `leaseq batches show`: the batch, its members' counts by status and its callbacks.
SELECT b.id, b.state, b.created_at, b.sealed_at, b.finished_at,
       b.on_success->>'task', b.on_failure->>'task', b.on_finish->>'task',
       (SELECT coalesce(jsonb_object_agg(s, n), '{}'::jsonb)
          FROM (SELECT j.status::text AS s, count(*) AS n FROM {schema}.jobs AS j
                WHERE j.batch_id = b.id GROUP BY j.status) AS c),
       (SELECT coalesce(jsonb_object_agg(kind, job_id), '{}'::jsonb)
          FROM {schema}.batch_callbacks AS k WHERE k.batch_id = b.id)
FROM {schema}.batches AS b
WHERE b.id = %(id)s;

-- name: job_batch
SELECT batch_id FROM {schema}.jobs WHERE id = %(id)s;

-- name: list_waiting
-- `leaseq waiting`: waiting jobs, oldest first, with what each still waits for (its
-- unfinished dependencies; the view waiting_jobs has every edge).
SELECT j.id, j.queue_name, j.task, extract(epoch FROM now() - j.created_at)::float8,
       (SELECT array_agg(d.depends_on ORDER BY d.depends_on)
          FROM {schema}.job_deps AS d
          JOIN {schema}.jobs AS p ON p.id = d.depends_on
         WHERE d.job_id = j.id AND p.status IN ('pending', 'running'))
FROM {schema}.jobs AS j
WHERE j.waiting
ORDER BY j.created_at, j.id
LIMIT %(limit)s;

-- == read replicas and several databases ==================================================

-- name: primary_wal_position
-- The primary's flushed WAL position: what a streaming standby can have received so far
-- (read first, then replica_lag on the replica).
SELECT pg_current_wal_flush_lsn()::text;

-- name: replica_lag
-- On the read replica: is it a standby, how many bytes of the primary's WAL (read just
-- before) it has not replayed yet, the age of the newest transaction it replayed
-- (clock_timestamp: the age now, not at the start of this transaction), and which server
-- answered, as host:port (its own address, so also behind a pooler or a multi-host DSN;
-- [addr]:port for IPv6; 'local' over a Unix socket, where inet_server_addr is NULL).
SELECT pg_is_in_recovery(),
       (%(primary_lsn)s::pg_lsn - pg_last_wal_replay_lsn())::bigint,
       extract(epoch FROM clock_timestamp() - pg_last_xact_replay_timestamp())::float8,
       CASE WHEN family(inet_server_addr()) = 6 THEN '[' || host(inet_server_addr()) || ']'
            ELSE coalesce(host(inet_server_addr()), 'local')
       END || ':' || current_setting('port');

-- name: database_identity
-- Which database a connection is on (the cluster's system identifier and the database
-- name): a transactional enqueue must be on the database of the queue it names.
SELECT (SELECT system_identifier FROM pg_control_system())::text, current_database();
