-- Unique keys (leaseq.ops.enqueue_async, the rules in leaseq.rules.unique): the key is a
-- row of unique_keys, taken in the statement that inserts its job; the fragments release
-- or keep it in every statement that ends a keyed job.


-- name: _unique_insert
-- The job row of insert_unique_job and insert_follow_up, under the id the CTE "lock" took
-- with the key (nothing is inserted when the key was not taken).
ins AS (
  INSERT INTO {schema}.jobs
    (id, queue_name, task, payload, priority, base_priority, available_at, max_attempts,
     payload_version, idempotency_key, ordering_key, key_policy, blocked, unique_key,
     unique_for, unique_states, debounce_until, limit_key, expires_at, fairness_key,
     cost)
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
         now() + make_interval(secs => %(debounce_max)s::float8), %(limit_key)s,
         {_expires_at}, %(fairness_key)s, %(cost)s
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
SELECT id, {_notify_ready}
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
SELECT id, {_notify_ready}
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
SELECT id, {_notify_ready}
FROM upd;

-- name: lock_unique_key
-- insert_follow_up's first step, in the same transaction: lock the key row while it still
-- names the holder live. Every statement that stops a keyed job running (fail_keyed_jobs,
-- expire_leases and release_jobs lock the row in _unique_superseded; complete_keyed_jobs
-- changes it) does so before it commits, so once this lock is ours each of them either
-- committed before it, and insert_follow_up (a new snapshot, READ COMMITTED) sees the
-- holder pending or ended, or waits for this transaction and then finds the key moved.
SELECT job_id
FROM {schema}.unique_keys
WHERE unique_key = %(unique_key)s AND job_id = %(holder)s AND held_until IS NULL
FOR UPDATE;

-- name: insert_follow_up
-- on_conflict="replace" (or a debounce) while the holder runs: a running job is never
-- changed, so a new job with the new payload is queued and the key moves to it, fenced by
-- the holder still holding it live AND still running (after lock_unique_key: a retry or a
-- requeue that committed between unique_holder and here left it pending, and then no
-- follow-up is queued: the client reads the holder again and replaces its payload). The
-- holder is now superseded: if its attempt fails it ends cancelled (SUPERSEDED) rather
-- than coming back as a second live job with the key.
WITH lock AS (
  UPDATE {schema}.unique_keys AS k
  SET job_id = nextval((SELECT pg_get_serial_sequence('{schema}.jobs', 'id'))::regclass)
  WHERE k.unique_key = %(unique_key)s AND k.job_id = %(holder)s AND k.held_until IS NULL
    AND EXISTS (SELECT 1 FROM {schema}.jobs AS h
                WHERE h.id = %(holder)s AND h.status = 'running')
  RETURNING k.job_id
), {_unique_insert}, ev AS (
  INSERT INTO {schema}.job_events
    (job_id, event, from_status, to_status, actor, lease_token, attempt, detail)
  SELECT h.id, 'superseded', h.status, h.status, NULL, h.lease_token, h.attempt_count,
         'unique key ' || left(h.unique_key, 200) || ' moved to follow-up job ' || ins.id
  FROM ins JOIN {schema}.jobs AS h ON h.id = %(holder)s
)
SELECT id, {_notify_ready}
FROM ins;

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
