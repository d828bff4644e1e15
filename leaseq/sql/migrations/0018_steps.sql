-- leaseq schema, version 18: durable steps (docs/durable.md).
--
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
