-- Periodic schedules (leaseq.ops.schedules_async, leaseq.worker.maintenance.Ticker).


-- name: _schedule_columns
-- A schedule row as leaseq.rows.schedule_from_row reads it, with its last job's status.
s.name, s.task, s.cron, s.every_seconds, s.payload::text, s.tz, s.queue, s.priority,
s.max_attempts, s.catch_up, s.catch_up_max, s.grace_seconds, s.overlap, s.enabled, s.source,
s.last_tick, s.next_tick, s.last_job_id,
(SELECT j.status::text FROM {schema}.jobs AS j WHERE j.id = s.last_job_id) AS last_job_status,
s.skipped_ticks, s.updated_by, s.updated_at, s.created_at, s.cost

-- name: lock_due_schedule
-- One due schedule, locked for this ticker's transaction; tickers skip each other's rows.
-- A row another ticker just advanced is re-checked against the WHERE after its commit, so
-- it is not due any more. now() is this transaction's clock, which the ticks are computed
-- against (never the worker's).
SELECT {_schedule_columns}, now()
FROM {schema}.schedules AS s
WHERE s.enabled AND s.next_tick <= now()
ORDER BY s.next_tick
LIMIT 1
FOR UPDATE OF s SKIP LOCKED;

-- name: lock_schedule
-- The schedule row's lock: held by whatever creates a schedule's jobs or changes it.
SELECT {_schedule_columns}, now()
FROM {schema}.schedules AS s
WHERE s.name = %(name)s
FOR UPDATE OF s;

-- name: tick_job
-- The tick row and its job in ONE statement: the job is inserted only if the tick row was
-- (ON CONFLICT DO NOTHING), so a tick enqueues at most one job however many tickers
-- computed it. The job id is drawn first so the tick row can name it (a CTE cannot update
-- a row a sibling CTE inserted). For overlap "queue" the job carries the schedule's
-- ordering key and waits behind its predecessor; the caller holds that key's lock.
WITH id AS (
  SELECT nextval(pg_get_serial_sequence('{schema}.jobs', 'id')) AS id
), tick AS (
  INSERT INTO {schema}.schedule_ticks (schedule_name, tick_at, job_id, catch_up, manual)
  SELECT %(name)s, %(tick_at)s, id.id, %(catch_up)s, %(manual)s FROM id
  ON CONFLICT DO NOTHING
  RETURNING job_id
), job AS (
  INSERT INTO {schema}.jobs
    (id, queue_name, task, payload, priority, base_priority, max_attempts, idempotency_key,
     ordering_key, key_policy, blocked, cost)
  OVERRIDING SYSTEM VALUE
  SELECT tick.job_id, s.queue, s.task, s.payload, s.priority, s.priority, s.max_attempts,
         %(idempotency_key)s, %(ordering_key)s::text, 'skip',
         %(ordering_key)s::text IS NOT NULL AND EXISTS (
           SELECT 1 FROM {schema}.jobs AS b
           WHERE b.ordering_key = %(ordering_key)s::text AND {_key_blocking}
         ),
         s.cost
  FROM tick JOIN {schema}.schedules AS s ON s.name = %(name)s
  RETURNING id, queue_name
)
SELECT id, pg_notify(%(channel)s, queue_name)::text FROM job;

-- name: skip_tick
-- A tick the overlap policy did not run: recorded with its reason, no job.
INSERT INTO {schema}.schedule_ticks (schedule_name, tick_at, catch_up, skipped)
VALUES (%(name)s, %(tick_at)s, %(catch_up)s, %(reason)s)
ON CONFLICT DO NOTHING
RETURNING 1;

-- name: advance_schedule
-- After the ticks of one round, under the row lock taken by lock_due_schedule.
UPDATE {schema}.schedules
SET last_tick = coalesce(%(last_tick)s, last_tick),
    next_tick = %(next_tick)s,
    last_job_id = coalesce(%(last_job_id)s, last_job_id),
    skipped_ticks = skipped_ticks + %(skipped)s
WHERE name = %(name)s;

-- name: park_schedule
-- A stored schedule whose ticks this code cannot compute (say, written by another version):
-- disabled, so it cannot stall the tickers; the caller audits why.
UPDATE {schema}.schedules
SET enabled = false, updated_by = %(actor)s, updated_at = now()
WHERE name = %(name)s;

-- name: next_tick_in
-- Seconds until the earliest enabled schedule is due (negative: overdue); NULL: none.
SELECT extract(epoch FROM min(next_tick) - now())::float8
FROM {schema}.schedules WHERE enabled;

-- name: upsert_code_schedule
-- A schedule declared in code, at worker start. Its timing and policies follow the code;
-- next_tick moves only when the timing changed (or it was just re-enabled by the code);
-- `enabled` follows the code only when the code's flag changed, so an operator's
-- enable/disable outlasts restarts. A dynamic schedule of the same name is left alone
-- (the caller sees no row and reports it).
INSERT INTO {schema}.schedules AS s
  (name, task, cron, every_seconds, payload, tz, queue, priority, max_attempts, catch_up,
   catch_up_max, grace_seconds, overlap, enabled, declared_enabled, source, next_tick,
   updated_by, cost)
VALUES (%(name)s, %(task)s, %(cron)s, %(every_seconds)s, %(payload)s::jsonb, %(tz)s,
        %(queue)s, %(priority)s, %(max_attempts)s, %(catch_up)s, %(catch_up_max)s,
        %(grace_seconds)s, %(overlap)s, %(enabled)s, %(enabled)s, 'code', %(next_tick)s,
        %(actor)s, %(cost)s)
ON CONFLICT (name) DO UPDATE
SET task = excluded.task, payload = excluded.payload, queue = excluded.queue,
    priority = excluded.priority, max_attempts = excluded.max_attempts, cost = excluded.cost,
    catch_up = excluded.catch_up, catch_up_max = excluded.catch_up_max,
    grace_seconds = excluded.grace_seconds, overlap = excluded.overlap,
    cron = excluded.cron, every_seconds = excluded.every_seconds, tz = excluded.tz,
    enabled = CASE WHEN s.declared_enabled IS DISTINCT FROM excluded.declared_enabled
                   THEN excluded.enabled ELSE s.enabled END,
    declared_enabled = excluded.declared_enabled,
    next_tick = CASE
      WHEN (s.cron, s.every_seconds, s.tz) IS DISTINCT FROM
           (excluded.cron, excluded.every_seconds, excluded.tz)
        OR (NOT s.enabled AND excluded.enabled
            AND s.declared_enabled IS DISTINCT FROM excluded.declared_enabled)
      THEN excluded.next_tick ELSE s.next_tick END,
    updated_by = CASE WHEN (s.task, s.cron, s.every_seconds, s.payload, s.tz, s.queue,
                            s.priority, s.max_attempts, s.catch_up, s.catch_up_max,
                            s.grace_seconds, s.overlap, s.declared_enabled, s.cost)
                           IS DISTINCT FROM
                           (excluded.task, excluded.cron, excluded.every_seconds,
                            excluded.payload, excluded.tz, excluded.queue, excluded.priority,
                            excluded.max_attempts, excluded.catch_up, excluded.catch_up_max,
                            excluded.grace_seconds, excluded.overlap,
                            excluded.declared_enabled, excluded.cost)
                      THEN excluded.updated_by ELSE s.updated_by END,
    updated_at = now()
WHERE s.source = 'code'
RETURNING name;

-- name: disable_undeclared_schedules
-- Code schedules of this app's tasks that the code no longer declares: disabled, history
-- kept (a later declaration enables them again).
UPDATE {schema}.schedules
SET enabled = false, declared_enabled = false, updated_by = %(actor)s, updated_at = now()
WHERE source = 'code' AND enabled AND task = ANY(%(tasks)s::text[])
  AND name <> ALL(%(names)s::text[])
RETURNING name;

-- name: insert_schedule
-- A dynamic schedule (Client.schedule_add); a name already taken is an error.
INSERT INTO {schema}.schedules
  (name, task, cron, every_seconds, payload, tz, queue, priority, max_attempts, catch_up,
   catch_up_max, grace_seconds, overlap, enabled, source, next_tick, updated_by, cost)
VALUES (%(name)s, %(task)s, %(cron)s, %(every_seconds)s, %(payload)s::jsonb, %(tz)s,
        %(queue)s, %(priority)s, %(max_attempts)s, %(catch_up)s, %(catch_up_max)s,
        %(grace_seconds)s, %(overlap)s, %(enabled)s, 'dynamic', %(next_tick)s, %(actor)s,
        %(cost)s)
ON CONFLICT (name) DO NOTHING
RETURNING name;

-- name: update_schedule
-- Client.schedule_change, under the row lock: every column given (the caller merged the
-- change into the current row).
UPDATE {schema}.schedules
SET task = %(task)s, cron = %(cron)s, every_seconds = %(every_seconds)s,
    payload = %(payload)s::jsonb, tz = %(tz)s, queue = %(queue)s, priority = %(priority)s,
    max_attempts = %(max_attempts)s, catch_up = %(catch_up)s, catch_up_max = %(catch_up_max)s,
    grace_seconds = %(grace_seconds)s, overlap = %(overlap)s, enabled = %(enabled)s,
    cost = %(cost)s, next_tick = %(next_tick)s, updated_by = %(actor)s, updated_at = now()
WHERE name = %(name)s;

-- name: delete_schedule
-- Only dynamic schedules are deleted (code ones come back at the next worker start: disable
-- them instead); their tick history goes with them.
WITH gone AS (
  DELETE FROM {schema}.schedules WHERE name = %(name)s AND source = 'dynamic' RETURNING name
)
DELETE FROM {schema}.schedule_ticks AS t USING gone WHERE t.schedule_name = gone.name
RETURNING 1;

-- name: list_schedules
SELECT {_schedule_columns}, now()
FROM {schema}.schedules AS s
WHERE %(name)s::text IS NULL OR s.name = %(name)s
ORDER BY s.name;

-- name: schedule_ticks
SELECT tick_at, job_id, catch_up, manual, skipped, created_at
FROM {schema}.schedule_ticks
WHERE schedule_name = %(name)s
ORDER BY tick_at DESC
LIMIT %(limit)s;

-- name: prune_schedule_ticks
-- Retention for tick rows: safe to delete, since a tick is only ever inserted at or after
-- its schedule's next_tick, which has moved past every stored one.
WITH doomed AS (
  SELECT t.schedule_name, t.tick_at FROM {schema}.schedule_ticks AS t
  WHERE t.created_at < now() - make_interval(secs => %(older_than)s)
  LIMIT %(limit)s
)
DELETE FROM {schema}.schedule_ticks AS t USING doomed
WHERE t.schedule_name = doomed.schedule_name AND t.tick_at = doomed.tick_at
RETURNING 1;

-- name: schedule_lag
-- The most overdue enabled schedule: seconds past its next tick (0 when none is overdue).
SELECT coalesce(greatest(extract(epoch FROM now() - min(next_tick)), 0), 0)::float8
FROM {schema}.schedules WHERE enabled;
