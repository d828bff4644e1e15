-- leaseq schema, version 8: durable pauses and the operator audit table.
--
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
