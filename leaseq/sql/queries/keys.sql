-- Ordering keys (leaseq.ops.base_async's key lock protocol, leaseq.ops.admin_async) and
-- priority aging.


-- name: lock_keys
-- Serialises everything that can change who is the head of these ordering keys (enqueue,
-- completion, failure, cancel, skip). Keys are locked in sorted order: no deadlocks.
SELECT pg_advisory_xact_lock(hashtextextended('{schema}.key.' || k, 0))
FROM unnest(%(keys)s::text[]) AS k
ORDER BY k;

-- name: try_lock_keys
-- The sweeper already holds row locks, so it must not wait on a key lock (a completion
-- holding the key may be waiting for one of those rows): it takes what it can get now.
SELECT k, pg_try_advisory_xact_lock(hashtextextended('{schema}.key.' || k, 0))
FROM unnest(%(keys)s::text[]) AS k
ORDER BY k;

-- name: promote_keys
-- Re-decide the head of each of these keys after anything changed them (a head finished,
-- a job was replayed or skipped): the head is the key's earliest pending job, unless one of
-- its jobs is running or an earlier one is dead under the "block" policy; every other
-- pending job of the key is blocked. Run under lock_keys, in the transaction that made the
-- change. Each key costs a few index probes, however deep its backlog.
WITH k AS (
  SELECT DISTINCT key FROM unnest(%(keys)s::text[]) AS u(key)
), first AS (
  SELECT k.key,
         (SELECT w.id FROM {schema}.jobs AS w
           WHERE w.ordering_key = k.key AND w.status = 'pending'
           ORDER BY w.id LIMIT 1) AS first_pending
  FROM k
), target AS (
  SELECT f.key,
         CASE WHEN EXISTS (
                SELECT 1 FROM {schema}.jobs AS r
                WHERE r.ordering_key = f.key AND r.status = 'running'
              )
              OR EXISTS (
                SELECT 1 FROM {schema}.jobs AS d
                WHERE d.ordering_key = f.key AND d.id < f.first_pending
                  AND d.status = 'dead' AND d.key_policy = 'block' AND NOT d.key_skipped
              )
           THEN NULL
           ELSE f.first_pending
         END AS head
  FROM first AS f
), unblocked AS (
  UPDATE {schema}.jobs AS j
  SET blocked = false
  FROM target AS t
  WHERE j.id = t.head AND j.blocked
  RETURNING j.id, j.queue_name, j.available_at
), reblocked AS (
  UPDATE {schema}.jobs AS j
  SET blocked = true
  FROM target AS t
  WHERE j.ordering_key = t.key AND j.status = 'pending' AND NOT j.blocked
    AND j.id IS DISTINCT FROM t.head
  RETURNING j.id
)
SELECT id, CASE WHEN available_at <= now() THEN pg_notify(%(channel)s, queue_name)::text END
FROM unblocked
UNION ALL
SELECT id, NULL FROM reblocked;

-- name: job_key
SELECT ordering_key FROM {schema}.jobs WHERE id = %(id)s;

-- name: blocked_keys
-- Keys held up by a dead head under the "block" policy, with the head and the queue behind.
SELECT h.ordering_key, h.id, h.task, h.queue_name, h.last_error_code, h.finished_at,
       (SELECT count(*) FROM {schema}.jobs AS w
         WHERE w.ordering_key = h.ordering_key AND w.status = 'pending' AND w.blocked)
FROM {schema}.jobs AS h
WHERE h.ordering_key IS NOT NULL
  AND h.status = 'dead' AND h.key_policy = 'block' AND NOT h.key_skipped
ORDER BY h.finished_at
LIMIT %(limit)s;

-- name: skip_dead_head
-- An operator lets a key move past its dead head (audited); the head stays dead.
WITH upd AS (
  UPDATE {schema}.jobs
  SET key_skipped = true
  WHERE id = %(id)s AND status = 'dead' AND ordering_key IS NOT NULL AND NOT key_skipped
  RETURNING id, lease_token, attempt_count
)
INSERT INTO {schema}.job_events
  (job_id, event, from_status, to_status, actor, lease_token, attempt, detail)
SELECT id, 'key_skipped', 'dead', 'dead', %(actor)s, lease_token, attempt_count, %(reason)s
FROM upd
RETURNING job_id;

-- name: age_priorities
-- Priority aging, a bounded batch at a time: a job that has been claimable for k whole
-- aging intervals gets base_priority + k (capped), so a flood of higher-priority work can
-- delay it only so long. SKIP LOCKED: rows being claimed are simply left alone.
WITH due AS (
  SELECT id, least(
           32767,
           base_priority + floor(extract(epoch FROM now() - available_at) / %(interval)s)
         )::int AS aged
  FROM {schema}.jobs
  WHERE status = 'pending' AND NOT blocked AND NOT waiting
    -- Both claim indexes (keyless jobs, jobs with a fairness key: version 26), read as one
    -- bitmap; without this the predicate matches neither and the batch reads the table.
    AND (fairness_key IS NULL OR fairness_key IS NOT NULL)
    AND available_at <= now() - make_interval(secs => %(interval)s)
    -- Ages are computed in numeric and capped before the cast: a very old (or infinite)
    -- available_at must not fail the batch.
    AND isfinite(available_at)
    AND priority < least(
          32767,
          base_priority + floor(extract(epoch FROM now() - available_at) / %(interval)s)
        )
  LIMIT %(limit)s
  FOR UPDATE SKIP LOCKED
)
UPDATE {schema}.jobs AS j
SET priority = due.aged
FROM due
WHERE j.id = due.id
RETURNING j.id;
