-- leaseq schema, version 11: concurrency and rate limits, enforced in the claim.
--
-- A limit is a row of `limits`, named by what it covers: queue:NAME, task:NAME, or key:...
-- (a job's own limit key, given at enqueue); a name ending in ":*" is a family, giving each
-- key of that prefix its own limit (key:customer:* covers key:customer:42). Every worker
-- reads the same rows in its claim statement, so a change applies at once everywhere.
ALTER TABLE {schema}.jobs
  ADD COLUMN limit_key text,
  ADD CONSTRAINT jobs_limit_key_bounded CHECK (length(limit_key) <= 200);

CREATE TABLE {schema}.limits (
  name text PRIMARY KEY,
  -- At most this many jobs under the limit run at once (NULL: no concurrency limit).
  concurrency integer,
  -- At most `rate` claims per `per_seconds`, `burst` at once (NULL rate: no rate limit).
  rate float8,
  per_seconds float8 NOT NULL DEFAULT 1,
  burst integer NOT NULL DEFAULT 1,
  updated_by text,
  updated_at timestamptz NOT NULL DEFAULT now(),
  CONSTRAINT limits_name_bounded CHECK (length(name) BETWEEN 1 AND 220),
  CONSTRAINT limits_name_scoped CHECK (name ~ '^(queue|task|key):.'),
  CONSTRAINT limits_concurrency_positive CHECK (concurrency BETWEEN 1 AND 1000000),
  CONSTRAINT limits_rate_positive CHECK (rate > 0 AND rate < 'infinity'),
  CONSTRAINT limits_per_positive CHECK (per_seconds > 0 AND per_seconds <= 31622400),
  CONSTRAINT limits_burst_positive CHECK (burst BETWEEN 1 AND 1000000),
  CONSTRAINT limits_something CHECK (concurrency IS NOT NULL OR rate IS NOT NULL)
);

-- One row per running job per concurrency limit it is under: the primary key makes "slot s
-- of limit L" exist at most once, so never more than `concurrency` slots 1..N are held. A
-- slot is taken by the claim (same statement) and deleted, matched by (job_id,
-- lease_token), by the fenced statement that ends that lease.
CREATE TABLE {schema}.limit_slots (
  limit_name text NOT NULL,
  slot integer NOT NULL,
  job_id bigint NOT NULL,
  lease_token bigint NOT NULL,
  taken_at timestamptz NOT NULL DEFAULT now(),
  PRIMARY KEY (limit_name, slot)
);

CREATE INDEX limit_slots_job_idx ON {schema}.limit_slots (job_id, lease_token);

-- Rate limits as GCRA: one theoretical arrival time per limit key, moved by each admitted
-- claim (database clock). O(1) per key, no history.
CREATE TABLE {schema}.rate_buckets (
  limit_name text PRIMARY KEY,
  tat timestamptz NOT NULL
);

-- The limits that apply to a job: its queue's, its task's and its own key's, each found by
-- exact name or else by its family (the name with its last ":" part replaced by "*").
CREATE FUNCTION {schema}.limits_of(p_queue text, p_task text, p_key text)
RETURNS TABLE (limit_name text, concurrency integer, rate float8, per_seconds float8,
               burst integer)
LANGUAGE sql STABLE AS $$
  SELECT n.key, l.concurrency, l.rate, l.per_seconds, l.burst
  FROM (VALUES ('queue:' || p_queue), ('task:' || p_task), ('key:' || p_key)) AS n(key)
  CROSS JOIN LATERAL (
    SELECT x.concurrency, x.rate, x.per_seconds, x.burst
    FROM {schema}.limits AS x
    WHERE x.name IN (n.key, regexp_replace(n.key, '[^:]*$', '*'))
    ORDER BY x.name = n.key DESC
    LIMIT 1
  ) AS l
  WHERE n.key IS NOT NULL
  ORDER BY n.key
$$;

-- The claim's limited path: of the candidates (in claim order, read but not locked by the
-- caller), lock a chunk at a time (SKIP LOCKED, re-checked that each is still claimable)
-- and keep the first p_want that get a slot of every concurrency limit and then a token of
-- every rate limit that applies. Set-based: one statement per chunk and per limit, not per
-- job. Slots go to a limit's requesters in claim order; a candidate refused by any limit
-- gives back what it took here and stays pending, in its place, with no attempt charged.
-- A limit found full (or a rate found spent: now() does not move within the claim) refuses
-- the later candidates at once, and a full queue limit ends the scan.
CREATE FUNCTION {schema}.admit(p_candidates bigint[], p_want integer)
RETURNS bigint[]
LANGUAGE plpgsql AS $$
DECLARE
  v_picked bigint[] := '{}';
  v_full text[] := '{}';
  v_pos integer := 1;
  v_total integer := coalesce(cardinality(p_candidates), 0);
  v_chunk bigint[];
  r_ids bigint[];
  r_toks bigint[];
  r_ords bigint[];
  r_names text[];
  r_concs integer[];
  r_rates float8[];
  r_pers float8[];
  r_bursts integer[];
  v_dead bigint[];
  v_alive bigint[];
  v_got bigint[];
  v_lim record;
  v_t0 timestamptz;
  v_step float8;
  v_m integer;
