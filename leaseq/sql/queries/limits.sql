-- Limits (leaseq.ops.limits_async). The claim's side is admit() (claim.sql); the release is
-- _slots_release and _queue_wake, used by every statement that ends a lease.


-- name: _slots_release
-- The concurrency slots of the leases a fenced statement just ended (CTE upd: id,
-- lease_token), given back in that same statement. Matched by the lease token, so only the
-- transition that ended the lease that took them can free them: a stale worker's write,
-- refused by the fence, frees nothing, and no slot is ever freed twice.
--
-- Task and key limits have slot rows (a job of cost N: N rows per limit), and so does a queue
-- limit whose slots moved there (version 30); otherwise a queue limit's slot is
-- jobs.queue_slot (version 16), cleared by the ending statement itself (its wake-up is
-- _queue_wake).
--
-- Wake-up: a slot freed of a limit that refused a claim lately (limits.refused_at, set by
-- admit(), migration 0013) sends a NOTIFY on the schema's channel, so a worker held back by
-- that limit claims now, not at its next poll: every queue ("*"), since a task or key limit
-- spans queues. RETURNING is computed for every deleted row even though nothing reads this
-- CTE. A limit that never refuses costs one uncorrelated check of the small limits table
-- per statement and sends nothing.
slots_freed AS (
  DELETE FROM {schema}.limit_slots AS s
  USING upd
  -- No slot rows at all (queue limits only: theirs are on the job rows): one uncorrelated
  -- check, and no probe per lease.
  WHERE (SELECT EXISTS (SELECT 1 FROM {schema}.limit_slots))
    AND s.job_id = upd.id AND s.lease_token = upd.lease_token
  RETURNING CASE
    WHEN (SELECT EXISTS (SELECT 1 FROM {schema}.limits
                         WHERE refused_at > now() - interval '5 minutes'))
     AND EXISTS (SELECT 1 FROM {schema}.limits AS b
                 WHERE b.name IN (s.limit_name, regexp_replace(s.limit_name, '[^:]*$', '*'))
                   AND b.refused_at > now() - interval '5 minutes')
    THEN pg_notify('leaseq.' || btrim('{schema}', '"'), '*')::text
  END
)

-- name: _queue_wake
-- (A RETURNING item of the upd that ends leases, alias j.) The wake-up of _slots_release
-- for a queue limit, whose slots are on the job rows (jobs.queue_slot, version 16): a
-- lease of a queue whose limit refused a claim lately sends a NOTIFY for that queue (the
-- same payload twice in a transaction is sent once). When no queue limit refused lately,
-- one uncorrelated check of the small limits table per statement, and nothing is sent.
CASE
  WHEN (SELECT EXISTS (SELECT 1 FROM {schema}.limits
                       WHERE refused_at > now() - interval '5 minutes'
                         AND left(name, 6) = 'queue:'))
   AND EXISTS (SELECT 1 FROM {schema}.limits AS b
               WHERE b.name IN ('queue:' || j.queue_name, 'queue:*')
                 AND b.refused_at > now() - interval '5 minutes')
  THEN pg_notify('leaseq.' || btrim('{schema}', '"'), j.queue_name)::text
END AS queue_woken

-- name: set_limit
-- Upsert a limit, audited in admin_events in the same statement. A lower concurrency does
-- not take slots away from running jobs: it applies to the claims that follow.
WITH up AS (
  INSERT INTO {schema}.limits AS l
    (name, concurrency, rate, per_seconds, burst, updated_by, updated_at)
  VALUES (%(name)s, %(concurrency)s, %(rate)s, %(per)s, %(burst)s, %(actor)s, now())
  ON CONFLICT (name) DO UPDATE
  SET concurrency = excluded.concurrency, rate = excluded.rate,
      per_seconds = excluded.per_seconds, burst = excluded.burst,
      updated_by = excluded.updated_by, updated_at = now()
  RETURNING name
), audit AS (
  INSERT INTO {schema}.admin_events (actor, action, scope, value, reason, detail)
  SELECT %(actor)s, 'limit_set', 'limit', left(name, 200), %(reason)s,
         'concurrency ' || coalesce(%(concurrency)s::text, 'none') || ', rate '
         || coalesce(%(rate)s::text || ' per ' || %(per)s::text || 's burst '
                     || %(burst)s::text, 'none')
  FROM up
)
SELECT name FROM up;

