-- leaseq schema, version 9: periodic schedules. A schedule row says when it ticks and what
-- it enqueues; a schedule_ticks row is one tick, keyed by (schedule, UTC instant), inserted
-- by the same statement as the tick's job: two tickers that compute the same tick can never
-- both enqueue it (see the tick_job statement).
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
