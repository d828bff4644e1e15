-- leaseq's complete current schema: what `leaseq migrate` builds from migration 0001 up to
-- the version below, written out in one place to read.
--
-- schema version: 38
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
  (11, 'limits'),
  (12, 'workflows'),
  (13, 'limits_cost'),
  (14, 'queue_stats_indexed'),
  (15, 'prune_index'),
  (16, 'queue_slots'),
  (17, 'payloads'),
  (18, 'steps'),
  (19, 'expires'),
  (20, 'sql_api'),
  (21, 'invariants'),
  (22, 'autoscaling'),
  (23, 'api_tokens'),
  (24, 'suspensions'),
  (25, 'sql_api_refresh'),
  (26, 'fairness'),
  (27, 'children'),
  (28, 'sql_api_cancel_children'),
  (29, 'fair_wake'),
  (30, 'job_cost'),
  (31, 'gather_wake'),
  (32, 'signal_seq'),
  (33, 'sql_api_cost'),
  (34, 'schedule_cost'),
  (35, 'callback_cost'),
  (36, 'payloads_vacuum'),
  (37, 'schema_lock_keys'),
  (38, 'fair_keys_vacuum');

CREATE TYPE {schema}.job_status AS ENUM (
  'pending', 'running', 'succeeded', 'dead', 'cancelled', 'suspended'
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
  -- The job's own limit key (key:...): a concurrency or rate limit of that name, or of its
  -- family, applies to it besides its queue's and task's (see the limits table).
  limit_key text,
  -- Dependencies (version 11): pending but waiting for a dependency (outside the claim
  -- index); some job depends on this one (its completion promotes dependents).
  waiting boolean NOT NULL DEFAULT false,
  has_dependents boolean NOT NULL DEFAULT false,
  -- The batch this job belongs to (version 11).
  batch_id bigint,
  -- The concurrency slot of its queue's limit that this running job holds (version 16):
  -- set by the claim, cleared by every statement that ends the lease.
  queue_slot integer,
  -- The start deadline (version 19): never started after it; the sweep ends it EXPIRED.
  expires_at timestamptz,
  -- Durable sleep and signals (version 24): why a suspended job waits ('sleep', 'signal'),
  -- when it is due (set only while suspended; 'infinity': no timeout) and for which signal.
  suspend_reason text,
  wake_at timestamptz,
  wait_signal text,
  -- Fair dispatch (version 26): claimed in turn with the queue's other keys (fair_keys).
  fairness_key text,
  -- Its cost (version 30): the units (slots) it takes of every concurrency limit that
  -- applies to it while it runs.
  cost integer NOT NULL DEFAULT 1,
  -- The job that spawned this one (version 31, ctx.spawn): its end may wake that parent.
  parent_id bigint,
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
  CONSTRAINT jobs_limit_key_bounded CHECK (length(limit_key) <= 200),
  CONSTRAINT jobs_only_pending_jobs_wait CHECK (NOT waiting OR status = 'pending'),
  -- Only a running job holds a queue slot: a path that forgot to clear it fails instead of
  -- leaking the slot.
  CONSTRAINT jobs_queue_slot_running CHECK (queue_slot IS NULL OR status = 'running'),
  CONSTRAINT jobs_suspend_bounded CHECK (length(suspend_reason) <= 32
                                         AND length(wait_signal) <= 128),
  CONSTRAINT jobs_cost_range CHECK (cost BETWEEN 1 AND 1000)
);

-- The claim reads this index in order and stops at LIMIT; only claimable pending rows live
-- in it, so finished history, blocked per-key backlogs and jobs waiting for dependencies
-- do not slow claims down.
CREATE INDEX jobs_claimable_idx
  ON {schema}.jobs (queue_name, priority DESC, available_at, id)
  WHERE status = 'pending' AND NOT blocked AND NOT waiting AND fairness_key IS NULL;

-- Jobs with a fairness key, per key in claim order (version 26; claim_fair_jobs).
CREATE INDEX jobs_fair_idx
  ON {schema}.jobs (queue_name, fairness_key, priority DESC, available_at, id)
  WHERE status = 'pending' AND NOT blocked AND NOT waiting AND fairness_key IS NOT NULL;

-- The sweep's pending jobs past their start deadline (version 19).
CREATE INDEX jobs_expiring_idx
  ON {schema}.jobs (expires_at)
  WHERE status = 'pending' AND expires_at IS NOT NULL;

-- The sweep looks only at running rows whose lease ran out.
CREATE INDEX jobs_expired_lease_idx
  ON {schema}.jobs (lease_expires_at)
  WHERE status = 'running';

-- Dead jobs are an operational state: listing them by queue and age must stay cheap.
CREATE INDEX jobs_dead_idx
  ON {schema}.jobs (queue_name, finished_at)
  WHERE status = 'dead';

-- Retention reads finished rows oldest first and stops at the cut-off, never walking the
-- retention window, the backlog or dead tuples (version 15).
CREATE INDEX jobs_prunable_idx
  ON {schema}.jobs (finished_at)
  WHERE status IN ('succeeded', 'cancelled');

-- A queue limit's slots (version 16): one running job per queue and slot number, numbers
-- 1..concurrency, so never more running than the limit, whoever claims.
CREATE UNIQUE INDEX jobs_queue_slot_idx
  ON {schema}.jobs (queue_name, queue_slot)
  WHERE queue_slot IS NOT NULL;

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
-- partial indexes only (pending: the claim index plus the blocked rows of the ordering
-- index; running; dead), so it stays cheap however much finished history the table holds. Jobs waiting on dependencies are neither ready nor scheduled
-- (see waiting_jobs).
CREATE VIEW {schema}.queue_stats AS
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
  -- Its jobs' cost (version 34): the units they take of every concurrency limit.
  cost integer NOT NULL DEFAULT 1,
  CONSTRAINT schedules_one_timing CHECK ((cron IS NULL) <> (every_seconds IS NULL)),
  CONSTRAINT schedules_every_positive CHECK (every_seconds >= 1),
  CONSTRAINT schedules_catch_up CHECK (catch_up IN ('none', 'latest', 'all')),
  CONSTRAINT schedules_catch_up_max CHECK (catch_up_max BETWEEN 1 AND 10000),
  CONSTRAINT schedules_grace CHECK (grace_seconds BETWEEN 1 AND 86400),
  CONSTRAINT schedules_overlap CHECK (overlap IN ('allow', 'skip', 'queue')),
  CONSTRAINT schedules_source CHECK (source IN ('code', 'dynamic')),
  CONSTRAINT schedules_max_attempts CHECK (max_attempts >= 1),
  CONSTRAINT schedules_cost_range CHECK (cost BETWEEN 1 AND 1000)
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

-- Concurrency and rate limits (version 11): a limit is a row of `limits`, named queue:NAME,
-- task:NAME or key:... (a family when it ends in ":*"); slots and rate buckets are taken
-- in the claim statement and slots given back by the fenced statement that ends the lease.
CREATE TABLE {schema}.limits (
  name text PRIMARY KEY,
  -- At most this many jobs under the limit run at once (NULL: no concurrency limit).
  concurrency integer,
  -- At most `rate` claims per `per_seconds`, `burst` at once (NULL rate: no rate limit).
  rate float8,
  per_seconds float8 NOT NULL DEFAULT 1,
  burst integer NOT NULL DEFAULT 1,
  updated_by text,
  updated_at timestamptz NOT NULL DEFAULT now(),
  -- When the concurrency limit last refused a claim (version 13; admit() sets it at most
  -- once a second): a slot freed while it is recent wakes the workers.
  refused_at timestamptz,
  -- A queue limit whose slots moved from the job rows (jobs.queue_slot) to slot rows
  -- (limit_slots), for good: a job of cost above 1 was claimed under it (version 30).
  queue_slot_rows boolean NOT NULL DEFAULT false,
  CONSTRAINT limits_name_bounded CHECK (length(name) BETWEEN 1 AND 220),
  CONSTRAINT limits_name_scoped CHECK (name ~ '^(queue|task|key):.'),
  CONSTRAINT limits_concurrency_positive CHECK (concurrency BETWEEN 1 AND 1000000),
  CONSTRAINT limits_rate_positive CHECK (rate > 0 AND rate < 'infinity'),
  CONSTRAINT limits_per_positive CHECK (per_seconds > 0 AND per_seconds <= 31622400),
  CONSTRAINT limits_burst_positive CHECK (burst BETWEEN 1 AND 1000000),
  CONSTRAINT limits_something CHECK (concurrency IS NOT NULL OR rate IS NOT NULL)
);

