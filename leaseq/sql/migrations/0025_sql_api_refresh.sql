-- leaseq schema, version 25: the SQL API's copies of the client's statements refreshed
-- (tools/sql_api_refresh.py --new) after version 24: a suspended job counts as live for
-- dependencies and batches, and its cancel ends it at once.

-- _api_cancel, first defined in 0020_sql_api.sql, refreshed.
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
  RETURN v_any;
END
$fn$;

-- _api_insert, first defined in 0020_sql_api.sql, refreshed.
CREATE OR REPLACE FUNCTION {schema}._api_insert(a_job jsonb)
RETURNS bigint LANGUAGE plpgsql
AS $fn$
DECLARE
  p_task text := a_job->>'task';
  p_payload jsonb := a_job->'payload';
  p_queue text := a_job->>'queue';
  p_priority integer := (a_job->>'priority')::integer;
  p_run_at timestamptz := (a_job->>'run_at')::timestamptz;
  p_delay float8 := (a_job->>'delay')::float8;
  p_max_attempts integer := (a_job->>'max_attempts')::integer;
  p_payload_version integer := (a_job->>'payload_version')::integer;
  p_idempotency_key text := a_job->>'idempotency_key';
  p_ordering_key text := a_job->>'ordering_key';
  p_key_policy text := a_job->>'key_policy';
  p_limit_key text := a_job->>'limit_key';
  p_unique_key text := a_job->>'unique_key';
  p_unique_for float8 := (a_job->>'unique_for')::float8;
  p_unique_states text[] := ARRAY(SELECT jsonb_array_elements_text(
    CASE WHEN jsonb_typeof(a_job->'unique_states') = 'array' THEN a_job->'unique_states' END));
  p_debounce float8 := (a_job->>'debounce')::float8;
  p_debounce_max float8 := (a_job->>'debounce_max')::float8;
  p_reschedule boolean := (a_job->>'reschedule')::boolean;
  p_expires timestamptz := (a_job->>'expires')::timestamptz;
  p_expires_in float8 := (a_job->>'expires_in')::float8;
  p_channel text := {schema}._api_channel();
  p_keys text[];
  p_ids bigint[];
  p_job_ids bigint[];
  p_depends_on bigint[];
  p_on_dead text[];
  p_ended bigint[];
  p_holder bigint;
  p_id bigint;
  p_batch_id bigint;
  v_on_conflict text := a_job->>'on_conflict';
  v_id bigint;
  v_note text;
  v_holder bigint;
  v_held_until timestamptz;
  v_status text;
  v_expired boolean;
  v_state text;
  v_outcome text;
  v_found bigint[];
  v_ended bigint[];
  v_unknown text;
  v_cancelled bigint[];
  v_row record;
BEGIN
  IF p_ordering_key IS NOT NULL THEN
    p_keys := ARRAY[p_ordering_key];
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
  IF p_unique_key IS NOT NULL THEN
    -- leaseq.ops.enqueue_async._enqueue_unique (each statement reads a new snapshot).
    FOR v_try IN 1..20 LOOP
