-- leaseq's complete current schema: what `leaseq migrate` builds from migration 0001 up to
-- the version below, written out in one place to read.
--
-- schema version: 11
--
-- `migrate()` never runs this file; the migrations in migrations/NNNN_*.sql are the source
-- of every database's schema. tests/integration/test_schema_sql.py builds one schema from the
-- migrations and one from this file and requires the two to be identical (tables, columns,
-- constraints, indexes, views, types, functions and the recorded versions), so a new
-- migration must come with its change here. {schema} is replaced by the quoted schema
-- identifier, as in the migrations. Column order is the order the migrations produce.

-- The versions applied, one row per migration (written by `leaseq migrate`).
CREATE TABLE {schema}.schema_version (
  version integer PRIMARY KEY,
  name text NOT NULL,
  applied_at timestamptz NOT NULL DEFAULT now()
);

INSERT INTO {schema}.schema_version (version, name) VALUES
  (1, 'initial'),
  (2, 'failure_policy'),
  (3, 'effects'),
  (4, 'queue_stats'),
  (5, 'ordering'),
  (6, 'key_heads'),
  (7, 'unique'),
  (8, 'pauses'),
  (9, 'schedules'),
  (10, 'trace_context'),
  (11, 'workflows');

CREATE TYPE {schema}.job_status AS ENUM (
  'pending', 'running', 'succeeded', 'dead', 'cancelled'
);

-- The seed's column names are kept (queue_name ... finished_at): tools and operators rely on
-- them.
CREATE TABLE {schema}.jobs (
  id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
  queue_name text NOT NULL,
  task text NOT NULL,
  payload jsonb NOT NULL,
  status {schema}.job_status NOT NULL DEFAULT 'pending',
  -- Claim order; may grow with priority aging (base_priority keeps the enqueue value).
  priority integer NOT NULL DEFAULT 0,
  available_at timestamptz NOT NULL DEFAULT now(),
  attempt_count integer NOT NULL DEFAULT 0,
  max_attempts integer NOT NULL DEFAULT 8,
  -- The lease: owner and expiry (database time); the token grows with every claim and
  -- fences every later write of the attempt.
  lease_owner text,
  lease_token bigint NOT NULL DEFAULT 0,
  lease_expires_at timestamptz,
  last_error_code text,
  last_error_detail text,
  created_at timestamptz NOT NULL DEFAULT now(),
  started_at timestamptz,
  heartbeat_at timestamptz,
  finished_at timestamptz,
  cancel_requested_at timestamptz,
  payload_version integer,
  last_error_class text,
  -- Failures of unknown cause get a smaller budget than transient ones; counted apart.
  unknown_failures integer NOT NULL DEFAULT 0,
  idempotency_key text,
  ordering_key text,
  -- A keyed job behind its key's head: pending, but outside the claim index.
  blocked boolean NOT NULL DEFAULT false,
  -- What a dead head does to its key: block (wait for replay or skip) or skip.
  key_policy text NOT NULL DEFAULT 'block',
  -- An operator skipped this dead head: it no longer blocks its key.
  key_skipped boolean NOT NULL DEFAULT false,
  -- The priority given at enqueue; `priority` may grow with aging.
  base_priority integer NOT NULL DEFAULT 0,
  -- Unique jobs: the key, how long it stays held after the job finishes (seconds), and in
  -- which final states; debounce_until caps how far a debounce may push available_at.
  unique_key text,
  unique_for float8,
  unique_states text[],
  debounce_until timestamptz,
  -- Tracing context of the enqueuing code and of the latest failed attempt (leaseq[otel]).
  trace_context jsonb,
  -- Dependencies (version 11): pending but waiting for a dependency (outside the claim
  -- index); some job depends on this one (its completion promotes dependents).
  waiting boolean NOT NULL DEFAULT false,
  has_dependents boolean NOT NULL DEFAULT false,
  -- The batch this job belongs to (version 11).
  batch_id bigint,
  CONSTRAINT jobs_max_attempts_positive CHECK (max_attempts >= 1),
  CONSTRAINT jobs_attempts_nonnegative CHECK (attempt_count >= 0),
  -- A running job always has an owner and an expiry; no other state keeps either, so a
  -- half-cleared lease can never be mistaken for ownership.
  CONSTRAINT jobs_lease_iff_running CHECK (
    (status = 'running') = (lease_owner IS NOT NULL AND lease_expires_at IS NOT NULL)
  ),
  CONSTRAINT jobs_error_detail_bounded CHECK (length(last_error_detail) <= 4000),
  CONSTRAINT jobs_error_code_bounded CHECK (length(last_error_code) <= 64),
  CONSTRAINT jobs_error_class_known
    CHECK (last_error_class IN ('permanent', 'transient', 'unknown')),
  CONSTRAINT jobs_idempotency_key_bounded CHECK (length(idempotency_key) <= 200),
  CONSTRAINT jobs_ordering_key_bounded CHECK (length(ordering_key) <= 200),
  CONSTRAINT jobs_key_policy_known CHECK (key_policy IN ('block', 'skip')),
  CONSTRAINT jobs_only_keyed_jobs_block CHECK (NOT blocked OR ordering_key IS NOT NULL),
  CONSTRAINT jobs_unique_key_bounded CHECK (length(unique_key) <= 200),
  CONSTRAINT jobs_only_pending_jobs_wait CHECK (NOT waiting OR status = 'pending')
);