-- One row per running job per concurrency limit it is under: the primary key makes "slot s
-- of limit L" exist at most once, so never more than `concurrency` slots 1..N are held. A
-- slot is taken by the claim (same statement) and deleted, matched by (job_id,
-- lease_token), by the fenced statement that ends that lease.
CREATE TABLE {schema}.limit_slots (
  limit_name text NOT NULL,
  slot integer NOT NULL,
  job_id bigint NOT NULL,
  lease_token bigint NOT NULL,
  taken_at timestamptz NOT NULL DEFAULT now(),
  PRIMARY KEY (limit_name, slot)
);

CREATE INDEX limit_slots_job_idx ON {schema}.limit_slots (job_id, lease_token);

-- Rate limits as GCRA: one theoretical arrival time per limit key, moved by each admitted
-- claim (database clock). O(1) per key, no history.
CREATE TABLE {schema}.rate_buckets (
  limit_name text PRIMARY KEY,
  tat timestamptz NOT NULL
);

-- The limits that apply to a job: its queue's, its task's and its own key's, each found by
-- exact name or else by its family (the name with its last ":" part replaced by "*").
CREATE FUNCTION {schema}.limits_of(p_queue text, p_task text, p_key text)
RETURNS TABLE (limit_name text, concurrency integer, rate float8, per_seconds float8,
               burst integer)
LANGUAGE sql STABLE AS $$
  SELECT n.key, l.concurrency, l.rate, l.per_seconds, l.burst
  FROM (VALUES ('queue:' || p_queue), ('task:' || p_task), ('key:' || p_key)) AS n(key)
  CROSS JOIN LATERAL (
    SELECT x.concurrency, x.rate, x.per_seconds, x.burst
    FROM {schema}.limits AS x
    WHERE x.name IN (n.key, regexp_replace(n.key, '[^:]*$', '*'))
    ORDER BY x.name = n.key DESC
    LIMIT 1
  ) AS l
  WHERE n.key IS NOT NULL
  ORDER BY n.key
$$;

-- Up to p_n free slot numbers of a limit, searched lazily from p_start (wrapping around at
-- p_conc): one index probe per number (OFFSET 0 keeps the planner from hashing every slot
-- of the limit, dead versions included, instead), passing over numbers held (committed) or
-- being taken by a claim in flight (the advisory lock this takes, held until commit).
-- PL/pgSQL so that its plan is cached for the session.
CREATE FUNCTION {schema}.free_slots(p_name text, p_conc integer, p_start integer,
                                    p_n integer)
RETURNS integer[]
LANGUAGE plpgsql
SET enable_seqscan = off
AS $$
BEGIN
  RETURN ARRAY(
    SELECT n.g
    FROM (SELECT (p_start + generate_series(0, p_conc - 1)) % p_conc + 1 AS g) AS n
    WHERE CASE
      WHEN EXISTS (SELECT 1 FROM {schema}.limit_slots AS t
                   WHERE t.limit_name = p_name AND t.slot = n.g OFFSET 0) THEN false
      WHEN left(p_name, 6) = 'queue:'
           AND EXISTS (SELECT 1 FROM {schema}.jobs AS q
                       WHERE q.queue_name = substr(p_name, 7) AND q.queue_slot = n.g
                       OFFSET 0) THEN false
      ELSE pg_try_advisory_xact_lock(hashtextextended('{schema}.slot.' || p_name || '#' || n.g, 0))
    END
    LIMIT p_n);
END
$$;

-- Every concurrency slot held, wherever it lives: a queue limit's on its running jobs,
-- task and key limits' in limit_slots (for operators and tests; leaseq's own statements
-- read the two places directly).
CREATE VIEW {schema}.held_slots AS
  SELECT s.limit_name, s.slot, s.job_id, s.lease_token
  FROM {schema}.limit_slots AS s
  UNION ALL
  SELECT 'queue:' || j.queue_name, j.queue_slot, j.id, j.lease_token
  FROM {schema}.jobs AS j
  WHERE j.queue_slot IS NOT NULL;

-- claim_jobs's way of saying "limits apply that its fast path does not handle: claim with
-- claim_limited_jobs" (SQLSTATE LQ001). It runs before the claim has locked anything.
CREATE FUNCTION {schema}.claim_needs_admit()
RETURNS bigint[]
LANGUAGE plpgsql
AS $$
BEGIN
  RAISE EXCEPTION 'leaseq: limits apply to this claim (claim_limited_jobs takes it)'
    USING ERRCODE = 'LQ001';
END
$$;

