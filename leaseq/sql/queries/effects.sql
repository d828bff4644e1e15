-- Effect records of external calls (leaseq.worker.effects) and the re-read of attempts
-- after a write whose outcome is unknown.


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
