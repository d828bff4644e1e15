-- leaseq schema, version 38: fair_keys is vacuumed by autovacuum from 1,000 dead rows on.
--
-- Each claim of a fair queue moves forward the pass of every key it takes from: a new row
-- version and a new entry in fair_keys_pass_idx, with the old entry left at the index's low
-- end, where the next claim's scan starts; every claim steps over all of them until a
-- vacuum removes them (40,000 jobs over 10,000 keys: 179 of the index's 244 pages). The
-- workers vacuum the table themselves (vacuum_fair_keys, the worker's FairKeyVacuum); this
-- is the backstop when none runs or may: autovacuum at 1,000 dead rows whatever the
-- table's size (a row per key: milliseconds) and without the cost throttle; and never
-- truncating its empty last pages (that takes an ACCESS EXCLUSIVE lock every fair claim
-- would queue behind, for pages the next claims fill again).
ALTER TABLE {schema}.fair_keys SET (
  autovacuum_vacuum_cost_delay = 0,
  autovacuum_vacuum_scale_factor = 0,
  autovacuum_vacuum_threshold = 1000,
  vacuum_truncate = false
);
