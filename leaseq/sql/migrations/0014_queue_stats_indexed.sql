-- queue_stats reads pending rows through the partial indexes only (version 14): it read
-- them by status alone, which no index covers (the claim index leaves blocked rows out),
-- so on a long history every `leaseq status`, metrics scrape and dashboard page scanned the
-- whole jobs table. Pending is the claim index's rows plus the blocked ones, which only
-- keyed jobs can be (the ordering index). Jobs waiting for dependencies stay out, as before.
CREATE OR REPLACE VIEW {schema}.queue_stats AS
WITH pending_rows AS (
  SELECT queue_name, available_at FROM {schema}.jobs
  WHERE status = 'pending' AND NOT blocked AND NOT waiting
  UNION ALL
  SELECT queue_name, available_at FROM {schema}.jobs
  WHERE status = 'pending' AND blocked AND ordering_key IS NOT NULL AND NOT waiting
), pending AS (
  SELECT queue_name,
         count(*) FILTER (WHERE available_at <= now()) AS ready,
         count(*) FILTER (WHERE available_at > now()) AS scheduled,
         min(available_at) FILTER (WHERE available_at <= now()) AS oldest_ready
  FROM pending_rows
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