-- What admit() returns: the admitted ids in claim order, each one's queue slot, and
-- whether it took slot rows (version 21: the leases' ends must delete them).
-- (version 21: slot_rows, did it take slot rows; version 30: the candidates claimed only to be
-- ended dead, their cost above a limit's concurrency, and why.)
CREATE TYPE {schema}.admission AS (admitted bigint[], slots integer[], slot_rows boolean,
                                   oversize bigint[], oversize_why text[]);

-- Up to p_n free slot numbers of queue p_queue's limit, searched from p_start (wrapping
-- around at p_conc), as free_slots() does for slot rows: one index probe per number,
-- passing over numbers held (committed), numbers in p_taken (this claim's own picks) and
-- numbers a claim in flight is taking (the advisory lock, held until commit).
CREATE FUNCTION {schema}.free_queue_slots(p_queue text, p_conc integer, p_start integer,
                                          p_n integer, p_taken integer[])
RETURNS integer[]
LANGUAGE plpgsql
SET enable_seqscan = off
AS $$
BEGIN
  RETURN ARRAY(
    SELECT n.g
    FROM (SELECT (p_start + generate_series(0, p_conc - 1)) % p_conc + 1 AS g) AS n
    WHERE NOT n.g = ANY(p_taken)
      AND CASE
        WHEN EXISTS (SELECT 1 FROM {schema}.jobs AS t
                     WHERE t.queue_name = p_queue AND t.queue_slot = n.g OFFSET 0) THEN false
        ELSE pg_try_advisory_xact_lock(
               hashtextextended('{schema}.slot.queue:' || p_queue || '#' || n.g, 0))
      END
    LIMIT p_n);
END
$$;

-- The claim's limited path: of the candidates (in claim order, read but not locked by the
-- caller), lock a chunk at a time (SKIP LOCKED, re-checked that each is still claimable)
-- and keep the first p_want that get a slot of every concurrency limit and then a token of
-- every rate limit that applies. Set-based: one statement per chunk and per limit, not per
-- job. Slots go to a limit's requesters in claim order; a candidate refused by any limit
-- gives back what it took here and stays pending, in its place, with no attempt charged.
-- A limit found full (or a rate found spent: now() does not move within the claim) refuses
-- the later candidates at once, and a full queue limit ends the scan.
CREATE FUNCTION {schema}.admit(p_candidates bigint[], p_want integer)
RETURNS {schema}.admission
LANGUAGE plpgsql
-- Its plans are cached for the session and may be made while limit_slots is nearly empty:
-- a sequential scan planned then would read every dead slot row left since the last vacuum,
-- call after call. With this its statements take the indexes.
SET enable_seqscan = off
AS $$
DECLARE
  v_picked bigint[] := '{}';
  v_full text[] := '{}';
  v_bit text[] := '{}';
  v_pos integer := 1;
  v_total integer := coalesce(cardinality(p_candidates), 0);
  v_chunk bigint[];
  r_ids bigint[];
  r_toks bigint[];
  r_ords bigint[];
  r_names text[];
  r_concs integer[];
  r_rates float8[];
  r_pers float8[];
  r_bursts integer[];
  r_costs integer[];
  v_dead bigint[];
  v_alive bigint[];
  v_atoks bigint[];
  v_acosts integer[];
  v_got bigint[];
  r_uniq bigint[];
  v_rated boolean;
  v_costly boolean;
  v_nums integer[];
  v_start integer;
  v_lim record;
  v_t0 timestamptz;
  v_step float8;
  v_m integer;
  v_qids bigint[] := '{}';
  v_qslots integer[] := '{}';
  v_slots integer[];
  v_slot_rows boolean := false;
  v_on_rows boolean;
  v_over bigint[] := '{}';
  v_over_why text[] := '{}';
  v_cover bigint[];
  v_cwhy text[];
BEGIN
  WHILE cardinality(v_picked) < p_want AND v_pos <= v_total LOOP
    v_chunk := p_candidates[v_pos : v_pos + (p_want - cardinality(v_picked)) - 1];
    v_pos := v_pos + cardinality(v_chunk);
    -- Lock the chunk and list, per candidate, the limits it is under (a row with NULLs
    -- for a candidate under none).
    WITH j AS MATERIALIZED (
      SELECT x.id, u.ord, least(x.lease_token, 9223372036854775806) + 1 AS tok,
             x.queue_name, x.task, x.limit_key, x.cost
      FROM unnest(v_chunk) WITH ORDINALITY AS u(id, ord)
      JOIN {schema}.jobs AS x ON x.id = u.id
      WHERE x.status = 'pending' AND NOT x.blocked AND NOT x.waiting
        AND x.available_at <= now()
      FOR UPDATE OF x SKIP LOCKED
    ), k AS (
      -- The limits looked up once per kind of job (queue, task, limit key), not per job: a
      -- claim's jobs are of one queue and mostly of a few tasks.
      SELECT d.queue_name, d.task, d.limit_key, l.limit_name, l.concurrency, l.rate,
             l.per_seconds, l.burst
      FROM (SELECT DISTINCT j.queue_name, j.task, j.limit_key FROM j) AS d
      CROSS JOIN LATERAL {schema}.limits_of(d.queue_name, d.task, d.limit_key) AS l
    )
    -- The rows come sorted once from the subquery (its ORDER BY feeds the aggregates in
    -- that order), rather than each array_agg sorting its own copy.
    SELECT array_agg(p.id), array_agg(p.tok), array_agg(p.ord), array_agg(p.limit_name),
           array_agg(p.concurrency), array_agg(p.rate), array_agg(p.per_seconds),
           array_agg(p.burst), array_agg(p.cost),
           -- The locked candidates once each, in claim order, and whether any is under a
           -- rate limit, or costs more than one slot: the common cases skip those steps.
           (SELECT array_agg(j.id ORDER BY j.ord) FROM j),
           coalesce(bool_or(p.rate IS NOT NULL), false),
           coalesce(bool_or(p.cost > 1 AND p.concurrency IS NOT NULL), false)
      INTO r_ids, r_toks, r_ords, r_names, r_concs, r_rates, r_pers, r_bursts, r_costs,
           r_uniq, v_rated, v_costly
      FROM (
        SELECT j.id, j.tok, j.ord, k.limit_name, k.concurrency, k.rate, k.per_seconds,
               k.burst, j.cost
        FROM j
        LEFT JOIN k ON k.queue_name = j.queue_name AND k.task = j.task
                   AND k.limit_key IS NOT DISTINCT FROM j.limit_key
        ORDER BY j.ord, k.limit_name
      ) AS p;
    CONTINUE WHEN r_ids IS NULL;  -- all taken or changed meanwhile
    v_dead := '{}';
    v_cover := '{}';
    IF v_costly THEN
      -- A cost above a limit's concurrency can never be admitted: such a candidate takes no
      -- slot and no token; it is claimed to be ended dead with why (by the client).
      SELECT coalesce(array_agg(o.id ORDER BY o.ord), '{}'),
             coalesce(array_agg(o.why ORDER BY o.ord), '{}')
        INTO v_cover, v_cwhy
        FROM (SELECT q.id, min(q.ord) AS ord,
                     min(format('cost %s is above the concurrency %s of limit %s',
                                q.cost, q.conc, q.name)) AS why
              FROM unnest(r_ids, r_ords, r_names, r_concs, r_costs)
                     AS q(id, ord, name, conc, cost)
              WHERE q.cost > q.conc
              GROUP BY q.id) AS o;
      v_dead := v_cover;
      v_over := v_over || v_cover;
      v_over_why := v_over_why || v_cwhy;
    END IF;
    -- Concurrency: per limit, its free slot numbers to its live requesters in claim order
    -- (a requester of cost N takes N of them, all or none; a requester that does not fit
    -- fills the limit for this claim, so later smaller jobs never overtake it).
    FOR v_lim IN
      SELECT q.name, min(q.conc) AS conc, array_agg(q.id ORDER BY q.ord) AS ids,
             array_agg(q.tok ORDER BY q.ord) AS toks,
             array_agg(q.cost ORDER BY q.ord) AS costs
      FROM unnest(r_ids, r_toks, r_ords, r_names, r_concs, r_costs)
             AS q(id, tok, ord, name, conc, cost)
      WHERE q.conc IS NOT NULL
      GROUP BY q.name
      ORDER BY q.name
    LOOP
      SELECT coalesce(array_agg(a.id ORDER BY a.o), '{}'),
             coalesce(array_agg(a.tok ORDER BY a.o), '{}'),
             coalesce(array_agg(a.cost ORDER BY a.o), '{}')
        INTO v_alive, v_atoks, v_acosts
        FROM unnest(v_lim.ids, v_lim.toks, v_lim.costs) WITH ORDINALITY AS a(id, tok, cost, o)
        WHERE NOT a.id = ANY(v_dead);
      CONTINUE WHEN cardinality(v_alive) = 0;
      -- A queue limit's slots: on the job rows unless they moved to slot rows (version 30).
      v_on_rows := left(v_lim.name, 6) = 'queue:'
        AND NOT EXISTS (SELECT 1 FROM {schema}.limits AS f
                        WHERE f.name IN (v_lim.name, 'queue:*') AND f.queue_slot_rows);
      IF v_lim.name = ANY(v_full) THEN
        v_got := '{}';
      ELSIF v_on_rows THEN
        IF v_costly AND EXISTS (SELECT 1 FROM unnest(v_acosts) AS c WHERE c > 1) THEN
          -- A job row holds one number: the client moves this limit's slots to slot rows
          -- (queue_limit_to_slot_rows) and claims again. Nothing of this claim is kept.
          RAISE EXCEPTION 'leaseq: a job of cost above 1 under %', v_lim.name
            USING ERRCODE = 'LQ011', DETAIL = v_lim.name;
        END IF;
        -- A queue limit's slots are on the job rows (jobs.queue_slot, version 16): numbers
        -- free as seen now, passing over those this claim already picked; the claim's
        -- UPDATE writes them, and the unique index decides.
        IF EXISTS (SELECT 1 FROM {schema}.jobs AS h
                   WHERE h.queue_name = substr(v_lim.name, 7) AND h.queue_slot > v_lim.conc)
        THEN
          v_got := '{}';
        ELSE
          v_nums := {schema}.free_queue_slots(substr(v_lim.name, 7), v_lim.conc,
                                              (r_uniq[1] % v_lim.conc)::integer,
                                              cardinality(v_alive), v_qslots);
          v_got := v_alive[1 : cardinality(v_nums)];
          v_qids := v_qids || v_got;
          v_qslots := v_qslots || v_nums;
        END IF;
      -- A limit lowered below slots still held admits nothing until those are freed (for a
      -- queue limit whose slots moved, those still on job rows count too).
      ELSIF EXISTS (SELECT 1 FROM {schema}.limit_slots AS h
                    WHERE h.limit_name = v_lim.name AND h.slot > v_lim.conc)
         OR (left(v_lim.name, 6) = 'queue:'
             AND EXISTS (SELECT 1 FROM {schema}.jobs AS h
                         WHERE h.queue_name = substr(v_lim.name, 7)
                           AND h.queue_slot > v_lim.conc)) THEN
        v_got := '{}';
      ELSE
        -- The primary key decides; free_slots() is a guess at free numbers, passing over
        -- numbers held or being taken by a claim in flight. It starts at the first
        -- candidate's id (mod the limit) and wraps around, so successive claims take fresh
        -- numbers rather than the same few again, whose index entries pile up dead versions
        -- (a slot row is inserted and deleted per job) until a vacuum.
        v_start := (r_uniq[1] % v_lim.conc)::integer;
        -- Probed, not guessed: inserting over a slot whose delete is not yet committed
        -- would wait for that transaction, and a claim never waits on another. As many
        -- numbers as the requesters' costs add up to (at most the limit).
        v_nums := {schema}.free_slots(
          v_lim.name, v_lim.conc, v_start,
          CASE WHEN v_costly THEN (SELECT sum(c)::integer FROM unnest(v_acosts) AS c)
               ELSE cardinality(v_alive) END);
        -- A plain insert (cheaper than ON CONFLICT). It fails only when a claim that
        -- committed after the search's snapshot took one of the numbers (rare): then the
        -- search again, and an insert that skips any number taken meanwhile.
        BEGIN
          IF NOT v_costly THEN
            INSERT INTO {schema}.limit_slots (limit_name, slot, job_id, lease_token)
            SELECT v_lim.name, f.g, r.id, r.tok
            FROM unnest(v_nums) WITH ORDINALITY AS f(g, rn)
            JOIN unnest(v_alive, v_atoks) WITH ORDINALITY AS r(id, tok, rn) USING (rn);
            v_got := v_alive[1 : cardinality(v_nums)];
          ELSE
            -- The longest prefix of requesters whose costs fit in the numbers found, each
            -- requester's units its own run of them.
            WITH e AS (
              SELECT a.id, a.tok, row_number() OVER (ORDER BY a.o, u.u) AS rn
              FROM unnest(v_alive, v_atoks, v_acosts) WITH ORDINALITY AS a(id, tok, cost, o)
              CROSS JOIN LATERAL generate_series(1, a.cost) AS u(u)
            ), fit AS (
              SELECT a.id
              FROM (SELECT a.id, sum(a.cost) OVER (ORDER BY a.o) AS cum
                    FROM unnest(v_alive, v_acosts) WITH ORDINALITY AS a(id, cost, o)) AS a
              WHERE a.cum <= cardinality(v_nums)
            ), ins AS (
              INSERT INTO {schema}.limit_slots (limit_name, slot, job_id, lease_token)
              SELECT v_lim.name, f.g, e.id, e.tok
              FROM unnest(v_nums) WITH ORDINALITY AS f(g, rn)
              JOIN e USING (rn)
              WHERE e.id IN (SELECT fit.id FROM fit)
              RETURNING job_id
            )
            SELECT coalesce(array_agg(DISTINCT ins.job_id), '{}') INTO v_got FROM ins;
            v_got := ARRAY(SELECT a FROM unnest(v_alive) WITH ORDINALITY AS x(a, o)
                           WHERE a = ANY(v_got) ORDER BY x.o);
          END IF;
        EXCEPTION WHEN unique_violation THEN
          v_nums := {schema}.free_slots(
            v_lim.name, v_lim.conc, v_start,
            (SELECT sum(c)::integer FROM unnest(v_acosts) AS c));
          -- Each requester's units, numbers in order; a requester is admitted when all its
          -- units got in, and only the prefix up to the first that did not (the others'
          -- rows go with the refused candidates' below).
          WITH e AS (
            SELECT a.id, a.tok, a.o, row_number() OVER (ORDER BY a.o, u.u) AS rn
            FROM unnest(v_alive, v_atoks, v_acosts) WITH ORDINALITY AS a(id, tok, cost, o)
            CROSS JOIN LATERAL generate_series(1, a.cost) AS u(u)
          ), ins AS (
            INSERT INTO {schema}.limit_slots (limit_name, slot, job_id, lease_token)
            SELECT v_lim.name, f.g, e.id, e.tok
            FROM unnest(v_nums) WITH ORDINALITY AS f(g, rn)
            JOIN e USING (rn)
            ON CONFLICT DO NOTHING
            RETURNING job_id
          ), n AS (
            SELECT a.id, a.o, a.cost, (SELECT count(*) FROM ins WHERE ins.job_id = a.id) AS got
            FROM unnest(v_alive, v_acosts) WITH ORDINALITY AS a(id, cost, o)
          )
          SELECT coalesce(array_agg(n.id ORDER BY n.o), '{}') INTO v_got
          FROM n
          WHERE n.o < coalesce((SELECT min(b.o) FROM n AS b WHERE b.got < b.cost),
                               9223372036854775807);
        END;
        -- Reported to the claim (admission.slot_rows, version 21): the leases' ends must take
        -- the statements that delete slot rows, whatever the claim's own snapshot saw.
        v_slot_rows := v_slot_rows OR cardinality(v_got) > 0;
      END IF;
      IF cardinality(v_got) < cardinality(v_alive) THEN
        v_bit := v_bit || v_lim.name;
        v_full := v_full || v_lim.name;
        v_dead := v_dead || ARRAY(SELECT a FROM unnest(v_alive) AS a WHERE NOT a = ANY(v_got));
      END IF;
    END LOOP;
    IF v_rated THEN
      -- Rates: per limit (bucket locked), how many of its live requesters it admits now
      -- (GCRA), in claim order; then each bucket is charged for its requesters still alive
      -- (never more than it admitted), so a candidate refused by one rate costs no other.
      FOR v_lim IN
        SELECT q.name, min(q.rate) AS rate, min(q.per) AS per, min(q.burst) AS burst,
               array_agg(q.id ORDER BY q.ord) AS ids
        FROM unnest(r_ids, r_ords, r_names, r_rates, r_pers, r_bursts)
               AS q(id, ord, name, rate, per, burst)
        WHERE q.rate IS NOT NULL
        GROUP BY q.name
        ORDER BY q.name
      LOOP
        v_alive := ARRAY(SELECT a FROM unnest(v_lim.ids) AS a WHERE NOT a = ANY(v_dead));
        CONTINUE WHEN cardinality(v_alive) = 0;
        v_step := v_lim.per / v_lim.rate;
        v_m := 0;
        -- A bucket another claim holds right now is passed over, not waited for (its
        -- candidates stay pending): a claim never waits on another claim, so claims taking
        -- buckets in different orders cannot deadlock.
        IF NOT v_lim.name = ANY(v_full)
           AND pg_try_advisory_xact_lock(hashtextextended('{schema}.bucket.' || v_lim.name, 0))
        THEN
          INSERT INTO {schema}.rate_buckets (limit_name, tat) VALUES (v_lim.name, now())
          ON CONFLICT DO NOTHING;
          SELECT greatest(b.tat, now()) INTO v_t0 FROM {schema}.rate_buckets AS b
          WHERE b.limit_name = v_lim.name FOR UPDATE;
          -- Admits i = 0..m-1 while (t0 + i*step) - now <= (burst - 1) * step.
          v_m := least(cardinality(v_alive), greatest(0, floor(
                   ((v_lim.burst - 1) * v_step - extract(epoch FROM v_t0 - now())) / v_step
                   + 1e-9)::integer + 1));
        END IF;
        IF v_m < cardinality(v_alive) THEN
          v_full := v_full || v_lim.name;
          v_dead := v_dead || v_alive[v_m + 1 :];
        END IF;
      END LOOP;
      FOR v_lim IN
        SELECT q.name, min(q.per / q.rate) AS step, count(*) AS n
        FROM unnest(r_ids, r_names, r_rates, r_pers) AS q(id, name, rate, per)
        WHERE q.rate IS NOT NULL AND NOT q.id = ANY(v_dead)
        GROUP BY q.name
      LOOP
        UPDATE {schema}.rate_buckets
        SET tat = greatest(tat, now()) + make_interval(secs => v_lim.step * v_lim.n)
        WHERE limit_name = v_lim.name;
      END LOOP;
    END IF;
    -- Refused candidates give back the slots they took here.
    IF cardinality(v_dead) > 0 THEN
      v_qslots := ARRAY(SELECT q.slot FROM unnest(v_qids, v_qslots) AS q(id, slot)
                        WHERE NOT q.id = ANY(v_dead));
      v_qids := ARRAY(SELECT q FROM unnest(v_qids) AS q WHERE NOT q = ANY(v_dead));
      DELETE FROM {schema}.limit_slots AS s
      USING unnest(r_ids, r_toks) AS d(id, tok)
      WHERE s.job_id = d.id AND s.lease_token = d.tok AND d.id = ANY(v_dead);
    END IF;
    IF cardinality(v_dead) = 0 THEN
      v_picked := v_picked || r_uniq;
    ELSE
      v_picked := v_picked || ARRAY(
        SELECT a.id FROM unnest(r_uniq) WITH ORDINALITY AS a(id, ord)
        WHERE NOT a.id = ANY(v_dead)
        ORDER BY a.ord
      );
    END IF;
    -- Those whose cost no limit of theirs can ever admit: claimed, to be ended dead.
    v_picked := v_picked || v_cover;
    IF cardinality(v_full) > 0 THEN
      EXIT WHEN EXISTS (SELECT 1 FROM unnest(v_full) AS f WHERE left(f, 6) = 'queue:');
    END IF;
  END LOOP;
  -- A concurrency limit refused a claim: mark it (at most once a second, never waiting on
  -- another claim's mark), so the statements that free its slots wake the workers.
  IF cardinality(v_bit) > 0 THEN
    UPDATE {schema}.limits AS l SET refused_at = now()
    WHERE l.name IN (
      SELECT m.name FROM {schema}.limits AS m
      WHERE (m.name = ANY(v_bit)
             OR m.name = ANY(ARRAY(SELECT regexp_replace(b, '[^:]*$', '*')
                                   FROM unnest(v_bit) AS b)))
        AND (m.refused_at IS NULL OR m.refused_at < now() - interval '1 second')
      FOR UPDATE SKIP LOCKED);
  END IF;
  -- Each admitted job's queue slot (NULL: no queue limit), in the order of admitted.
  v_slots := ARRAY(
    SELECT q.slot
    FROM unnest(v_picked) WITH ORDINALITY AS p(id, ord)
    LEFT JOIN unnest(v_qids, v_qslots) AS q(id, slot) ON q.id = p.id
    ORDER BY p.ord);
  RETURN ROW(v_picked, v_slots, v_slot_rows, v_over, v_over_why)::{schema}.admission;
END
$$;

-- A queue limit's slots move to slot rows: the barrier first (EXCLUSIVE on pauses, as
-- pause_scope takes it: it waits for every claim in flight to commit, and a claim planned
-- meanwhile waits for this one and then sees the flag), then the flag on the limit that
-- applies to the queue (its own, else the queue family's). Called by the client when
-- admit() says a job of cost above 1 is under a queue limit whose slots are on the job
-- rows (SQLSTATE LQ011), in a transaction of its own.
CREATE FUNCTION {schema}.queue_limit_to_slot_rows(p_name text)
RETURNS boolean
LANGUAGE plpgsql
AS $fn$
DECLARE
  v_done boolean;
BEGIN
  LOCK TABLE {schema}.pauses IN EXCLUSIVE MODE;
  UPDATE {schema}.limits AS l SET queue_slot_rows = true
  WHERE l.name = (SELECT x.name FROM {schema}.limits AS x
                  WHERE x.name IN (p_name, 'queue:*')
                  ORDER BY x.name = p_name DESC LIMIT 1)
    AND left(p_name, 6) = 'queue:'
  RETURNING true INTO v_done;
  RETURN coalesce(v_done, false);
END
$fn$;

-- claim_jobs's fast path met a job of cost above 1 (each job takes one number there):
-- claim_limited_jobs takes it (SQLSTATE LQ001, as claim_needs_admit; nothing is claimed).
CREATE FUNCTION {schema}.claim_needs_admit_slot()
RETURNS integer
LANGUAGE plpgsql
AS $fn$
BEGIN
  RAISE EXCEPTION 'leaseq: a job of cost above 1 (claim_limited_jobs takes it)'
    USING ERRCODE = 'LQ001';
END
$fn$;


-- GCRA: admit `cost` units iff the bucket's theoretical arrival time is at most the burst
-- tolerance ahead of now(), then move it on by cost emission intervals. One row, updated
-- under its row lock (concurrent claims queue on it and re-check the condition).
CREATE FUNCTION {schema}.rate_take(p_name text, p_rate float8, p_per float8, p_burst integer,
                                   p_cost integer)
RETURNS boolean
LANGUAGE plpgsql AS $$
DECLARE
  step interval := make_interval(secs => p_per / p_rate);
  tau interval := make_interval(secs => p_per / p_rate * (p_burst - p_cost));
BEGIN
  INSERT INTO {schema}.rate_buckets AS b (limit_name, tat)
  SELECT p_name, now() + step * p_cost
  WHERE p_cost <= p_burst
  ON CONFLICT (limit_name) DO UPDATE
  SET tat = greatest(b.tat, now()) + step * p_cost
  WHERE greatest(b.tat, now()) - now() <= tau;
  RETURN FOUND;
END
$$;

-- How long until the bucket admits `cost` units (0: now; NULL: no rate limit there).
CREATE FUNCTION {schema}.rate_wait(p_name text, p_rate float8, p_per float8, p_burst integer,
                                   p_cost integer)
RETURNS float8
LANGUAGE sql STABLE AS $$
  SELECT greatest(0, coalesce(extract(epoch FROM
           (SELECT b.tat FROM {schema}.rate_buckets AS b WHERE b.limit_name = p_name)
           - now()), 0) - p_per / p_rate * (p_burst - p_cost))::float8
  WHERE p_rate IS NOT NULL
$$;
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

-- Large payloads kept out of the hot table (version 17, docs/payloads.md).
-- A payload over the application's offload_above is stored here, or in S3-compatible object
-- storage with only its object key here; the job row keeps a small marker
-- ({"leaseq:ref": "pg" | "s3", "bytes": N}) so every claim and every update of the job
-- reads and writes a few bytes instead of the payload. The enqueue writes the row in the
-- transaction of the job's insert, so a rolled-back enqueue leaves no row. Retention and
-- purge delete it with its job, in the same statement; an object's key then goes to
-- payload_deletes, from which the maintenance service deletes the object (retried until
-- the store says it is gone). No foreign key: a cascade would run one more statement per
-- pruned job; the sweep instead removes rows whose job was deleted by hand.
CREATE TABLE {schema}.payloads (
  job_id bigint PRIMARY KEY,
  store text NOT NULL,
  -- The payload's JSON text (sealed when its task encrypts), for store 'pg'.
  data text,
  -- The object key, for store 's3'.
  object_key text,
  bytes integer NOT NULL,
  created_at timestamptz NOT NULL DEFAULT now(),
  -- The key the payload is sealed with (NULL: plain), so rotation finds it without
  -- reading it (an object's content is in its store).
  kid text,
  CONSTRAINT payloads_store_known CHECK (store IN ('pg', 's3')),
  CONSTRAINT payloads_where CHECK (
    (store = 'pg' AND data IS NOT NULL AND object_key IS NULL)
    OR (store = 's3' AND data IS NULL AND object_key IS NOT NULL))
)
-- Vacuumed without the cost throttle, from 5% dead (version 36): every row is a large
-- value deleted by retention, and a throttled vacuum of its TOAST fell behind the inserts.
WITH (
  autovacuum_vacuum_cost_delay = 0,
  autovacuum_vacuum_scale_factor = 0.05,
  toast.autovacuum_vacuum_cost_delay = 0,
  toast.autovacuum_vacuum_scale_factor = 0.05
);

-- The orphan sweep's question: is an object in the bucket still someone's payload?
CREATE UNIQUE INDEX payloads_object_key_idx ON {schema}.payloads (object_key)
  WHERE object_key IS NOT NULL;

-- Objects whose payload row is gone, waiting to be deleted from their store.
CREATE TABLE {schema}.payload_deletes (
  object_key text PRIMARY KEY,
  queued_at timestamptz NOT NULL DEFAULT now(),
  attempts integer NOT NULL DEFAULT 0,
  last_error text
);

-- One row per finished step of a job (ctx.step): its name, its place in the handler's
-- order, and its JSON result (sealed when the task encrypts). The primary key makes a step
-- recorded at most once per job; (job_id, seq) makes two steps of one job never share a
-- place. A row is written only by the fenced statement step_record, in the transaction of
-- the step's own database work, so a worker whose lease ended cannot record a step.
-- Retention and purge delete a job's steps with it; a replay keeps them.
CREATE TABLE {schema}.job_steps (
  job_id bigint NOT NULL,
  name text NOT NULL,
  seq integer NOT NULL,
  attempt integer NOT NULL,
  lease_token bigint NOT NULL,
  recorded_at timestamptz NOT NULL DEFAULT now(),
  result jsonb,
  PRIMARY KEY (job_id, name),
  CONSTRAINT job_steps_seq_unique UNIQUE (job_id, seq),
  CONSTRAINT job_steps_name_bounded CHECK (length(name) <= 128),
  CONSTRAINT job_steps_seq_valid CHECK (seq >= 0)
);

-- The autoscaling signal (migration 0022, docs/autoscaling.md): what a worker of each
-- queue runs at once and its bounds, and one row per queue for the autoscaler.
CREATE TABLE {schema}.queue_scaling (
  queue_name text PRIMARY KEY,
  concurrency integer NOT NULL,
  min_workers integer NOT NULL DEFAULT 0,
  max_workers integer,
  updated_by text,
  updated_at timestamptz NOT NULL DEFAULT now(),
  CONSTRAINT queue_scaling_queue_bounded CHECK (length(queue_name) BETWEEN 1 AND 128),
  CONSTRAINT queue_scaling_concurrency CHECK (concurrency BETWEEN 1 AND 10000),
  CONSTRAINT queue_scaling_min CHECK (min_workers BETWEEN 0 AND 100000),
  CONSTRAINT queue_scaling_max CHECK (max_workers BETWEEN greatest(min_workers, 1) AND 100000),
  CONSTRAINT queue_scaling_by_bounded CHECK (length(updated_by) <= 200)
);

-- The claimable rows come from jobs_claimable_idx's predicate, so the backlog is counted
-- from that partial index; the running rows from jobs_expired_lease_idx's.
CREATE VIEW {schema}.autoscaling AS
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

-- The HTTP API's tokens (only their hashes) and its audit trail (migration 0023,
-- docs/http-api.md).
CREATE TABLE {schema}.api_tokens (
  name text PRIMARY KEY,
  token_hash text NOT NULL UNIQUE,
  scopes text[] NOT NULL,
  -- NULL: every queue.
  queues text[],
  created_by text,
  created_at timestamptz NOT NULL DEFAULT now(),
  revoked_at timestamptz,
  last_used_at timestamptz,
  CONSTRAINT api_tokens_name_bounded CHECK (length(name) BETWEEN 1 AND 128),
  CONSTRAINT api_tokens_scopes_known CHECK (
    cardinality(scopes) > 0
    AND scopes <@ ARRAY['enqueue', 'read', 'cancel', 'replay', 'signal']::text[]),
  CONSTRAINT api_tokens_by_bounded CHECK (length(created_by) <= 200)
);

CREATE TABLE {schema}.api_requests (
  id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
  at timestamptz NOT NULL DEFAULT now(),
  actor text NOT NULL,
  method text NOT NULL,
  path text NOT NULL,
  status integer NOT NULL,
  detail text,
  CONSTRAINT api_requests_path_bounded CHECK (length(path) <= 2000),
  CONSTRAINT api_requests_detail_bounded CHECK (length(detail) <= 4000)
);

-- The trail by time (an operator deleting old rows reads it oldest first).
CREATE INDEX api_requests_at_idx ON {schema}.api_requests (at);

-- The SQL API (migration 0020, docs/sql-api.md): enqueue, enqueue_many, job_state,
-- job_result, cancel, and their helpers. The copies of the client's statements are
-- written by tools/sql_api_refresh.py.
-- The wake-up channel of this schema (leaseq.params.notify_channel).
CREATE FUNCTION {schema}._api_channel()
RETURNS text LANGUAGE sql IMMUTABLE
AS $fn$
SELECT 'leaseq.' || rtrim(replace('{schema}.', '"', ''), '.')
$fn$;

-- A refusal: one line, under one of leaseq's SQLSTATEs.
CREATE FUNCTION {schema}._api_refuse(a_state text, a_message text)
RETURNS void LANGUAGE plpgsql
AS $fn$
BEGIN
  RAISE EXCEPTION USING ERRCODE = a_state, MESSAGE = a_message;
END
$fn$;

-- A value as a message shows it (Python's repr for JSON's scalars), at most 60 characters.
CREATE FUNCTION {schema}._api_show(a_value jsonb)
RETURNS text LANGUAGE sql IMMUTABLE
AS $fn$
SELECT CASE WHEN length(t) <= 60 THEN t ELSE left(t, 57) || '...' END
FROM (SELECT CASE jsonb_typeof(a_value)
               -- JSON's escapes (\n, \", ...), as repr escapes: one line.
               WHEN 'string' THEN '''' || substr(a_value::text, 2, length(a_value::text) - 2)
                                  || ''''
               WHEN 'boolean' THEN initcap(a_value::text)
               WHEN 'null' THEN 'None'
               ELSE coalesce(a_value::text, 'None')
             END AS t) AS s
$fn$;

-- leaseq.validate.check_name: task and queue names.
CREATE FUNCTION {schema}._api_name(a_kind text, a_value jsonb)
RETURNS text LANGUAGE plpgsql IMMUTABLE
AS $fn$
DECLARE
  v_text text := a_value #>> '{}';
BEGIN
  IF jsonb_typeof(a_value) IS DISTINCT FROM 'string' OR v_text = '' THEN
    PERFORM {schema}._api_refuse('LQ001', format('%s name must be a non-empty string, got %s',
                                                a_kind, {schema}._api_show(a_value)));
  END IF;
  IF length(v_text) > 128 OR v_text !~ '^[A-Za-z0-9_][A-Za-z0-9_.:/-]*$' THEN
    PERFORM {schema}._api_refuse('LQ001', format(
      'invalid %s name %s: use letters, digits and _ . : - / (at most 128 characters, '
      'not starting with punctuation)', a_kind, {schema}._api_show(a_value)));
  END IF;
  RETURN v_text;
END
$fn$;

-- leaseq.validate.check_int: a JSON integer (not a boolean, not 1.0) within bounds.
CREATE FUNCTION {schema}._api_int(a_kind text, a_value jsonb, a_low numeric, a_high numeric)
RETURNS numeric LANGUAGE plpgsql IMMUTABLE
AS $fn$
BEGIN
  IF jsonb_typeof(a_value) IS DISTINCT FROM 'number' OR a_value::text !~ '^-?[0-9]+$' THEN
    PERFORM {schema}._api_refuse('LQ001', format('%s must be an integer, got %s',
                                                a_kind, {schema}._api_show(a_value)));
  END IF;
  IF a_value::text::numeric NOT BETWEEN a_low AND a_high THEN
    PERFORM {schema}._api_refuse('LQ001', format('%s must be between %s and %s, got %s',
                                                a_kind, a_low, a_high, a_value::text));
  END IF;
  RETURN a_value::text::numeric;
END
$fn$;

-- A key of at most 200 characters, or NULL (idempotency, ordering, unique and limit keys).
CREATE FUNCTION {schema}._api_key(a_kind text, a_value jsonb, a_rule text)
RETURNS text LANGUAGE plpgsql IMMUTABLE
AS $fn$
BEGIN
  IF a_value IS NULL OR jsonb_typeof(a_value) = 'null' THEN
    RETURN NULL;
  END IF;
  IF jsonb_typeof(a_value) <> 'string' OR a_value #>> '{}' = ''
     OR length(a_value #>> '{}') > 200 THEN
    PERFORM {schema}._api_refuse('LQ001', format(
      '%s must be a non-empty string of at most 200 characters (%s), got %s',
      a_kind, a_rule, {schema}._api_show(a_value)));
  END IF;
  RETURN a_value #>> '{}';
END
$fn$;

-- leaseq.rules.unique's seconds: more than 0, at most ten years, or NULL.
CREATE FUNCTION {schema}._api_window(a_kind text, a_value jsonb)
RETURNS float8 LANGUAGE plpgsql IMMUTABLE
AS $fn$
BEGIN
  IF a_value IS NULL OR jsonb_typeof(a_value) = 'null' THEN
    RETURN NULL;
  END IF;
  IF jsonb_typeof(a_value) <> 'number' THEN
    PERFORM {schema}._api_refuse('LQ001', format('%s must be seconds or a timedelta, got %s',
                                                a_kind, {schema}._api_show(a_value)));
  END IF;
  IF a_value::text::numeric <= 0 OR a_value::text::numeric > 315360000 THEN
    PERFORM {schema}._api_refuse('LQ001', format(
      '%s must be more than 0 and at most 3.1536e+08 seconds, got %s', a_kind, a_value::text));
  END IF;
  RETURN a_value::text::float8;
END
$fn$;

-- leaseq.validate.encode_payload's rules for a JSON value: at most a_limit bytes in its
-- compact form (no spaces after , and :), at most 64 levels of lists and objects. NUL and
-- lone surrogates cannot reach here: jsonb refuses them.
CREATE FUNCTION {schema}._api_payload(a_payload jsonb, a_limit integer)
RETURNS jsonb LANGUAGE plpgsql IMMUTABLE
AS $fn$
DECLARE
  v_text text := a_payload::text;
  v_size bigint := octet_length(v_text);
  v_depth integer;
  v_spaces bigint;
BEGIN
  -- The walk is needed only when the text is over the limit (the compact form may not
  -- be) or has more brackets than the depth allowed, as in the client.
  IF v_size > a_limit
     OR length(v_text) - length(translate(v_text, '[{', '')) > 64 THEN
    WITH RECURSIVE walk(node, depth) AS (
      SELECT a_payload, 1
      UNION ALL
      SELECT c.value, w.depth + 1
      FROM walk AS w,
           LATERAL (SELECT e.value FROM jsonb_array_elements(
                      CASE WHEN jsonb_typeof(w.node) = 'array' THEN w.node END) AS e
                    UNION ALL
                    SELECT e.value FROM jsonb_each(
                      CASE WHEN jsonb_typeof(w.node) = 'object' THEN w.node END) AS e) AS c
      WHERE w.depth <= 64 AND jsonb_typeof(c.value) IN ('array', 'object')
    )
    SELECT max(depth),
           sum(CASE jsonb_typeof(node)
                 WHEN 'array' THEN greatest(jsonb_array_length(node) - 1, 0)
                 ELSE greatest(2 * (SELECT count(*) FROM jsonb_object_keys(node)) - 1, 0)
               END)
    INTO v_depth, v_spaces
    FROM walk
    WHERE jsonb_typeof(node) IN ('array', 'object');
    IF v_depth > 64 THEN
      PERFORM {schema}._api_refuse('LQ002',
        'payload nests lists and objects more than 64 levels deep');
    END IF;
    v_size := v_size - coalesce(v_spaces, 0);
  END IF;
  IF v_size > a_limit THEN
    PERFORM {schema}._api_refuse('LQ002', format(
      'payload is %s bytes, over the limit of %s bytes', v_size, a_limit));
  END IF;
  RETURN a_payload;
END
$fn$;

-- One job's options checked as leaseq.jobspec.job_params checks them (in its order), with
-- the defaults of leaseq.jobspec.OPTIONS: the checked job, as _api_insert takes it.
CREATE FUNCTION {schema}._api_check(a_job jsonb)
RETURNS jsonb LANGUAGE plpgsql STABLE
AS $fn$
DECLARE
  v_names text[] := ARRAY['task', 'payload', 'queue', 'priority', 'run_at', 'delay',
    'max_attempts', 'payload_version', 'idempotency_key', 'ordering_key', 'key_policy',
    'unique_key', 'unique_for', 'unique_states', 'on_conflict', 'debounce', 'debounce_max',
    'limit_key', 'depends_on', 'on_dead', 'expires', 'fairness_key', 'cost', 'batch_id'];
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
                              'max_attempts', 8, 'key_policy', 'block', 'on_dead', 'cancel',
                              'cost', 1)
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
                                      'no NUL, valid Unicode'),
    'cost', {schema}._api_int('cost', v_job->'cost', 1, 1000));
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

-- leaseq.ops.ending_async._promote_dependents: after jobs ended in this transaction, fire
-- their sealed batches and decide their waiting dependents, down the graph.
CREATE FUNCTION {schema}._api_promote(a_ended bigint[])
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

-- One checked job inserted as leaseq.ops.enqueue_async inserts it: a unique key taken in
-- the insert's statement (or the conflict resolved as on_conflict says), an ordering key
-- under its lock, dependencies locked and stored (and decided when one ended already), a
-- batch joined while it is open.
CREATE FUNCTION {schema}._api_insert(a_job jsonb)
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
  p_cost integer := (a_job->>'cost')::integer;
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
     unique_for, unique_states, debounce_until, limit_key, expires_at, fairness_key,
     cost)
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
         coalesce(p_expires::timestamptz, now() + make_interval(secs => p_expires_in::float8)), p_fairness_key, p_cost
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
     unique_for, unique_states, debounce_until, limit_key, expires_at, fairness_key,
     cost)
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
         coalesce(p_expires::timestamptz, now() + make_interval(secs => p_expires_in::float8)), p_fairness_key, p_cost
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
     unique_for, unique_states, debounce_until, limit_key, expires_at, fairness_key,
     cost)
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
         coalesce(p_expires::timestamptz, now() + make_interval(secs => p_expires_in::float8)), p_fairness_key, p_cost
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
   payload_version, idempotency_key, key_policy, limit_key, expires_at, fairness_key, cost)
