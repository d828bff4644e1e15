-- Fenced transitions of running jobs (leaseq.ops.lease_async, failure_async): heartbeat,
-- complete and fail, each fenced by owner + token + an unexpired lease, with the trail row
-- written by the same statement.


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
RETURNING job_id, to_status::text, lease_token

-- name: _failure_input
-- The failures of a batch as Python decided them (fail_jobs, fail_keyed_jobs), one row each.
SELECT *
  FROM unnest(
    %(ids)s::bigint[], %(owners)s::text[], %(tokens)s::bigint[],
    %(to_statuses)s::text[], %(delays)s::float8[], %(codes)s::text[], %(details)s::text[],
    %(classes)s::text[], %(reasons)s::text[]
  ) AS d(id, owner, token, to_status, delay, code, detail, class, reason)

-- name: _failure_applied
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
RETURNING j.id, {_queue_wake}, j.lease_token;

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
SELECT id, NULL, lease_token FROM upd;

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
SELECT id, NULL, lease_token FROM upd;

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
