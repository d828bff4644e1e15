-- leaseq schema, version 1: the seed's jobs table, the audit trail, and the indexes the
-- claim and the sweep need. {schema} is replaced by the quoted schema identifier.

CREATE TYPE {schema}.job_status AS ENUM (
  'pending', 'running', 'succeeded', 'dead', 'cancelled'
);

CREATE TABLE {schema}.jobs (
  id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
  queue_name text NOT NULL,
  task text NOT NULL,
  payload jsonb NOT NULL,
  status {schema}.job_status NOT NULL DEFAULT 'pending',
  priority integer NOT NULL DEFAULT 0,
  available_at timestamptz NOT NULL DEFAULT now(),
  attempt_count integer NOT NULL DEFAULT 0,
  max_attempts integer NOT NULL DEFAULT 8,
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
  CONSTRAINT jobs_max_attempts_positive CHECK (max_attempts >= 1),
  CONSTRAINT jobs_attempts_nonnegative CHECK (attempt_count >= 0),
  -- A running job always has an owner and an expiry; no other state keeps either, so a
  -- half-cleared lease can never be mistaken for ownership.
  CONSTRAINT jobs_lease_iff_running CHECK (
    (status = 'running') = (lease_owner IS NOT NULL AND lease_expires_at IS NOT NULL)
  ),
  CONSTRAINT jobs_error_detail_bounded CHECK (length(last_error_detail) <= 4000),
  CONSTRAINT jobs_error_code_bounded CHECK (length(last_error_code) <= 64)
);

-- The claim reads this index in order and stops at LIMIT; only pending rows live in it,
-- so finished history does not slow claims down.
CREATE INDEX jobs_claimable_idx
  ON {schema}.jobs (queue_name, priority DESC, available_at, id)
  WHERE status = 'pending';

-- The sweep looks only at running rows whose lease ran out.
CREATE INDEX jobs_expired_lease_idx
  ON {schema}.jobs (lease_expires_at)
  WHERE status = 'running';

-- Dead jobs are an operational state: listing them by queue and age must stay cheap.
CREATE INDEX jobs_dead_idx
  ON {schema}.jobs (queue_name, finished_at)
  WHERE status = 'dead';

-- Every transition other than claim and succeed leaves a row here, written by the same
-- statement that makes the transition, so the trail can never disagree with the job.
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
  CONSTRAINT job_events_detail_bounded CHECK (length(detail) <= 4000)
);

CREATE INDEX job_events_job_idx ON {schema}.job_events (job_id, id);
