-- leaseq schema, version 12: job dependencies, batches and stored results.
--
-- A dependency is an edge row (job_id waits for depends_on). A job with an unfinished
-- dependency is stored pending but `waiting`, outside the claim index. Readiness is derived
-- from the edge rows and the dependencies' statuses, in the transaction that makes a
-- dependency terminal (never from a counter). `has_dependents` marks jobs that some edge
-- names, so their completions take the coordinated statements that promote dependents;
-- everything else keeps the plain statements.
ALTER TABLE {schema}.jobs
  ADD COLUMN waiting boolean NOT NULL DEFAULT false,
  ADD COLUMN has_dependents boolean NOT NULL DEFAULT false,
  ADD COLUMN batch_id bigint,
  ADD CONSTRAINT jobs_only_pending_jobs_wait CHECK (NOT waiting OR status = 'pending');

-- The claim index, now without waiting jobs (a big fan-in's waiting rows would otherwise
-- sit in front of every claim's scan).
DROP INDEX {schema}.jobs_claimable_idx;
CREATE INDEX jobs_claimable_idx
  ON {schema}.jobs (queue_name, priority DESC, available_at, id)
  WHERE status = 'pending' AND NOT blocked AND NOT waiting;

-- Waiting jobs by age: the metrics' count and oldest wait, and the blockers view.
CREATE INDEX jobs_waiting_idx
  ON {schema}.jobs (created_at)
  WHERE waiting;

-- One row per dependency. on_dead: what a dependency ending dead or cancelled does to the
-- dependent (cancel it, run it anyway, or run it without reporting that dependency).
-- Dependencies always existed before their dependent (ids are checked at enqueue), so the
-- graph cannot have a cycle. No foreign key on depends_on: pruning a finished dependency
-- must not touch its dependents' rows (a missing dependency counts as finished).
CREATE TABLE {schema}.job_deps (
  job_id bigint NOT NULL REFERENCES {schema}.jobs (id) ON DELETE CASCADE,
  depends_on bigint NOT NULL,
  on_dead text NOT NULL DEFAULT 'cancel',
  PRIMARY KEY (job_id, depends_on),
  CONSTRAINT job_deps_on_dead_known CHECK (on_dead IN ('cancel', 'run', 'ignore')),
  CONSTRAINT job_deps_not_self CHECK (job_id <> depends_on)
);

-- Who waits for a job that just finished: the promotion's first probe.
CREATE INDEX job_deps_depends_on_idx ON {schema}.job_deps (depends_on);

-- A batch groups jobs (jobs.batch_id; its members are marked has_dependents, so their
-- endings take the coordinated statements). open: jobs may join; sealed: they may not;
-- done: its callbacks were enqueued. Callbacks are job specs (task, payload, queue,
-- priority, max_attempts); counts are derived from the member rows when it fires.
CREATE TABLE {schema}.batches (
  id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
  state text NOT NULL DEFAULT 'open',
  on_success jsonb,
  on_failure jsonb,
  on_finish jsonb,
  created_at timestamptz NOT NULL DEFAULT now(),
  sealed_at timestamptz,
  finished_at timestamptz,
  CONSTRAINT batches_state_known CHECK (state IN ('open', 'sealed', 'done'))
);

-- A batch's members: counted when it fires, listed by `leaseq batches show`.
CREATE INDEX jobs_batch_idx ON {schema}.jobs (batch_id) WHERE batch_id IS NOT NULL;

-- One row per callback enqueued: the primary key is what makes each fire at most once,
-- however many transactions find the batch finished.
CREATE TABLE {schema}.batch_callbacks (
  batch_id bigint NOT NULL,
  kind text NOT NULL,
  job_id bigint NOT NULL,
  created_at timestamptz NOT NULL DEFAULT now(),
  PRIMARY KEY (batch_id, kind),
  CONSTRAINT batch_callbacks_kind_known CHECK (kind IN ('success', 'failure', 'finish'))
);

-- Stored results of tasks with store_result=True, written by the fenced completion itself
-- (lease_token: the attempt that wrote it). Their own retention (expires_at), independent of
-- job pruning, so a result is never lost to the job's pruning before it expires.
CREATE TABLE {schema}.job_results (
  job_id bigint PRIMARY KEY,
  value jsonb NOT NULL,
  stored_at timestamptz NOT NULL DEFAULT now(),
  expires_at timestamptz NOT NULL,
  lease_token bigint NOT NULL
);

CREATE INDEX job_results_expires_idx ON {schema}.job_results (expires_at);

-- queue_stats: jobs waiting on dependencies are neither ready nor scheduled (an old
-- waiting job must not look like a stuck queue).
CREATE OR REPLACE VIEW {schema}.queue_stats AS
WITH pending AS (
  SELECT queue_name,
         count(*) FILTER (WHERE available_at <= now()) AS ready,
         count(*) FILTER (WHERE available_at > now()) AS scheduled,
         min(available_at) FILTER (WHERE available_at <= now()) AS oldest_ready
  FROM {schema}.jobs
  WHERE status = 'pending' AND NOT waiting
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

-- Waiting jobs with what they wait for, for psql users and `leaseq jobs waiting`.
CREATE VIEW {schema}.waiting_jobs AS
SELECT j.id, j.queue_name, j.task, j.created_at, now() - j.created_at AS waiting_for,
       d.depends_on, d.on_dead, p.status AS dependency_status
FROM {schema}.jobs AS j
JOIN {schema}.job_deps AS d ON d.job_id = j.id
LEFT JOIN {schema}.jobs AS p ON p.id = d.depends_on
WHERE j.waiting;
