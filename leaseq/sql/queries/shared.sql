-- Fragments several sections use: the ordering key's blocking test, the operator's job
-- filter, the job columns every job read returns (models.Job's field order) and the
-- wake-up of jobs that became claimable.


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

-- name: _job_columns
-- A job row as leaseq.rows.job_from_row decodes it, aliased with models.Job's field names
-- in its field order (tests/unit/test_jobspec.py checks both). The payload comes as text:
-- the client decodes it, and shows a row it cannot decode.
id AS job_id, queue_name AS queue, task, payload::text AS payload, status::text AS status,
priority, available_at, attempt_count, max_attempts, lease_owner, lease_token,
lease_expires_at, last_error_code, last_error_detail, created_at, started_at, heartbeat_at,
finished_at, cancel_requested_at, payload_version, last_error_class, unknown_failures,
idempotency_key, unique_key, suspend_reason, wake_at, cost

-- name: _notify_ready
-- The wake-up of a job just inserted or changed (columns available_at, blocked,
-- queue_name): a NOTIFY on the schema's channel for its queue when it is claimable now.
-- Sent at commit, and only if the transaction commits; one per queue per transaction.
CASE WHEN available_at <= now() AND NOT blocked
  THEN pg_notify(%(channel)s, queue_name)::text END
