-- leaseq schema, version 7: reserved for unique jobs (branch h/unique). This placeholder
-- only keeps the versions of branch h/pauses gapless; the merge replaces it with that
-- branch's 0007 migration.
SELECT 1;
