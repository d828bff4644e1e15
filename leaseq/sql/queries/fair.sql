-- Fair dispatch inside a queue (leaseq.ops.fair_async, docs/fairness.md): the fair claim
-- and the enqueue's touch of its keys (weights, per-key reads and pruning: fair_keys.sql).
-- The state is fair_keys (migration 0026): per key, its weight and pass.


-- name: _queue_is_fair
-- Is %(queue)s a fair queue (some job was enqueued into it with a fairness key)? An
-- uncorrelated probe of fair_keys' primary key (an InitPlan, run once per statement).
EXISTS (SELECT 1 FROM {schema}.fair_keys AS fq WHERE fq.queue_name = %(queue)s)

-- name: _fair_claimable
-- A candidate (alias c) of a fair claim is claimable: the plain claim's conditions.
c.status = 'pending' AND NOT c.blocked AND NOT c.waiting
      AND c.available_at <= now()
      AND (c.expires_at IS NULL OR c.expires_at > now())
      AND {_not_paused}

-- name: queue_is_fair
-- Asked before a claim inside a caller's transaction, where a refused statement would end
-- that transaction.
SELECT {_queue_is_fair};

-- name: claim_fair_jobs
-- The claim of a fair queue, one statement: weighted round robin over its keys (stride
-- scheduling). k0: the keys next in turn, lowest pass first (fair_keys_pass_idx), a few
-- more than the claim's size to step over keys with nothing claimable, and two parked keys
-- whose park ended. Each key's effective pass: its own, or the queue's current
-- virtual time v0 (the lowest pass of the keys in turn) for a key that joins or comes back
-- from parking, so a returning key competes with one job per other key, never with a
-- backlog of turns. heads: each key's next jobs in its own claim order (priority, then
-- available_at, id: jobs_fair_idx; jobs without a key are the key ''), at most its share
-- of the claim (weight / total weight), locked SKIP LOCKED; the i-th job of a key gets the
-- virtual time pass + (i - 1) / weight, and the claim takes the lowest. Under limits,
-- admit() takes them in that order. Then, in the same statement: each key that got m jobs
-- advances its pass by m / weight, and a key found with nothing claimable is parked (both
-- single-row updates of rows locked SKIP LOCKED: a claim never waits on another; the gen
-- test keeps a key an enqueue just touched from being parked).
-- Suspended jobs of the queue that are due are woken first (_wake_due), as in claim_jobs;
-- their keys are not parked by this statement, and a parked one is unparked (rewake).
-- A key parked with only scheduled jobs (a delay, a retry's backoff) is parked until the
-- first of them at most. Every other way a job becomes claimable unparks its key through
-- the jobs_fair_ready trigger (version 29), in that statement's transaction.
WITH {_wake_due}, k0 AS MATERIALIZED (
  (SELECT f.fairness_key AS fkey, f.weight, f.pass, f.gen, f.park_step
   FROM {schema}.fair_keys AS f
   WHERE f.queue_name = %(queue)s AND f.parked_until IS NULL
   ORDER BY f.pass NULLS FIRST
   LIMIT %(limit)s + 8)
  UNION ALL
  -- And two parked keys whose park ended, longest ended first: an idle key is probed
  -- again at a bounded rate, never in place of a key in turn.
  (SELECT f.fairness_key, f.weight, f.pass, f.gen, f.park_step
   FROM {schema}.fair_keys AS f
   WHERE f.queue_name = %(queue)s AND f.parked_until <= now()
   ORDER BY f.parked_until
   LIMIT 2)
), v AS MATERIALIZED (
  SELECT coalesce(min(k0.pass) FILTER (WHERE k0.park_step = 0), min(k0.pass), 0) AS v0,
         sum(k0.weight) AS w
  FROM k0
), kq AS MATERIALIZED (
  SELECT k0.fkey, k0.weight, k0.gen,
         CASE WHEN k0.pass IS NULL OR k0.park_step > 0
              THEN greatest(coalesce(k0.pass, v.v0), v.v0) ELSE k0.pass END AS ep,
         least(%(limit)s, ceil(%(limit)s * k0.weight / v.w))::integer AS share,
         -- Joins (or comes back) at this claim's virtual time: no pass of its own yet.
         k0.pass IS NULL OR k0.park_step > 0 AS joining
  FROM k0 CROSS JOIN v
), found AS MATERIALIZED (
  SELECT kq.fkey, h.id, h.priority, h.available_at
  FROM kq CROSS JOIN LATERAL (
    SELECT c.id, c.priority, c.available_at
    FROM {schema}.jobs AS c
    WHERE kq.fkey <> '' AND c.queue_name = %(queue)s AND c.fairness_key = kq.fkey
      AND {_fair_claimable}
    ORDER BY c.priority DESC, c.available_at, c.id
    LIMIT kq.share
    FOR UPDATE SKIP LOCKED
  ) AS h
  UNION ALL
  SELECT kq.fkey, h.id, h.priority, h.available_at
  FROM kq CROSS JOIN LATERAL (
    SELECT c.id, c.priority, c.available_at
    FROM {schema}.jobs AS c
    WHERE kq.fkey = '' AND c.queue_name = %(queue)s AND c.fairness_key IS NULL
      AND {_fair_claimable}
    ORDER BY c.priority DESC, c.available_at, c.id
    LIMIT kq.share
    FOR UPDATE SKIP LOCKED
  ) AS h
), heads AS MATERIALIZED (
  -- At equal virtual time a joining key's job comes first: it joins at this claim's
  -- virtual time and keeps no pass until it gets a job, so a key passed over on a tie
  -- would join again at the next claim's (later) time and lose the tie again, until every
  -- key it tied with had drained (keys joining together, more than a claim takes).
  SELECT f.fkey, f.id,
         kq.ep + (row_number() OVER (PARTITION BY f.fkey
                                     ORDER BY f.priority DESC, f.available_at, f.id) - 1)
                 / kq.weight AS vt,
         NOT kq.joining AS served
  FROM found AS f JOIN kq USING (fkey)
), pick AS MATERIALIZED (
  SELECT CASE WHEN NOT {_limits_apply}
           THEN ARRAY(SELECT h.id FROM heads AS h ORDER BY h.vt, h.served, h.id
                      LIMIT %(limit)s)
         END AS ids,
         CASE WHEN {_limits_apply}
           THEN {schema}.admit(ARRAY(SELECT h.id FROM heads AS h
                                     ORDER BY h.vt, h.served, h.id),
                               %(limit)s)
         END AS adm
), claimed AS (
  UPDATE {schema}.jobs AS j
  SET {_claim_set},
      queue_slot = ((SELECT adm FROM pick)).slots[
                     array_position(((SELECT adm FROM pick)).admitted, j.id)]
  WHERE j.id = ANY((SELECT coalesce(p.ids, (p.adm).admitted) FROM pick AS p)::bigint[])
  {_claim_returning},
            -- slot_rows as admit() reports them (see claim_limited_jobs).
            coalesce(((SELECT adm FROM pick)).slot_rows, false),
            ((SELECT adm FROM pick)).oversize_why[
              array_position(((SELECT adm FROM pick)).oversize, j.id)]
), took AS (
  -- Per key: how many of its jobs were claimed, and whether that was its last claimable
  -- one (every job found claimed, and no other behind them: one more index probe, a
  -- scalar subquery in the index's order with LIMIT 1, so that every plan reads
  -- jobs_fair_idx; as NOT EXISTS, whose ORDER BY and LIMIT the planner drops, a generic
  -- plan made while one key held nearly every row read the whole table for each other
  -- key: 1.3 s a claim under 1,000,000 jobs of one tenant).
  SELECT h.fkey, count(cl.id) AS m,
         count(cl.id) = count(*) AND h.fkey <> ''
         AND h.fkey NOT IN (SELECT coalesce(w.fairness_key, '') FROM woken AS w)
         AND (SELECT c.id FROM {schema}.jobs AS c
              WHERE c.queue_name = %(queue)s AND c.fairness_key = h.fkey
                AND c.status = 'pending' AND NOT c.blocked AND NOT c.waiting
                AND c.available_at <= now()
                AND NOT c.id = ANY(ARRAY(SELECT x.id FROM found AS x WHERE x.fkey = h.fkey))
              ORDER BY c.priority DESC, c.available_at, c.id
              LIMIT 1) IS NULL AS drained
  FROM heads AS h
  LEFT JOIN claimed AS cl ON cl.id = h.id
  GROUP BY h.fkey
  HAVING count(cl.id) > 0
), mine AS MATERIALIZED (
  -- The rows of the keys taken from, locked once, SKIP LOCKED (a row another claim holds
  -- keeps its pass: it is advanced by the next claim that gets it). Every read of
  -- fair_keys from here on is by its primary key, one probe per key (a lateral, or
  -- = ANY of the keys): as joins, a generic plan made after the table's statistics moved
  -- (a vacuum, an analyze) hashed a sequential scan of all of fair_keys in every claim.
  SELECT t.fkey, t.m, t.drained, kq.ep, kq.gen
  FROM took AS t JOIN kq USING (fkey) CROSS JOIN LATERAL (
    SELECT 1 FROM {schema}.fair_keys AS x
    WHERE x.queue_name = %(queue)s AND x.fairness_key = t.fkey
    FOR UPDATE SKIP LOCKED
  ) AS x
), advanced AS (
  -- A key whose last claimable job was just claimed is parked at once (briefly), so it
  -- does not take a place among the next claim's keys in turn (unless an enqueue touched
  -- it since this statement's snapshot: gen).
  UPDATE {schema}.fair_keys AS f
  SET (pass, parked_until, park_step, active_at) = (
        SELECT greatest(coalesce(f.pass, m.ep), m.ep) + m.m / f.weight,
               CASE WHEN m.drained AND f.gen = m.gen THEN now() + interval '0.05 seconds' END,
               CASE WHEN m.drained AND f.gen = m.gen THEN 0.05 ELSE 0 END,
               now()
        FROM mine AS m WHERE m.fkey = f.fairness_key)
  WHERE f.queue_name = %(queue)s AND f.fairness_key = ANY(ARRAY(SELECT m.fkey FROM mine AS m))
), idle AS MATERIALIZED (
  -- The rows of the keys found with nothing claimable (and no sleeper woken here), locked
  -- once, SKIP LOCKED, at the gen this statement read (an enqueue since: not parked).
  SELECT y.fkey, y.gen
  FROM kq AS y CROSS JOIN LATERAL (
    SELECT 1 FROM {schema}.fair_keys AS x
    WHERE x.queue_name = %(queue)s AND x.fairness_key = y.fkey AND x.gen = y.gen
    FOR UPDATE SKIP LOCKED
  ) AS x
  WHERE NOT EXISTS (SELECT 1 FROM found WHERE found.fkey = y.fkey)
    AND y.fkey NOT IN (SELECT coalesce(w.fairness_key, '') FROM woken AS w)
), parked AS (
  -- Parked until its next scheduled job at the latest (the first of its first 100 pending
  -- entries in claim order that is not due yet: exact within one priority).
  UPDATE {schema}.fair_keys AS f
  SET park_step = least(5, greatest(0.05, f.park_step * 2)),
      parked_until = least(
        now() + make_interval(secs => least(5, greatest(0.05, f.park_step * 2))),
        CASE WHEN f.fairness_key = '' THEN
          (SELECT min(s.available_at) FROM (
             SELECT c.available_at FROM {schema}.jobs AS c
             WHERE c.queue_name = %(queue)s AND c.fairness_key IS NULL
               AND c.status = 'pending' AND NOT c.blocked AND NOT c.waiting
             ORDER BY c.priority DESC, c.available_at, c.id LIMIT 100) AS s
           WHERE s.available_at > now())
        ELSE
          (SELECT min(s.available_at) FROM (
             SELECT c.available_at FROM {schema}.jobs AS c
             WHERE c.queue_name = %(queue)s AND c.fairness_key = f.fairness_key
               AND c.status = 'pending' AND NOT c.blocked AND NOT c.waiting
             ORDER BY c.priority DESC, c.available_at, c.id LIMIT 100) AS s
           WHERE s.available_at > now())
        END)
  WHERE f.queue_name = %(queue)s
    AND f.fairness_key = ANY(ARRAY(SELECT i.fkey FROM idle AS i))
    AND f.gen = (SELECT i.gen FROM idle AS i WHERE i.fkey = f.fairness_key)
), woke AS MATERIALIZED (
  -- The keys of the sleepers this statement woke, parked and not among its keys in turn,
  -- locked SKIP LOCKED (a row another claim holds is left as it is: that key is then found
  -- when its park ends).
  SELECT wk.k
  FROM (SELECT DISTINCT coalesce(w.fairness_key, '') AS k FROM woken AS w) AS wk
  CROSS JOIN LATERAL (
    SELECT 1 FROM {schema}.fair_keys AS x
    WHERE x.queue_name = %(queue)s AND x.fairness_key = wk.k AND x.parked_until IS NOT NULL
    FOR UPDATE SKIP LOCKED
  ) AS x
  WHERE wk.k NOT IN (SELECT fkey FROM kq)
), rewake AS (
  -- ...unparked, as an enqueue would.
  UPDATE {schema}.fair_keys AS f
  SET gen = f.gen + 1, parked_until = NULL, park_step = 0, active_at = now(),
      pass = CASE WHEN f.park_step > 0 THEN NULL ELSE f.pass END
  WHERE f.queue_name = %(queue)s AND f.fairness_key = ANY(ARRAY(SELECT k FROM woke))
)
SELECT * FROM claimed;

-- name: touch_fair_keys
-- The enqueue of jobs with fairness keys, in its transaction and after their insert: each
-- key's row is created (its pass NULL: it joins at the queue's current virtual time) or
-- unparked, and its gen bumped, so a claim that read the key before these jobs committed
-- parks nothing. A key back from parking joins at the current virtual time too. The
-- queue's key '' (its jobs without a key) is created once. Rows in key order: two
-- enqueues never wait on each other in opposite orders.
WITH keyless AS (
  INSERT INTO {schema}.fair_keys (queue_name, fairness_key)
  SELECT DISTINCT q, '' FROM unnest(%(queues)s::text[]) AS q
  ON CONFLICT (queue_name, fairness_key) DO NOTHING
)
INSERT INTO {schema}.fair_keys AS f (queue_name, fairness_key)
SELECT DISTINCT u.q, u.k FROM unnest(%(queues)s::text[], %(keys)s::text[]) AS u(q, k)
ORDER BY 1, 2
ON CONFLICT (queue_name, fairness_key) DO UPDATE
SET gen = f.gen + 1,
    parked_until = NULL,
    park_step = 0,
    active_at = now(),
    pass = CASE WHEN f.park_step > 0 THEN NULL ELSE f.pass END;
