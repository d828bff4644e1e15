-- Reading jobs, their trail and the queues' health (leaseq.ops.inspect_async).


-- name: get_job
-- The payload as text: the client decodes it, and shows a row it cannot decode (leaseq.rows).
SELECT {_job_columns}
FROM {schema}.jobs
WHERE id = %(id)s;

-- name: list_jobs
-- Operator listing (dead list, inspection), newest first.
SELECT {_job_columns}
FROM {schema}.jobs
WHERE {_job_filter}
ORDER BY id DESC
LIMIT %(limit)s;

-- name: job_events
SELECT id, job_id, at, event, from_status::text, to_status::text, actor, lease_token,
       attempt, error_code, detail, error_class
FROM {schema}.job_events
WHERE job_id = %(id)s
ORDER BY id;

-- name: queues_have_work
-- Drain mode's stop test: the partial indexes answer it without touching history. A
-- suspended job with a wake-up time is work to come (like a scheduled one); one waiting for
-- a signal without a timeout is not (a drain would wait for it for ever).
SELECT EXISTS (
  SELECT 1 FROM {schema}.jobs
  WHERE status = 'pending' AND queue_name = ANY(%(queues)s::text[])
) OR EXISTS (
  SELECT 1 FROM {schema}.jobs
  WHERE status = 'running' AND queue_name = ANY(%(queues)s::text[])
) OR EXISTS (
  SELECT 1 FROM {schema}.jobs
  WHERE wake_at IS NOT NULL AND wake_at < 'infinity' AND queue_name = ANY(%(queues)s::text[])
);

-- name: held_jobs
-- What a burst worker leaves behind when nothing is claimable: due jobs of these queues held
-- back by a pause (queue, task or ordering key), then those held otherwise (a concurrency
-- or rate limit, an ordering key's predecessor still running elsewhere). Said in its exit
-- line, so a burst that stops early is never taken for an empty queue.
SELECT count(*) FILTER (WHERE h.paused), count(*) FILTER (WHERE NOT h.paused)
FROM (
  SELECT EXISTS (
           SELECT 1 FROM {schema}.pauses AS p
           WHERE (p.scope = 'queue' AND p.value = j.queue_name)
              OR (p.scope = 'task' AND p.value = j.task)
              OR (p.scope = 'ordering_key' AND p.value = j.ordering_key)
         ) AS paused
  FROM {schema}.jobs AS j
  WHERE j.status = 'pending' AND NOT j.blocked AND NOT j.waiting AND j.available_at <= now()
    AND j.queue_name = ANY(%(queues)s::text[])
) AS h;

-- name: queue_stats
-- Per-queue health from the view (partial indexes only: cheap on any history).
SELECT queue_name, ready, scheduled, running, dead, oldest_ready_age, oldest_dead_age,
       near_expiry
FROM {schema}.queue_stats
ORDER BY queue_name;

-- name: recent_throughput
-- Jobs finished per queue in the last %(seconds)s seconds. This one scans finished rows
-- (there is no index on finished_at, to keep completions cheap): for humans, not scrapes.
SELECT queue_name, count(*)
FROM {schema}.jobs
WHERE status IN ('succeeded', 'dead', 'cancelled')
  AND finished_at > now() - make_interval(secs => %(seconds)s)
GROUP BY queue_name;

-- name: database_health
-- The rest of the database metrics: leases waiting for a sweep (running partial index),
-- and what pg_stat_activity says about leaseq's own connections.
SELECT
  (SELECT count(*) FROM {schema}.jobs
    WHERE status = 'running' AND lease_expires_at <= now()),
  (SELECT count(*) FROM pg_stat_activity
    WHERE wait_event_type = 'Lock' AND left(application_name, 6) = 'leaseq'),
  (SELECT coalesce(json_object_agg(application_name, n), '{}'::json)
     FROM (SELECT application_name, count(*) AS n FROM pg_stat_activity
           WHERE left(application_name, 6) = 'leaseq' GROUP BY application_name) AS c);
