-- leaseq schema, version 19: start deadlines (docs/deadlines.md).
--
-- A job enqueued with expires= is never started after expires_at (the claim compares it with
-- the database clock, in the statement that starts the job). A pending job past it is ended
-- by the sweep (expire_pending_jobs: cancelled, error code EXPIRED, one 'expired' event),
-- found through jobs_expiring_idx, which holds only pending jobs that have a deadline.
ALTER TABLE {schema}.jobs ADD COLUMN expires_at timestamptz;

CREATE INDEX jobs_expiring_idx ON {schema}.jobs (expires_at)
  WHERE status = 'pending' AND expires_at IS NOT NULL;
