-- leaseq schema, version 35: a batch callback carries its cost (issue 32): fire_batches writes
-- the callback job's cost from its stored signature (1 for one stored before job cost). The
-- SQL API's copies of the client's statements refreshed (tools/sql_api_refresh.py --new).

-- _api_promote, first defined in 0025_sql_api_refresh.sql, refreshed.
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
    (id, queue_name, task, payload, priority, base_priority, max_attempts, cost)
  OVERRIDING SYSTEM VALUE
  SELECT cb.job_id, c.spec->>'queue', c.spec->>'task',
         jsonb_build_object('batch_id', c.batch_id, 'kind', c.kind, 'total', c.total,
                            'succeeded', c.succeeded, 'dead', c.dead,
                            'cancelled', c.cancelled, 'payload', c.spec->'payload'),
         (c.spec->>'priority')::int, (c.spec->>'priority')::int,
         (c.spec->>'max_attempts')::int,
         -- A spec stored before job cost (version 30) has none: cost 1.
         coalesce((c.spec->>'cost')::int, 1)
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
