-- Leases given back at shutdown and leases that expired (leaseq.ops.failure_async).


-- name: release_jobs
-- Gives back leases whose handler never started (shutdown): the attempt is not charged
-- and available_at is kept, so the job keeps its place in line. Its limit slots go too.
-- Unique keys as in fail_keyed_jobs: a job whose key moved to a follow-up (superseded,
-- _unique_superseded locks the key rows) is not given back as a second live job with the
-- key: it ends cancelled (SUPERSEDED), and the follow-up keeps the key.
WITH d0 AS (
  SELECT *
  FROM unnest(%(ids)s::bigint[], %(owners)s::text[], %(tokens)s::bigint[])
    AS l(id, owner, token)
), {_unique_superseded}, d AS (
  SELECT d0.id, d0.owner, d0.token, coalesce(s.superseded, false) AS superseded,
         'superseded: its unique key moved to job ' || coalesce(s.holder::text, '(none)')
           || ', not run' AS reason
  FROM d0 LEFT JOIN sup AS s ON s.id = d0.id
), upd AS (
  UPDATE {schema}.jobs AS j
  SET status = CASE WHEN d.superseded THEN 'cancelled'
                    ELSE 'pending' END::{schema}.job_status,
      attempt_count = j.attempt_count - 1,
      finished_at = CASE WHEN d.superseded THEN now() ELSE j.finished_at END,
      last_error_code = CASE WHEN d.superseded THEN '{code:SUPERSEDED}'
                             ELSE j.last_error_code END,
      last_error_detail = CASE WHEN d.superseded THEN d.reason ELSE j.last_error_detail END,
      lease_owner = NULL,
      lease_expires_at = NULL,
      queue_slot = NULL
  FROM d
  WHERE j.id = d.id
    AND j.status = 'running'
    AND j.lease_owner = d.owner
    AND j.lease_token = d.token
    AND j.lease_expires_at > now()
  RETURNING j.id, j.status, j.lease_token, j.attempt_count, d.owner, d.superseded, d.reason,
            {_queue_wake}
), {_slots_release}
INSERT INTO {schema}.job_events
  (job_id, event, from_status, to_status, actor, lease_token, attempt, error_code, detail)
SELECT id, 'released', 'running', status, owner, lease_token, attempt_count,
       CASE WHEN superseded THEN '{code:SUPERSEDED}' END,
       CASE WHEN superseded THEN reason END
FROM upd
RETURNING job_id, to_status::text;

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

-- name: lock_expiring_jobs
-- Pending jobs past their start deadline (jobs_expiring_idx), a bounded batch, SKIP LOCKED:
-- a claim holding one has read it as unclaimable already (the claim checks expires_at
-- with the same clock), so nothing here waits on a worker.
SELECT id, ordering_key
FROM {schema}.jobs
WHERE status = 'pending'
  AND expires_at IS NOT NULL
  AND expires_at <= now()
ORDER BY expires_at
LIMIT %(limit)s
FOR UPDATE SKIP LOCKED;

-- name: expire_pending_jobs
-- The jobs lock_expiring_jobs locked (same transaction) end cancelled with the code EXPIRED
-- and one 'expired' event each: the status test makes a second sweep (or a replay that
-- came first) a no-op, so each expiry is written exactly once. A unique key they held
-- goes (or stays as a window) as for a cancel; the caller then decides their ordering
-- keys' heads and their dependents in this transaction.
WITH upd AS (
  UPDATE {schema}.jobs AS j
  SET status = 'cancelled',
      finished_at = now(),
      waiting = false,
      last_error_code = '{code:EXPIRED}',
      last_error_class = 'permanent',
      last_error_detail = 'not started by its deadline ' || j.expires_at
  WHERE j.id = ANY(%(ids)s::bigint[])
    AND j.status = 'pending'
    AND j.expires_at <= now()
  RETURNING j.id, j.status, j.lease_token, j.attempt_count, j.queue_name,
            j.last_error_detail, j.unique_key, j.unique_for, j.unique_states
), fin AS (
  SELECT * FROM upd WHERE unique_key IS NOT NULL
), {_unique_release}
INSERT INTO {schema}.job_events
  (job_id, event, from_status, to_status, actor, lease_token, attempt, error_code,
   error_class, detail)
SELECT id, 'expired', 'pending', 'cancelled', %(actor)s, lease_token, attempt_count,
       '{code:EXPIRED}', 'permanent', last_error_detail
FROM upd
RETURNING job_id;