VALUES (
  p_queue, p_task, p_payload::jsonb, p_priority, p_priority,
  coalesce(p_run_at::timestamptz, now() + make_interval(secs => p_delay)),
  p_max_attempts, p_payload_version, p_idempotency_key, p_key_policy, p_limit_key,
  coalesce(p_expires::timestamptz, now() + make_interval(secs => p_expires_in::float8)), p_fairness_key, p_cost
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
     expires_at, fairness_key, cost)
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
    p_limit_key, coalesce(p_expires::timestamptz, now() + make_interval(secs => p_expires_in::float8)), p_fairness_key, p_cost
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

-- The SQL API, public and stable from here on.

-- Store one job; returns its id (the holder's, when its unique key is held and
-- on_conflict is skip). NULL for an option means its default.
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
  fairness_key text DEFAULT NULL,
  cost integer DEFAULT NULL)
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
     'fairness_key', fairness_key, 'cost', cost)) AS o
   WHERE jsonb_typeof(o.value) <> 'null')
  || jsonb_build_object('task', task, 'payload', coalesce(payload, 'null'::jsonb))))
$fn$;

-- Store many jobs: a JSON array of objects with enqueue's option names (JSON null is
-- Python's None). All are checked before any is stored; returns their ids in input order.
CREATE FUNCTION {schema}._api_enqueue_many(a_jobs jsonb)
RETURNS bigint[] LANGUAGE plpgsql
AS $fn$
DECLARE
  v_checked jsonb[];
  v_job jsonb;
  v_ids bigint[] := '{}';
