-- leaseq schema, version 24: durable sleep and signals (docs/durable.md).
--
-- A job that sleeps (ctx.sleep) or waits for a signal (ctx.wait_for) is 'suspended': it
-- holds no lease, no limit slot and no connection. wake_at is when it becomes pending again
-- (set only while suspended: 'infinity' for a wait without a timeout); the claim wakes the
-- due ones of its queue, each by a single-row update, through jobs_wake_idx. wait_signal
-- names the signal it waits for (the send wakes it in the transaction that stores the
-- signal); suspend_reason is 'sleep' or 'signal'. No statement of this migration names the
-- new status: a value added to an enum cannot be used in the transaction that added it
-- (the migrations run in one), hence the index on wake_at rather than on the status.
ALTER TYPE {schema}.job_status ADD VALUE 'suspended';

ALTER TABLE {schema}.jobs
  ADD COLUMN suspend_reason text,
  ADD COLUMN wake_at timestamptz,
  ADD COLUMN wait_signal text,
  ADD CONSTRAINT jobs_suspend_bounded CHECK (length(suspend_reason) <= 32
                                             AND length(wait_signal) <= 128);

CREATE INDEX jobs_wake_idx ON {schema}.jobs (queue_name, wake_at) WHERE wake_at IS NOT NULL;

-- Signals sent to jobs (client.signal, `leaseq jobs signal`): one per job and name, so a
-- signal is stored, and delivered, at most once; kept until the job is deleted, so one sent
-- before the job waits for it is found when it does. The delivery is recorded in the
-- waiting step's record (job_steps) under the fence.
CREATE TABLE {schema}.job_signals (
  job_id bigint NOT NULL,
  name text NOT NULL,
  payload jsonb,
  sent_at timestamptz NOT NULL DEFAULT now(),
  actor text,
  PRIMARY KEY (job_id, name),
  CONSTRAINT job_signals_name_bounded CHECK (length(name) <= 128 AND length(actor) <= 200)
);
