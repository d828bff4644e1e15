-- leaseq schema, version 15: an index for retention.
--
-- The prune looked for succeeded and cancelled jobs past the cut-off by walking the primary
-- key from the oldest id, so its last batch of every round (the one that finds fewer rows
-- than its limit) read every row still in the table: the retention window, the backlog,
-- dead tuples. At a few thousand jobs/s that was 0.2-1.5 s per statement, holding back the
-- xmin horizon that claims and autovacuum need. This index holds only finished rows that
-- retention may remove, in finished_at order, so a prune reads what it deletes and stops.
-- Only a completion or a cancel writes to it (claims and enqueues leave it alone).
CREATE INDEX jobs_prunable_idx
  ON {schema}.jobs (finished_at)
  WHERE status IN ('succeeded', 'cancelled');