-- statement: insert_unique_job
WITH lock AS (
  INSERT INTO {schema}.unique_keys AS k (unique_key, job_id, held_until)
  VALUES (p_unique_key,
          nextval((SELECT pg_get_serial_sequence('{schema}.jobs', 'id'))::regclass), NULL)
  ON CONFLICT (unique_key) DO NOTHING
  RETURNING k.job_id
), ins AS (
  INSERT INTO {schema}.jobs
    (id, queue_name, task, payload, priority, base_priority, available_at, max_attempts,
     payload_version, idempotency_key, ordering_key, key_policy, blocked, unique_key,
     unique_for, unique_states, debounce_until, limit_key, expires_at)
  OVERRIDING SYSTEM VALUE
  SELECT lock.job_id, p_queue, p_task, p_payload::jsonb, p_priority, p_priority,
         coalesce(p_run_at::timestamptz, now() + make_interval(secs => p_delay)),
         p_max_attempts, p_payload_version, p_idempotency_key, p_ordering_key,
         p_key_policy,
         -- As in insert_keyed_job (the caller holds the ordering key's lock).
         p_ordering_key::text IS NOT NULL AND EXISTS (
           SELECT 1 FROM {schema}.jobs AS b
           WHERE b.ordering_key = p_ordering_key AND ((b.status IN ('pending', 'running') AND NOT b.blocked)
 OR (b.status = 'dead' AND b.key_policy = 'block' AND NOT b.key_skipped))
         ),
         p_unique_key, p_unique_for::float8, p_unique_states::text[],
         now() + make_interval(secs => p_debounce_max::float8), p_limit_key,
         coalesce(p_expires::timestamptz, now() + make_interval(secs => p_expires_in::float8))
  FROM lock
  RETURNING id, queue_name, available_at, blocked
)
SELECT id, CASE WHEN available_at <= now() AND NOT blocked
  THEN pg_notify(p_channel, queue_name)::text END
FROM ins
-- end: insert_unique_job
      INTO v_id, v_note;
      EXIT WHEN FOUND;
-- statement: unique_holder
SELECT k.job_id, k.held_until, j.status::text, k.held_until <= now()
FROM {schema}.unique_keys AS k
LEFT JOIN {schema}.jobs AS j ON j.id = k.job_id
WHERE k.unique_key = p_unique_key
-- end: unique_holder
      INTO v_holder, v_held_until, v_status, v_expired;
      CONTINUE WHEN NOT FOUND;
      IF v_expired THEN
-- statement: take_unique_window
WITH lock AS (
  UPDATE {schema}.unique_keys AS k
  SET job_id = nextval((SELECT pg_get_serial_sequence('{schema}.jobs', 'id'))::regclass),
      held_until = NULL
  WHERE k.unique_key = p_unique_key AND k.held_until <= now()
  RETURNING k.job_id
), ins AS (
  INSERT INTO {schema}.jobs
    (id, queue_name, task, payload, priority, base_priority, available_at, max_attempts,
     payload_version, idempotency_key, ordering_key, key_policy, blocked, unique_key,
     unique_for, unique_states, debounce_until, limit_key, expires_at)
  OVERRIDING SYSTEM VALUE
  SELECT lock.job_id, p_queue, p_task, p_payload::jsonb, p_priority, p_priority,
         coalesce(p_run_at::timestamptz, now() + make_interval(secs => p_delay)),
         p_max_attempts, p_payload_version, p_idempotency_key, p_ordering_key,
         p_key_policy,
         -- As in insert_keyed_job (the caller holds the ordering key's lock).
         p_ordering_key::text IS NOT NULL AND EXISTS (
           SELECT 1 FROM {schema}.jobs AS b
           WHERE b.ordering_key = p_ordering_key AND ((b.status IN ('pending', 'running') AND NOT b.blocked)
 OR (b.status = 'dead' AND b.key_policy = 'block' AND NOT b.key_skipped))
         ),
         p_unique_key, p_unique_for::float8, p_unique_states::text[],
         now() + make_interval(secs => p_debounce_max::float8), p_limit_key,
         coalesce(p_expires::timestamptz, now() + make_interval(secs => p_expires_in::float8))
  FROM lock
  RETURNING id, queue_name, available_at, blocked
)
SELECT id, CASE WHEN available_at <= now() AND NOT blocked
  THEN pg_notify(p_channel, queue_name)::text END
FROM ins
-- end: take_unique_window
        INTO v_id, v_note;
        EXIT WHEN FOUND;
        CONTINUE;
      END IF;
      -- leaseq.rules.unique.holder_state and resolve_conflict
      v_state := coalesce(v_status, CASE WHEN v_held_until IS NOT NULL THEN 'finished'
                                         ELSE 'pending' END);
      v_outcome := CASE WHEN v_on_conflict = 'raise' THEN 'raise'
                        WHEN v_on_conflict = 'skip' OR v_held_until IS NOT NULL THEN 'skip'
                        WHEN v_state = 'pending' THEN 'replace'
                        ELSE 'follow_up' END;
      IF v_outcome = 'raise' THEN
        PERFORM {schema}._api_refuse('LQ003', format('unique key %s is held by job %s (%s)',
                                                    '''' || p_unique_key || '''', v_holder,
                                                    v_state));
      END IF;
      IF v_outcome = 'skip' THEN
        RETURN v_holder;
      END IF;
      p_holder := v_holder;
      IF v_outcome = 'replace' THEN
-- statement: unique_replace
WITH upd AS (
  UPDATE {schema}.jobs AS j
  SET payload = p_payload::jsonb,
      priority = p_priority,
      base_priority = p_priority,
      available_at = CASE
        WHEN p_debounce::float8 IS NOT NULL
          THEN least(now() + make_interval(secs => p_debounce::float8),
                     coalesce(j.debounce_until, 'infinity'))
        WHEN p_reschedule
          THEN coalesce(p_run_at::timestamptz, now() + make_interval(secs => p_delay))
        ELSE j.available_at
      END
  WHERE j.id = p_holder AND j.status = 'pending' AND j.unique_key = p_unique_key
  RETURNING j.id, j.queue_name, j.available_at, j.blocked, j.lease_token, j.attempt_count
), ev AS (
  INSERT INTO {schema}.job_events
    (job_id, event, from_status, to_status, actor, lease_token, attempt, detail)
  SELECT id, 'unique_replaced', 'pending', 'pending', NULL, lease_token, attempt_count,
         'payload replaced by an enqueue of unique key ' || left(p_unique_key, 200)
  FROM upd
)
SELECT id, CASE WHEN available_at <= now() AND NOT blocked
  THEN pg_notify(p_channel, queue_name)::text END
FROM upd
-- end: unique_replace
        INTO v_id, v_note;
        EXIT WHEN FOUND;
        CONTINUE;
      END IF;
-- statement: insert_follow_up
WITH lock AS (
  UPDATE {schema}.unique_keys AS k
  SET job_id = nextval((SELECT pg_get_serial_sequence('{schema}.jobs', 'id'))::regclass)
  WHERE k.unique_key = p_unique_key AND k.job_id = p_holder AND k.held_until IS NULL
    AND EXISTS (SELECT 1 FROM {schema}.jobs AS h
                WHERE h.id = p_holder AND h.status = 'running')
  RETURNING k.job_id
), ins AS (
  INSERT INTO {schema}.jobs
    (id, queue_name, task, payload, priority, base_priority, available_at, max_attempts,
     payload_version, idempotency_key, ordering_key, key_policy, blocked, unique_key,
     unique_for, unique_states, debounce_until, limit_key, expires_at)
  OVERRIDING SYSTEM VALUE
  SELECT lock.job_id, p_queue, p_task, p_payload::jsonb, p_priority, p_priority,
         coalesce(p_run_at::timestamptz, now() + make_interval(secs => p_delay)),
         p_max_attempts, p_payload_version, p_idempotency_key, p_ordering_key,
         p_key_policy,
         -- As in insert_keyed_job (the caller holds the ordering key's lock).
         p_ordering_key::text IS NOT NULL AND EXISTS (
           SELECT 1 FROM {schema}.jobs AS b
           WHERE b.ordering_key = p_ordering_key AND ((b.status IN ('pending', 'running') AND NOT b.blocked)
 OR (b.status = 'dead' AND b.key_policy = 'block' AND NOT b.key_skipped))
         ),
         p_unique_key, p_unique_for::float8, p_unique_states::text[],
         now() + make_interval(secs => p_debounce_max::float8), p_limit_key,
         coalesce(p_expires::timestamptz, now() + make_interval(secs => p_expires_in::float8))
  FROM lock
  RETURNING id, queue_name, available_at, blocked
), ev AS (
  INSERT INTO {schema}.job_events
    (job_id, event, from_status, to_status, actor, lease_token, attempt, detail)
  SELECT h.id, 'superseded', h.status, h.status, NULL, h.lease_token, h.attempt_count,
         'unique key ' || left(h.unique_key, 200) || ' moved to follow-up job ' || ins.id
  FROM ins JOIN {schema}.jobs AS h ON h.id = p_holder
)
SELECT id, CASE WHEN available_at <= now() AND NOT blocked
  THEN pg_notify(p_channel, queue_name)::text END
FROM ins
-- end: insert_follow_up
      INTO v_id, v_note;
      EXIT WHEN FOUND;
    END LOOP;
    IF v_id IS NULL THEN
      PERFORM {schema}._api_refuse('LQ000', format(
        'unique key %s changed hands 20 times during one enqueue; try again',
        '''' || p_unique_key || ''''));
    END IF;
    RETURN v_id;
  END IF;
  IF p_ordering_key IS NULL THEN
-- statement: insert_job
INSERT INTO {schema}.jobs
  (queue_name, task, payload, priority, base_priority, available_at, max_attempts,
   payload_version, idempotency_key, key_policy, limit_key, expires_at)
VALUES (
  p_queue, p_task, p_payload::jsonb, p_priority, p_priority,
  coalesce(p_run_at::timestamptz, now() + make_interval(secs => p_delay)),
  p_max_attempts, p_payload_version, p_idempotency_key, p_key_policy, p_limit_key,
  coalesce(p_expires::timestamptz, now() + make_interval(secs => p_expires_in::float8))
)
RETURNING id, CASE WHEN available_at <= now() AND NOT blocked
  THEN pg_notify(p_channel, queue_name)::text END
-- end: insert_job
    INTO v_id, v_note;
  ELSE
-- statement: insert_keyed_job
WITH ins AS (
  INSERT INTO {schema}.jobs
    (queue_name, task, payload, priority, base_priority, available_at, max_attempts,
     payload_version, idempotency_key, ordering_key, key_policy, blocked, limit_key,
     expires_at)
  VALUES (
    p_queue, p_task, p_payload::jsonb, p_priority, p_priority,
    coalesce(p_run_at::timestamptz, now() + make_interval(secs => p_delay)),
    p_max_attempts, p_payload_version, p_idempotency_key, p_ordering_key,
    p_key_policy,
    -- Behind any live (or blocking dead) job of its key: wait. The caller holds the key's
    -- advisory lock (lock_keys), so this answer cannot go stale before the commit.
    EXISTS (
      SELECT 1 FROM {schema}.jobs AS b
      WHERE b.ordering_key = p_ordering_key AND ((b.status IN ('pending', 'running') AND NOT b.blocked)
 OR (b.status = 'dead' AND b.key_policy = 'block' AND NOT b.key_skipped))
    ),
    p_limit_key, coalesce(p_expires::timestamptz, now() + make_interval(secs => p_expires_in::float8))
  )
  RETURNING id, queue_name, available_at, blocked
)
SELECT id, CASE WHEN available_at <= now() AND NOT blocked
  THEN pg_notify(p_channel, queue_name)::text END
FROM ins
-- end: insert_keyed_job
    INTO v_id, v_note;
  END IF;

  IF a_job ? 'depends_on' THEN
    -- leaseq.ops.deps_async._store_deps
    p_ids := ARRAY(SELECT jsonb_array_elements_text(a_job->'depends_on')::bigint ORDER BY 1);
    v_found := '{}';
    v_ended := '{}';
    FOR v_row IN
-- statement: lock_dependency_parents
WITH locked AS (
  SELECT id, has_dependents, status
  FROM {schema}.jobs
  WHERE id = ANY(p_ids::bigint[])
  ORDER BY id
  FOR UPDATE
), flag AS (
  UPDATE {schema}.jobs AS j
  SET has_dependents = true
  FROM locked AS l
  WHERE j.id = l.id AND NOT l.has_dependents
)
SELECT id, status::text FROM locked
-- end: lock_dependency_parents
    LOOP
      v_found := v_found || v_row.id;
      IF v_row.status IN ('succeeded', 'dead', 'cancelled') THEN
        v_ended := v_ended || v_row.id;
      END IF;
    END LOOP;
    SELECT string_agg(i::text, ', ' ORDER BY i) INTO v_unknown
    FROM (SELECT i FROM unnest(p_ids) AS i WHERE i <> ALL(v_found) ORDER BY i LIMIT 10) AS u;
    IF v_unknown IS NOT NULL THEN
      PERFORM {schema}._api_refuse('LQ001',
        'depends_on names job(s) that do not exist: ' || v_unknown);
    END IF;
    p_job_ids := array_fill(v_id, ARRAY[cardinality(p_ids)]);
    p_depends_on := p_ids;
    p_on_dead := array_fill(a_job->>'on_dead', ARRAY[cardinality(p_ids)]);
    p_ids := ARRAY[v_id];
-- statement: insert_deps
WITH edges AS (
  INSERT INTO {schema}.job_deps (job_id, depends_on, on_dead)
  SELECT * FROM unnest(p_job_ids::bigint[], p_depends_on::bigint[], p_on_dead::text[])
  ON CONFLICT DO NOTHING
)
UPDATE {schema}.jobs SET waiting = true WHERE id = ANY(p_ids::bigint[])
-- end: insert_deps
    ;
    IF cardinality(v_ended) > 0 THEN
      p_ended := NULL;
      v_cancelled := '{}';
      FOR v_row IN
-- statement: promote_dependents
WITH c AS MATERIALIZED (
  SELECT j.id,
         NOT EXISTS (
           SELECT 1 FROM (
             SELECT d.depends_on FROM {schema}.job_deps AS d
             WHERE d.job_id = j.id
             ORDER BY d.job_id DESC, d.depends_on DESC
           ) AS d
           JOIN {schema}.jobs AS p ON p.id = d.depends_on
           WHERE p.status IN ('pending', 'running', 'suspended')
         ) AS ready,
         CASE WHEN p_ended::bigint[] IS NULL THEN
           (SELECT d.depends_on || ' ended ' || p.status
              FROM {schema}.job_deps AS d
              JOIN {schema}.jobs AS p ON p.id = d.depends_on
             WHERE d.job_id = j.id AND d.on_dead = 'cancel'
               AND p.status IN ('dead', 'cancelled')
             ORDER BY d.depends_on
             LIMIT 1)
         ELSE
           (SELECT d.depends_on || ' ended ' || p.status
              FROM {schema}.job_deps AS d
              JOIN {schema}.jobs AS p ON p.id = d.depends_on
             WHERE d.job_id = j.id AND d.depends_on = ANY(p_ended::bigint[])
               AND d.on_dead = 'cancel' AND p.status IN ('dead', 'cancelled')
             ORDER BY d.depends_on
             LIMIT 1)
         END AS culprit
  FROM {schema}.jobs AS j
  WHERE j.id = ANY(p_ids::bigint[]) AND j.waiting AND j.status = 'pending'
), upd AS (
  UPDATE {schema}.jobs AS j
  SET waiting = false,
      status = CASE WHEN c.culprit IS NULL THEN 'pending' ELSE 'cancelled' END
               ::{schema}.job_status,
      finished_at = CASE WHEN c.culprit IS NULL THEN NULL ELSE now() END,
      last_error_code = CASE WHEN c.culprit IS NULL THEN j.last_error_code
                             ELSE 'DEPENDENCY_FAILED' END,
      last_error_class = CASE WHEN c.culprit IS NULL THEN j.last_error_class
                              ELSE 'permanent' END,
      last_error_detail = CASE WHEN c.culprit IS NULL THEN j.last_error_detail
                               ELSE 'dependency ' || c.culprit END
  FROM c
  WHERE j.id = c.id AND (c.ready OR c.culprit IS NOT NULL)
  RETURNING j.id, j.status, j.queue_name, j.available_at, j.lease_token, j.attempt_count,
            c.culprit
), ev AS (
  INSERT INTO {schema}.job_events
    (job_id, event, from_status, to_status, actor, lease_token, attempt, error_code,
     error_class, detail)
  SELECT id, CASE WHEN culprit IS NULL THEN 'promoted' ELSE 'dependency_failed' END,
         'pending', status, NULL, lease_token, attempt_count,
         CASE WHEN culprit IS NOT NULL THEN 'DEPENDENCY_FAILED' END,
         CASE WHEN culprit IS NOT NULL THEN 'permanent' END,
         CASE WHEN culprit IS NULL THEN 'all dependencies ended'
              ELSE 'dependency ' || culprit || ' (on_dead cancel)' END
  FROM upd
)
SELECT id, status::text,
       CASE WHEN status = 'pending' AND available_at <= now()
         THEN pg_notify(p_channel, queue_name)::text END
FROM upd
-- end: promote_dependents
      LOOP
        IF v_row.status = 'cancelled' THEN
          v_cancelled := v_cancelled || v_row.id;
        END IF;
      END LOOP;
      PERFORM {schema}._api_promote(v_cancelled);
    END IF;
  END IF;

  IF a_job->>'batch_id' IS NOT NULL THEN
    -- leaseq.ops.deps_async._join_batches
    p_id := (a_job->>'batch_id')::bigint;
    p_batch_id := p_id;
-- statement: lock_open_batch
SELECT state FROM {schema}.batches WHERE id = p_id FOR UPDATE
-- end: lock_open_batch
    INTO v_status;
    IF NOT FOUND THEN
      PERFORM {schema}._api_refuse('LQ001', format('no batch %s', p_id));
    END IF;
    IF v_status <> 'open' THEN
      PERFORM {schema}._api_refuse('LQ001', format('batch %s is %s: no job can join it',
                                                  p_id, v_status));
    END IF;
    p_ids := ARRAY[v_id];
-- statement: join_batch
UPDATE {schema}.jobs
SET batch_id = p_batch_id, has_dependents = true
WHERE id = ANY(p_ids::bigint[])
-- end: join_batch
    ;
  END IF;
  RETURN v_id;
END
$fn$;

-- _api_promote, first defined in 0020_sql_api.sql, refreshed.
CREATE OR REPLACE FUNCTION {schema}._api_promote(a_ended bigint[])
RETURNS void LANGUAGE plpgsql
AS $fn$
DECLARE
  p_ids bigint[];
  p_ended bigint[];
  p_channel text := {schema}._api_channel();
  v_ids bigint[] := ARRAY(SELECT DISTINCT unnest(a_ended) ORDER BY 1);
  v_locked bigint[];
  v_next bigint[];
  v_row record;
BEGIN
  WHILE cardinality(v_ids) > 0 LOOP
    p_ids := v_ids;
    v_locked := '{}';
    FOR v_row IN
-- statement: lock_batches_of
SELECT b.id
FROM {schema}.batches AS b
WHERE b.id IN (SELECT j.batch_id FROM {schema}.jobs AS j
               WHERE j.id = ANY(p_ids::bigint[]) AND j.batch_id IS NOT NULL)
  AND b.state <> 'done'
ORDER BY b.id
FOR UPDATE
-- end: lock_batches_of
    LOOP
      v_locked := v_locked || v_row.id;
    END LOOP;
    IF cardinality(v_locked) > 0 THEN
      p_ids := v_locked;
      FOR v_row IN
-- statement: fire_batches
WITH b AS (
  SELECT b.id, b.on_success, b.on_failure, b.on_finish,
         count(j.id) AS total,
         count(j.id) FILTER (WHERE j.status = 'succeeded') AS succeeded,
         count(j.id) FILTER (WHERE j.status = 'dead') AS dead,
         count(j.id) FILTER (WHERE j.status = 'cancelled') AS cancelled,
         count(j.id) FILTER (WHERE j.status IN ('pending', 'running', 'suspended')) AS live
  FROM {schema}.batches AS b
  LEFT JOIN {schema}.jobs AS j ON j.batch_id = b.id
  WHERE b.id = ANY(p_ids::bigint[]) AND b.state = 'sealed'
  GROUP BY b.id
), due AS (
  SELECT * FROM b WHERE live = 0
), calls AS (
  SELECT due.id AS batch_id, k.kind, k.spec, due.total, due.succeeded, due.dead,
         due.cancelled,
         nextval((SELECT pg_get_serial_sequence('{schema}.jobs', 'id'))::regclass) AS job_id
  FROM due,
       LATERAL (VALUES ('success', due.on_success), ('failure', due.on_failure),
                       ('finish', due.on_finish)) AS k(kind, spec)
  WHERE k.spec IS NOT NULL
    AND (k.kind = 'finish' OR (k.kind = 'success') = (due.dead + due.cancelled = 0))
), cb AS (
  INSERT INTO {schema}.batch_callbacks (batch_id, kind, job_id)
  SELECT batch_id, kind, job_id FROM calls
  ON CONFLICT DO NOTHING
  RETURNING batch_id, kind, job_id
), ins AS (
  INSERT INTO {schema}.jobs
    (id, queue_name, task, payload, priority, base_priority, max_attempts)
  OVERRIDING SYSTEM VALUE
  SELECT cb.job_id, c.spec->>'queue', c.spec->>'task',
         jsonb_build_object('batch_id', c.batch_id, 'kind', c.kind, 'total', c.total,
                            'succeeded', c.succeeded, 'dead', c.dead,
                            'cancelled', c.cancelled, 'payload', c.spec->'payload'),
         (c.spec->>'priority')::int, (c.spec->>'priority')::int,
         (c.spec->>'max_attempts')::int
  FROM cb JOIN calls AS c ON c.batch_id = cb.batch_id AND c.kind = cb.kind
  RETURNING id, queue_name
), done AS (
  UPDATE {schema}.batches AS x
  SET state = 'done', finished_at = now()
  FROM due
  WHERE x.id = due.id
)
SELECT id, pg_notify(p_channel, queue_name)::text FROM ins
-- end: fire_batches
      LOOP
        NULL;
      END LOOP;
    END IF;
    p_ids := v_ids;
    v_locked := '{}';
    FOR v_row IN
-- statement: lock_dependents
SELECT j.id
FROM {schema}.jobs AS j
WHERE j.id IN (SELECT d.job_id FROM {schema}.job_deps AS d
               WHERE d.depends_on = ANY(p_ids::bigint[]))
  AND j.waiting
ORDER BY j.id
FOR UPDATE
-- end: lock_dependents
    LOOP
      v_locked := v_locked || v_row.id;
    END LOOP;
    IF cardinality(v_locked) = 0 THEN
      RETURN;
    END IF;
    p_ids := v_locked;
    p_ended := v_ids;
    v_next := '{}';
    FOR v_row IN
-- statement: promote_dependents
WITH c AS MATERIALIZED (
  SELECT j.id,
         NOT EXISTS (
           SELECT 1 FROM (
             SELECT d.depends_on FROM {schema}.job_deps AS d
             WHERE d.job_id = j.id
             ORDER BY d.job_id DESC, d.depends_on DESC
           ) AS d
           JOIN {schema}.jobs AS p ON p.id = d.depends_on
           WHERE p.status IN ('pending', 'running', 'suspended')
         ) AS ready,
         CASE WHEN p_ended::bigint[] IS NULL THEN
           (SELECT d.depends_on || ' ended ' || p.status
              FROM {schema}.job_deps AS d
              JOIN {schema}.jobs AS p ON p.id = d.depends_on
             WHERE d.job_id = j.id AND d.on_dead = 'cancel'
               AND p.status IN ('dead', 'cancelled')
             ORDER BY d.depends_on
             LIMIT 1)
         ELSE
           (SELECT d.depends_on || ' ended ' || p.status
              FROM {schema}.job_deps AS d
              JOIN {schema}.jobs AS p ON p.id = d.depends_on
             WHERE d.job_id = j.id AND d.depends_on = ANY(p_ended::bigint[])
               AND d.on_dead = 'cancel' AND p.status IN ('dead', 'cancelled')
             ORDER BY d.depends_on
             LIMIT 1)
         END AS culprit
  FROM {schema}.jobs AS j
  WHERE j.id = ANY(p_ids::bigint[]) AND j.waiting AND j.status = 'pending'
), upd AS (
  UPDATE {schema}.jobs AS j
  SET waiting = false,
      status = CASE WHEN c.culprit IS NULL THEN 'pending' ELSE 'cancelled' END
               ::{schema}.job_status,
      finished_at = CASE WHEN c.culprit IS NULL THEN NULL ELSE now() END,
      last_error_code = CASE WHEN c.culprit IS NULL THEN j.last_error_code
                             ELSE 'DEPENDENCY_FAILED' END,
      last_error_class = CASE WHEN c.culprit IS NULL THEN j.last_error_class
                              ELSE 'permanent' END,
      last_error_detail = CASE WHEN c.culprit IS NULL THEN j.last_error_detail
                               ELSE 'dependency ' || c.culprit END
  FROM c
  WHERE j.id = c.id AND (c.ready OR c.culprit IS NOT NULL)
  RETURNING j.id, j.status, j.queue_name, j.available_at, j.lease_token, j.attempt_count,
            c.culprit
), ev AS (
  INSERT INTO {schema}.job_events
    (job_id, event, from_status, to_status, actor, lease_token, attempt, error_code,
     error_class, detail)
  SELECT id, CASE WHEN culprit IS NULL THEN 'promoted' ELSE 'dependency_failed' END,
         'pending', status, NULL, lease_token, attempt_count,
         CASE WHEN culprit IS NOT NULL THEN 'DEPENDENCY_FAILED' END,
         CASE WHEN culprit IS NOT NULL THEN 'permanent' END,
         CASE WHEN culprit IS NULL THEN 'all dependencies ended'
              ELSE 'dependency ' || culprit || ' (on_dead cancel)' END
  FROM upd
)
SELECT id, status::text,
       CASE WHEN status = 'pending' AND available_at <= now()
         THEN pg_notify(p_channel, queue_name)::text END
FROM upd
-- end: promote_dependents
    LOOP
      IF v_row.status = 'cancelled' THEN
        v_next := v_next || v_row.id;
      END IF;
    END LOOP;
    v_ids := ARRAY(SELECT DISTINCT unnest(v_next) ORDER BY 1);
  END LOOP;
END
$fn$;
