-- leaseq schema, version 36: the payloads table is vacuumed without the cost throttle.
--
-- Every row of payloads is a large value (over offload_above: its TOAST chunks, ~500 per
-- MB) that retention deletes a retention period after its insert. Under autovacuum's
-- default cost limit a vacuum of its TOAST table dirtied ~40 MB/s at most and ran for
-- minutes while new payloads extended the table: a 10-minute run at 10 MB/s of 1 MB
-- payloads left it at 4.4 GB for 0.7 GB live, still growing (issue 34, bench.sustained).
-- Unthrottled, and started at 5% dead rather than 20%, vacuum frees the space as fast as
-- retention deletes it, and new chunks reuse it.
ALTER TABLE {schema}.payloads SET (
  autovacuum_vacuum_cost_delay = 0,
  autovacuum_vacuum_scale_factor = 0.05,
  toast.autovacuum_vacuum_cost_delay = 0,
  toast.autovacuum_vacuum_scale_factor = 0.05
);
