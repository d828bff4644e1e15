-- leaseq schema, version 4: per-queue health for psql users, `leaseq status` and the
-- metrics endpoint. Each part reads one partial index (pending, running, dead), so it stays
-- cheap however much finished history the table holds.

CREATE VIEW {schema}.queue_stats AS
WITH pending AS (
  SELECT queue_name,
         count(*) FILTER (WHERE available_at <= now()) AS ready,
         count(*) FILTER (WHERE available_at > now()) AS scheduled,
         min(available_at) FILTER (WHERE available_at <= now()) AS oldest_ready
  FROM {schema}.jobs
  WHERE status = 'pending'
  GROUP BY queue_name
), running AS (
  SELECT queue_name,
         count(*) AS running,
         count(*) FILTER (WHERE lease_expires_at < now() + interval '10 seconds') AS near_expiry
  FROM {schema}.jobs
  WHERE status = 'running'
  GROUP BY queue_name
), dead AS (
  SELECT queue_name, count(*) AS dead, min(finished_at) AS oldest_dead
  FROM {schema}.jobs
  WHERE status = 'dead'
  GROUP BY queue_name
)
SELECT queue_name,
       coalesce(ready, 0) AS ready,
       coalesce(scheduled, 0) AS scheduled,
       coalesce(running, 0) AS running,
       coalesce(dead, 0) AS dead,
       coalesce(extract(epoch FROM now() - oldest_ready), 0)::float8 AS oldest_ready_age,
       coalesce(extract(epoch FROM now() - oldest_dead), 0)::float8 AS oldest_dead_age,
       coalesce(near_expiry, 0) AS near_expiry
FROM pending
FULL JOIN running USING (queue_name)
FULL JOIN dead USING (queue_name);