-- The claim reads this index in order and stops at LIMIT; only claimable pending rows live
-- in it, so finished history, blocked per-key backlogs and jobs waiting for dependencies
-- do not slow claims down.
CREATE INDEX jobs_claimable_idx
  ON {schema}.jobs (queue_name, priority DESC, available_at, id)
  WHERE status = 'pending' AND NOT blocked AND NOT waiting;

-- The sweep looks only at running rows whose lease ran out.
CREATE INDEX jobs_expired_lease_idx
  ON {schema}.jobs (lease_expires_at)
  WHERE status = 'running';

-- Dead jobs are an operational state: listing them by queue and age must stay cheap.
CREATE INDEX jobs_dead_idx
  ON {schema}.jobs (queue_name, finished_at)
  WHERE status = 'dead';

-- A key's live jobs in order: finds a key's head and the next job to unblock.
CREATE INDEX jobs_ordering_idx
  ON {schema}.jobs (ordering_key, id)
  WHERE ordering_key IS NOT NULL AND status IN ('pending', 'running', 'dead');

-- A key's current head(s) without walking its backlog: at most one entry per key.
CREATE INDEX jobs_key_heads_idx
  ON {schema}.jobs (ordering_key)
  WHERE ordering_key IS NOT NULL AND status = 'pending' AND NOT blocked;

-- Who holds each unique key: held_until NULL = a live job (pending or running) holds it; a
-- time = the window after that job finished, which ends then. Pruning or purging jobs never
-- touches this table, so a window cannot shrink.
CREATE TABLE {schema}.unique_keys (
  unique_key text PRIMARY KEY,
  job_id bigint NOT NULL,
  held_until timestamptz
);

-- Expired windows are found (and deleted by the sweep) without scanning live keys.
CREATE INDEX unique_keys_held_until_idx
  ON {schema}.unique_keys (held_until)
  WHERE held_until IS NOT NULL;

-- Every transition other than claim and succeed leaves a row here, written by the same
-- statement that makes the transition, so the trail can never disagree with the job. No
-- foreign key: the trail outlives jobs that retention or a purge removed.
CREATE TABLE {schema}.job_events (
  id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
  job_id bigint NOT NULL,
  at timestamptz NOT NULL DEFAULT now(),
  event text NOT NULL,
  from_status {schema}.job_status,
  to_status {schema}.job_status,
  actor text,
  lease_token bigint,
  attempt integer,
  error_code text,
  detail text,
  error_class text,
  CONSTRAINT job_events_detail_bounded CHECK (length(detail) <= 4000)
);

CREATE INDEX job_events_job_idx ON {schema}.job_events (job_id, id);

