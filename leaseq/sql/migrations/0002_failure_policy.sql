-- leaseq schema, version 2: failure classes, payload versions, inspection views.

ALTER TABLE {schema}.jobs
  ADD COLUMN payload_version integer,
  ADD COLUMN last_error_class text,
  -- Failures of unknown cause get a smaller budget than transient ones; counted apart.
  ADD COLUMN unknown_failures integer NOT NULL DEFAULT 0,
  ADD CONSTRAINT jobs_error_class_known
    CHECK (last_error_class IN ('permanent', 'transient', 'unknown'));

ALTER TABLE {schema}.job_events
  ADD COLUMN error_class text;

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
