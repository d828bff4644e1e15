-- leaseq schema, version 26: fair dispatch across keys inside one queue (docs/fairness.md).
--
-- A job enqueued with a fairness_key is claimed by claim_fair_jobs, which rotates over the
-- queue's keys with claimable work, weighted round robin (stride scheduling): each key's
-- row in fair_keys holds its weight and its pass (virtual time: a claim of m of its jobs
-- advances it by m / weight), and a claim takes the jobs with the lowest passes. The
-- state is kept by single-row updates in the claim's own statement. Such jobs leave the
-- plain claim's index (jobs_claimable_idx now holds jobs without a key only) for their own,
-- jobs_fair_idx, ordered within a key as the plain claim orders a queue (priority, then
-- available_at, id). A queue with a fair_keys row is claimed by claim_fair_jobs only; its
-- jobs without a key take their turns as one more key (the key '').
--
-- A key found with nothing claimable is parked (parked_until, park_step: 0.05 s doubling up
-- to 10 s), so a queue with many idle keys does not probe them claim after claim; an
-- enqueue of the key unparks it (and bumps gen, which makes a claim that read the key
-- before that enqueue park nothing: its UPDATE re-checks gen on the row it locks). pass
-- NULL: the key joins (or returns) at the queue's current virtual time.
ALTER TABLE {schema}.jobs ADD COLUMN fairness_key text;

DROP INDEX {schema}.jobs_claimable_idx;
CREATE INDEX jobs_claimable_idx
  ON {schema}.jobs (queue_name, priority DESC, available_at, id)
  WHERE status = 'pending' AND NOT blocked AND NOT waiting AND fairness_key IS NULL;

CREATE INDEX jobs_fair_idx
  ON {schema}.jobs (queue_name, fairness_key, priority DESC, available_at, id)
  WHERE status = 'pending' AND NOT blocked AND NOT waiting AND fairness_key IS NOT NULL;

CREATE TABLE {schema}.fair_keys (
  queue_name text NOT NULL,
  fairness_key text NOT NULL,
  weight float8 NOT NULL DEFAULT 1,
  pass float8,
  gen bigint NOT NULL DEFAULT 0,
  parked_until timestamptz,
  park_step float8 NOT NULL DEFAULT 0,
  PRIMARY KEY (queue_name, fairness_key),
  CONSTRAINT fair_keys_weight_positive CHECK (weight > 0 AND weight <= 1000000)
);

-- The keys in turn (not parked) by pass, and the parked ones by the end of their park.
CREATE INDEX fair_keys_pass_idx ON {schema}.fair_keys (queue_name, pass NULLS FIRST)
  WHERE parked_until IS NULL;
CREATE INDEX fair_keys_parked_idx ON {schema}.fair_keys (queue_name, parked_until)
  WHERE parked_until IS NOT NULL;

-- queue_stats: the pending rows are now in three partial indexes (keyless claimable, fair
-- claimable, blocked).
CREATE OR REPLACE VIEW {schema}.queue_stats AS
WITH pending_rows AS (
  SELECT queue_name, available_at FROM {schema}.jobs
  WHERE status = 'pending' AND NOT blocked AND NOT waiting AND fairness_key IS NULL
  UNION ALL
  SELECT queue_name, available_at FROM {schema}.jobs
  WHERE status = 'pending' AND NOT blocked AND NOT waiting AND fairness_key IS NOT NULL
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

-- claim_jobs's (and claim_limited_jobs's) way of saying "this queue is fair: claim it with
-- claim_fair_jobs" (SQLSTATE LQ010), before anything is locked.
CREATE FUNCTION {schema}.claim_needs_fair()
RETURNS bigint[]
LANGUAGE plpgsql
AS $fn$
BEGIN
  RAISE EXCEPTION 'leaseq: this queue has fairness keys (claim_fair_jobs takes it)'
    USING ERRCODE = 'LQ010';
END
$fn$;