BEGIN
  IF jsonb_typeof(a_jobs) IS DISTINCT FROM 'array' THEN
    PERFORM {schema}._api_refuse('LQ001', format('jobs must be a JSON array of job objects, got %s',
                                                coalesce(jsonb_typeof(a_jobs), 'NULL')));
  END IF;
  v_checked := ARRAY(SELECT {schema}._api_check(e)
                     FROM jsonb_array_elements(a_jobs) WITH ORDINALITY AS t(e, o) ORDER BY o);
  FOREACH v_job IN ARRAY v_checked LOOP
    v_ids := v_ids || {schema}._api_insert(v_job);
  END LOOP;
  RETURN v_ids;
END
$fn$;

CREATE FUNCTION {schema}.enqueue_many(jobs jsonb)
RETURNS bigint[] LANGUAGE sql
AS $fn$
SELECT {schema}._api_enqueue_many(jobs)
$fn$;

-- A job's status (pending, running, succeeded, dead, cancelled), NULL when there is none.
CREATE FUNCTION {schema}.job_state(job_id bigint)
RETURNS text LANGUAGE sql STABLE
AS $fn$
SELECT j.status::text FROM {schema}.jobs AS j WHERE j.id = job_id
$fn$;

-- A job's outcome as Client.result reads it: its status, whether a result is stored (and
-- not expired), the value, its last failure. No row when the job and its result are gone.
CREATE FUNCTION {schema}.job_result(p_id bigint)
RETURNS TABLE (status text, has_value boolean, value jsonb, error_code text,
               error_class text, error_detail text, stored_at timestamptz)
