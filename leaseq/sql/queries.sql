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
   payload_version, idempotency_key, key_policy)
VALUES (
  %(queue)s, %(task)s, %(payload)s::jsonb, %(priority)s, %(priority)s,
  coalesce(%(run_at)s::timestamptz, now() + make_interval(secs => %(delay)s)),
  %(max_attempts)s, %(payload_version)s, %(idempotency_key)s, %(key_policy)s
)
RETURNING id, CASE WHEN available_at <= now() THEN pg_notify(%(channel)s, queue_name)::text END;

-- name: insert_keyed_job
-- insert_job for a job with an ordering key; the caller holds the key's advisory lock.
WITH ins AS (
  INSERT INTO {schema}.jobs
    (queue_name, task, payload, priority, base_priority, available_at, max_attempts,
     payload_version, idempotency_key, ordering_key, key_policy, blocked)
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
    )
  )
  RETURNING id, queue_name, available_at
)
SELECT id, CASE WHEN available_at <= now() THEN pg_notify(%(channel)s, queue_name)::text END
FROM ins;

-- name: insert_jobs
-- Bulk form of insert_job: arrays in, one statement. Identity values are assigned in the
-- order unnest produces rows, so sorted ids match the input order. PostgreSQL folds
-- duplicate notifications of one transaction, so one wake-up per queue goes out.
WITH ins AS (
  INSERT INTO {schema}.jobs
    (queue_name, task, payload, priority, base_priority, available_at, max_attempts,
     payload_version, idempotency_key, ordering_key, key_policy, blocked)
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
         )
  FROM unnest(
    %(queues)s::text[], %(tasks)s::text[], %(payloads)s::jsonb[], %(priorities)s::int[],
    %(run_ats)s::timestamptz[], %(delays)s::float8[], %(max_attempts)s::int[],
    %(payload_versions)s::int[], %(idempotency_keys)s::text[], %(ordering_keys)s::text[],
    %(key_policies)s::text[]
  ) WITH ORDINALITY
    AS u(queue, task, payload, priority, run_at, delay, max_attempts, payload_version,
         idempotency_key, ordering_key, key_policy, ord)
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
   payload_version, idempotency_key)
FROM STDIN;


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
UPDATE {schema}.jobs AS j
SET status = 'running',
    attempt_count = least(j.attempt_count, 2147483646) + 1,
    lease_owner = %(owner)s,
    lease_token = least(j.lease_token, 9223372036854775806) + 1,
    lease_expires_at = now() + make_interval(secs => %(lease_seconds)s),
    started_at = now(),
    heartbeat_at = now()
WHERE j.id = ANY(ARRAY(
  SELECT id
  FROM {schema}.jobs
  WHERE queue_name = %(queue)s
    AND status = 'pending'
    AND NOT blocked
    AND available_at <= now()
  ORDER BY priority DESC, available_at, id
  LIMIT %(limit)s
  FOR UPDATE SKIP LOCKED
))
RETURNING j.id, j.lease_token, j.lease_owner, j.task, j.queue_name, j.payload::text,
          j.attempt_count, j.max_attempts, j.priority, j.payload_version,
          j.unknown_failures, j.idempotency_key, j.ordering_key,
          -- Times as float8 seconds: the clock, then ages (see leases_from_rows).
          date_part('epoch', now()),
          CASE WHEN isfinite(j.created_at) THEN date_part('epoch', now() - j.created_at) END,
          CASE WHEN isfinite(j.available_at)
            THEN date_part('epoch', now() - j.available_at) END;

-- name: _owned_by_token
-- The fence for a batch of one owner's leases; ids must be ascending and unique. Each
-- row's token is found by binary search (width_bucket) over the ids. Joining
-- unnest(ids, tokens) instead makes PostgreSQL copy every input row whole for
-- EvalPlanQual and often hash all running jobs: this form drained 1.3-2.2x faster
-- (bench: drain-raw). The arrays sit in scalar subqueries, evaluated once per statement:
-- in a generic plan the driver's int2/int4 arrays would otherwise be cast per row.
j.id = ANY(%(ids)s::bigint[])
  AND j.status = 'running'
  AND j.lease_owner = %(owner)s
  AND j.lease_token
      = (SELECT %(tokens)s::bigint[])[width_bucket(j.id, (SELECT %(ids)s::bigint[]))]
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
  lease_expires_at = NULL

-- name: heartbeat_jobs
-- Renews many leases in one statement; rows missing from RETURNING lost their lease.
UPDATE {schema}.jobs AS j
SET lease_expires_at = now() + make_interval(secs => %(lease_seconds)s),
    heartbeat_at = now()
WHERE {_owned_by_token}
RETURNING j.id, j.lease_token, j.lease_expires_at, j.cancel_requested_at IS NOT NULL;

-- name: complete_jobs
-- Fenced success for a batch; rows missing from RETURNING were not ours any more.
UPDATE {schema}.jobs AS j
SET status = 'succeeded',
    finished_at = now(),
    lease_owner = NULL,
    lease_expires_at = NULL
WHERE {_owned_by_token}
RETURNING j.id;