BEGIN
  WHILE cardinality(v_picked) < p_want AND v_pos <= v_total LOOP
    v_chunk := p_candidates[v_pos : v_pos + (p_want - cardinality(v_picked)) - 1];
    v_pos := v_pos + cardinality(v_chunk);
    -- Lock the chunk and list, per candidate, the limits it is under (a row with NULLs
    -- for a candidate under none).
    SELECT array_agg(p.id ORDER BY p.ord, p.limit_name),
           array_agg(p.tok ORDER BY p.ord, p.limit_name),
           array_agg(p.ord ORDER BY p.ord, p.limit_name),
           array_agg(p.limit_name ORDER BY p.ord, p.limit_name),
           array_agg(p.concurrency ORDER BY p.ord, p.limit_name),
           array_agg(p.rate ORDER BY p.ord, p.limit_name),
           array_agg(p.per_seconds ORDER BY p.ord, p.limit_name),
           array_agg(p.burst ORDER BY p.ord, p.limit_name)
      INTO r_ids, r_toks, r_ords, r_names, r_concs, r_rates, r_pers, r_bursts
      FROM (
        SELECT j.id, least(j.lease_token, 9223372036854775806) + 1 AS tok, j.ord,
               l.limit_name, l.concurrency, l.rate, l.per_seconds, l.burst
        FROM (
          SELECT x.id, u.ord, x.lease_token, x.queue_name, x.task, x.limit_key
          FROM unnest(v_chunk) WITH ORDINALITY AS u(id, ord)
          JOIN {schema}.jobs AS x ON x.id = u.id
          WHERE x.status = 'pending' AND NOT x.blocked AND x.available_at <= now()
          FOR UPDATE OF x SKIP LOCKED
        ) AS j
        LEFT JOIN LATERAL {schema}.limits_of(j.queue_name, j.task, j.limit_key) AS l ON true
      ) AS p;
    CONTINUE WHEN r_ids IS NULL;  -- all taken or changed meanwhile
    v_dead := '{}';
    -- Concurrency: per limit, its free slot numbers to its live requesters in claim order.
    FOR v_lim IN
      SELECT q.name, min(q.conc) AS conc, array_agg(q.id ORDER BY q.ord) AS ids,
             array_agg(q.tok ORDER BY q.ord) AS toks
      FROM unnest(r_ids, r_toks, r_ords, r_names, r_concs) AS q(id, tok, ord, name, conc)
      WHERE q.conc IS NOT NULL
      GROUP BY q.name
      ORDER BY q.name
    LOOP
      v_alive := ARRAY(SELECT a FROM unnest(v_lim.ids) AS a WHERE NOT a = ANY(v_dead));
      CONTINUE WHEN cardinality(v_alive) = 0;
      IF v_lim.name = ANY(v_full)
         -- A limit lowered below slots still held admits nothing until those are freed.
         OR EXISTS (SELECT 1 FROM {schema}.limit_slots AS h
                    WHERE h.limit_name = v_lim.name AND h.slot > v_lim.conc) THEN
        v_got := '{}';
      ELSE
        -- The primary key decides; the search is a guess at free numbers, and the advisory
        -- try-lock keeps two claims from waiting on each other's uncommitted slot.
        WITH req AS (
          SELECT r.id, r.tok, row_number() OVER () AS rn
          FROM unnest(v_lim.ids, v_lim.toks) AS r(id, tok)
          WHERE NOT r.id = ANY(v_dead)
        ), free AS (
          SELECT f.g, row_number() OVER () AS rn
          FROM (
            -- Numbers up to the highest held + the number wanted hold enough free ones
            -- (the highest comes from the primary key's index; a set-returning function
            -- in FROM is materialised whole, so its range must stay small).
            SELECT g
            FROM generate_series(1, least(v_lim.conc, cardinality(v_alive) + coalesce(
                   (SELECT max(m.slot) FROM {schema}.limit_slots AS m
                     WHERE m.limit_name = v_lim.name), 0))) AS g
            WHERE NOT EXISTS (SELECT 1 FROM {schema}.limit_slots AS t
                              WHERE t.limit_name = v_lim.name AND t.slot = g)
              AND pg_try_advisory_xact_lock(
                    hashtextextended('leaseq.slot.' || v_lim.name || '#' || g, 0))
            LIMIT cardinality(v_alive)
          ) AS f
        ), ins AS (
          INSERT INTO {schema}.limit_slots (limit_name, slot, job_id, lease_token)
          SELECT v_lim.name, free.g, req.id, req.tok FROM req JOIN free USING (rn)
          ON CONFLICT DO NOTHING
          RETURNING job_id
        )
        SELECT coalesce(array_agg(job_id), '{}') INTO v_got FROM ins;
      END IF;
      IF cardinality(v_got) < cardinality(v_alive) THEN
        v_full := v_full || v_lim.name;
        v_dead := v_dead || ARRAY(SELECT a FROM unnest(v_alive) AS a WHERE NOT a = ANY(v_got));
      END IF;
    END LOOP;
    -- Rates: per limit (bucket locked), how many of its live requesters it admits now
    -- (GCRA), in claim order; then each bucket is charged for its requesters still alive
    -- (never more than it admitted), so a candidate refused by one rate costs no other.
    FOR v_lim IN
      SELECT q.name, min(q.rate) AS rate, min(q.per) AS per, min(q.burst) AS burst,
             array_agg(q.id ORDER BY q.ord) AS ids
      FROM unnest(r_ids, r_ords, r_names, r_rates, r_pers, r_bursts)
             AS q(id, ord, name, rate, per, burst)
      WHERE q.rate IS NOT NULL
      GROUP BY q.name
      ORDER BY q.name
    LOOP
      v_alive := ARRAY(SELECT a FROM unnest(v_lim.ids) AS a WHERE NOT a = ANY(v_dead));
      CONTINUE WHEN cardinality(v_alive) = 0;
      v_step := v_lim.per / v_lim.rate;
      v_m := 0;
      -- A bucket another claim holds right now is passed over, not waited for (its
      -- candidates stay pending): a claim never waits on another claim, so claims taking
      -- buckets in different orders cannot deadlock.
      IF NOT v_lim.name = ANY(v_full)
         AND pg_try_advisory_xact_lock(hashtextextended('leaseq.bucket.' || v_lim.name, 0))
      THEN
        INSERT INTO {schema}.rate_buckets (limit_name, tat) VALUES (v_lim.name, now())
        ON CONFLICT DO NOTHING;
        SELECT greatest(b.tat, now()) INTO v_t0 FROM {schema}.rate_buckets AS b
        WHERE b.limit_name = v_lim.name FOR UPDATE;
        -- Admits i = 0..m-1 while (t0 + i*step) - now <= (burst - 1) * step.
        v_m := least(cardinality(v_alive), greatest(0, floor(
                 ((v_lim.burst - 1) * v_step - extract(epoch FROM v_t0 - now())) / v_step
                 + 1e-9)::integer + 1));
      END IF;
      IF v_m < cardinality(v_alive) THEN
        v_full := v_full || v_lim.name;
        v_dead := v_dead || v_alive[v_m + 1 :];
      END IF;
    END LOOP;
    FOR v_lim IN
      SELECT q.name, min(q.per / q.rate) AS step, count(*) AS n
      FROM unnest(r_ids, r_names, r_rates, r_pers) AS q(id, name, rate, per)
      WHERE q.rate IS NOT NULL AND NOT q.id = ANY(v_dead)
      GROUP BY q.name
    LOOP
      UPDATE {schema}.rate_buckets
      SET tat = greatest(tat, now()) + make_interval(secs => v_lim.step * v_lim.n)
      WHERE limit_name = v_lim.name;
    END LOOP;
    -- Refused candidates give back the slots they took here.
    IF cardinality(v_dead) > 0 THEN
      DELETE FROM {schema}.limit_slots AS s
      USING unnest(r_ids, r_toks) AS d(id, tok)
      WHERE s.job_id = d.id AND s.lease_token = d.tok AND d.id = ANY(v_dead);
    END IF;
    v_picked := v_picked || ARRAY(
      SELECT a.id FROM unnest(r_ids, r_ords) AS a(id, ord)
      WHERE NOT a.id = ANY(v_dead)
      GROUP BY a.id ORDER BY min(a.ord)
    );
    EXIT WHEN EXISTS (SELECT 1 FROM unnest(v_full) AS f WHERE left(f, 6) = 'queue:');
  END LOOP;
  RETURN v_picked;
