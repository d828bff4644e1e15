-- Pauses (leaseq.ops.pauses_async). The claim's side is the _not_paused fragment (claim.sql).


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
-- name) for a task or key, which every listener takes as a wake-up. The parked keys of
-- fair queues the pause held (the queue's, or every queue's for a task or key) are
-- unparked with their gen bumped, as an enqueue does (docs/fairness.md).
WITH del AS (
  DELETE FROM {schema}.pauses
  WHERE scope = %(scope)s AND value = %(value)s
  RETURNING scope, value, paused_at
), unparked AS (
  UPDATE {schema}.fair_keys AS f
  SET gen = f.gen + 1, parked_until = NULL, park_step = 0, active_at = now(),
      pass = CASE WHEN f.park_step > 0 THEN NULL ELSE f.pass END
  FROM del
  WHERE f.parked_until IS NOT NULL
    AND (del.scope <> 'queue' OR f.queue_name = del.value)
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
