-- leaseq schema, version 17: large payloads kept out of the hot table (docs/payloads.md).
--
-- A payload over the application's offload_above is stored here, or in S3-compatible object
-- storage with only its object key here; the job row keeps a small marker
-- ({"leaseq:ref": "pg" | "s3", "bytes": N}) so every claim and every update of the job
-- reads and writes a few bytes instead of the payload. The enqueue writes the row in the
-- transaction of the job's insert, so a rolled-back enqueue leaves no row. Retention and
-- purge delete it with its job, in the same statement; an object's key then goes to
-- payload_deletes, from which the maintenance service deletes the object (retried until
-- the store says it is gone). No foreign key: a cascade would run one more statement per
-- pruned job; the sweep instead removes rows whose job was deleted by hand.
CREATE TABLE {schema}.payloads (
  job_id bigint PRIMARY KEY,
  store text NOT NULL,
  -- The payload's JSON text (sealed when its task encrypts), for store 'pg'.
  data text,
  -- The object key, for store 's3'.
  object_key text,
  bytes integer NOT NULL,
  created_at timestamptz NOT NULL DEFAULT now(),
  -- The key the payload is sealed with (NULL: plain), so rotation finds it without
  -- reading it (an object's content is in its store).
  kid text,
  CONSTRAINT payloads_store_known CHECK (store IN ('pg', 's3')),
  CONSTRAINT payloads_where CHECK (
    (store = 'pg' AND data IS NOT NULL AND object_key IS NULL)
    OR (store = 's3' AND data IS NULL AND object_key IS NOT NULL))
);

-- The orphan sweep's question: is an object in the bucket still someone's payload?
CREATE UNIQUE INDEX payloads_object_key_idx ON {schema}.payloads (object_key)
  WHERE object_key IS NOT NULL;

-- Objects whose payload row is gone, waiting to be deleted from their store.
CREATE TABLE {schema}.payload_deletes (
  object_key text PRIMARY KEY,
  queued_at timestamptz NOT NULL DEFAULT now(),
  attempts integer NOT NULL DEFAULT 0,
  last_error text
);
