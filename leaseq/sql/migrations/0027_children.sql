-- leaseq schema, version 27: fan-out with results (ctx.spawn, ctx.gather; docs/durable.md).
--
-- One row per child a job spawned, written in the transaction of the spawning step's record
-- (job_steps), so a parent that reruns never spawns its children twice: (parent_id, step)
-- is the spawning step, unique per job and name. Cancelling the parent cancels the
-- unfinished children through it; retention and purge delete a parent's rows with it.
CREATE TABLE {schema}.job_children (
  parent_id bigint NOT NULL,
  step text NOT NULL,
  child_id bigint NOT NULL,
  PRIMARY KEY (parent_id, step, child_id)
);
