-- The web dashboard (leaseq.ops.web_async, leaseq.web). Every statement here runs in a
-- transaction that began with web_statement_timeout, and returns a bounded number of rows.


-- name: web_statement_timeout
-- SET LOCAL takes no parameters; set_config(..., true) is the same, scoped to the
-- transaction, so a slow page is cancelled by the server instead of piling up. Custom
-- plans only: a generic plan of "x IS NULL OR col = x" filters cannot prove a partial
-- index's predicate (status = 'dead'), and the dashboard's few reads plan in microseconds.
-- No JIT: a page's reads touch few rows, but a per-row subquery (list_limits) is costed
-- over the whole jobs table and JIT compiling it took a second, longer than the read.
SELECT set_config('statement_timeout', %(ms)s, true),
       set_config('plan_cache_mode', 'force_custom_plan', true),
       set_config('jit', 'off', true);

-- name: web_queue_stats
-- The queue_stats view (partial indexes only since migration 14), bounded for a page.
SELECT queue_name, ready, scheduled, running, dead, oldest_ready_age, oldest_dead_age,
       near_expiry
FROM {schema}.queue_stats
ORDER BY queue_name
LIMIT 1000;

-- name: web_throughput
-- Jobs finished per queue and minute over the last hour, among the newest %(window)s jobs
-- only (a primary-key range): there is no index on finished_at (completions stay cheap),
-- so the count is capped rather than a scan of all history. minute 0 is the current one.
SELECT queue_name,
       least(59, floor(extract(epoch FROM now() - finished_at) / 60))::int AS minute,
       count(*)
FROM {schema}.jobs
WHERE id > (SELECT coalesce(max(id), 0) FROM {schema}.jobs) - %(window)s
  AND status IN ('succeeded', 'dead', 'cancelled')
  AND finished_at > now() - interval '1 hour'
GROUP BY 1, 2;

-- name: web_jobs
-- The job list: newest first, keyset-paginated by id (%(before)s: the last id of the
-- previous page). Walks the primary key backwards and stops at LIMIT, so the default page
-- reads a few index entries; a narrow filter reads more of them, bounded by the timeout.
SELECT {_job_columns}
FROM {schema}.jobs
WHERE (%(statuses)s::{schema}.job_status[] IS NULL OR status = ANY(%(statuses)s))
  AND (%(queue)s::text IS NULL OR queue_name = %(queue)s)
  AND (%(task)s::text IS NULL OR task = %(task)s)
  AND (%(error_code)s::text IS NULL OR last_error_code = %(error_code)s)
  AND (%(ordering_key)s::text IS NULL OR ordering_key = %(ordering_key)s)
  AND (%(unique_key)s::text IS NULL OR unique_key = %(unique_key)s)
  AND (%(payload)s::jsonb IS NULL OR payload @> %(payload)s::jsonb)
  AND (%(before)s::bigint IS NULL OR id < %(before)s)
  AND (%(created_after)s::timestamptz IS NULL OR created_at >= %(created_after)s)
  AND (%(created_before)s::timestamptz IS NULL OR created_at < %(created_before)s)
ORDER BY id DESC
LIMIT %(limit)s;

-- name: web_count_dead
-- The dry run of a bulk replay or purge: how many dead jobs the filter matches, counted
-- up to %(cap)s (the dead partial index; the page says "cap+" beyond it).
SELECT count(*) FROM (
  SELECT 1 FROM {schema}.jobs WHERE {_job_filter} LIMIT %(cap)s
) AS capped;

-- name: web_job_ordering_key
-- The job page's extras models.Job does not carry: its ordering key, whether it waits on
-- dependencies (pending but not claimable yet) or is blocked behind its key's head.
SELECT ordering_key, waiting, blocked FROM {schema}.jobs WHERE id = %(id)s;

-- name: web_dead_jobs
-- One page of the dead list, newest first, keyset-paginated by id like web_jobs; the
-- dead partial index holds every candidate, so even a deep page reads dead rows only.
SELECT {_job_columns}
FROM {schema}.jobs
WHERE {_job_filter}
  AND (%(before)s::bigint IS NULL OR id < %(before)s)
ORDER BY id DESC
LIMIT %(limit)s;