-- name: declare_limit
-- A worker declaring its tasks' limits at start: inserted when missing, else left as it
-- is when already equal; a different value is updated and audited (the code changed).
WITH old AS (
  SELECT concurrency, rate, per_seconds, burst FROM {schema}.limits WHERE name = %(name)s
), up AS (
  INSERT INTO {schema}.limits AS l
    (name, concurrency, rate, per_seconds, burst, updated_by, updated_at)
  SELECT %(name)s, %(concurrency)s, %(rate)s, %(per)s, %(burst)s, %(actor)s, now()
  WHERE NOT EXISTS (
    SELECT 1 FROM old
    WHERE old.concurrency IS NOT DISTINCT FROM %(concurrency)s::int
      AND old.rate IS NOT DISTINCT FROM %(rate)s::float8
      AND old.per_seconds = %(per)s::float8 AND old.burst = %(burst)s::int
  )
  ON CONFLICT (name) DO UPDATE
  SET concurrency = excluded.concurrency, rate = excluded.rate,
      per_seconds = excluded.per_seconds, burst = excluded.burst,
      updated_by = excluded.updated_by, updated_at = now()
  RETURNING name
), audit AS (
  INSERT INTO {schema}.admin_events (actor, action, scope, value, reason, detail)
  SELECT %(actor)s, 'limit_set', 'limit', left(name, 200), %(reason)s,
         'declared by a task: concurrency ' || coalesce(%(concurrency)s::text, 'none')
         || ', rate ' || coalesce(%(rate)s::text || ' per ' || %(per)s::text || 's', 'none')
  FROM up
)
SELECT name FROM up;

-- name: queue_limit_to_slot_rows
-- A queue limit's slots move from the job rows to slot rows (version 30: a job of cost
-- above 1 is under it). Its own transaction; it waits for the claims in flight.
SELECT {schema}.queue_limit_to_slot_rows(%(name)s);

-- name: remove_limit
WITH del AS (
  DELETE FROM {schema}.limits WHERE name = %(name)s RETURNING name
), audit AS (
  INSERT INTO {schema}.admin_events (actor, action, scope, value, reason)
  SELECT %(actor)s, 'limit_removed', 'limit', left(name, 200), %(reason)s FROM del
)
SELECT name FROM del;

-- name: list_limits
-- Each limit with what it holds: slots in use (a family: over its keys that have no limit
-- of their own), the jobs
-- waiting on it (claimable and pending; a family: those of its keys that have no exact
-- limit of their own, found by a scan of the claimable jobs) and how long until its rate
-- bucket admits one more claim. Claimable jobs live in two partial indexes (fairness keys
-- or not): a queue's are counted from both by their leading queue_name; task and key
-- limits read the claimable set once (the CTE, read only if such a limit exists), never
-- the whole table.
WITH claimable AS MATERIALIZED (
  SELECT queue_name, task, limit_key FROM {schema}.jobs
  WHERE status = 'pending' AND NOT blocked AND NOT waiting AND fairness_key IS NULL
    AND available_at <= now()
  UNION ALL
  SELECT queue_name, task, limit_key FROM {schema}.jobs
  WHERE status = 'pending' AND NOT blocked AND NOT waiting AND fairness_key IS NOT NULL
    AND available_at <= now()
)
SELECT l.name, l.concurrency, l.rate, l.per_seconds, l.burst, l.updated_by, l.updated_at,
       -- Slots (units: a job of cost N holds N) in use. A queue limit's are on its running
       -- jobs (jobs.queue_slot, version 16), or slot rows once they moved (version 30).
       CASE WHEN left(l.name, 6) = 'queue:'
            THEN (SELECT count(*) FROM {schema}.jobs AS r
                  WHERE r.queue_slot IS NOT NULL
                    AND CASE WHEN l.name = 'queue:*'
                          THEN NOT EXISTS (SELECT 1 FROM {schema}.limits AS e
                                           WHERE e.name = 'queue:' || r.queue_name)
                          ELSE r.queue_name = substr(l.name, 7)
                        END)
            ELSE 0
       END
       + (SELECT count(*) FROM {schema}.limit_slots AS s
                  WHERE s.limit_name = l.name
                     OR (right(l.name, 2) = ':*'
                         AND left(s.limit_name, length(l.name) - 1)
                             = left(l.name, length(l.name) - 1)
                         AND position(':' IN substr(s.limit_name, length(l.name))) = 0
                         AND NOT EXISTS (SELECT 1 FROM {schema}.limits AS e
                                         WHERE e.name = s.limit_name))),
       CASE WHEN right(l.name, 2) = ':*'
            THEN (SELECT count(*)
                  FROM claimable AS j
                  CROSS JOIN LATERAL (
                    SELECT CASE split_part(l.name, ':', 1)
                             WHEN 'queue' THEN 'queue:' || j.queue_name
                             WHEN 'task' THEN 'task:' || j.task
                             ELSE 'key:' || j.limit_key
                           END AS name
                  ) AS m
                  WHERE regexp_replace(m.name, '[^:]*$', '*') = l.name
                    AND NOT EXISTS (SELECT 1 FROM {schema}.limits AS e WHERE e.name = m.name))
            WHEN left(l.name, 6) = 'queue:'
            THEN (SELECT count(*) FROM {schema}.jobs AS j
                  WHERE j.status = 'pending' AND NOT j.blocked AND NOT j.waiting
                    AND j.fairness_key IS NULL
                    AND j.available_at <= now() AND j.queue_name = substr(l.name, 7))
               + (SELECT count(*) FROM {schema}.jobs AS j
                  WHERE j.status = 'pending' AND NOT j.blocked AND NOT j.waiting
                    AND j.fairness_key IS NOT NULL
                    AND j.available_at <= now() AND j.queue_name = substr(l.name, 7))
            ELSE (SELECT count(*) FROM claimable AS j
                  WHERE CASE split_part(l.name, ':', 1)
                          WHEN 'task' THEN j.task = substr(l.name, 6)
                          ELSE j.limit_key = substr(l.name, 5)
                        END)
       END,
       CASE WHEN right(l.name, 2) = ':*' THEN NULL
            ELSE {schema}.rate_wait(l.name, l.rate, l.per_seconds, l.burst, 1) END
