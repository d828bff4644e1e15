-- leaseq schema, version 3: durable records of external side effects, and enqueue-given
-- idempotency keys.

ALTER TABLE {schema}.jobs
  ADD COLUMN idempotency_key text,
  ADD CONSTRAINT jobs_idempotency_key_bounded CHECK (length(idempotency_key) <= 200);

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