-- name: web_waiting_counts
-- Jobs waiting on dependencies per queue (the waiting partial index): queue_stats counts
-- them nowhere, neither ready nor scheduled.
SELECT queue_name, count(*)
FROM {schema}.jobs
WHERE waiting
GROUP BY queue_name
ORDER BY queue_name
LIMIT 1000;

-- name: web_workers
-- /workers: who holds leases now (the running partial index): per lease owner, how many
-- jobs, since when, the last heartbeat, how many leases ran out and await the sweep
-- (stale), and the first held job ids.
SELECT lease_owner, count(*), min(started_at), max(heartbeat_at),
       count(*) FILTER (WHERE lease_expires_at < now()),
       (array_agg(id ORDER BY id))[1:20]
FROM {schema}.jobs
WHERE status = 'running'
GROUP BY lease_owner
ORDER BY lease_owner
LIMIT 1000;

-- name: web_task_stats
-- /tasks: per task over the newest %(window)s jobs (a primary-key range, as the
-- throughput; there is no index on finished_at) that finished in the last %(seconds)s:
-- how many succeeded and died, run time percentiles of the successes (started_at to
-- finished_at; the last attempt's), and the failure rate dead / (succeeded + dead).
SELECT task,
       count(*) FILTER (WHERE status = 'succeeded'),
       count(*) FILTER (WHERE status = 'dead'),
       percentile_cont(ARRAY[0.5, 0.95, 0.99]::float8[]) WITHIN GROUP (
         ORDER BY extract(epoch FROM finished_at - started_at)::float8
       ) FILTER (WHERE status = 'succeeded' AND started_at IS NOT NULL),
       (count(*) FILTER (WHERE status = 'dead'))::float8
         / greatest(count(*) FILTER (WHERE status IN ('succeeded', 'dead')), 1)
FROM {schema}.jobs
WHERE id > (SELECT coalesce(max(id), 0) FROM {schema}.jobs) - %(window)s
  AND status IN ('succeeded', 'dead')
  AND finished_at > now() - make_interval(secs => %(seconds)s)
GROUP BY task
ORDER BY task
LIMIT 1000;

-- name: web_dead_groups
-- /dead grouped by error code (the dead partial index): how many, the newest and oldest
-- finish, and one example job; the biggest groups first.
SELECT last_error_code, count(*), max(finished_at), min(finished_at), max(id)
FROM {schema}.jobs
WHERE status = 'dead'
  AND (%(queue)s::text IS NULL OR queue_name = %(queue)s)
GROUP BY last_error_code
ORDER BY count(*) DESC, last_error_code
LIMIT 100;

-- name: web_state_estimates
-- The job list's per-state counts of history (succeeded, cancelled), which no partial
-- index holds: the planner's estimate (pg_stats x reltuples), not a count of rows. The
-- live states are counted exactly from web_queue_stats.
SELECT m.v, round(m.f * greatest(c.reltuples, 0))::bigint
FROM pg_class AS c
JOIN pg_namespace AS n ON n.oid = c.relnamespace
JOIN pg_stats AS s ON s.schemaname = n.nspname AND s.tablename = c.relname
                  AND s.attname = 'status'
CROSS JOIN LATERAL unnest(s.most_common_vals::text::text[], s.most_common_freqs) AS m(v, f)
WHERE c.oid = '{schema}.jobs'::regclass;

-- name: web_task_names
-- The task filter's suggestions: the distinct task names among the newest %(window)s jobs
-- (the primary key walked backwards and stopped at the window). No index leads with task,
-- so a DISTINCT over all history would scan the table; a task not run recently is not
-- suggested (typing it still filters).
SELECT DISTINCT task
FROM (SELECT task FROM {schema}.jobs ORDER BY id DESC LIMIT %(window)s) AS recent
ORDER BY task
LIMIT 200;

-- name: web_error_codes
-- The error code filter's suggestions, from the same bounded window as web_task_names
-- (no index leads with last_error_code either).
SELECT DISTINCT last_error_code
FROM (
  SELECT last_error_code FROM {schema}.jobs ORDER BY id DESC LIMIT %(window)s
) AS recent
WHERE last_error_code IS NOT NULL
ORDER BY last_error_code
LIMIT 200;
