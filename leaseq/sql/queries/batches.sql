-- Batches (leaseq.ops.batches_async; fired from leaseq.ops.ending_async with the
-- dependents). Whoever may change whether a batch is finished locks its row: an enqueue
-- into it, its seal, and every transition that ends one of its jobs (lock_batches_of).
-- fire_batches then decides with a new snapshot (READ COMMITTED), so the last of two
-- members ending at once sees the other's commit, and a seal sees every member that ended
-- before it.


-- name: _batch_keeps_it
-- (A jobs row, unaliased.) Does an unfinished batch still count this job? fire_batches
-- counts a batch's members from their rows, so retention (prune_finished) and purge_jobs
-- keep the rows of members of batches not yet done: a cancelled or dead member pruned
-- before the batch fired made it fire on_success with a smaller total. A batch only moves
-- towards done, so a batch seen done here stays done; one seen unfinished keeps its rows.
(batch_id IS NOT NULL
 AND EXISTS (SELECT 1 FROM {schema}.batches AS kb WHERE kb.id = batch_id AND kb.state <> 'done'))

-- name: create_batch
INSERT INTO {schema}.batches (on_success, on_failure, on_finish)
VALUES (%(on_success)s::jsonb, %(on_failure)s::jsonb, %(on_finish)s::jsonb)
RETURNING id;

-- name: lock_open_batch
-- An enqueue into a batch: the batch must still be open (held until this commits, so a
-- seal waits for these jobs and then counts them).
SELECT state FROM {schema}.batches WHERE id = %(id)s FOR UPDATE;

-- name: join_batch
-- Jobs just inserted join the batch; has_dependents routes their endings to the
-- coordinated statements, which fire the batch.
UPDATE {schema}.jobs
SET batch_id = %(batch_id)s, has_dependents = true
WHERE id = ANY(%(ids)s::bigint[]);

-- name: lock_batches_of
-- The unfinished batches of jobs that just ended, locked in id order.
SELECT b.id
FROM {schema}.batches AS b
WHERE b.id IN (SELECT j.batch_id FROM {schema}.jobs AS j
               WHERE j.id = ANY(%(ids)s::bigint[]) AND j.batch_id IS NOT NULL)
  AND b.state <> 'done'
ORDER BY b.id
FOR UPDATE;

-- name: seal_batch
UPDATE {schema}.batches
SET state = 'sealed', sealed_at = now()
WHERE id = %(id)s AND state = 'open'
RETURNING id;

-- name: fire_batches
-- For each sealed batch (locked by the caller) whose members have all ended: its callbacks
-- (success when every member succeeded, failure when any ended dead or cancelled, finish
-- always) become ordinary jobs, each recorded in batch_callbacks first (ON CONFLICT DO
-- NOTHING: at most once per batch and kind), with the batch id and counts in the payload.
WITH b AS (
  SELECT b.id, b.on_success, b.on_failure, b.on_finish,
         count(j.id) AS total,
         count(j.id) FILTER (WHERE j.status = 'succeeded') AS succeeded,
         count(j.id) FILTER (WHERE j.status = 'dead') AS dead,
         count(j.id) FILTER (WHERE j.status = 'cancelled') AS cancelled,
         count(j.id) FILTER (WHERE j.status IN ('pending', 'running', 'suspended')) AS live
  FROM {schema}.batches AS b
  LEFT JOIN {schema}.jobs AS j ON j.batch_id = b.id
  WHERE b.id = ANY(%(ids)s::bigint[]) AND b.state = 'sealed'
  GROUP BY b.id
), due AS (
  SELECT * FROM b WHERE live = 0
), calls AS (
  SELECT due.id AS batch_id, k.kind, k.spec, due.total, due.succeeded, due.dead,
         due.cancelled,
         nextval((SELECT pg_get_serial_sequence('{schema}.jobs', 'id'))::regclass) AS job_id
  FROM due,
       LATERAL (VALUES ('success', due.on_success), ('failure', due.on_failure),
                       ('finish', due.on_finish)) AS k(kind, spec)
  WHERE k.spec IS NOT NULL
    AND (k.kind = 'finish' OR (k.kind = 'success') = (due.dead + due.cancelled = 0))
), cb AS (
  INSERT INTO {schema}.batch_callbacks (batch_id, kind, job_id)
  SELECT batch_id, kind, job_id FROM calls
  ON CONFLICT DO NOTHING
  RETURNING batch_id, kind, job_id
), ins AS (
  INSERT INTO {schema}.jobs
    (id, queue_name, task, payload, priority, base_priority, max_attempts, cost)
  OVERRIDING SYSTEM VALUE
  SELECT cb.job_id, c.spec->>'queue', c.spec->>'task',
         jsonb_build_object('batch_id', c.batch_id, 'kind', c.kind, 'total', c.total,
                            'succeeded', c.succeeded, 'dead', c.dead,
                            'cancelled', c.cancelled, 'payload', c.spec->'payload'),
         (c.spec->>'priority')::int, (c.spec->>'priority')::int,
         (c.spec->>'max_attempts')::int,
         -- A spec stored before job cost (version 30) has none: cost 1.
         coalesce((c.spec->>'cost')::int, 1)
  FROM cb JOIN calls AS c ON c.batch_id = cb.batch_id AND c.kind = cb.kind
  RETURNING id, queue_name
), done AS (
  UPDATE {schema}.batches AS x
  SET state = 'done', finished_at = now()
  FROM due
  WHERE x.id = due.id
)
SELECT id, pg_notify(%(channel)s, queue_name)::text FROM ins;

-- name: get_batch
-- `leaseq batches show`: the batch, its members' counts by status and its callbacks.
SELECT b.id, b.state, b.created_at, b.sealed_at, b.finished_at,
       b.on_success->>'task', b.on_failure->>'task', b.on_finish->>'task',
       (SELECT coalesce(jsonb_object_agg(s, n), '{}'::jsonb)
          FROM (SELECT j.status::text AS s, count(*) AS n FROM {schema}.jobs AS j
                WHERE j.batch_id = b.id GROUP BY j.status) AS c),
       (SELECT coalesce(jsonb_object_agg(kind, job_id), '{}'::jsonb)
          FROM {schema}.batch_callbacks AS k WHERE k.batch_id = b.id)
FROM {schema}.batches AS b
WHERE b.id = %(id)s;

-- name: job_batch
SELECT batch_id FROM {schema}.jobs WHERE id = %(id)s;
