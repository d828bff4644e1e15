-- leaseq schema, version 28: the SQL API's cancel cascades to the unfinished children a job
-- spawned (ctx.spawn, version 27), in its transaction, as client.cancel does: _api_cancel
-- runs the client's unfinished_children statement after the job's own cancel and cancels
-- each child through itself.

-- _api_cancel, last defined in 0025_sql_api_refresh.sql, with the cascade.
CREATE OR REPLACE FUNCTION {schema}._api_cancel(a_id bigint, a_actor text, a_reason text)
RETURNS boolean LANGUAGE plpgsql
AS $fn$
DECLARE
  p_id bigint := a_id;
  p_actor text := a_actor;
  p_reason text := left(a_reason, 4000);
  p_keys text[];
  p_channel text := {schema}._api_channel();
  v_key text;
  v_any boolean := false;
  v_cancelled bigint[] := '{}';
  v_row record;
BEGIN
-- statement: job_key
SELECT ordering_key FROM {schema}.jobs WHERE id = p_id
-- end: job_key
  INTO v_key;
  IF v_key IS NOT NULL THEN
    p_keys := ARRAY[v_key];
    FOR v_row IN
-- statement: lock_keys
SELECT pg_advisory_xact_lock(hashtextextended('{schema}.key.' || k, 0))
FROM unnest(p_keys::text[]) AS k
ORDER BY k
-- end: lock_keys
    LOOP
      NULL;
    END LOOP;
  END IF;
  FOR v_row IN
-- statement: cancel_job
WITH old AS (
  SELECT id, status FROM {schema}.jobs
  WHERE id = p_id AND status IN ('pending', 'running', 'suspended')
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
), key_windows AS (
  UPDATE {schema}.unique_keys AS k
  SET held_until = now() + make_interval(secs => f.unique_for)
  FROM fin AS f
  WHERE k.unique_key = f.unique_key AND k.job_id = f.id AND k.held_until IS NULL
    AND f.unique_for IS NOT NULL AND f.status::text = ANY(f.unique_states)
  RETURNING k.job_id
), key_freed AS (
  DELETE FROM {schema}.unique_keys AS k
  USING fin AS f
  WHERE k.unique_key = f.unique_key AND k.job_id = f.id AND k.held_until IS NULL
    AND NOT coalesce(f.unique_for IS NOT NULL AND f.status::text = ANY(f.unique_states), false)
  RETURNING k.job_id
)
INSERT INTO {schema}.job_events
  (job_id, event, from_status, to_status, actor, lease_token, attempt, detail)
SELECT id,
       CASE status WHEN 'cancelled' THEN 'cancelled' ELSE 'cancel_requested' END,
       from_status, status, p_actor, lease_token, attempt_count, p_reason
FROM upd
RETURNING job_id, to_status::text
-- end: cancel_job
  LOOP
    v_any := true;
    IF v_row.to_status = 'cancelled' THEN
      v_cancelled := v_cancelled || v_row.job_id;
    END IF;
  END LOOP;
  IF v_key IS NOT NULL THEN
    FOR v_row IN
-- statement: promote_keys
WITH k AS (
  SELECT DISTINCT key FROM unnest(p_keys::text[]) AS u(key)
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
SELECT id, CASE WHEN available_at <= now() THEN pg_notify(p_channel, queue_name)::text END
FROM unblocked
UNION ALL
SELECT id, NULL FROM reblocked
-- end: promote_keys
    LOOP
      NULL;
    END LOOP;
  END IF;
  PERFORM {schema}._api_promote(v_cancelled);
  IF v_any THEN
    -- Its unfinished children (ctx.spawn) are cancelled with it, in this transaction, as
    -- client.cancel does (each through this function: keys, dependents, its own children).
    FOR v_row IN
-- statement: unfinished_children
SELECT k.child_id FROM {schema}.job_children AS k
JOIN {schema}.jobs AS j ON j.id = k.child_id
WHERE k.parent_id = p_id AND j.status IN ('pending', 'running', 'suspended')
ORDER BY k.child_id
-- end: unfinished_children
    LOOP
      PERFORM {schema}._api_cancel(v_row.child_id, p_actor, p_reason);
    END LOOP;
  END IF;
  RETURN v_any;
END
$fn$;