LANGUAGE sql STABLE
AS $fn$
-- statement: job_result
SELECT coalesce(j.status::text, CASE WHEN r.job_id IS NOT NULL THEN 'succeeded' END),
       r.job_id IS NOT NULL, r.value, j.last_error_code, j.last_error_class,
       j.last_error_detail, r.stored_at
FROM (SELECT p_id::bigint AS id) AS k
LEFT JOIN {schema}.jobs AS j ON j.id = k.id
LEFT JOIN {schema}.job_results AS r ON r.job_id = k.id AND r.expires_at > now()
WHERE j.id IS NOT NULL OR r.job_id IS NOT NULL
-- end: job_result
$fn$;

-- Client.cancel: a pending job ends cancelled now (its dependents decided, its ordering
-- key's next job promoted), a running one is asked to stop. False when the job does not
-- exist or already finished.
CREATE FUNCTION {schema}._api_cancel(a_id bigint, a_actor text, a_reason text)
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

CREATE FUNCTION {schema}.cancel(job_id bigint, actor text DEFAULT NULL, reason text DEFAULT NULL)
RETURNS boolean LANGUAGE sql
AS $fn$
SELECT {schema}._api_cancel(job_id, actor, reason)
$fn$;

-- Durable sleep and signals (version 24, docs/durable.md): a suspended job holds no lease,
-- slot or connection; wake_at (set only while suspended, 'infinity' for a wait without a
-- timeout) is when the claim makes it pending again, through jobs_wake_idx; wait_signal
-- names the signal it waits for; suspend_reason is 'sleep' or 'signal'.
CREATE INDEX jobs_wake_idx ON {schema}.jobs (queue_name, wake_at) WHERE wake_at IS NOT NULL;

-- Signals sent to jobs: one row per delivery (job, name, seq from version 32), kept until
-- the job is deleted, so one sent before the job waits for it is found when it does.
CREATE TABLE {schema}.job_signals (
  job_id bigint NOT NULL,
  name text NOT NULL,
  payload jsonb,
  sent_at timestamptz NOT NULL DEFAULT now(),
  actor text,
  -- (version 32) The name's delivery number: 1, 2, ... in the order sent.
  seq integer NOT NULL,
  PRIMARY KEY (job_id, name, seq),
  CONSTRAINT job_signals_name_bounded CHECK (length(name) <= 128 AND length(actor) <= 200),
  CONSTRAINT job_signals_seq_valid CHECK (seq >= 1)
);
-- Fair dispatch (version 26, docs/fairness.md): per queue and fairness key, its weight and
-- its pass (virtual time: a claim of m of its jobs advances it by m / weight; NULL: joins
-- at the queue's current one); a key found with nothing claimable is parked a while
-- (parked_until, park_step), and an enqueue unparks it and bumps gen.
CREATE TABLE {schema}.fair_keys (
  queue_name text NOT NULL,
  fairness_key text NOT NULL,
  weight float8 NOT NULL DEFAULT 1,
  pass float8,
  gen bigint NOT NULL DEFAULT 0,
  parked_until timestamptz,
  park_step float8 NOT NULL DEFAULT 0,
  PRIMARY KEY (queue_name, fairness_key),
  CONSTRAINT fair_keys_weight_positive CHECK (weight > 0 AND weight <= 1000000),
  -- (version 29) The last enqueue, wake-up or claim of the key: prune_fair_keys' idle test.
  active_at timestamptz NOT NULL DEFAULT now()
)
-- (version 38) Autovacuum from 1,000 dead rows, unthrottled, never truncating (its lock
-- would stop every fair claim): each claim leaves the old pass entries of its keys where
-- the next claim's scan of fair_keys_pass_idx starts (the workers vacuum it too:
-- vacuum_fair_keys).
WITH (
  autovacuum_vacuum_cost_delay = 0,
  autovacuum_vacuum_scale_factor = 0,
  autovacuum_vacuum_threshold = 1000,
  vacuum_truncate = false
);

-- The keys in turn (not parked) by pass, and the parked ones by the end of their park.
CREATE INDEX fair_keys_pass_idx ON {schema}.fair_keys (queue_name, pass NULLS FIRST)
  WHERE parked_until IS NULL;
CREATE INDEX fair_keys_parked_idx ON {schema}.fair_keys (queue_name, parked_until)
  WHERE parked_until IS NOT NULL;

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

-- Fan-out with results (version 27, docs/durable.md): the children a job spawned, one row
-- each, written with the spawning step's record.
CREATE TABLE {schema}.job_children (
  parent_id bigint NOT NULL,
  step text NOT NULL,
  child_id bigint NOT NULL,
  PRIMARY KEY (parent_id, step, child_id)
);

-- A fair queue's key is woken by whatever makes one of its jobs claimable (version 29,
-- docs/fairness.md): its row unparked and its gen bumped in that statement's transaction.
CREATE FUNCTION {schema}.fair_key_ready()
RETURNS trigger
LANGUAGE plpgsql
AS $fn$
BEGIN
  IF NEW.fairness_key IS NULL THEN
    UPDATE {schema}.fair_keys AS f
    SET gen = f.gen + 1, parked_until = NULL, park_step = 0, active_at = now(),
        pass = CASE WHEN f.park_step > 0 THEN NULL ELSE f.pass END
    WHERE f.queue_name = NEW.queue_name AND f.fairness_key = ''
      -- Once per transaction is enough (a later claim compares gen with its own read).
      AND (f.parked_until IS NOT NULL OR f.xmin <> pg_current_xact_id()::xid);
  ELSE
    INSERT INTO {schema}.fair_keys AS f (queue_name, fairness_key)
    VALUES (NEW.queue_name, NEW.fairness_key)
    ON CONFLICT (queue_name, fairness_key) DO UPDATE
    SET gen = f.gen + 1, parked_until = NULL, park_step = 0, active_at = now(),
        pass = CASE WHEN f.park_step > 0 THEN NULL ELSE f.pass END
    WHERE f.parked_until IS NOT NULL OR f.xmin <> pg_current_xact_id()::xid;
  END IF;
  RETURN NULL;
