-- Durable steps (leaseq.worker.steps): the records of a job's finished steps, read once per
-- attempt, and the fenced write of one more.


-- name: step_records
-- Read on the primary: the attempt must see every step an earlier attempt committed.
SELECT name, seq, attempt, lease_token, recorded_at, result
FROM {schema}.job_steps
WHERE job_id = %(id)s
ORDER BY seq;

-- name: timer_record
-- A sleeping or waiting step's record, fenced as step_record: its wake-up time (epoch
-- seconds, from the database clock: now() + %(seconds)s, or %(until)s as given; NULL: no
-- timeout) is fixed the first time the step runs, and read back from the record on reruns.
WITH fence AS (
  SELECT id FROM {schema}.jobs
  WHERE id = %(id)s
    AND status = 'running'
    AND lease_owner = %(owner)s
    AND lease_token = %(token)s
    AND lease_expires_at > now()
  FOR SHARE
)
INSERT INTO {schema}.job_steps (job_id, name, seq, attempt, lease_token, result)
SELECT fence.id, %(name)s, %(seq)s, %(attempt)s, %(token)s,
       jsonb_build_object('until', coalesce(
         %(until)s::float8,
         date_part('epoch', now() + make_interval(secs => %(seconds)s::float8))))
FROM fence
ON CONFLICT DO NOTHING
RETURNING (result->>'until')::float8;

-- name: step_record
-- Records a finished step, only while the lease holds, in the transaction of the step's own
-- database work (ctx.transaction() inside the step) or a short one of its own. FOR SHARE
-- holds the job row until the commit, so no sweep, cancel or claim can end the lease between
-- this check and the commit. ON CONFLICT: a record under this name (or at this place) already
-- committed, which a stale attempt finds out here; its caller rolls back its work.
WITH fence AS (
  SELECT id FROM {schema}.jobs
  WHERE id = %(id)s
    AND status = 'running'
    AND lease_owner = %(owner)s
    AND lease_token = %(token)s
    AND lease_expires_at > now()
  FOR SHARE
)
INSERT INTO {schema}.job_steps (job_id, name, seq, attempt, lease_token, result)
SELECT fence.id, %(name)s, %(seq)s, %(attempt)s, %(token)s, %(result)s::jsonb FROM fence
ON CONFLICT DO NOTHING
RETURNING 1;

-- name: step_records_batch
-- The records of finished steps of several jobs running on one worker, in one statement and
-- one commit (leaseq.worker.recorder: group commit; each step still returns only after its
-- own record committed). Each row is fenced by its own lease exactly as step_record is, its
-- job row held FOR SHARE until the commit, taken in id order so that two batches never wait
-- on each other crosswise. Returns the rows recorded; a missing one was refused (its lease
-- ended, or a record of its name or place already committed).
WITH given AS (
  SELECT *
  FROM unnest(%(ids)s::bigint[], %(owners)s::text[], %(tokens)s::bigint[],
              %(attempts)s::int[], %(names)s::text[], %(seqs)s::int[], %(results)s::text[])
    AS g(id, owner, token, attempt, name, seq, result)
), fence AS (
  SELECT j.id, g.token
  FROM {schema}.jobs AS j
  JOIN given AS g ON g.id = j.id
  WHERE j.status = 'running'
    AND j.lease_owner = g.owner
    AND j.lease_token = g.token
    AND j.lease_expires_at > now()
  ORDER BY j.id
  FOR SHARE OF j
)
INSERT INTO {schema}.job_steps (job_id, name, seq, attempt, lease_token, result)
SELECT g.id, g.name, g.seq, g.attempt, g.token, g.result::jsonb
FROM given AS g
JOIN fence AS f ON f.id = g.id AND f.token = g.token
ON CONFLICT DO NOTHING
RETURNING job_id, lease_token, name;

-- name: job_steps
SELECT name, seq, attempt, lease_token, recorded_at, result
FROM {schema}.job_steps
WHERE job_id = %(id)s
ORDER BY seq;

-- name: _job_records_deleted
-- (CTE batch with an array ids: jobs this statement deletes.) Their step records, signals,
-- children links and effect records go in the same statement: retention and purge never
-- leave any of them without its job (an effect record may hold the job's data).
effects_gone AS (
  DELETE FROM {schema}.job_effects AS f WHERE f.job_id = ANY((SELECT ids FROM batch)::bigint[])
), steps_gone AS (
  DELETE FROM {schema}.job_steps AS s WHERE s.job_id = ANY((SELECT ids FROM batch)::bigint[])
), signals_gone AS (
  DELETE FROM {schema}.job_signals AS g WHERE g.job_id = ANY((SELECT ids FROM batch)::bigint[])
), children_gone AS (
  DELETE FROM {schema}.job_children AS k
  WHERE k.parent_id = ANY((SELECT ids FROM batch)::bigint[])
), fanin_gone AS (
  DELETE FROM {schema}.job_fanin AS n
  WHERE n.parent_id = ANY((SELECT ids FROM batch)::bigint[])
)

-- name: restart_lock
-- `leaseq jobs restart --from-step`: the job row, held until the commit (no claim, cancel
-- or replay moves it meanwhile), with its status and the place of the step named.
SELECT j.status::text,
       (SELECT s.seq FROM {schema}.job_steps AS s WHERE s.job_id = j.id AND s.name = %(name)s)
FROM {schema}.jobs AS j
WHERE j.id = %(id)s
FOR UPDATE;

-- name: steps_delete_from
-- The restart's cut: the records of the step named and of every step after it go, in the
-- transaction of the replay that brings the job back (the records before it stay).
DELETE FROM {schema}.job_steps WHERE job_id = %(id)s AND seq >= %(seq)s
RETURNING name;

-- name: children_record
-- The children a spawning step enqueued, in that step's transaction (with its record): their
-- rows, each child naming its parent (its end may wake the parent: jobs_child_ended), and
-- the parent's gate row, which exists before any child can end (they commit together).
WITH linked AS (
  INSERT INTO {schema}.job_children (parent_id, step, child_id)
  SELECT %(id)s, %(step)s, unnest(%(children)s::bigint[])
  ON CONFLICT DO NOTHING
), named AS (
  UPDATE {schema}.jobs SET parent_id = %(id)s WHERE id = ANY(%(children)s::bigint[])
)
INSERT INTO {schema}.job_fanin (parent_id) VALUES (%(id)s)
ON CONFLICT DO NOTHING;

-- name: gather_gate
-- In a gather's suspension, after suspend_fence: the parent's gate row, held until the
-- commit, with the children this gather waits for. A child's end takes the same row first
-- (jobs_child_ended), so the children_states that follows sees every end committed before,
-- and an end committed after finds the parent suspended and wakes it.
UPDATE {schema}.job_fanin SET children = %(children)s::bigint[]
WHERE parent_id = %(id)s
RETURNING 1;

-- name: children_states
-- What gather waits for: each child's status (NULL: the row is gone), in the order given.
SELECT c.id, j.status::text
FROM unnest(%(children)s::bigint[]) WITH ORDINALITY AS c(id, n)
LEFT JOIN {schema}.jobs AS j ON j.id = c.id
ORDER BY c.n;

-- name: unfinished_children
-- A cancelled parent's children still to cancel.
SELECT k.child_id FROM {schema}.job_children AS k
JOIN {schema}.jobs AS j ON j.id = k.child_id
WHERE k.parent_id = %(id)s AND j.status IN ('pending', 'running', 'suspended')
ORDER BY k.child_id;
