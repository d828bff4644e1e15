-- The keys of fair queues (leaseq.ops.fair_async, docs/fairness.md): operators' weights,
-- the per-key reads of the CLI, dashboard and metrics, and the pruning of idle keys. The
-- fair claim itself is in fair.sql.


-- name: set_fair_weight
-- An operator's weight for a key of a fair queue (audited): its share of the claims is
-- weight / the sum of the weights of the keys with claimable work.
WITH up AS (
  INSERT INTO {schema}.fair_keys AS f (queue_name, fairness_key, weight)
  VALUES (%(queue)s, %(key)s, %(weight)s)
  ON CONFLICT (queue_name, fairness_key) DO UPDATE SET weight = excluded.weight
  RETURNING f.queue_name
)
INSERT INTO {schema}.admin_events (actor, action, scope, value, reason, detail)
SELECT %(actor)s, 'fair_weight', 'fair_key', %(queue)s || '/' || %(key)s, %(reason)s,
       'weight ' || %(weight)s::text
FROM up;

-- name: fair_keys
-- The keys of a fair queue with their weights and backlogs (claimable now), the largest
-- backlogs first, bounded (the CLI, dashboard and metrics show the top keys only).
SELECT f.fairness_key, f.weight, f.pass, f.parked_until IS NOT NULL AND f.parked_until > now(),
       CASE WHEN f.fairness_key = ''
         THEN (SELECT count(*) FROM {schema}.jobs AS c
                WHERE c.queue_name = f.queue_name AND c.fairness_key IS NULL
                  AND c.status = 'pending' AND NOT c.blocked AND NOT c.waiting)
         ELSE (SELECT count(*) FROM {schema}.jobs AS c
                WHERE c.queue_name = f.queue_name AND c.fairness_key = f.fairness_key
                  AND c.status = 'pending' AND NOT c.blocked AND NOT c.waiting)
       END AS backlog,
       (SELECT count(*) FROM {schema}.jobs AS r
         WHERE r.status = 'running' AND r.queue_name = f.queue_name
           AND r.fairness_key IS NOT DISTINCT FROM nullif(f.fairness_key, '')) AS running
FROM {schema}.fair_keys AS f
WHERE f.queue_name = %(queue)s
ORDER BY 5 DESC, f.fairness_key
LIMIT %(limit)s;

-- name: fair_key_stats
-- The database metrics of fair queues: per queue, its keys with the largest backlogs (at
-- most %(top)s, a bound on the label sets), each with its backlog (pending, claimable or
-- waiting for its turn) and its share (its weight over the weights of the queue's keys with
-- a backlog). One grouped read of jobs_fair_idx; jobs without a key are the key ''.
WITH backlog AS (
  SELECT queue_name, fairness_key, count(*) AS n FROM {schema}.jobs
  WHERE status = 'pending' AND NOT blocked AND NOT waiting AND fairness_key IS NOT NULL
  GROUP BY 1, 2
  UNION ALL
  SELECT j.queue_name, '', count(*) FROM {schema}.jobs AS j
  WHERE j.status = 'pending' AND NOT j.blocked AND NOT j.waiting AND j.fairness_key IS NULL
    AND j.queue_name IN (SELECT DISTINCT queue_name FROM {schema}.fair_keys)
  GROUP BY 1
), ranked AS (
  SELECT b.queue_name, b.fairness_key, b.n, coalesce(f.weight, 1) AS weight,
         row_number() OVER (PARTITION BY b.queue_name ORDER BY b.n DESC, b.fairness_key) AS r,
         sum(coalesce(f.weight, 1)) OVER (PARTITION BY b.queue_name) AS total
  FROM backlog AS b
  LEFT JOIN {schema}.fair_keys AS f
    ON f.queue_name = b.queue_name AND f.fairness_key = b.fairness_key
)
SELECT queue_name, fairness_key, n, weight / total
FROM ranked
WHERE r <= %(top)s
ORDER BY queue_name, r;

-- name: prune_fair_keys
-- Upkeep of fair queues (the worker's FairKeyPruner): delete keys idle (no enqueue, wake-up
-- or claim) for %(older_than)s seconds with no live job left, at most %(limit)s. Never the
-- queue's key '' (its keyless jobs' turn) nor a key an operator weighted. A live job is
-- pending (in jobs_fair_idx: claimable, scheduled or paused), running, or asleep with a
-- wake-up time; a job blocked by its ordering key, waiting for dependencies or for a
-- signal becomes claimable only through the jobs_fair_ready trigger, which re-creates the
-- key. Against a concurrent enqueue or wake-up of a key (both bump gen under the row's
-- lock): the delete takes the row only if its gen is still the one read here (a row
-- changed meanwhile is re-checked on its new version: kept); and one that comes after the
-- delete inserts the key again (its ON CONFLICT waits for this transaction).
WITH live AS MATERIALIZED (
  SELECT DISTINCT r.queue_name, r.fairness_key FROM {schema}.jobs AS r
  WHERE r.status = 'running' AND r.fairness_key IS NOT NULL
  UNION
  SELECT DISTINCT s.queue_name, s.fairness_key FROM {schema}.jobs AS s
  WHERE s.wake_at IS NOT NULL AND s.fairness_key IS NOT NULL
), cand AS MATERIALIZED (
  SELECT f.queue_name, f.fairness_key, f.gen
  FROM {schema}.fair_keys AS f
  WHERE f.fairness_key <> '' AND f.weight = 1
    AND f.active_at < now() - make_interval(secs => %(older_than)s)
    AND NOT EXISTS (SELECT 1 FROM {schema}.jobs AS c
                    WHERE c.queue_name = f.queue_name AND c.fairness_key = f.fairness_key
                      AND c.status = 'pending' AND NOT c.blocked AND NOT c.waiting)
    AND NOT EXISTS (SELECT 1 FROM live AS l
                    WHERE l.queue_name = f.queue_name AND l.fairness_key = f.fairness_key)
  LIMIT %(limit)s
)
DELETE FROM {schema}.fair_keys AS f
USING cand AS c
WHERE f.queue_name = c.queue_name AND f.fairness_key = c.fairness_key AND f.gen = c.gen
RETURNING f.queue_name, f.fairness_key;

-- name: fair_keys_dead
-- Dead row versions in fair_keys as the statistics last counted them (0 without
-- track_counts): each claim of a fair queue leaves one per key it advanced.
SELECT coalesce((SELECT s.n_dead_tup FROM pg_stat_user_tables AS s
                 WHERE s.relid = '{schema}.fair_keys'::regclass), 0);

-- name: vacuum_fair_keys
-- Upkeep of fair queues (the worker's FairKeyVacuum). Why: a claim moves the passes of the
-- keys it takes from forward, which leaves their old entries at the low end of
-- fair_keys_pass_idx, exactly where the next claim's scan starts; every claim steps over
-- all of them until a vacuum removes them (autovacuum comes once a minute at best: 300,000
-- entries at 5,000 jobs/s). The table holds a row per key, so this is milliseconds.
-- SKIP_LOCKED: never waits for another worker's vacuum of it. TRUNCATE false: giving back
-- the table's empty last pages takes an ACCESS EXCLUSIVE lock that every claim of a fair
-- queue would queue behind, for pages the next claims fill again. Outside a transaction.
VACUUM (SKIP_LOCKED, PARALLEL 0, TRUNCATE false) {schema}.fair_keys;