-- One row per external effect a job declared ("charge-card", optionally per key). A row left
-- 'started' by an earlier attempt means the outcome is uncertain: the effect may or may not
-- have happened, and a reconcile hook (or a human) must decide before anything is repeated.
CREATE TABLE {schema}.job_effects (
  job_id bigint NOT NULL,
  name text NOT NULL,
  key text NOT NULL DEFAULT '',
  status text NOT NULL,
  attempt integer NOT NULL,
  lease_token bigint NOT NULL,
  started_at timestamptz NOT NULL DEFAULT now(),
  finished_at timestamptz,
  result jsonb,
  error text,
  PRIMARY KEY (job_id, name, key),
  CONSTRAINT job_effects_status_known CHECK (status IN ('started', 'done', 'failed')),
  CONSTRAINT job_effects_error_bounded CHECK (length(error) <= 4000),
  CONSTRAINT job_effects_name_bounded CHECK (length(name) <= 128 AND length(key) <= 200)
);

-- The whole audit trail with the job it belongs to: `leaseq jobs show` for psql users.
-- A LEFT JOIN, because the trail outlives jobs that retention or a purge removed.
CREATE VIEW {schema}.job_history AS
SELECT e.job_id, e.id AS event_id, e.at, e.event, e.from_status, e.to_status, e.actor,
       e.lease_token, e.attempt, e.error_code, e.error_class, e.detail,
       j.queue_name, j.task, j.status AS current_status
FROM {schema}.job_events AS e
LEFT JOIN {schema}.jobs AS j ON j.id = e.job_id;

-- Dead jobs as an operational list: what failed, how, and for how long it has waited.
CREATE VIEW {schema}.dead_jobs AS
SELECT id, queue_name, task, last_error_code, last_error_class, last_error_detail,
       attempt_count, max_attempts, created_at, finished_at, now() - finished_at AS dead_for
FROM {schema}.jobs
WHERE status = 'dead';

-- Per-queue health for psql users, `leaseq status` and the metrics endpoint. Each part reads
-- one partial index (pending, running, dead), so it stays cheap however much finished
-- history the table holds. Jobs waiting on dependencies are neither ready nor scheduled
-- (see waiting_jobs).
CREATE VIEW {schema}.queue_stats AS
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

-- Who holds each unique key, with the holder's state (NULL once the job was pruned): for
-- psql users. live = a pending or running job holds it; otherwise a window until held_until.
CREATE VIEW {schema}.unique_key_holders AS
SELECT k.unique_key, k.job_id, k.held_until IS NULL AS live, k.held_until,
       j.status AS job_status, j.queue_name, j.task
FROM {schema}.unique_keys AS k
LEFT JOIN {schema}.jobs AS j ON j.id = k.job_id;

-- A pause row stops claims of its scope (a queue, a task, or an ordering key) from the
-- moment it commits: claim_jobs reads this table in the claim statement itself, so no
-- worker memory is involved and a pause survives restarts and deploys. A pause on a queue
-- that has no jobs yet is valid.
CREATE TABLE {schema}.pauses (
  scope text NOT NULL,
  value text NOT NULL,
  paused_at timestamptz NOT NULL DEFAULT now(),
  paused_by text,
  reason text NOT NULL,
  PRIMARY KEY (scope, value),
  CONSTRAINT pauses_scope_known CHECK (scope IN ('queue', 'task', 'ordering_key')),
  CONSTRAINT pauses_value_bounded CHECK (length(value) BETWEEN 1 AND 200),
  CONSTRAINT pauses_paused_by_bounded CHECK (length(paused_by) <= 200),
  CONSTRAINT pauses_reason_bounded CHECK (length(reason) <= 4000)
);

-- Operator actions that are not about one job (pause, resume; later schedules and limits):
-- who did what to which scope, when, and why. Job-level actions stay in job_events.
CREATE TABLE {schema}.admin_events (
  id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
  at timestamptz NOT NULL DEFAULT now(),
  actor text,
  action text NOT NULL,
  scope text,
  value text,
  reason text,
  detail text,
  CONSTRAINT admin_events_actor_bounded CHECK (length(actor) <= 200),
  CONSTRAINT admin_events_action_bounded CHECK (length(action) <= 64),
  CONSTRAINT admin_events_scope_bounded CHECK (length(scope) <= 64),
  CONSTRAINT admin_events_value_bounded CHECK (length(value) <= 200),
  CONSTRAINT admin_events_reason_bounded CHECK (length(reason) <= 4000),
  CONSTRAINT admin_events_detail_bounded CHECK (length(detail) <= 4000)
);

