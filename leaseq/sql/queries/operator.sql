-- What operators do to jobs (leaseq.ops.admin_async): cancel, replay, purge, and retention.


-- name: cancel_job
-- A pending or suspended job is cancelled at once; a running one gets a request its worker
-- sees at the next heartbeat (its lease stays valid, so the worker can still report
-- honestly). old: the status before (the event's from_status; a suspended job's wake-up
-- time goes with it).
WITH old AS (
  SELECT id, status FROM {schema}.jobs
  WHERE id = %(id)s AND status IN ('pending', 'running', 'suspended')
  FOR UPDATE
), upd AS (
  UPDATE {schema}.jobs AS j
  SET status = CASE WHEN j.status = 'running' THEN j.status ELSE 'cancelled' END,
      finished_at = CASE WHEN j.status = 'running' THEN j.finished_at ELSE now() END,
      waiting = false,
      wake_at = NULL,
      wait_signal = NULL,
      cancel_requested_at = CASE
        WHEN j.status = 'running' THEN coalesce(j.cancel_requested_at, now())
        ELSE j.cancel_requested_at
      END
  FROM old
  WHERE j.id = old.id
  RETURNING j.id, j.status, old.status AS from_status, j.lease_token, j.attempt_count,
            j.unique_key, j.unique_for, j.unique_states
), fin AS (
  -- A job cancelled here lets its unique key go (or keeps it as a window).
  SELECT * FROM upd WHERE status = 'cancelled' AND unique_key IS NOT NULL
), {_unique_release}
INSERT INTO {schema}.job_events
  (job_id, event, from_status, to_status, actor, lease_token, attempt, detail)
SELECT id,
       CASE status WHEN 'cancelled' THEN 'cancelled' ELSE 'cancel_requested' END,
       from_status, status, %(actor)s, lease_token, attempt_count, %(reason)s
FROM upd
RETURNING job_id, to_status::text;

-- name: run_now
-- "Run this scheduled job now" (a retry waiting out its back-off, a delayed job): only a
-- pending job not yet due. Its available_at becomes now(), in its history, and its queue's
-- workers are woken at commit; limits, pauses, ordering keys and dependencies still decide
-- when it is claimed (the claim checks them, not this). Nothing else of the row changes.
WITH upd AS (
  UPDATE {schema}.jobs
  SET available_at = now()
  WHERE id = %(id)s AND status = 'pending' AND available_at > now()
  RETURNING id, queue_name, attempt_count, available_at, blocked
), ev AS (
  INSERT INTO {schema}.job_events (job_id, event, from_status, to_status, actor, attempt, detail)
  SELECT id, 'run_now', 'pending', 'pending', %(actor)s, attempt_count, %(reason)s FROM upd
)
SELECT id, {_notify_ready} FROM upd;

