-- Large payloads kept out of the hot table and encrypted values at rest
-- (leaseq.ops.payloads_async; docs/payloads.md, docs/encryption.md). A job whose payload is
-- offloaded carries only a marker in jobs.payload; its payload is a row of payloads (store
-- 'pg': the text itself; 's3': the object's key). Retention and purge delete the rows with
-- their jobs (_payloads_deleted, in their own statements).


-- name: _payloads_deleted
-- (CTE batch with an array ids: jobs this statement deletes.) Their offloaded payloads
-- go in the same statement; an object's key is queued for the store's delete.
payloads_gone AS (
  DELETE FROM {schema}.payloads AS p
  WHERE p.job_id = ANY((SELECT ids FROM batch)::bigint[])
  RETURNING p.object_key
), objects_queued AS (
  INSERT INTO {schema}.payload_deletes (object_key)
  SELECT object_key FROM payloads_gone WHERE object_key IS NOT NULL
  ON CONFLICT DO NOTHING
)

-- name: store_payloads
-- In the enqueue's transaction, after the jobs' insert (or a replace's update): each
-- offloaded payload's row. A replaced payload's old object is queued for deletion.
-- data is sent in binary (its placeholder ends in b): as an array literal the server parsed
-- every character of megabytes of text, half of a 1 MB enqueue's time.
WITH u AS (
  SELECT *
  FROM unnest(%(ids)s::bigint[], %(stores)s::text[], %(data)b::text[],
              %(object_keys)s::text[], %(bytes)s::int[], %(kids)s::text[])
    AS u(job_id, store, data, object_key, bytes, kid)
), old AS (
  -- The rows as they were: every part of a statement reads one snapshot, taken before its
  -- changes (a FOR UPDATE here would follow ins's update and see nothing). The job rows
  -- are locked already (their insert, or the replace's update), so no one else races.
  SELECT p.job_id, p.object_key
  FROM {schema}.payloads AS p
  WHERE p.job_id = ANY(%(ids)s::bigint[])
), ins AS (
  INSERT INTO {schema}.payloads AS p (job_id, store, data, object_key, bytes, kid)
  SELECT job_id, store, data, object_key, bytes, kid FROM u
  ON CONFLICT (job_id) DO UPDATE
  SET store = excluded.store, data = excluded.data, object_key = excluded.object_key,
      bytes = excluded.bytes, kid = excluded.kid, created_at = now()
  RETURNING p.job_id
), replaced AS (
  INSERT INTO {schema}.payload_deletes (object_key)
  SELECT o.object_key FROM old AS o JOIN u ON u.job_id = o.job_id
  WHERE o.object_key IS NOT NULL AND o.object_key IS DISTINCT FROM u.object_key
  ON CONFLICT DO NOTHING
)
SELECT count(*) FROM ins;

-- name: drop_payloads
-- A job's payload row when the job's new payload is inline again (a replace that brought
-- it under offload_above): the old object, if any, is queued for deletion.
WITH gone AS (
  DELETE FROM {schema}.payloads WHERE job_id = ANY(%(ids)s::bigint[]) RETURNING object_key
)
INSERT INTO {schema}.payload_deletes (object_key)
SELECT object_key FROM gone WHERE object_key IS NOT NULL
ON CONFLICT DO NOTHING;

-- name: payloads_of
-- The offloaded payloads of claimed jobs: read once per attempt, by the claim that took them.
SELECT job_id, store, data, object_key FROM {schema}.payloads
WHERE job_id = ANY(%(ids)s::bigint[]);

-- name: next_payload_deletes
-- A bounded batch of objects to delete, locked so two maintenance services split the work.
SELECT object_key FROM {schema}.payload_deletes
ORDER BY queued_at
LIMIT %(limit)s
FOR UPDATE SKIP LOCKED;

-- name: payload_deletes_done
DELETE FROM {schema}.payload_deletes WHERE object_key = ANY(%(keys)s::text[]);

-- name: payload_deletes_failed
-- Kept for the next round, with the store's reason (shown by `leaseq status`).
UPDATE {schema}.payload_deletes
SET attempts = attempts + 1, last_error = left(%(error)s, 500), queued_at = now()
WHERE object_key = ANY(%(keys)s::text[]);

-- name: orphan_payload_rows
-- Rows whose job is gone without its statement deleting them (a hand-written DELETE):
-- removed, a bounded batch at a time; their objects are queued for deletion.
WITH doomed AS (
  SELECT p.job_id FROM {schema}.payloads AS p
  WHERE p.created_at < now() - make_interval(secs => %(grace)s)
    AND NOT EXISTS (SELECT 1 FROM {schema}.jobs AS j WHERE j.id = p.job_id)
  LIMIT %(limit)s
), gone AS (
  DELETE FROM {schema}.payloads AS p USING doomed WHERE p.job_id = doomed.job_id
  RETURNING p.object_key
), queued AS (
  INSERT INTO {schema}.payload_deletes (object_key)
  SELECT object_key FROM gone WHERE object_key IS NOT NULL
  ON CONFLICT DO NOTHING
)
SELECT count(*) FROM gone;

-- name: known_object_keys
-- The orphan sweep: which of these objects (listed from the bucket) are still a payload or
-- already queued for deletion; the others belong to no job (an enqueue that rolled back or
-- died between its upload and its commit).
SELECT k FROM unnest(%(keys)s::text[]) AS k
WHERE EXISTS (SELECT 1 FROM {schema}.payloads AS p WHERE p.object_key = k)
   OR EXISTS (SELECT 1 FROM {schema}.payload_deletes AS d WHERE d.object_key = k);

-- name: payload_store_stats
-- `leaseq status` and the metrics: offloaded payloads by store, objects waiting to be
-- deleted and the oldest such wait.
SELECT (SELECT count(*) FROM {schema}.payloads WHERE store = 'pg'),
       (SELECT count(*) FROM {schema}.payloads WHERE store = 's3'),
       (SELECT count(*) FROM {schema}.payload_deletes),
       (SELECT coalesce(extract(epoch FROM now() - min(queued_at)), 0)::float8
          FROM {schema}.payload_deletes);

-- name: rotation_jobs
-- `leaseq keys rotate`: a batch of job payloads sealed under an older key, after id
-- %(after)s, locked for this batch's transaction (SKIP LOCKED: a row being claimed is
-- left for the next pass; rotation never waits on a worker).
SELECT id, payload::text FROM {schema}.jobs
WHERE id > %(after)s AND payload ? 'leaseq:enc' AND payload->>'kid' <> %(kid)s
ORDER BY id LIMIT %(limit)s
FOR UPDATE SKIP LOCKED;

-- name: rotate_jobs
UPDATE {schema}.jobs AS j SET payload = u.value
FROM unnest(%(ids)s::bigint[], %(values)s::jsonb[]) AS u(id, value)
WHERE j.id = u.id;

-- name: rotation_results
SELECT job_id, value::text FROM {schema}.job_results
WHERE job_id > %(after)s AND value ? 'leaseq:enc' AND value->>'kid' <> %(kid)s
ORDER BY job_id LIMIT %(limit)s
FOR UPDATE SKIP LOCKED;

-- name: rotate_results
UPDATE {schema}.job_results AS r SET value = u.value
FROM unnest(%(ids)s::bigint[], %(values)s::jsonb[]) AS u(id, value)
WHERE r.job_id = u.id;

-- name: rotation_effects
-- Effect records are keyed (job_id, name, key): the batch walks job_id, a job's records
-- together.
SELECT job_id, name, key, result::text FROM {schema}.job_effects
WHERE job_id > %(after)s AND result ? 'leaseq:enc' AND result->>'kid' <> %(kid)s
ORDER BY job_id LIMIT %(limit)s
FOR UPDATE SKIP LOCKED;

-- name: rotate_effects
UPDATE {schema}.job_effects AS e SET result = u.value
FROM unnest(%(ids)s::bigint[], %(names)s::text[], %(keys)s::text[], %(values)s::jsonb[])
  AS u(id, name, key, value)
WHERE e.job_id = u.id AND e.name = u.name AND e.key = u.key;

-- name: rotation_steps
-- Step records are keyed (job_id, name): the batch walks job_id, a job's records together.
SELECT job_id, name, result::text FROM {schema}.job_steps
WHERE job_id > %(after)s AND result ? 'leaseq:enc' AND result->>'kid' <> %(kid)s
ORDER BY job_id LIMIT %(limit)s
FOR UPDATE SKIP LOCKED;

-- name: rotate_steps
UPDATE {schema}.job_steps AS s SET result = u.value
FROM unnest(%(ids)s::bigint[], %(names)s::text[], %(values)s::jsonb[]) AS u(id, name, value)
WHERE s.job_id = u.id AND s.name = u.name;

-- name: rotation_payloads
SELECT job_id, store, data, object_key FROM {schema}.payloads
WHERE job_id > %(after)s AND kid IS NOT NULL AND kid <> %(kid)s
ORDER BY job_id LIMIT %(limit)s
FOR UPDATE SKIP LOCKED;

-- name: rotate_payloads
UPDATE {schema}.payloads AS p SET data = coalesce(u.data, p.data), kid = %(kid)s
FROM unnest(%(ids)s::bigint[], %(data)s::text[]) AS u(id, data)
WHERE p.job_id = u.id;

-- name: sealed_counts
-- `leaseq keys rotate --dry-run` and its progress: values still sealed under another key
-- than the newest, per table.
SELECT (SELECT count(*) FROM {schema}.jobs
         WHERE payload ? 'leaseq:enc' AND payload->>'kid' <> %(kid)s),
       (SELECT count(*) FROM {schema}.job_results
         WHERE value ? 'leaseq:enc' AND value->>'kid' <> %(kid)s),
       (SELECT count(*) FROM {schema}.job_effects
         WHERE result ? 'leaseq:enc' AND result->>'kid' <> %(kid)s),
       (SELECT count(*) FROM {schema}.payloads WHERE kid IS NOT NULL AND kid <> %(kid)s),
       (SELECT count(*) FROM {schema}.job_steps
         WHERE result ? 'leaseq:enc' AND result->>'kid' <> %(kid)s);
