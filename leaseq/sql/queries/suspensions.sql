-- Durable sleep and signals (leaseq.ops.steps_async, leaseq.worker.waits): the fenced
-- suspension of a running job, its wake-up by the claim (_wake_due) or by a signal, and
-- the signals themselves. Every one is a single-row update of the job under a row lock
-- that the suspension and the signal both take first, so neither can miss the other.


-- name: suspend_fence
-- First statement of a suspension's transaction: the lease's fence, holding the job row
-- until the commit. A signal's send takes the same row lock first, so the statements that
-- follow here (each with a snapshot of its own, under READ COMMITTED) see every signal
-- committed before, and a signal committed after finds the job suspended.
SELECT date_part('epoch', now()), cancel_requested_at IS NOT NULL
FROM {schema}.jobs
WHERE id = %(id)s
  AND status = 'running'
  AND lease_owner = %(owner)s
  AND lease_token = %(token)s
  AND lease_expires_at > now()
FOR UPDATE;

-- name: signal_get
-- The delivery a wait consumes: the first one of the name from %(seq)s on (the waits of one
-- name before it, in this run, consumed the ones before %(seq)s).
SELECT payload, seq FROM {schema}.job_signals
WHERE job_id = %(id)s AND name = %(name)s AND seq >= %(seq)s
ORDER BY seq
LIMIT 1;

-- name: step_result_set
-- A waiting step's record gets its outcome (the signal's payload, or the timeout), in the
-- suspension's transaction (the job row is held, under the lease's fence): once.
UPDATE {schema}.job_steps SET result = %(result)s::jsonb
WHERE job_id = %(id)s AND name = %(name)s AND lease_token <= %(token)s
RETURNING 1;

-- name: suspend_job
-- The suspension itself, fenced like every ending of a lease: the lease, its queue slot
-- and its limit slots (_slots_release) are given back, the attempt is not charged (it
-- runs again when woken, as the same attempt), available_at is kept. The start deadline
-- (expires_at) is cleared: the job has started, and its wake-up must not expire it.
WITH upd AS (
  UPDATE {schema}.jobs AS j
  SET status = 'suspended',
      attempt_count = j.attempt_count - 1,
      lease_owner = NULL,
      lease_expires_at = NULL,
      queue_slot = NULL,
      expires_at = NULL,
      suspend_reason = %(reason)s,
      wake_at = coalesce(to_timestamp(%(until)s::float8), 'infinity'),
      wait_signal = %(signal)s
  FROM (VALUES (%(id)s::bigint, %(owner)s::text, %(token)s::bigint)) AS l(id, owner, token)
  WHERE j.id = l.id
    AND j.status = 'running'
    AND j.lease_owner = l.owner
    AND j.lease_token = l.token
    AND j.lease_expires_at > now()
  RETURNING j.id, j.lease_token, j.attempt_count, l.owner, {_queue_wake}
), {_slots_release}
INSERT INTO {schema}.job_events
  (job_id, event, from_status, to_status, actor, lease_token, attempt, detail)
SELECT id, 'suspended', 'running', 'suspended', owner, lease_token, attempt_count, %(detail)s
FROM upd
RETURNING job_id;

-- name: _wake_due
-- (A CTE of both claim statements, parameters %(queue)s and %(limit)s.) Suspended jobs of
-- the queue whose wake-up time has come become pending, each by a single-row update of its
-- own row, with a 'woken' event; the next claim takes them (this statement's snapshot
-- cannot see them). jobs_wake_idx holds only suspended rows, so a claim pays one short index
-- probe however many jobs sleep, and nothing when none is due. SKIP LOCKED: a row a signal
-- or a cancel holds is theirs. A NOTIFY brings the next claim at once.
woken AS (
  UPDATE {schema}.jobs AS w
  SET status = 'pending', available_at = w.wake_at, wake_at = NULL, wait_signal = NULL,
      suspend_reason = NULL
  WHERE w.id = ANY(ARRAY(
      SELECT s.id FROM {schema}.jobs AS s
      WHERE s.queue_name = %(queue)s AND s.wake_at <= now()
      ORDER BY s.wake_at
      LIMIT least(4 * %(limit)s + 32, 1000)
      FOR UPDATE SKIP LOCKED))
    AND w.status = 'suspended'
  RETURNING w.id, w.lease_token, w.attempt_count, w.fairness_key,
            pg_notify('leaseq.' || btrim('{schema}', '"'), w.queue_name)
), woken_trail AS (
  INSERT INTO {schema}.job_events (job_id, event, from_status, to_status, lease_token, attempt)
  SELECT id, 'woken', 'suspended', 'pending', lease_token, attempt_count FROM woken
)

-- name: signal_lock
-- First statement of a signal's send: the job row, held until the commit (see
-- suspend_fence), with its state.
SELECT status::text, task FROM {schema}.jobs WHERE id = %(id)s FOR NO KEY UPDATE;

-- name: signal_job_by_key
-- The live job holding a unique key (the signal's target named by its key).
SELECT id FROM {schema}.jobs
WHERE unique_key = %(unique_key)s AND status IN ('pending', 'running', 'suspended')
ORDER BY id DESC
LIMIT 1;

-- name: signal_store
-- The signal's row, the name's next delivery (seq: the largest stored plus one, read under
-- the job row signal_lock holds, so sends to one job take turns; the primary key keeps each
-- delivery one row) and, when the job is suspended waiting for that name, its wake-up, in
-- one statement after signal_lock: its snapshot sees the suspension if one committed. (A
-- suspended wait waits for the delivery after the ones its run consumed, which is this one.)
WITH sig AS (
  INSERT INTO {schema}.job_signals (job_id, name, seq, payload, actor)
  SELECT %(id)s, %(name)s, coalesce(max(s.seq), 0) + 1, %(payload)s::jsonb, %(actor)s
  FROM {schema}.job_signals AS s
  WHERE s.job_id = %(id)s AND s.name = %(name)s
  RETURNING job_id
), upd AS (
  UPDATE {schema}.jobs AS j
  SET status = 'pending', available_at = now(), wake_at = NULL, wait_signal = NULL,
      suspend_reason = NULL
  WHERE j.id = %(id)s AND j.status = 'suspended' AND j.wait_signal = %(name)s
    AND EXISTS (SELECT 1 FROM sig)
  RETURNING j.id, j.lease_token, j.attempt_count, j.queue_name,
            pg_notify('leaseq.' || btrim('{schema}', '"'), j.queue_name)
), ev AS (
  INSERT INTO {schema}.job_events
    (job_id, event, from_status, to_status, actor, lease_token, attempt, detail)
  SELECT id, 'signalled', 'suspended', 'pending', %(actor)s, lease_token, attempt_count,
         'signal ' || %(name)s
  FROM upd
)
SELECT (SELECT count(*) FROM sig), (SELECT count(*) FROM upd);

-- name: job_signals
SELECT name, payload, sent_at, actor FROM {schema}.job_signals
WHERE job_id = %(id)s
ORDER BY sent_at, name, seq;

-- name: suspended_stats
-- Suspended jobs by queue and reason, and how late the most overdue wake-up is (seconds;
-- 0 when none is due): a growing overdue means no worker claims that queue.
SELECT queue_name, suspend_reason, count(*),
       coalesce(max(extract(epoch FROM now() - wake_at)) FILTER (WHERE wake_at <= now()), 0)::float8
FROM {schema}.jobs
WHERE wake_at IS NOT NULL
GROUP BY queue_name, suspend_reason
ORDER BY queue_name, suspend_reason;
