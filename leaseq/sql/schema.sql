-- leaseq's complete current schema: what `leaseq migrate` builds from migration 0001 up to
-- the version below, written out in one place to read.
--
-- schema version: 19
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
  (19, 'expires');

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
  CONSTRAINT jobs_queue_slot_running CHECK (queue_slot IS NULL OR status = 'running')
);

-- The claim reads this index in order and stops at LIMIT; only claimable pending rows live
-- in it, so finished history, blocked per-key backlogs and jobs waiting for dependencies
-- do not slow claims down.
CREATE INDEX jobs_claimable_idx
  ON {schema}.jobs (queue_name, priority DESC, available_at, id)
  WHERE status = 'pending' AND NOT blocked AND NOT waiting;

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
  WHERE status = 'pending' AND NOT blocked AND NOT waiting
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
      ELSE pg_try_advisory_xact_lock(hashtextextended('leaseq.slot.' || p_name || '#' || n.g, 0))
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

-- What admit() returns: the admitted ids in claim order, and each one's queue slot.
CREATE TYPE {schema}.admission AS (admitted bigint[], slots integer[]);

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
               hashtextextended('leaseq.slot.queue:' || p_queue || '#' || n.g, 0))
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
  v_dead bigint[];
  v_alive bigint[];
  v_got bigint[];
  r_uniq bigint[];
  v_rated boolean;
  v_nums integer[];
  v_start integer;
  v_lim record;
  v_t0 timestamptz;
  v_step float8;
  v_m integer;
  v_qids bigint[] := '{}';
  v_qslots integer[] := '{}';
  v_slots integer[];
BEGIN
  WHILE cardinality(v_picked) < p_want AND v_pos <= v_total LOOP
    v_chunk := p_candidates[v_pos : v_pos + (p_want - cardinality(v_picked)) - 1];
    v_pos := v_pos + cardinality(v_chunk);
    -- Lock the chunk and list, per candidate, the limits it is under (a row with NULLs
    -- for a candidate under none).
    WITH j AS MATERIALIZED (
      SELECT x.id, u.ord, least(x.lease_token, 9223372036854775806) + 1 AS tok,
             x.queue_name, x.task, x.limit_key
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
           array_agg(p.burst),
           -- The locked candidates once each, in claim order, and whether any is under a
           -- rate limit: the common cases skip the rate steps and the re-sort below.
           (SELECT array_agg(j.id ORDER BY j.ord) FROM j),
           coalesce(bool_or(p.rate IS NOT NULL), false)
      INTO r_ids, r_toks, r_ords, r_names, r_concs, r_rates, r_pers, r_bursts, r_uniq,
           v_rated
      FROM (
        SELECT j.id, j.tok, j.ord, k.limit_name, k.concurrency, k.rate, k.per_seconds,
               k.burst
        FROM j
        LEFT JOIN k ON k.queue_name = j.queue_name AND k.task = j.task
                   AND k.limit_key IS NOT DISTINCT FROM j.limit_key
        ORDER BY j.ord, k.limit_name
      ) AS p;
    CONTINUE WHEN r_ids IS NULL;  -- all taken or changed meanwhile
    v_dead := '{}';
    -- Concurrency: per limit, its free slot numbers to its live requesters in claim order.
    FOR v_lim IN
      SELECT q.name, min(q.conc) AS conc, array_agg(q.id ORDER BY q.ord) AS ids,
             array_agg(q.tok ORDER BY q.ord) AS toks
      FROM unnest(r_ids, r_toks, r_ords, r_names, r_concs) AS q(id, tok, ord, name, conc)
      WHERE q.conc IS NOT NULL
      GROUP BY q.name
      ORDER BY q.name
    LOOP
      v_alive := ARRAY(SELECT a FROM unnest(v_lim.ids) AS a WHERE NOT a = ANY(v_dead));
      CONTINUE WHEN cardinality(v_alive) = 0;
      IF v_lim.name = ANY(v_full) THEN
        v_got := '{}';
      ELSIF left(v_lim.name, 6) = 'queue:' THEN
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
      -- A limit lowered below slots still held admits nothing until those are freed.
      ELSIF EXISTS (SELECT 1 FROM {schema}.limit_slots AS h
                    WHERE h.limit_name = v_lim.name AND h.slot > v_lim.conc) THEN
        v_got := '{}';
      ELSE
        -- The primary key decides; free_slots() is a guess at free numbers, passing over
        -- numbers held or being taken by a claim in flight. It starts at the first
        -- candidate's id (mod the limit) and wraps around, so successive claims take fresh
        -- numbers rather than the same few again, whose index entries pile up dead versions
        -- (a slot row is inserted and deleted per job) until a vacuum.
        v_start := (r_uniq[1] % v_lim.conc)::integer;
        -- Probed, not guessed: inserting over a slot whose delete is not yet committed
        -- would wait for that transaction, and a claim never waits on another.
        v_nums := {schema}.free_slots(v_lim.name, v_lim.conc, v_start, cardinality(v_alive));
        -- A plain insert (cheaper than ON CONFLICT). It fails only when a claim that
        -- committed after the search's snapshot took one of the numbers (rare): then the
        -- search again, and an insert that skips any number taken meanwhile.
        BEGIN
          INSERT INTO {schema}.limit_slots (limit_name, slot, job_id, lease_token)
          SELECT v_lim.name, f.g, r.id, r.tok
          FROM unnest(v_nums) WITH ORDINALITY AS f(g, rn)
          JOIN (SELECT q.id, q.tok, row_number() OVER () AS rn
                FROM unnest(v_lim.ids, v_lim.toks) AS q(id, tok)
                WHERE NOT q.id = ANY(v_dead)) AS r USING (rn);
          v_got := v_alive[1 : cardinality(v_nums)];
        EXCEPTION WHEN unique_violation THEN
          v_nums := {schema}.free_slots(v_lim.name, v_lim.conc, v_start,
                                        cardinality(v_alive));
          WITH ins AS (
            INSERT INTO {schema}.limit_slots (limit_name, slot, job_id, lease_token)
            SELECT v_lim.name, f.g, r.id, r.tok
            FROM unnest(v_nums) WITH ORDINALITY AS f(g, rn)
            JOIN (SELECT q.id, q.tok, row_number() OVER () AS rn
                  FROM unnest(v_lim.ids, v_lim.toks) AS q(id, tok)
                  WHERE NOT q.id = ANY(v_dead)) AS r USING (rn)
            ON CONFLICT DO NOTHING
            RETURNING job_id
          )
          SELECT coalesce(array_agg(job_id), '{}') INTO v_got FROM ins;
        END;
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
           AND pg_try_advisory_xact_lock(hashtextextended('leaseq.bucket.' || v_lim.name, 0))
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
  RETURN ROW(v_picked, v_slots)::{schema}.admission;
END
$$;

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
