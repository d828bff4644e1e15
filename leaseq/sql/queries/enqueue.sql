-- Enqueue (leaseq.ops.enqueue_async): one job, unnested arrays, COPY; the tracing context
-- stored with jobs just inserted. Jobs with a unique key are in unique.sql.


-- name: insert_job
-- One round trip: the row and its wake-up go together, so the NOTIFY is delivered only if
-- (and when) the enclosing transaction commits. Jobs scheduled for later wake nobody. Jobs
-- without an ordering key take this plain INSERT (insert_keyed_job has the key logic,
-- which cost single enqueues about 15% even when it did not apply).
INSERT INTO {schema}.jobs
  (queue_name, task, payload, priority, base_priority, available_at, max_attempts,
   payload_version, idempotency_key, key_policy, limit_key, expires_at, fairness_key, cost)
VALUES (
  %(queue)s, %(task)s, %(payload)s::jsonb, %(priority)s, %(priority)s,
  coalesce(%(run_at)s::timestamptz, now() + make_interval(secs => %(delay)s)),
  %(max_attempts)s, %(payload_version)s, %(idempotency_key)s, %(key_policy)s, %(limit_key)s,
  {_expires_at}, %(fairness_key)s, %(cost)s
)
RETURNING id, {_notify_ready};

-- name: _expires_at
-- The start deadline of one job: the instant given, or seconds from the database clock
-- (make_interval is strict: neither given, NULL).
coalesce(%(expires)s::timestamptz, now() + make_interval(secs => %(expires_in)s::float8))

-- name: insert_keyed_job
-- insert_job for a job with an ordering key; the caller holds the key's advisory lock.
WITH ins AS (
  INSERT INTO {schema}.jobs
    (queue_name, task, payload, priority, base_priority, available_at, max_attempts,
     payload_version, idempotency_key, ordering_key, key_policy, blocked, limit_key,
     expires_at, fairness_key, cost)
  VALUES (
    %(queue)s, %(task)s, %(payload)s::jsonb, %(priority)s, %(priority)s,
    coalesce(%(run_at)s::timestamptz, now() + make_interval(secs => %(delay)s)),
    %(max_attempts)s, %(payload_version)s, %(idempotency_key)s, %(ordering_key)s,
    %(key_policy)s,
    -- Behind any live (or blocking dead) job of its key: wait. The caller holds the key's
    -- advisory lock (lock_keys), so this answer cannot go stale before the commit.
    EXISTS (
      SELECT 1 FROM {schema}.jobs AS b
      WHERE b.ordering_key = %(ordering_key)s AND {_key_blocking}
    ),
    %(limit_key)s, {_expires_at}, %(fairness_key)s, %(cost)s
  )
  RETURNING id, queue_name, available_at, blocked
)
SELECT id, {_notify_ready}
FROM ins;

-- name: insert_jobs
-- Bulk form of insert_job: arrays in, one statement. Identity values are assigned in the
-- order unnest produces rows, so sorted ids match the input order. PostgreSQL folds
-- duplicate notifications of one transaction, so one wake-up per queue goes out.
WITH ins AS (
  INSERT INTO {schema}.jobs
    (queue_name, task, payload, priority, base_priority, available_at, max_attempts,
     payload_version, idempotency_key, ordering_key, key_policy, blocked, limit_key,
     expires_at, fairness_key, cost)
  SELECT u.queue, u.task, u.payload, u.priority, u.priority,
         coalesce(u.run_at, now() + make_interval(secs => u.delay)), u.max_attempts,
         u.payload_version, u.idempotency_key, u.ordering_key, u.key_policy,
         -- Within the batch only a key's first job may be its head; after that, as in
         -- insert_job, anything live of the key already stored holds it up.
         u.ordering_key IS NOT NULL AND (
           row_number() OVER (PARTITION BY u.ordering_key ORDER BY u.ord) > 1
           OR EXISTS (
             SELECT 1 FROM {schema}.jobs AS b
             WHERE b.ordering_key = u.ordering_key AND {_key_blocking}
           )
         ),
         u.limit_key,
         coalesce(u.expires, now() + make_interval(secs => u.expires_in)),
         u.fairness_key, u.cost
  -- One array per option of the arrays path (leaseq.jobspec.ARRAY_OPTIONS, in its order,
  -- each under the option's own name), then leaseq.jobspec.DERIVED_ARRAYS.
  FROM unnest(
    %(task)s::text[], %(payload)s::jsonb[], %(queue)s::text[], %(priority)s::int[],
    %(run_at)s::timestamptz[], %(delay)s::float8[], %(max_attempts)s::int[],
    %(payload_version)s::int[], %(idempotency_key)s::text[], %(ordering_key)s::text[],
    %(key_policy)s::text[], %(limit_key)s::text[], %(expires)s::timestamptz[],
    %(fairness_key)s::text[], %(cost)s::int[], %(expires_in)s::float8[]
  ) WITH ORDINALITY
    AS u(task, payload, queue, priority, run_at, delay, max_attempts, payload_version,
         idempotency_key, ordering_key, key_policy, limit_key, expires, fairness_key, cost,
         expires_in, ord)
  ORDER BY u.ord
  RETURNING id, queue_name, available_at, blocked
)
SELECT id, {_notify_ready}
FROM ins
ORDER BY id;

-- name: reserve_job_ids
-- Bulk enqueue by COPY: take the ids first (so they come back in input order) and the
-- database's clock (so delays count from database time, as everywhere else); the queues'
-- wake-ups go out in the same round trip (delivered only if the transaction commits).
-- The sequence is looked up once, in a scalar subquery: called per row,
-- pg_get_serial_sequence took three quarters of the statement's time.
SELECT now(),
       array_agg(nextval((SELECT pg_get_serial_sequence('{schema}.jobs', 'id'))::regclass)
                 ORDER BY g),
       (SELECT count(pg_notify(%(channel)s, q)) FROM unnest(%(queues)s::text[]) AS q)
FROM generate_series(1, %(n)s) AS g;

-- name: copy_jobs
-- COPY writes the reserved ids into the identity column as given; the columns are
-- leaseq.jobspec.COPY_COLUMNS, in that order.
COPY {schema}.jobs
  (id, queue_name, task, payload, priority, base_priority, available_at, max_attempts,
   payload_version, idempotency_key, key_policy, limit_key, expires_at, fairness_key, cost)
FROM STDIN;

-- name: set_trace_contexts
-- Tracing hooks only: the enqueuing context of jobs just inserted, in the same transaction
-- (a separate statement keeps the hot insert statements free of a column most never use).
UPDATE {schema}.jobs AS j
SET trace_context = jsonb_build_object('create', c.carrier)
FROM unnest(%(ids)s::bigint[], %(carriers)s::jsonb[]) AS c(id, carrier)
WHERE j.id = c.id;

-- name: job_trace_context
SELECT trace_context FROM {schema}.jobs WHERE id = %(id)s;

-- name: record_attempt_trace
-- Tracing hooks only: the failed attempt's span, which the next attempt's span links to.
-- Fenced like every write of an attempt (owner and token): after a failover lost a claim,
-- the token alone can repeat for another lease (docs/ha.md).
UPDATE {schema}.jobs
SET trace_context = coalesce(trace_context, '{}'::jsonb)
    || jsonb_build_object('attempt', %(carrier)s::jsonb)
WHERE id = %(id)s AND lease_owner = %(owner)s AND lease_token = %(token)s;
