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