-- name: fail_jobs
-- Fenced failure for a batch. Python decided each job's next state (retry after a delay,
-- or dead); a pending cancel request overrides a retry, since nobody wants it run again.
-- The event row is written by the same statement, so the trail cannot miss a transition.
WITH d AS (
  SELECT *
  FROM unnest(
    %(ids)s::bigint[], %(owners)s::text[], %(tokens)s::bigint[],
    %(to_statuses)s::text[], %(delays)s::float8[], %(codes)s::text[], %(details)s::text[],
    %(classes)s::text[], %(reasons)s::text[]
  ) AS d(id, owner, token, to_status, delay, code, detail, class, reason)
), upd AS (
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
  RETURNING j.id, j.status, j.lease_token, j.attempt_count, d.owner, d.code, d.detail,
            d.class, d.reason
)
INSERT INTO {schema}.job_events
  (job_id, event, from_status, to_status, actor, lease_token, attempt, error_code,
   error_class, detail)
SELECT id,
       CASE status WHEN 'pending' THEN 'retry_scheduled' WHEN 'dead' THEN 'dead'
                   ELSE 'cancelled' END,
       'running', status, owner, lease_token, attempt_count, code, class,
       left(CASE status WHEN 'cancelled' THEN 'cancel requested' ELSE reason END
            || coalesce(': ' || detail, ''), 4000)
FROM upd
RETURNING job_id, to_status::text;

-- name: release_jobs
-- Gives back leases whose handler never started (shutdown): the attempt is not charged
-- and available_at is kept, so the job keeps its place in line.
WITH upd AS (
  UPDATE {schema}.jobs AS j
  SET status = 'pending',
      attempt_count = j.attempt_count - 1,
      lease_owner = NULL,
      lease_expires_at = NULL
  FROM unnest(%(ids)s::bigint[], %(owners)s::text[], %(tokens)s::bigint[]) AS l(id, owner, token)
  WHERE j.id = l.id
    AND j.status = 'running'
    AND j.lease_owner = l.owner
    AND j.lease_token = l.token
    AND j.lease_expires_at > now()
  RETURNING j.id, j.lease_token, j.attempt_count, l.owner
)
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
WITH d AS (
  SELECT *
  FROM unnest(
    %(ids)s::bigint[], %(tokens)s::bigint[], %(to_statuses)s::text[], %(delays)s::float8[],
    %(reasons)s::text[]
  ) AS d(id, token, to_status, delay, reason)
), upd AS (
  UPDATE {schema}.jobs AS j
  SET {_attempt_ended},
      last_error_code = '{code:LEASE_EXPIRED}',
      last_error_class = 'transient',
      last_error_detail = 'lease of ' || j.lease_owner || ' expired at ' || j.lease_expires_at
  FROM d
  WHERE j.id = d.id
    AND j.status = 'running'
    AND j.lease_token = d.token
    AND j.lease_expires_at <= now()
  RETURNING j.id, j.status, j.lease_token, j.attempt_count, j.last_error_detail, d.reason
)
INSERT INTO {schema}.job_events
  (job_id, event, from_status, to_status, actor, lease_token, attempt, error_code,
   error_class, detail)
SELECT id, 'lease_expired', 'running', status, %(actor)s, lease_token, attempt_count,
       '{code:LEASE_EXPIRED}', 'transient',
       CASE status WHEN 'cancelled' THEN 'cancel requested' ELSE reason END
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
      cancel_requested_at = CASE
        WHEN status = 'running' THEN coalesce(cancel_requested_at, now())
        ELSE cancel_requested_at
      END
  WHERE id = %(id)s AND status IN ('pending', 'running')
  RETURNING id, status, lease_token, attempt_count
)
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
WITH prev AS (
  SELECT id, status, attempt_count, ordering_key
  FROM {schema}.jobs
  WHERE {_job_filter} AND id = ANY(%(ids)s::bigint[])
  ORDER BY id
  LIMIT %(limit)s
  FOR UPDATE SKIP LOCKED
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
      blocked = j.ordering_key IS NOT NULL
  FROM prev
  WHERE j.id = prev.id
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
SELECT ev.job_id, pg_notify(%(channel)s, upd.queue_name)::text
FROM ev JOIN upd ON upd.id = ev.job_id;

-- name: replay_candidates
-- The next batch a replay would take, with their keys, so the keys can be locked first.
SELECT id, ordering_key
FROM {schema}.jobs
WHERE {_job_filter}
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
-- so pruning never delays a claim; scanning in id order finds the oldest rows first.
WITH doomed AS (
  SELECT id
  FROM {schema}.jobs
  WHERE status IN ('succeeded', 'cancelled')
    AND finished_at < now() - make_interval(secs => %(older_than)s)
  ORDER BY id
  LIMIT %(limit)s
  FOR UPDATE SKIP LOCKED
), trail AS (
  DELETE FROM {schema}.job_events AS e USING doomed WHERE e.job_id = doomed.id
), effects AS (
  DELETE FROM {schema}.job_effects AS f USING doomed WHERE f.job_id = doomed.id
)
DELETE FROM {schema}.jobs AS j USING doomed WHERE j.id = doomed.id
RETURNING j.id;


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
  WHERE status = 'pending' AND NOT blocked
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
       idempotency_key
FROM {schema}.jobs
WHERE id = %(id)s;

-- name: list_jobs
-- Operator listing (dead list, inspection), newest first.
SELECT id, queue_name, task, payload::text, status::text, priority, available_at, attempt_count,
       max_attempts, lease_owner, lease_token, lease_expires_at, last_error_code,
       last_error_detail, created_at, started_at, heartbeat_at, finished_at,
       cancel_requested_at, payload_version, last_error_class, unknown_failures,
       idempotency_key
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
UPDATE {schema}.jobs
SET trace_context = coalesce(trace_context, '{}'::jsonb)
    || jsonb_build_object('attempt', %(carrier)s::jsonb)
WHERE id = %(id)s AND lease_token = %(token)s;