END
$$;

-- GCRA: admit `cost` units iff the bucket's theoretical arrival time is at most the burst
-- tolerance ahead of now(), then move it on by cost emission intervals. One row, updated
-- under its row lock (concurrent claims queue on it and re-check the condition).
CREATE FUNCTION {schema}.rate_take(p_name text, p_rate float8, p_per float8, p_burst integer,
                                   p_cost integer)
RETURNS boolean
LANGUAGE plpgsql AS $$
DECLARE
  step interval := make_interval(secs => p_per / p_rate);
  tau interval := make_interval(secs => p_per / p_rate * (p_burst - p_cost));
BEGIN
  INSERT INTO {schema}.rate_buckets AS b (limit_name, tat)
  SELECT p_name, now() + step * p_cost
  WHERE p_cost <= p_burst
  ON CONFLICT (limit_name) DO UPDATE
  SET tat = greatest(b.tat, now()) + step * p_cost
  WHERE greatest(b.tat, now()) - now() <= tau;
  RETURN FOUND;
END
$$;

-- How long until the bucket admits `cost` units (0: now; NULL: no rate limit there).
CREATE FUNCTION {schema}.rate_wait(p_name text, p_rate float8, p_per float8, p_burst integer,
                                   p_cost integer)
RETURNS float8
LANGUAGE sql STABLE AS $$
  SELECT greatest(0, coalesce(extract(epoch FROM
           (SELECT b.tat FROM {schema}.rate_buckets AS b WHERE b.limit_name = p_name)
           - now()), 0) - p_per / p_rate * (p_burst - p_cost))::float8
  WHERE p_rate IS NOT NULL
$$;