-- name: replay_jobs
-- Dead (or, when allowed, cancelled) jobs back to pending under the same ids with a fresh
-- attempt budget, in bounded batches; the previous attempt count stays in the event row.
-- Serves both `replay ID` (filter by id) and bulk replay (filter by queue, task, code, age).
-- Keyed jobs come back blocked; the caller (holding the keys' locks) then runs
-- promote_keys, so a replayed job heads its key again only if it is the earliest pending
-- one and nothing is running.
-- A job with a unique key must re-take it in this statement (free, an expired window, or
-- its own window); when another job holds it, the replay of that job is refused: it stays
-- as it was and a replay_refused event names the holder. Of several jobs of one key in a
-- batch, the first takes it and the others are refused.
-- Rows: (job id, notify, refused, holder, unique key).
WITH prev AS (
  SELECT id, status, attempt_count, ordering_key, unique_key, lease_token
  FROM {schema}.jobs
  WHERE {_job_filter} AND id = ANY(%(ids)s::bigint[])
  ORDER BY id
  LIMIT %(limit)s
  FOR UPDATE SKIP LOCKED
), took AS (
  INSERT INTO {schema}.unique_keys AS k (unique_key, job_id, held_until)
  SELECT DISTINCT ON (unique_key) unique_key, id, NULL::timestamptz
  FROM prev
  WHERE unique_key IS NOT NULL
  ORDER BY unique_key, id
  ON CONFLICT (unique_key) DO UPDATE
  SET job_id = excluded.job_id, held_until = NULL
  WHERE k.job_id = excluded.job_id OR k.held_until <= now()
  RETURNING k.job_id
), refused AS (
  SELECT p.id, p.status, p.attempt_count, p.lease_token, p.unique_key,
         (SELECT k.job_id FROM {schema}.unique_keys AS k
           WHERE k.unique_key = p.unique_key AND k.job_id <> p.id) AS holder
  FROM prev AS p
  WHERE p.unique_key IS NOT NULL AND p.id NOT IN (SELECT job_id FROM took)
), refusal AS (
  INSERT INTO {schema}.job_events
    (job_id, event, from_status, to_status, actor, lease_token, attempt, detail)
  SELECT id, 'replay_refused', status, status, %(actor)s, lease_token, attempt_count,
         left('unique key ' || unique_key || ' is held by '
              || coalesce('job ' || holder, 'another job') || ': ' || %(reason)s, 4000)
  FROM refused
), upd AS (
  UPDATE {schema}.jobs AS j
  SET status = 'pending',
      attempt_count = 0,
      unknown_failures = 0,
      available_at = now(),
      finished_at = NULL,
      cancel_requested_at = NULL,
      key_skipped = false,
      -- A start deadline is not carried over: a replayed expired job would end again at
      -- once (the replay's event keeps the reason; the old deadline is in the trail).
      expires_at = NULL,
      -- promote_keys, run next in the same transaction, decides who heads the key.
      blocked = j.ordering_key IS NOT NULL,
      -- A job with dependencies waits again; the client decides it next, in the same
      -- transaction, after locking its dependencies (as an enqueue does).
      waiting = EXISTS (SELECT 1 FROM {schema}.job_deps AS d WHERE d.job_id = j.id)
  FROM prev
  WHERE j.id = prev.id AND (prev.unique_key IS NULL OR prev.id IN (SELECT job_id FROM took))
  RETURNING j.id, prev.status AS from_status, prev.attempt_count, j.lease_token,
            j.queue_name
), ev AS (
  INSERT INTO {schema}.job_events
    (job_id, event, from_status, to_status, actor, lease_token, attempt, detail)
  SELECT id, 'replayed', from_status, 'pending', %(actor)s, lease_token, attempt_count,
         %(reason)s
  FROM upd
  RETURNING job_id
)
SELECT ev.job_id, pg_notify(%(channel)s, upd.queue_name)::text, false, NULL::bigint,
       NULL::text
FROM ev JOIN upd ON upd.id = ev.job_id
UNION ALL
SELECT id, NULL, true, holder, unique_key FROM refused;

-- name: replay_candidates
-- The next batch a replay would take, with their keys, so the keys can be locked first.
-- Jobs whose replay was refused earlier in this run are passed in %(skip)s.
SELECT id, ordering_key
FROM {schema}.jobs
WHERE {_job_filter} AND NOT (id = ANY(%(skip)s::bigint[]))
ORDER BY id
LIMIT %(limit)s;

-- name: count_jobs
-- How many jobs an operator's filter matches (the dry run of a bulk replay or purge).
SELECT count(*) FROM {schema}.jobs WHERE {_job_filter};

-- name: purge_jobs
-- Deletes dead jobs an operator chose, in bounded batches (ids from replay_candidates, whose
-- ordering keys the caller has locked: a purged dead head must let its key move on, so the
-- caller re-decides those keys' heads in the same transaction). Their audit trail stays,
-- with a final 'purged' row saying who removed them and why; their step and effect
-- records go (_job_records_deleted).
WITH doomed AS (
  SELECT id, status, lease_token, attempt_count
  FROM {schema}.jobs
  WHERE {_job_filter} AND id = ANY(%(ids)s::bigint[])
    -- A member of a batch not yet done stays until it fired (_batch_keeps_it).
    AND NOT {_batch_keeps_it}
  ORDER BY id
  LIMIT %(limit)s
  FOR UPDATE SKIP LOCKED
), gone AS (
  DELETE FROM {schema}.jobs AS j USING doomed WHERE j.id = doomed.id RETURNING j.id
), batch AS (
  SELECT ARRAY(SELECT id FROM doomed) AS ids
), {_job_records_deleted}, {_payloads_deleted}
INSERT INTO {schema}.job_events
  (job_id, event, from_status, actor, lease_token, attempt, detail)
SELECT doomed.id, 'purged', doomed.status, %(actor)s, doomed.lease_token,
       doomed.attempt_count, %(reason)s
FROM doomed JOIN gone ON gone.id = doomed.id
RETURNING job_id;

-- name: prune_finished
-- Retention: removes succeeded and cancelled jobs older than the cut-off, their trail, step
-- and effect records (_job_records_deleted) and offloaded payloads (_payloads_deleted),
-- in bounded batches. It locks only finished rows (SKIP LOCKED), which no claim touches,
-- so pruning never delays a claim. It reads jobs_prunable_idx oldest first and stops at
-- the cut-off: a batch reads about the rows it deletes, not the retention window or the
-- backlog (walking the primary key instead made each round's last batch read them all).
-- The deletes take the batch as one array (= ANY), so each is a lookup per id whatever
-- the plan: the worker runs this on its generic plan, which, joining the batch instead,
-- expected a large batch and read the whole jobs table (seq scan or a merge join from the
-- first id) for every 1,000 rows: 0.6-1.1 s a batch at 400k rows, instead of ~10 ms.
WITH doomed AS (
  SELECT id
  FROM {schema}.jobs
  WHERE status IN ('succeeded', 'cancelled')
    AND finished_at < now() - make_interval(secs => %(older_than)s)
    -- A member of a batch not yet done stays until it fired (_batch_keeps_it).
    AND NOT {_batch_keeps_it}
  ORDER BY finished_at
  LIMIT %(limit)s
  FOR UPDATE SKIP LOCKED
), batch AS (
  SELECT ARRAY(SELECT id FROM doomed) AS ids
), trail AS (
  DELETE FROM {schema}.job_events AS e WHERE e.job_id = ANY((SELECT ids FROM batch)::bigint[])
), {_job_records_deleted}, {_payloads_deleted}
DELETE FROM {schema}.jobs AS j WHERE j.id = ANY((SELECT ids FROM batch)::bigint[])
RETURNING j.id;
