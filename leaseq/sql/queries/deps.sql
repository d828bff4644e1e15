-- Dependencies (leaseq.ops.deps_async; the promotion runs in leaseq.ops.ending_async). A
-- dependent is pending and `waiting` until promote_dependents finds every dependency
-- ended. Promotion runs in the transaction of the fenced transition that ended a
-- dependency, in two statements: lock_dependents locks the waiting dependents (in id
-- order), then promote_dependents decides with a NEW snapshot, taken after those locks
-- (READ COMMITTED, which every leaseq transaction runs at). Two dependencies ending at
-- once in two transactions both lock the shared dependent, so the second decides after
-- the first committed and sees both ended: none is left waiting.


-- name: lock_dependency_parents
-- Enqueue of dependents: lock the dependencies named (id order) and mark them as having
-- dependents. A completion of one of them either committed before (then its status is
-- read here, at its latest version) or waits for this transaction and then finds
-- has_dependents set (the plain statements exclude such rows; the client re-runs them
-- with the coordinated ones). Ids missing from the result do not exist.
WITH locked AS (
  SELECT id, has_dependents, status
  FROM {schema}.jobs
  WHERE id = ANY(%(ids)s::bigint[])
  ORDER BY id
  FOR UPDATE
), flag AS (
  UPDATE {schema}.jobs AS j
  SET has_dependents = true
  FROM locked AS l
  WHERE j.id = l.id AND NOT l.has_dependents
)
SELECT id, status::text FROM locked;

-- name: insert_deps
-- The edges of jobs just inserted, and their `waiting` flag (the rows are not visible to
-- any claim before this transaction commits; promote_dependents runs next).
WITH edges AS (
  INSERT INTO {schema}.job_deps (job_id, depends_on, on_dead)
  SELECT * FROM unnest(%(job_ids)s::bigint[], %(depends_on)s::bigint[], %(on_dead)s::text[])
  ON CONFLICT DO NOTHING
)
UPDATE {schema}.jobs SET waiting = true WHERE id = ANY(%(ids)s::bigint[]);

-- name: lock_dependents
-- The waiting dependents of jobs that just ended, locked in id order (see above).
SELECT j.id
FROM {schema}.jobs AS j
WHERE j.id IN (SELECT d.job_id FROM {schema}.job_deps AS d
               WHERE d.depends_on = ANY(%(ids)s::bigint[]))
  AND j.waiting
ORDER BY j.id
FOR UPDATE;

-- name: promote_dependents
-- Readiness derived from the edge rows: a waiting job whose dependencies have all ended
-- becomes claimable ('promoted'); one with a dependency ended dead or cancelled under
-- on_dead 'cancel' ends cancelled at once ('dependency_failed'). A dependency that no
-- longer exists (pruned) counts as ended. The caller locked these rows (lock_dependents)
-- or inserted them in this transaction. Rows: (id, new status, notify).
-- Cost: "any unfinished dependency?" stops at the first one found, scanning from the
-- highest id down (jobs tend to end in id order, so a fan-in of N finds one at once rather
-- than reading N edges at every ending). A failed dependency is looked for only among
-- %(ended)s, the jobs whose ending runs this (an earlier failure was decided when it
-- happened); NULL (enqueue, replay) looks at every dependency. MATERIALIZED: each
-- job's answer is computed once, not once per SET expression that reads it.
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
         CASE WHEN %(ended)s::bigint[] IS NULL THEN
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
             WHERE d.job_id = j.id AND d.depends_on = ANY(%(ended)s::bigint[])
               AND d.on_dead = 'cancel' AND p.status IN ('dead', 'cancelled')
             ORDER BY d.depends_on
             LIMIT 1)
         END AS culprit
  FROM {schema}.jobs AS j
  WHERE j.id = ANY(%(ids)s::bigint[]) AND j.waiting AND j.status = 'pending'
), upd AS (
  UPDATE {schema}.jobs AS j
  SET waiting = false,
      status = CASE WHEN c.culprit IS NULL THEN 'pending' ELSE 'cancelled' END
               ::{schema}.job_status,
      finished_at = CASE WHEN c.culprit IS NULL THEN NULL ELSE now() END,
      last_error_code = CASE WHEN c.culprit IS NULL THEN j.last_error_code
                             ELSE '{code:DEPENDENCY_FAILED}' END,
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
         CASE WHEN culprit IS NOT NULL THEN '{code:DEPENDENCY_FAILED}' END,
         CASE WHEN culprit IS NOT NULL THEN 'permanent' END,
         CASE WHEN culprit IS NULL THEN 'all dependencies ended'
              ELSE 'dependency ' || culprit || ' (on_dead cancel)' END
  FROM upd
)
SELECT id, status::text,
       CASE WHEN status = 'pending' AND available_at <= now()
         THEN pg_notify(%(channel)s, queue_name)::text END