FROM {schema}.limits AS l
ORDER BY l.name;

-- name: rate_consume
-- Charge a rate limit's bucket for work done outside jobs (the same bucket claims use).
-- No row: no rate limit of that name (or family).
SELECT {schema}.rate_take(%(name)s, l.rate, l.per_seconds, l.burst, %(cost)s)
FROM {schema}.limits AS l
WHERE l.name IN (%(name)s, regexp_replace(%(name)s, '[^:]*$', '*')) AND l.rate IS NOT NULL
ORDER BY l.name = %(name)s DESC
LIMIT 1;

-- name: rate_available
-- Tokens the bucket would admit now, and seconds until the next one frees up.
SELECT greatest(0, floor(
         (l.per_seconds / l.rate * l.burst
          - greatest(0, coalesce(extract(epoch FROM b.tat - now()), 0)))
         / (l.per_seconds / l.rate) + 1e-9))::int,
       {schema}.rate_wait(%(name)s, l.rate, l.per_seconds, l.burst, 1)
FROM {schema}.limits AS l
LEFT JOIN {schema}.rate_buckets AS b ON b.limit_name = %(name)s
WHERE l.name IN (%(name)s, regexp_replace(%(name)s, '[^:]*$', '*')) AND l.rate IS NOT NULL
ORDER BY l.name = %(name)s DESC
LIMIT 1;

-- name: claim_wait
-- After a claim came back short: are there limits at all (if not, the fetcher stops
-- asking until its next poll), and how long until a rate limit of the first claimable
-- jobs of these queues admits one (NULL: no rate limit holds them back). The worker sleeps
-- until then instead of polling a bucket that cannot admit yet.
SELECT EXISTS (SELECT 1 FROM {schema}.limits),
       (SELECT min(w.wait)
          FROM (SELECT c.queue_name, c.task, c.limit_key
                  FROM {schema}.jobs AS c
                 WHERE c.queue_name = ANY(%(queues)s::text[]) AND c.status = 'pending'
                   AND NOT c.blocked AND NOT c.waiting AND c.available_at <= now()
                 ORDER BY c.priority DESC, c.available_at, c.id
                 LIMIT 50) AS h
          CROSS JOIN LATERAL (
            SELECT max({schema}.rate_wait(x.limit_name, x.rate, x.per_seconds, x.burst, 1))
                     AS wait
            FROM {schema}.limits_of(h.queue_name, h.task, h.limit_key) AS x
            WHERE x.rate IS NOT NULL
          ) AS w
         WHERE EXISTS (SELECT 1 FROM {schema}.limits WHERE rate IS NOT NULL)
           AND w.wait > 0);

-- name: delete_orphan_slots
-- The sweep's safety net: slots whose lease is no longer running (nothing leaseq writes
-- leaves one; a job deleted or changed by hand could). Slots of running leases are never
-- touched, and a slot taken by a claim still in flight is not visible yet.
DELETE FROM {schema}.limit_slots AS s
WHERE NOT EXISTS (
  SELECT 1 FROM {schema}.jobs AS j
  WHERE j.id = s.job_id AND j.status = 'running' AND j.lease_token = s.lease_token
)
RETURNING s.limit_name;