-- autoscaling (version 22) counts claimable rows from both claim indexes.
CREATE OR REPLACE VIEW {schema}.autoscaling AS
WITH claimable_rows AS (
  -- Keyless jobs from jobs_claimable_idx, jobs with a fairness key from jobs_fair_idx
  -- (version 26).
  SELECT queue_name, available_at FROM {schema}.jobs
  WHERE status = 'pending' AND NOT blocked AND NOT waiting AND fairness_key IS NULL
    AND available_at <= now()
  UNION ALL
  SELECT queue_name, available_at FROM {schema}.jobs
  WHERE status = 'pending' AND NOT blocked AND NOT waiting AND fairness_key IS NOT NULL
    AND available_at <= now()
), claimable AS (
  SELECT queue_name, count(*) AS claimable, min(available_at) AS oldest
  FROM claimable_rows
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

-- The SQL API's copies of the client's statements refreshed (tools/sql_api_refresh.py):
-- fairness_key, an option of enqueue and enqueue_many as of this version.

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
  p_fairness_key text := a_job->>'fairness_key';
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
  -- A fairness key: its row created or unparked, gen bumped (touch_fair_keys), in this
  -- transaction; the queue's key '' too.
  IF p_fairness_key IS NOT NULL THEN
    INSERT INTO {schema}.fair_keys (queue_name, fairness_key) VALUES (p_queue, '')
    ON CONFLICT (queue_name, fairness_key) DO NOTHING;
    INSERT INTO {schema}.fair_keys AS f (queue_name, fairness_key)
    VALUES (p_queue, p_fairness_key)
    ON CONFLICT (queue_name, fairness_key) DO UPDATE
    SET gen = f.gen + 1, parked_until = NULL, park_step = 0,
        pass = CASE WHEN f.park_step > 0 THEN NULL ELSE f.pass END;
  END IF;
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
     unique_for, unique_states, debounce_until, limit_key, expires_at, fairness_key)
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
         coalesce(p_expires::timestamptz, now() + make_interval(secs => p_expires_in::float8)), p_fairness_key
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
     unique_for, unique_states, debounce_until, limit_key, expires_at, fairness_key)
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
         coalesce(p_expires::timestamptz, now() + make_interval(secs => p_expires_in::float8)), p_fairness_key
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
     unique_for, unique_states, debounce_until, limit_key, expires_at, fairness_key)
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
         coalesce(p_expires::timestamptz, now() + make_interval(secs => p_expires_in::float8)), p_fairness_key
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
   payload_version, idempotency_key, key_policy, limit_key, expires_at, fairness_key)
VALUES (
  p_queue, p_task, p_payload::jsonb, p_priority, p_priority,
  coalesce(p_run_at::timestamptz, now() + make_interval(secs => p_delay)),
  p_max_attempts, p_payload_version, p_idempotency_key, p_key_policy, p_limit_key,
  coalesce(p_expires::timestamptz, now() + make_interval(secs => p_expires_in::float8)), p_fairness_key
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
     expires_at, fairness_key)
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
    p_limit_key, coalesce(p_expires::timestamptz, now() + make_interval(secs => p_expires_in::float8)), p_fairness_key
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

-- _api_check: fairness_key checked as leaseq.validate.check_fairness_key.
CREATE OR REPLACE FUNCTION {schema}._api_check(a_job jsonb)
RETURNS jsonb LANGUAGE plpgsql STABLE
AS $fn$
DECLARE
  v_names text[] := ARRAY['task', 'payload', 'queue', 'priority', 'run_at', 'delay',
    'max_attempts', 'payload_version', 'idempotency_key', 'ordering_key', 'key_policy',
    'unique_key', 'unique_for', 'unique_states', 'on_conflict', 'debounce', 'debounce_max',
    'limit_key', 'depends_on', 'on_dead', 'expires', 'fairness_key', 'batch_id'];
  v_job jsonb;
  v_unknown text;
  v_given text;
  v_key text;
  v_window float8;
  v_states text[];
  v_wait float8;
  v_cap float8;
  v_mode text;
  v_run_at timestamptz;
  v_delay float8 := 0;
  v_limit integer := coalesce(nullif(current_setting('leaseq.payload_limit', true), ''),
                              '1048576')::integer;
  v_deps bigint[];
  v_expires timestamptz;
  v_expires_in float8;
  v_item jsonb;
  v_out jsonb;
