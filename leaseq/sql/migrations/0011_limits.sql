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
  FOR s IN
    SELECT c.x FROM (
      SELECT g, 0 FROM generate_series(1, least(p_max, 64)) AS g
      UNION ALL
      SELECT 1 + floor(random() * p_max)::integer, 1 FROM generate_series(1, 8)
      WHERE p_max > 64
      UNION ALL
      SELECT h.slot + 1, 2 FROM {schema}.limit_slots AS h
      WHERE h.limit_name = p_name AND p_max > 64
    ) AS c(x, pref)
    WHERE c.x <= p_max
      AND NOT EXISTS (SELECT 1 FROM {schema}.limit_slots AS t
                      WHERE t.limit_name = p_name AND t.slot = c.x)
    ORDER BY c.pref, c.x
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

-- The claim's limited path: of the candidates (locked by the caller, in claim order), the
-- first p_want that get a slot of every concurrency limit and a token of every rate limit
-- that applies. A candidate refused by any limit gives back what it took in this call and
-- stays pending, in its place, with no attempt charged.
CREATE FUNCTION {schema}.admit(p_candidates bigint[], p_want integer)
RETURNS bigint[]
LANGUAGE plpgsql AS $$
DECLARE
  picked bigint[] := '{}';
  c record;
  l record;
  ok boolean;
  charged text[];
  step interval;
BEGIN
  FOR c IN
    SELECT j.id, least(j.lease_token, 9223372036854775806) + 1 AS token,
           j.queue_name, j.task, j.limit_key
    FROM unnest(p_candidates) WITH ORDINALITY AS u(id, ord)
    JOIN {schema}.jobs AS j ON j.id = u.id
    ORDER BY u.ord
  LOOP
    EXIT WHEN cardinality(picked) >= p_want;
    ok := true;
    charged := '{}';
    FOR l IN SELECT * FROM {schema}.limits_of(c.queue_name, c.task, c.limit_key) LOOP
      IF l.concurrency IS NOT NULL THEN
        ok := {schema}.take_slot(l.limit_name, l.concurrency, c.id, c.token);
        EXIT WHEN NOT ok;
      END IF;
    END LOOP;
    IF ok THEN
      FOR l IN SELECT * FROM {schema}.limits_of(c.queue_name, c.task, c.limit_key)
               WHERE rate IS NOT NULL LOOP
        ok := {schema}.rate_take(l.limit_name, l.rate, l.per_seconds, l.burst, 1);
        EXIT WHEN NOT ok;
        charged := charged || l.limit_name;
      END LOOP;
      IF NOT ok THEN
        -- Give back the tokens this candidate took: the rows are locked by us, so moving
        -- their tat back by one step restores them exactly.
        FOR l IN SELECT * FROM {schema}.limits_of(c.queue_name, c.task, c.limit_key)
                 WHERE limit_name = ANY(charged) LOOP
          step := make_interval(secs => l.per_seconds / l.rate);
          UPDATE {schema}.rate_buckets SET tat = tat - step WHERE limit_name = l.limit_name;
        END LOOP;
      END IF;
    END IF;
    IF ok THEN
      picked := picked || c.id;
    ELSE
      DELETE FROM {schema}.limit_slots WHERE job_id = c.id AND lease_token = c.token;
    END IF;
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
