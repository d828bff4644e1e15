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

-- Takes a free slot of limit p_name (1..p_max) for a job's new lease; false when none can
-- be had now. The primary key decides: the search below is only a guess at a free number,
-- and the advisory try-lock only keeps two claims from waiting on each other's uncommitted
-- insert of the same slot (a busy number is skipped, never waited for).
CREATE FUNCTION {schema}.take_slot(p_name text, p_max integer, p_job bigint, p_token bigint)
RETURNS boolean
LANGUAGE plpgsql AS $$
DECLARE
  s integer;
BEGIN
  -- A limit lowered below slots still held: no new slot until those above it are freed
  -- (otherwise a freed low slot would let running jobs exceed the new limit).
  IF EXISTS (SELECT 1 FROM {schema}.limit_slots AS h
             WHERE h.limit_name = p_name AND h.slot > p_max) THEN
    RETURN false;
  END IF;
  -- A large limit, mostly free: a few random numbers find a free one at once, without
  -- reading the slots held.
  IF p_max > 64 THEN
    FOR i IN 1..4 LOOP
      s := 1 + floor(random() * p_max)::integer;
      IF pg_try_advisory_xact_lock(hashtextextended('leaseq.slot.' || p_name || '#' || s, 0))
      THEN
        INSERT INTO {schema}.limit_slots (limit_name, slot, job_id, lease_token)
        VALUES (p_name, s, p_job, p_token)
        ON CONFLICT DO NOTHING;
        IF FOUND THEN
          RETURN true;
        END IF;
      END IF;
    END LOOP;
  END IF;
  FOR s IN
    SELECT c.x FROM (
      SELECT g FROM generate_series(1, least(p_max, 64)) AS g
      UNION
      SELECT h.slot + 1 FROM {schema}.limit_slots AS h
      WHERE h.limit_name = p_name AND p_max > 64
    ) AS c(x)
    WHERE c.x <= p_max
      AND NOT EXISTS (SELECT 1 FROM {schema}.limit_slots AS t
                      WHERE t.limit_name = p_name AND t.slot = c.x)
    ORDER BY c.x
    LIMIT 16
  LOOP
    IF pg_try_advisory_xact_lock(hashtextextended('leaseq.slot.' || p_name || '#' || s, 0)) THEN
      INSERT INTO {schema}.limit_slots (limit_name, slot, job_id, lease_token)
      VALUES (p_name, s, p_job, p_token)
      ON CONFLICT DO NOTHING;
      IF FOUND THEN
        RETURN true;
      END IF;
    END IF;
  END LOOP;
  RETURN false;
END
$$;

-- The claim's limited path: of the candidates (in claim order, read but not locked by the
-- caller), lock each in turn (SKIP LOCKED, re-checking that it is still claimable) and keep
-- the first p_want that get a slot of every concurrency limit and then a token of every
-- rate limit that applies. A candidate refused by any limit gives back what it took here
-- and stays pending, in its place, with no attempt charged. A limit found full (or a rate
-- found spent: now() does not move within the claim) refuses the later candidates at once,
-- and a full queue limit ends the scan: only rows that are tried get locked.
CREATE FUNCTION {schema}.admit(p_candidates bigint[], p_want integer)
RETURNS bigint[]
LANGUAGE plpgsql AS $$
DECLARE
  picked bigint[] := '{}';
  full_ text[] := '{}';
  c record;
  token bigint;
  names text[];
  concs integer[];
  rates float8[];
  pers float8[];
  bursts integer[];
  ok boolean;
  n integer;
  charged integer;
BEGIN
  FOR c IN
    SELECT u.id, u.ord FROM unnest(p_candidates) WITH ORDINALITY AS u(id, ord) ORDER BY u.ord
  LOOP
    EXIT WHEN cardinality(picked) >= p_want;
    SELECT least(j.lease_token, 9223372036854775806) + 1,
           array_agg(l.limit_name ORDER BY l.limit_name),
           array_agg(l.concurrency ORDER BY l.limit_name),
           array_agg(l.rate ORDER BY l.limit_name),
           array_agg(l.per_seconds ORDER BY l.limit_name),
           array_agg(l.burst ORDER BY l.limit_name)
      INTO token, names, concs, rates, pers, bursts
      FROM (SELECT * FROM {schema}.jobs AS x
             WHERE x.id = c.id AND x.status = 'pending' AND NOT x.blocked
               AND x.available_at <= now()
             FOR UPDATE SKIP LOCKED) AS j
      LEFT JOIN LATERAL {schema}.limits_of(j.queue_name, j.task, j.limit_key) AS l ON true
     GROUP BY j.lease_token;
    CONTINUE WHEN token IS NULL;  -- taken or changed meanwhile
    ok := true;
    n := coalesce(cardinality(names), 0);
    IF names[1] IS NULL THEN
      n := 0;  -- no limit applies
    END IF;
    IF n > 0 AND names && full_ THEN
      ok := false;
    END IF;
    FOR i IN 1..n LOOP
      EXIT WHEN NOT ok;
      IF concs[i] IS NOT NULL THEN
        ok := {schema}.take_slot(names[i], concs[i], c.id, token);
        IF NOT ok THEN
          full_ := full_ || names[i];
        END IF;
      END IF;
    END LOOP;
    charged := 0;
    FOR i IN 1..n LOOP
      EXIT WHEN NOT ok;
      IF rates[i] IS NOT NULL THEN
        ok := {schema}.rate_take(names[i], rates[i], pers[i], bursts[i], 1);
        IF ok THEN
          charged := i;
        ELSE
          full_ := full_ || names[i];
        END IF;
      END IF;
    END LOOP;
    IF ok THEN
      picked := picked || c.id;
      CONTINUE;
    END IF;
    -- Give back what this candidate took: its slots, and its rate tokens (the bucket rows
    -- are locked by us, so moving tat back by one step restores them exactly).
    FOR i IN 1..charged LOOP
      IF rates[i] IS NOT NULL THEN
        UPDATE {schema}.rate_buckets
        SET tat = tat - make_interval(secs => pers[i] / rates[i])
        WHERE limit_name = names[i];
      END IF;
    END LOOP;
    DELETE FROM {schema}.limit_slots WHERE job_id = c.id AND lease_token = token;
    -- Nothing of this queue can be admitted any more.
    EXIT WHEN EXISTS (SELECT 1 FROM unnest(full_) AS f WHERE left(f, 6) = 'queue:');
  END LOOP;
  RETURN picked;
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