BEGIN
  IF jsonb_typeof(a_job) IS DISTINCT FROM 'object' THEN
    PERFORM {schema}._api_refuse('LQ001', format('a job is a JSON object, got %s',
                                                coalesce(jsonb_typeof(a_job), 'NULL')));
  END IF;
  SELECT string_agg(quote_literal(k), ', ' ORDER BY quote_literal(k)) INTO v_unknown
  FROM jsonb_object_keys(a_job) AS k WHERE k <> ALL(v_names);
  IF v_unknown IS NOT NULL THEN
    PERFORM {schema}._api_refuse('LQ001', 'unknown job option(s): ' || v_unknown);
  END IF;
  IF NOT a_job ? 'task' THEN
    PERFORM {schema}._api_refuse('LQ001', 'a job needs a task');
  END IF;
  -- The defaults (leaseq.jobspec.DEFAULTS); JSON null stands for Python's None.
  v_job := jsonb_build_object('payload', 'null'::jsonb, 'queue', 'default', 'priority', 0,
                              'max_attempts', 8, 'key_policy', 'block', 'on_dead', 'cancel')
           || a_job;

  -- leaseq.rules.unique.unique_options and check_schedule
  IF coalesce(jsonb_typeof(v_job->'unique_key'), 'null') = 'null' THEN
    SELECT string_agg(n, ', ' ORDER BY o) INTO v_given
    FROM unnest(ARRAY['unique_for', 'unique_states', 'on_conflict', 'debounce',
                      'debounce_max']) WITH ORDINALITY AS u(n, o)
    WHERE coalesce(jsonb_typeof(v_job->n), 'null') <> 'null';
    IF v_given IS NOT NULL THEN
      PERFORM {schema}._api_refuse('LQ001', v_given || ' needs a unique_key');
    END IF;
  ELSE
    v_key := {schema}._api_key('unique_key', v_job->'unique_key', 'no NUL, valid Unicode');
    v_window := {schema}._api_window('unique_for', v_job->'unique_for');
    IF coalesce(jsonb_typeof(v_job->'unique_states'), 'null') = 'null' THEN
      v_states := CASE WHEN v_window IS NOT NULL THEN ARRAY['pending', 'running', 'succeeded']
                       ELSE ARRAY['pending', 'running'] END;
    ELSE
      IF jsonb_typeof(v_job->'unique_states') NOT IN ('array', 'object') THEN
        PERFORM {schema}._api_refuse('LQ001', format(
          'unique_states must be a list of states, got %s',
          {schema}._api_show(v_job->'unique_states')));
      END IF;
      -- A Python mapping iterates over its keys: so does a JSON object here.
      v_states := CASE jsonb_typeof(v_job->'unique_states')
        WHEN 'array' THEN ARRAY(SELECT e #>> '{}' FROM jsonb_array_elements(v_job->'unique_states')
                                WITH ORDINALITY AS t(e, o) ORDER BY o)
        ELSE ARRAY(SELECT jsonb_object_keys(v_job->'unique_states')) END;
      SELECT string_agg(s, ', ' ORDER BY o) INTO v_given
      FROM (SELECT s, min(o) AS o FROM unnest(v_states) WITH ORDINALITY AS u(s, o)
            WHERE s NOT IN ('pending', 'running', 'succeeded', 'dead', 'cancelled')
            GROUP BY s) AS x;
      IF v_given IS NOT NULL THEN
        PERFORM {schema}._api_refuse('LQ001', 'unique_states: unknown state(s) ' || v_given);
      END IF;
      IF NOT v_states @> ARRAY['pending', 'running'] THEN
        PERFORM {schema}._api_refuse('LQ001', 'unique_states must contain pending and running');
      END IF;
      SELECT string_agg(s, ', ' ORDER BY o) INTO v_given
      FROM (SELECT s, min(o) AS o FROM unnest(v_states) WITH ORDINALITY AS u(s, o)
            WHERE s IN ('succeeded', 'dead', 'cancelled') GROUP BY s) AS x;
      IF v_given IS NOT NULL AND v_window IS NULL THEN
        PERFORM {schema}._api_refuse('LQ001', format(
          'unique_states lists %s but no unique_for is given', v_given));
      END IF;
      v_states := ARRAY(SELECT s FROM unnest(ARRAY['pending', 'running', 'succeeded', 'dead',
                                                   'cancelled']) WITH ORDINALITY AS u(s, o)
                        WHERE s = ANY(v_states) ORDER BY o);
    END IF;
    v_wait := {schema}._api_window('debounce', v_job->'debounce');
    v_cap := {schema}._api_window('debounce_max', v_job->'debounce_max');
    IF v_cap IS NOT NULL AND v_wait IS NULL THEN
      PERFORM {schema}._api_refuse('LQ001', 'debounce_max needs debounce');
    END IF;
    IF v_cap < v_wait THEN
      PERFORM {schema}._api_refuse('LQ001', format(
        'debounce_max (%ss) must be at least debounce (%ss)', v_cap, v_wait));
    END IF;
    IF coalesce(jsonb_typeof(v_job->'on_conflict'), 'null') = 'null' THEN
      v_mode := CASE WHEN v_wait IS NOT NULL THEN 'replace' ELSE 'skip' END;
    ELSIF jsonb_typeof(v_job->'on_conflict') <> 'string'
          OR v_job->>'on_conflict' NOT IN ('skip', 'replace', 'raise') THEN
      PERFORM {schema}._api_refuse('LQ001', format(
        'on_conflict must be skip, replace or raise, got %s',
        {schema}._api_show(v_job->'on_conflict')));
    ELSE
      v_mode := v_job->>'on_conflict';
    END IF;
    IF v_wait IS NOT NULL AND v_mode <> 'replace' THEN
      PERFORM {schema}._api_refuse('LQ001', format(
        'debounce replaces the pending job: on_conflict=%s contradicts it', v_mode));
    END IF;
    IF v_wait IS NOT NULL AND (coalesce(jsonb_typeof(v_job->'run_at'), 'null') <> 'null'
                               OR coalesce(jsonb_typeof(v_job->'delay'), 'null') <> 'null') THEN
      PERFORM {schema}._api_refuse('LQ001',
        'debounce sets when the job runs: give no run_at or delay with it');
    END IF;
  END IF;

  -- leaseq.jobspec.schedule: run_at (a timestamp with its offset) or delay (seconds).
  IF coalesce(jsonb_typeof(v_job->'run_at'), 'null') <> 'null'
     AND coalesce(jsonb_typeof(v_job->'delay'), 'null') <> 'null' THEN
    PERFORM {schema}._api_refuse('LQ001', 'give either run_at or delay, not both');
  END IF;
  IF coalesce(jsonb_typeof(v_job->'run_at'), 'null') <> 'null' THEN
    BEGIN
      IF jsonb_typeof(v_job->'run_at') <> 'string'
         OR v_job->>'run_at' !~
              '[0-9]{2}:[0-9]{2}(:[0-9]{2}(\.[0-9]+)?)? *([zZ]|[+-][0-9]{2}(:?[0-9]{2})?)$' THEN
        RAISE EXCEPTION 'naive';
      END IF;
      v_run_at := (v_job->>'run_at')::timestamptz;
    EXCEPTION WHEN OTHERS THEN
      PERFORM {schema}._api_refuse('LQ001', format(
        'run_at must be a timezone-aware datetime, got %s', {schema}._api_show(v_job->'run_at')));
    END;
    IF abs(extract(epoch FROM v_run_at - now())) > 3153600000 THEN
      PERFORM {schema}._api_refuse('LQ001', format('run_at must be within 100 years of now, got %s',
                                                  v_job->>'run_at'));
    END IF;
  ELSIF coalesce(jsonb_typeof(v_job->'delay'), 'null') <> 'null' THEN
    IF jsonb_typeof(v_job->'delay') <> 'number' THEN
      PERFORM {schema}._api_refuse('LQ001', format('delay must be seconds or a timedelta, got %s',
                                                  {schema}._api_show(v_job->'delay')));
    END IF;
    IF (v_job->>'delay')::numeric < 0 THEN
      PERFORM {schema}._api_refuse('LQ001', format('delay must not be negative, got %s',
                                                  v_job->>'delay'));
    END IF;
    IF (v_job->>'delay')::numeric > 3153600000 THEN
      PERFORM {schema}._api_refuse('LQ001', format(
        'delay must be at most 3.1536e+09 seconds (100 years), got %s', v_job->>'delay'));
    END IF;
    v_delay := (v_job->>'delay')::float8;
  END IF;
  IF v_wait IS NOT NULL THEN
    v_delay := v_wait;
  END IF;

  -- The options checked one by one, in leaseq.jobspec.OPTIONS' order.
  v_out := jsonb_build_object(
    'task', {schema}._api_name('task', v_job->'task'),
    'queue', {schema}._api_name('queue', v_job->'queue'),
    'priority', {schema}._api_int('priority', v_job->'priority', -32768, 32767),
    'max_attempts', {schema}._api_int('max_attempts', v_job->'max_attempts', 1, 10000));
  v_out := v_out || jsonb_build_object(
    'payload_version', CASE WHEN coalesce(jsonb_typeof(v_job->'payload_version'), 'null') <> 'null'
      THEN {schema}._api_int('payload_version', v_job->'payload_version', 0, 2147483647) END,
    'idempotency_key', {schema}._api_key('idempotency_key', v_job->'idempotency_key',
                                         'no NUL, valid Unicode'),
    'ordering_key', {schema}._api_key('ordering_key', v_job->'ordering_key',
                                      'no NUL, valid Unicode'),
    'fairness_key', {schema}._api_key('fairness_key', v_job->'fairness_key',
                                      'no NUL, valid Unicode'));
  IF jsonb_typeof(v_job->'key_policy') IS DISTINCT FROM 'string'
     OR v_job->>'key_policy' NOT IN ('block', 'skip') THEN
    PERFORM {schema}._api_refuse('LQ001', format('key_policy must be ''block'' or ''skip'', got %s',
                                                {schema}._api_show(v_job->'key_policy')));
  END IF;
  v_out := v_out || jsonb_build_object(
    'key_policy', v_job->>'key_policy',
    'limit_key', {schema}._api_key('limit_key', v_job->'limit_key', 'no NUL'),
    'batch_id', CASE WHEN coalesce(jsonb_typeof(v_job->'batch_id'), 'null') <> 'null'
      THEN {schema}._api_int('batch_id', v_job->'batch_id', 1, 9223372036854775807) END,
    'payload', {schema}._api_payload(v_job->'payload', v_limit),
    'run_at', v_run_at, 'delay', v_delay,
    'reschedule', coalesce(jsonb_typeof(v_job->'run_at'), 'null') <> 'null'
                  OR coalesce(jsonb_typeof(v_job->'delay'), 'null') <> 'null',
    'unique_key', v_key, 'unique_for', v_window, 'unique_states', to_jsonb(v_states),
    'on_conflict', v_mode, 'debounce', v_wait, 'debounce_max', v_cap);

  -- leaseq.validate.check_expires: an instant (a timestamp with its offset) or seconds.
  IF jsonb_typeof(v_job->'expires') = 'string' THEN
    BEGIN
      IF v_job->>'expires' !~
           '[0-9]{2}:[0-9]{2}(:[0-9]{2}(\.[0-9]+)?)? *([zZ]|[+-][0-9]{2}(:?[0-9]{2})?)$' THEN
        RAISE EXCEPTION 'naive';
      END IF;
      v_expires := (v_job->>'expires')::timestamptz;
    EXCEPTION WHEN OTHERS THEN
      PERFORM {schema}._api_refuse('LQ001', format(
        'expires must be a timezone-aware datetime, got %s', {schema}._api_show(v_job->'expires')));
    END;
  ELSIF jsonb_typeof(v_job->'expires') = 'number' THEN
    IF (v_job->>'expires')::numeric <= 0 OR (v_job->>'expires')::numeric > 3153600000 THEN
      PERFORM {schema}._api_refuse('LQ001', format(
        'expires must be more than 0 and at most 3.1536e+09 seconds, got %s', v_job->>'expires'));
    END IF;
    v_expires_in := (v_job->>'expires')::float8;
  ELSIF coalesce(jsonb_typeof(v_job->'expires'), 'null') <> 'null' THEN
    PERFORM {schema}._api_refuse('LQ001', format(
      'expires must be seconds, a timedelta or an aware datetime, got %s',
      {schema}._api_show(v_job->'expires')));
  END IF;
  v_out := v_out || jsonb_build_object('expires', v_expires, 'expires_in', v_expires_in);

  -- leaseq.rules.deps.check_depends_on (job ids only: Ref and Dep are Python's).
  IF coalesce(jsonb_typeof(v_job->'depends_on'), 'null') <> 'null' THEN
    IF jsonb_typeof(v_job->'on_dead') IS DISTINCT FROM 'string'
       OR v_job->>'on_dead' NOT IN ('cancel', 'run', 'ignore') THEN
      PERFORM {schema}._api_refuse('LQ001', format('on_dead must be one of cancel, run, ignore, got %s',
                                                  {schema}._api_show(v_job->'on_dead')));
    END IF;
    IF jsonb_typeof(v_job->'depends_on') <> 'array' THEN
      PERFORM {schema}._api_refuse('LQ001', 'depends_on must be a list of job ids, Ref or Dep');
    END IF;
    IF jsonb_array_length(v_job->'depends_on') > 100000 THEN
      PERFORM {schema}._api_refuse('LQ001', 'at most 100000 dependencies per job');
    END IF;
    v_deps := '{}';
    FOR v_item IN SELECT e FROM jsonb_array_elements(v_job->'depends_on') WITH ORDINALITY
                  AS t(e, o) ORDER BY o LOOP
      IF jsonb_typeof(v_item) <> 'number' OR v_item::text !~ '^-?[0-9]+$' THEN
        PERFORM {schema}._api_refuse('LQ001', format('a dependency is a job id, Ref or Dep, got %s',
                                                    {schema}._api_show(v_item)));
      END IF;
      IF v_item::text::numeric < 1 THEN
        PERFORM {schema}._api_refuse('LQ001', format(
          'a dependency''s job id must be positive, got %s', v_item::text));
      END IF;
      IF NOT v_item::text::bigint = ANY(v_deps) THEN
        v_deps := v_deps || v_item::text::bigint;
      END IF;
    END LOOP;
    IF cardinality(v_deps) > 0 THEN
      v_out := v_out || jsonb_build_object('depends_on', to_jsonb(v_deps),
                                           'on_dead', v_job->>'on_dead');
    END IF;
  END IF;

  -- leaseq.ops.deps_async._check_deps
  IF v_out->>'batch_id' IS NOT NULL AND v_key IS NOT NULL THEN
    PERFORM {schema}._api_refuse('LQ001', 'a job in a batch cannot have a unique_key');
  END IF;
  IF v_out ? 'depends_on' AND (v_key IS NOT NULL OR v_out->>'ordering_key' IS NOT NULL) THEN
    PERFORM {schema}._api_refuse('LQ001',
      'depends_on cannot be combined with unique_key or ordering_key');
  END IF;
  RETURN v_out;
END
$fn$;

-- enqueue(..., fairness_key => ...): one more named option.
DROP FUNCTION {schema}.enqueue(text, jsonb, text, integer, timestamptz, float8, integer, integer, text, text, text, text, float8, text[], text, float8, float8, text, bigint[], text, jsonb, bigint);
CREATE FUNCTION {schema}.enqueue(
  task text,
  payload jsonb DEFAULT 'null',
  queue text DEFAULT NULL,
  priority integer DEFAULT NULL,
  run_at timestamptz DEFAULT NULL,
  delay float8 DEFAULT NULL,
  max_attempts integer DEFAULT NULL,
  payload_version integer DEFAULT NULL,
  idempotency_key text DEFAULT NULL,
  ordering_key text DEFAULT NULL,
  key_policy text DEFAULT NULL,
  unique_key text DEFAULT NULL,
  unique_for float8 DEFAULT NULL,
  unique_states text[] DEFAULT NULL,
  on_conflict text DEFAULT NULL,
  debounce float8 DEFAULT NULL,
  debounce_max float8 DEFAULT NULL,
  limit_key text DEFAULT NULL,
  depends_on bigint[] DEFAULT NULL,
  on_dead text DEFAULT NULL,
  expires jsonb DEFAULT NULL,
  batch_id bigint DEFAULT NULL,
  fairness_key text DEFAULT NULL)
RETURNS bigint LANGUAGE sql
AS $fn$
SELECT {schema}._api_insert({schema}._api_check(
  (SELECT coalesce(jsonb_object_agg(o.key, o.value), '{}'::jsonb)
   FROM jsonb_each(jsonb_build_object(
     'task', task, 'queue', queue, 'priority', priority, 'run_at', run_at, 'delay', delay,
     'max_attempts', max_attempts, 'payload_version', payload_version,
     'idempotency_key', idempotency_key, 'ordering_key', ordering_key,
     'key_policy', key_policy, 'unique_key', unique_key, 'unique_for', unique_for,
     'unique_states', unique_states, 'on_conflict', on_conflict, 'debounce', debounce,
     'debounce_max', debounce_max, 'limit_key', limit_key, 'depends_on', depends_on,
     'on_dead', on_dead, 'expires', expires, 'batch_id', batch_id,
     'fairness_key', fairness_key)) AS o
   WHERE jsonb_typeof(o.value) <> 'null')
  || jsonb_build_object('task', task, 'payload', coalesce(payload, 'null'::jsonb))))
$fn$;