END
$fn$;

CREATE TRIGGER jobs_fair_ready
  AFTER UPDATE OF status, blocked, waiting ON {schema}.jobs
  FOR EACH ROW
  WHEN (NEW.status = 'pending' AND NOT NEW.blocked AND NOT NEW.waiting
        AND (OLD.status <> 'pending' OR OLD.blocked OR OLD.waiting)
        AND NOT (OLD.status::text = 'suspended' AND NEW.available_at = OLD.wake_at))
  EXECUTE FUNCTION {schema}.fair_key_ready();

-- A gathering parent is woken by its last child's end (version 31, docs/durable.md): the
-- parent's gate row (written at the spawn; the children its gather waits for, set by its
-- suspension), and the trigger that every child's ending statement runs.
CREATE TABLE {schema}.job_fanin (
  parent_id bigint PRIMARY KEY,
  children bigint[]
);

CREATE FUNCTION {schema}.child_ended()
RETURNS trigger
LANGUAGE plpgsql
AS $fn$
BEGIN
  PERFORM 1 FROM {schema}.job_fanin WHERE parent_id = NEW.parent_id FOR UPDATE;
  WITH woken AS (
    UPDATE {schema}.jobs AS p
    SET status = 'pending', available_at = now(), wake_at = NULL, wait_signal = NULL,
        suspend_reason = NULL
    WHERE p.id = (
        SELECT s.id FROM {schema}.jobs AS s
        WHERE s.id = NEW.parent_id AND s.status = 'suspended'
          AND s.suspend_reason = 'children'
        FOR UPDATE SKIP LOCKED)
      AND EXISTS (
        SELECT 1 FROM {schema}.job_fanin AS f
        WHERE f.parent_id = NEW.parent_id AND f.children IS NOT NULL)
      AND NOT EXISTS (
        SELECT 1 FROM {schema}.job_fanin AS f
        CROSS JOIN LATERAL unnest(f.children) AS c(id)
        JOIN {schema}.jobs AS k ON k.id = c.id
        WHERE f.parent_id = NEW.parent_id
          AND k.status IN ('pending', 'running', 'suspended'))
    RETURNING p.id, p.lease_token, p.attempt_count,
              pg_notify({schema}._api_channel(), p.queue_name)
  )
  INSERT INTO {schema}.job_events
    (job_id, event, from_status, to_status, lease_token, attempt, detail)
  SELECT id, 'woken', 'suspended', 'pending', lease_token, attempt_count,
         'its children ended (job ' || NEW.id || ' last)'
  FROM woken;
  RETURN NULL;
END
$fn$;

CREATE TRIGGER jobs_child_ended
  AFTER UPDATE OF status ON {schema}.jobs
  FOR EACH ROW
  WHEN (NEW.parent_id IS NOT NULL
        AND NEW.status IN ('succeeded', 'dead', 'cancelled')
        AND OLD.status::text IN ('pending', 'running', 'suspended'))
  EXECUTE FUNCTION {schema}.child_ended();
