-- leaseq schema, version 22: the autoscaling signal (docs/autoscaling.md).
--
-- queue_scaling holds what an autoscaler cannot see from the jobs: how many handlers one
-- worker of the queue runs (WorkerConfig.concurrency) and the bounds of its worker count.
-- The view autoscaling gives one row per queue with work or a setting: the claimable
-- backlog (0 while the queue is paused), the running count, the oldest claimable job's
-- wait, and suggested_workers = ceil(min(claimable + running, the queue's concurrency
-- limit) / concurrency) within [min_workers, max_workers]. KEDA's postgresql scaler reads
-- it with targetQueryValue 1; leaseq web serves it at /api/v1/autoscaling.
CREATE TABLE {schema}.queue_scaling (
  queue_name text PRIMARY KEY,
  concurrency integer NOT NULL,
  min_workers integer NOT NULL DEFAULT 0,
  max_workers integer,
  updated_by text,
  updated_at timestamptz NOT NULL DEFAULT now(),
  CONSTRAINT queue_scaling_queue_bounded CHECK (length(queue_name) BETWEEN 1 AND 128),
  CONSTRAINT queue_scaling_concurrency CHECK (concurrency BETWEEN 1 AND 10000),
  CONSTRAINT queue_scaling_min CHECK (min_workers BETWEEN 0 AND 100000),
  CONSTRAINT queue_scaling_max CHECK (max_workers BETWEEN greatest(min_workers, 1) AND 100000),
  CONSTRAINT queue_scaling_by_bounded CHECK (length(updated_by) <= 200)
);

-- The claimable rows come from jobs_claimable_idx's predicate, so the backlog is counted
-- from that partial index; the running rows from jobs_expired_lease_idx's.
CREATE VIEW {schema}.autoscaling AS
WITH claimable AS (
  SELECT queue_name, count(*) AS claimable, min(available_at) AS oldest
  FROM {schema}.jobs
  WHERE status = 'pending' AND NOT blocked AND NOT waiting AND available_at <= now()
  GROUP BY queue_name
), running AS (
  SELECT queue_name, count(*) AS running
  FROM {schema}.jobs
  WHERE status = 'running'
  GROUP BY queue_name
), queues AS (
  SELECT queue_name FROM claimable
  UNION
  SELECT queue_name FROM running
  UNION
  SELECT queue_name FROM {schema}.queue_scaling
), counted AS (
  SELECT q.queue_name,
         CASE WHEN p.value IS NULL THEN coalesce(c.claimable, 0) ELSE 0 END AS claimable,
         coalesce(r.running, 0) AS running,
         CASE WHEN p.value IS NULL
           THEN coalesce(extract(epoch FROM now() - c.oldest), 0) ELSE 0 END::float8
           AS oldest_wait,
         p.value IS NOT NULL AS paused,
         -- Without a setting: WorkerConfig's default concurrency.
         coalesce(s.concurrency, 10) AS concurrency,
         coalesce(s.min_workers, 0) AS min_workers,
         s.max_workers,
         l.concurrency AS queue_limit
  FROM queues AS q
  LEFT JOIN claimable AS c ON c.queue_name = q.queue_name
  LEFT JOIN running AS r ON r.queue_name = q.queue_name
  LEFT JOIN {schema}.queue_scaling AS s ON s.queue_name = q.queue_name
  LEFT JOIN {schema}.pauses AS p ON p.scope = 'queue' AND p.value = q.queue_name
  LEFT JOIN {schema}.limits AS l ON l.name = 'queue:' || q.queue_name
)
SELECT queue_name AS queue, claimable, running, oldest_wait, paused, concurrency,
       min_workers, max_workers, queue_limit,
       least(greatest(
               ceil(least(claimable + running, coalesce(queue_limit, claimable + running))
                    ::numeric / concurrency)::integer,
               min_workers),
             coalesce(max_workers, 2147483647)) AS suggested_workers
FROM counted;
