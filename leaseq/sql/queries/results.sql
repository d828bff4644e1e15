-- Stored results (leaseq.ops.results_async; tasks with store_result=True).


-- name: store_results
-- In the transaction of the fenced completion, only for the leases that completion took
-- (the client passes the ids it returned, with their tokens): a stale worker's completion
-- took nothing, so it stores nothing. Keyed by lease, not job: only the value of the lease
-- that ended the job (its token is the job's lease_token, and it succeeded) is stored, once
-- per job, so a stale and a current lease of one job in one batch cannot both reach the
-- upsert (which would fail the whole completion: ON CONFLICT cannot touch a row twice). A
-- re-run after a replay overwrites an older attempt's value, never the reverse
-- (lease_token). The NOTIFY wakes result() waiters.
WITH u AS (
  SELECT DISTINCT ON (u.id) u.id, u.token, u.value, u.ttl
  FROM unnest(%(ids)s::bigint[], %(tokens)s::bigint[], %(values)s::jsonb[],
              %(ttls)s::float8[]) AS u(id, token, value, ttl)
  JOIN {schema}.jobs AS j
    ON j.id = u.id AND j.lease_token = u.token AND j.status = 'succeeded'
  ORDER BY u.id
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
