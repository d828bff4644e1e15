-- leaseq schema, version 34: a schedule's jobs carry a cost (issue 32; jobs.cost, version
-- 30): schedules.cost, from the task's default for a schedule declared in code, given to
-- schedule_add / schedule_change for a dynamic one, and written by tick_job on each job.
ALTER TABLE {schema}.schedules ADD COLUMN cost integer NOT NULL DEFAULT 1;
ALTER TABLE {schema}.schedules
  ADD CONSTRAINT schedules_cost_range CHECK (cost BETWEEN 1 AND 1000);
