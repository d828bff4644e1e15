-- leaseq schema, version 7: unique jobs and debounce.
-- A keyed job records its key and how the key is held after it finishes; who holds a key
-- is decided by unique_keys alone (one row per key, so its primary key is the constraint).
ALTER TABLE {schema}.jobs
  ADD COLUMN unique_key text,
  ADD COLUMN unique_for float8,
  ADD COLUMN unique_states text[],
  ADD COLUMN debounce_until timestamptz,
  ADD CONSTRAINT jobs_unique_key_bounded CHECK (length(unique_key) <= 200);

-- Who holds each unique key: held_until NULL = a live job (pending or running) holds it; a
-- time = the window after that job finished, which ends then. Pruning or purging jobs never
-- touches this table, so a window cannot shrink.
CREATE TABLE {schema}.unique_keys (
  unique_key text PRIMARY KEY,
  job_id bigint NOT NULL,
  held_until timestamptz
);

-- Expired windows are found (and deleted by the sweep) without scanning live keys.
CREATE INDEX unique_keys_held_until_idx
  ON {schema}.unique_keys (held_until)
  WHERE held_until IS NOT NULL;

-- Who holds each unique key, with the holder's state (NULL once the job was pruned): for
-- psql users. live = a pending or running job holds it; otherwise a window until held_until.
CREATE VIEW {schema}.unique_key_holders AS
SELECT k.unique_key, k.job_id, k.held_until IS NULL AS live, k.held_until,
       j.status AS job_status, j.queue_name, j.task
FROM {schema}.unique_keys AS k
LEFT JOIN {schema}.jobs AS j ON j.id = k.job_id;
