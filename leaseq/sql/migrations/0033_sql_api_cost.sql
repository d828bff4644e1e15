-- leaseq schema, version 33: the SQL API's enqueue() takes cost by name (issue 32; version
-- 30 gave it to enqueue_many's JSON objects and to the checks and copies both share).
-- enqueue(..., cost => ...): one more named option.
DROP FUNCTION {schema}.enqueue(text, jsonb, text, integer, timestamptz, float8, integer, integer, text, text, text, text, float8, text[], text, float8, float8, text, bigint[], text, jsonb, bigint, text);
CREATE FUNCTION {schema}.enqueue(
  task text,
  payload jsonb DEFAULT 'null',
  queue text DEFAULT NULL,
  priority integer DEFAULT NULL,
  run_at timestamptz DEFAULT NULL,
  delay float8 DEFAULT NULL,
  max_attempts integer DEFAULT NULL,
  payload_version integer DEFAULT NULL,
  idempotency_key text DEFAULT NULL,
  ordering_key text DEFAULT NULL,
  key_policy text DEFAULT NULL,
  unique_key text DEFAULT NULL,
  unique_for float8 DEFAULT NULL,
  unique_states text[] DEFAULT NULL,
  on_conflict text DEFAULT NULL,
  debounce float8 DEFAULT NULL,
  debounce_max float8 DEFAULT NULL,
  limit_key text DEFAULT NULL,
  depends_on bigint[] DEFAULT NULL,
  on_dead text DEFAULT NULL,
  expires jsonb DEFAULT NULL,
  batch_id bigint DEFAULT NULL,
  fairness_key text DEFAULT NULL,
  cost integer DEFAULT NULL)
RETURNS bigint LANGUAGE sql
AS $fn$
SELECT {schema}._api_insert({schema}._api_check(
  (SELECT coalesce(jsonb_object_agg(o.key, o.value), '{}'::jsonb)
   FROM jsonb_each(jsonb_build_object(
     'task', task, 'queue', queue, 'priority', priority, 'run_at', run_at, 'delay', delay,
     'max_attempts', max_attempts, 'payload_version', payload_version,
     'idempotency_key', idempotency_key, 'ordering_key', ordering_key,
     'key_policy', key_policy, 'unique_key', unique_key, 'unique_for', unique_for,
     'unique_states', unique_states, 'on_conflict', on_conflict, 'debounce', debounce,
     'debounce_max', debounce_max, 'limit_key', limit_key, 'depends_on', depends_on,
     'on_dead', on_dead, 'expires', expires, 'batch_id', batch_id,
     'fairness_key', fairness_key, 'cost', cost)) AS o
   WHERE jsonb_typeof(o.value) <> 'null')
  || jsonb_build_object('task', task, 'payload', coalesce(payload, 'null'::jsonb))))
$fn$;