-- The pauses in force, for psql users, `leaseq status` and the metrics endpoint.
CREATE VIEW {schema}.paused_scopes AS
SELECT scope, value, paused_at, paused_by, reason,
       extract(epoch FROM now() - paused_at)::float8 AS paused_for
FROM {schema}.pauses;

-- Periodic schedules (version 9): a schedule row says when it ticks and what it enqueues;
-- a schedule_ticks row is one tick, keyed by (schedule, UTC instant), inserted by the same
-- statement as the tick's job, so two tickers can never both enqueue one tick.
CREATE TABLE {schema}.schedules (
  name text PRIMARY KEY,
  task text NOT NULL,
  cron text,
  every_seconds double precision,
  payload jsonb NOT NULL DEFAULT 'null',
  tz text NOT NULL DEFAULT 'UTC',
  queue text NOT NULL DEFAULT 'default',
  priority integer NOT NULL DEFAULT 0,
  max_attempts integer NOT NULL DEFAULT 8,
  catch_up text NOT NULL DEFAULT 'latest',
  catch_up_max integer NOT NULL DEFAULT 100,
  grace_seconds double precision NOT NULL DEFAULT 600,
  overlap text NOT NULL DEFAULT 'allow',
  enabled boolean NOT NULL DEFAULT true,
  -- What the code last declared for `enabled`: a worker start applies the code's flag only
  -- when it changed there, so an operator's enable/disable outlasts restarts.
  declared_enabled boolean,
  source text NOT NULL,
  last_tick timestamptz,
  next_tick timestamptz NOT NULL,
  last_job_id bigint,
  skipped_ticks bigint NOT NULL DEFAULT 0,
  updated_by text,
  updated_at timestamptz NOT NULL DEFAULT now(),
  created_at timestamptz NOT NULL DEFAULT now(),
  CONSTRAINT schedules_one_timing CHECK ((cron IS NULL) <> (every_seconds IS NULL)),
  CONSTRAINT schedules_every_positive CHECK (every_seconds >= 1),
  CONSTRAINT schedules_catch_up CHECK (catch_up IN ('none', 'latest', 'all')),
  CONSTRAINT schedules_catch_up_max CHECK (catch_up_max BETWEEN 1 AND 10000),
  CONSTRAINT schedules_grace CHECK (grace_seconds BETWEEN 1 AND 86400),
  CONSTRAINT schedules_overlap CHECK (overlap IN ('allow', 'skip', 'queue')),
  CONSTRAINT schedules_source CHECK (source IN ('code', 'dynamic')),
  CONSTRAINT schedules_max_attempts CHECK (max_attempts >= 1)
);

-- The tickers' question, "which enabled schedule is due?", reads only this index.
CREATE INDEX schedules_due_idx ON {schema}.schedules (next_tick) WHERE enabled;

-- One row per tick: job_id is the job it enqueued, or NULL with `skipped` saying why not
-- (overlap). The primary key is what makes a tick enqueue at most one job.
CREATE TABLE {schema}.schedule_ticks (
  schedule_name text NOT NULL,
  tick_at timestamptz NOT NULL,
  job_id bigint,
  catch_up boolean NOT NULL DEFAULT false,
  manual boolean NOT NULL DEFAULT false,
  skipped text,
  created_at timestamptz NOT NULL DEFAULT now(),
  PRIMARY KEY (schedule_name, tick_at),
  CONSTRAINT schedule_ticks_job_or_reason CHECK ((job_id IS NULL) <> (skipped IS NULL))
);

-- Job dependencies, batches and stored results (version 11).
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

-- Waiting jobs with what they wait for, for psql users and `leaseq jobs waiting`.
CREATE VIEW {schema}.waiting_jobs AS
SELECT j.id, j.queue_name, j.task, j.created_at, now() - j.created_at AS waiting_for,
       d.depends_on, d.on_dead, p.status AS dependency_status
FROM {schema}.jobs AS j
JOIN {schema}.job_deps AS d ON d.job_id = j.id
LEFT JOIN {schema}.jobs AS p ON p.id = d.depends_on
WHERE j.waiting;