FROM upd;

-- name: dependency_ids
-- The dependencies of jobs that wait again (replayed), to be locked before deciding them.
SELECT DISTINCT depends_on FROM {schema}.job_deps WHERE job_id = ANY(%(ids)s::bigint[]);

-- name: replay_dependents
-- replay(with_dependents=True): the jobs cancelled because one of these (just replayed)
-- jobs ended, and transitively theirs, come back pending and waiting, audited as replays;
-- promote_dependents then decides them in the same transaction.
WITH RECURSIVE down(id) AS (
  SELECT d.job_id
  FROM {schema}.job_deps AS d JOIN {schema}.jobs AS j ON j.id = d.job_id
  WHERE d.depends_on = ANY(%(ids)s::bigint[])
    AND j.status = 'cancelled' AND j.last_error_code = '{code:DEPENDENCY_FAILED}'
  UNION
  SELECT d.job_id
  FROM down
  JOIN {schema}.job_deps AS d ON d.depends_on = down.id
  JOIN {schema}.jobs AS j ON j.id = d.job_id
  WHERE j.status = 'cancelled' AND j.last_error_code = '{code:DEPENDENCY_FAILED}'
), locked AS (
  SELECT j.id, j.attempt_count
  FROM {schema}.jobs AS j
  WHERE j.id IN (SELECT id FROM down) AND j.status = 'cancelled'
  ORDER BY j.id
  FOR UPDATE
), upd AS (
  UPDATE {schema}.jobs AS j
  SET status = 'pending',
      waiting = true,
      attempt_count = 0,
      unknown_failures = 0,
      available_at = now(),
      finished_at = NULL,
      cancel_requested_at = NULL
  FROM locked AS l
  WHERE j.id = l.id
  RETURNING j.id, j.lease_token, l.attempt_count
)
INSERT INTO {schema}.job_events
  (job_id, event, from_status, to_status, actor, lease_token, attempt, detail)
SELECT id, 'replayed', 'cancelled', 'pending', %(actor)s, lease_token, attempt_count,
       left('with its dependency: ' || %(reason)s, 4000)
FROM upd
RETURNING job_id;

-- name: job_dependencies
-- jobs show: what a job waits for (or waited for), with their states.
SELECT d.depends_on, d.on_dead, p.status::text
FROM {schema}.job_deps AS d
LEFT JOIN {schema}.jobs AS p ON p.id = d.depends_on
WHERE d.job_id = %(id)s
ORDER BY d.depends_on;

-- name: job_dependents
-- jobs show: the jobs that wait for (or waited for) this one, with their states.
SELECT d.job_id, d.on_dead, j.status::text, j.waiting
FROM {schema}.job_deps AS d
JOIN {schema}.jobs AS j ON j.id = d.job_id
WHERE d.depends_on = %(id)s
ORDER BY d.job_id
LIMIT %(limit)s;

-- name: waiting_stats
-- Metrics: jobs waiting on dependencies and the oldest such wait (partial index on
-- created_at WHERE waiting).
SELECT count(*), coalesce(extract(epoch FROM now() - min(created_at)), 0)::float8
FROM {schema}.jobs
WHERE waiting;

-- name: list_waiting
-- `leaseq waiting`: waiting jobs, oldest first, with what each still waits for (its
-- unfinished dependencies; the view waiting_jobs has every edge).
SELECT j.id, j.queue_name, j.task, extract(epoch FROM now() - j.created_at)::float8,
       (SELECT array_agg(d.depends_on ORDER BY d.depends_on)
          FROM {schema}.job_deps AS d
          JOIN {schema}.jobs AS p ON p.id = d.depends_on
         WHERE d.job_id = j.id AND p.status IN ('pending', 'running', 'suspended'))
FROM {schema}.jobs AS j
WHERE j.waiting
ORDER BY j.created_at, j.id
LIMIT %(limit)s;
