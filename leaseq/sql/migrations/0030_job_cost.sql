-- leaseq schema, version 30: job cost (issue 32). A job of cost N takes N units of every
-- concurrency limit that applies to it; a slot is a unit.
--
-- A unit is a slot number, as before, so the unique constraints stay the invariant and no
-- counter is kept: a job of cost N holds N numbers of each limit. A task or key limit's
-- numbers are rows of limit_slots (primary key (limit_name, slot)): N rows per job, matched
-- by (job_id, lease_token), so every statement that ends a lease already deletes them all.
-- A queue limit's slot is one column of the job (jobs.queue_slot under a unique index,
-- version 16), which cannot hold N numbers, and a number on a job row cannot be kept apart
-- from one in limit_slots by any constraint. So a queue limit takes its slots in one place
-- or the other, never both at once: on the job rows (the default, the fast path) until a
-- job of cost above 1 is claimed under it; then its slots move to slot rows for good
-- (limits.queue_slot_rows). The move waits for every claim in flight and holds new ones
-- back until it commits (queue_limit_to_slot_rows, the pause's barrier: every claim
-- statement takes ROW SHARE on pauses when it is planned, before its snapshot), so from
-- then on no claim writes a queue slot on a job row for that limit; the numbers still held
-- on job rows (claimed before the move) only ever go away, and are passed over.
ALTER TABLE {schema}.jobs ADD COLUMN cost integer NOT NULL DEFAULT 1;
ALTER TABLE {schema}.jobs
  ADD CONSTRAINT jobs_cost_range CHECK (cost BETWEEN 1 AND 1000);

ALTER TABLE {schema}.limits ADD COLUMN queue_slot_rows boolean NOT NULL DEFAULT false;

-- A queue limit's slots move to slot rows: the barrier first (EXCLUSIVE on pauses, as
-- pause_scope takes it: it waits for every claim in flight to commit, and a claim planned
-- meanwhile waits for this one and then sees the flag), then the flag on the limit that
-- applies to the queue (its own, else the queue family's). Called by the client when
-- admit() says a job of cost above 1 is under a queue limit whose slots are on the job
-- rows (SQLSTATE LQ011), in a transaction of its own.
CREATE FUNCTION {schema}.queue_limit_to_slot_rows(p_name text)
RETURNS boolean
LANGUAGE plpgsql
AS $fn$
DECLARE
  v_done boolean;
BEGIN
  LOCK TABLE {schema}.pauses IN EXCLUSIVE MODE;
  UPDATE {schema}.limits AS l SET queue_slot_rows = true
  WHERE l.name = (SELECT x.name FROM {schema}.limits AS x
                  WHERE x.name IN (p_name, 'queue:*')
                  ORDER BY x.name = p_name DESC LIMIT 1)
    AND left(p_name, 6) = 'queue:'
  RETURNING true INTO v_done;
  RETURN coalesce(v_done, false);
END
$fn$;

-- claim_jobs's fast path met a job of cost above 1 (each job takes one number there):
-- claim_limited_jobs takes it (SQLSTATE LQ001, as claim_needs_admit; nothing is claimed).
CREATE FUNCTION {schema}.claim_needs_admit_slot()
RETURNS integer
LANGUAGE plpgsql
AS $fn$
BEGIN
  RAISE EXCEPTION 'leaseq: a job of cost above 1 (claim_limited_jobs takes it)'
    USING ERRCODE = 'LQ001';
END
$fn$;

-- free_slots(), version 30: a queue limit whose slots moved to slot rows passes over the
-- numbers still held on job rows (claimed before the move; none is written after it).
CREATE OR REPLACE FUNCTION {schema}.free_slots(p_name text, p_conc integer, p_start integer,
                                               p_n integer)
RETURNS integer[]
LANGUAGE plpgsql
SET enable_seqscan = off
AS $$
BEGIN
  RETURN ARRAY(
    SELECT n.g
    FROM (SELECT (p_start + generate_series(0, p_conc - 1)) % p_conc + 1 AS g) AS n
    WHERE CASE
      WHEN EXISTS (SELECT 1 FROM {schema}.limit_slots AS t
                   WHERE t.limit_name = p_name AND t.slot = n.g OFFSET 0) THEN false
      WHEN left(p_name, 6) = 'queue:'
           AND EXISTS (SELECT 1 FROM {schema}.jobs AS q
                       WHERE q.queue_name = substr(p_name, 7) AND q.queue_slot = n.g
                       OFFSET 0) THEN false
      ELSE pg_try_advisory_xact_lock(hashtextextended('leaseq.slot.' || p_name || '#' || n.g, 0))
    END
    LIMIT p_n);
END
$$;

-- admit() again, with costs; it also returns the candidates whose cost is above the
-- concurrency of a limit that applies (they could never start): claimed without slots, with
-- why, for the client to end dead under the lease just taken.
DROP FUNCTION {schema}.admit(bigint[], integer);

ALTER TYPE {schema}.admission ADD ATTRIBUTE oversize bigint[];
ALTER TYPE {schema}.admission ADD ATTRIBUTE oversize_why text[];

CREATE FUNCTION {schema}.admit(p_candidates bigint[], p_want integer)
RETURNS {schema}.admission
LANGUAGE plpgsql
-- Its plans are cached for the session and may be made while limit_slots is nearly empty:
-- a sequential scan planned then would read every dead slot row left since the last vacuum,
-- call after call. With this its statements take the indexes.
SET enable_seqscan = off
AS $$
DECLARE
  v_picked bigint[] := '{}';
  v_full text[] := '{}';
  v_bit text[] := '{}';
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
  r_costs integer[];
  v_dead bigint[];
  v_alive bigint[];
  v_atoks bigint[];
  v_acosts integer[];
  v_got bigint[];
  r_uniq bigint[];
  v_rated boolean;
  v_costly boolean;
  v_nums integer[];
  v_start integer;
  v_lim record;
  v_t0 timestamptz;
  v_step float8;
  v_m integer;
  v_qids bigint[] := '{}';
  v_qslots integer[] := '{}';
  v_slots integer[];
  v_slot_rows boolean := false;
  v_on_rows boolean;
  v_over bigint[] := '{}';
  v_over_why text[] := '{}';
  v_cover bigint[];
  v_cwhy text[];
BEGIN
  WHILE cardinality(v_picked) < p_want AND v_pos <= v_total LOOP
    v_chunk := p_candidates[v_pos : v_pos + (p_want - cardinality(v_picked)) - 1];
    v_pos := v_pos + cardinality(v_chunk);
    -- Lock the chunk and list, per candidate, the limits it is under (a row with NULLs
    -- for a candidate under none).
    WITH j AS MATERIALIZED (
      SELECT x.id, u.ord, least(x.lease_token, 9223372036854775806) + 1 AS tok,
             x.queue_name, x.task, x.limit_key, x.cost
      FROM unnest(v_chunk) WITH ORDINALITY AS u(id, ord)
      JOIN {schema}.jobs AS x ON x.id = u.id
      WHERE x.status = 'pending' AND NOT x.blocked AND NOT x.waiting
        AND x.available_at <= now()
      FOR UPDATE OF x SKIP LOCKED
    ), k AS (
      -- The limits looked up once per kind of job (queue, task, limit key), not per job: a
      -- claim's jobs are of one queue and mostly of a few tasks.
      SELECT d.queue_name, d.task, d.limit_key, l.limit_name, l.concurrency, l.rate,
             l.per_seconds, l.burst
      FROM (SELECT DISTINCT j.queue_name, j.task, j.limit_key FROM j) AS d
      CROSS JOIN LATERAL {schema}.limits_of(d.queue_name, d.task, d.limit_key) AS l
    )
    -- The rows come sorted once from the subquery (its ORDER BY feeds the aggregates in
    -- that order), rather than each array_agg sorting its own copy.
    SELECT array_agg(p.id), array_agg(p.tok), array_agg(p.ord), array_agg(p.limit_name),
           array_agg(p.concurrency), array_agg(p.rate), array_agg(p.per_seconds),
           array_agg(p.burst), array_agg(p.cost),
           -- The locked candidates once each, in claim order, and whether any is under a
           -- rate limit, or costs more than one slot: the common cases skip those steps.
           (SELECT array_agg(j.id ORDER BY j.ord) FROM j),
           coalesce(bool_or(p.rate IS NOT NULL), false),
           coalesce(bool_or(p.cost > 1 AND p.concurrency IS NOT NULL), false)
      INTO r_ids, r_toks, r_ords, r_names, r_concs, r_rates, r_pers, r_bursts, r_costs,
           r_uniq, v_rated, v_costly
      FROM (
        SELECT j.id, j.tok, j.ord, k.limit_name, k.concurrency, k.rate, k.per_seconds,
               k.burst, j.cost
        FROM j
        LEFT JOIN k ON k.queue_name = j.queue_name AND k.task = j.task
                   AND k.limit_key IS NOT DISTINCT FROM j.limit_key
        ORDER BY j.ord, k.limit_name
      ) AS p;
    CONTINUE WHEN r_ids IS NULL;  -- all taken or changed meanwhile
    v_dead := '{}';
    v_cover := '{}';
    IF v_costly THEN
      -- A cost above a limit's concurrency can never be admitted: such a candidate takes no
      -- slot and no token; it is claimed to be ended dead with why (by the client).
      SELECT coalesce(array_agg(o.id ORDER BY o.ord), '{}'),
             coalesce(array_agg(o.why ORDER BY o.ord), '{}')
        INTO v_cover, v_cwhy
        FROM (SELECT q.id, min(q.ord) AS ord,
                     min(format('cost %s is above the concurrency %s of limit %s',
                                q.cost, q.conc, q.name)) AS why
              FROM unnest(r_ids, r_ords, r_names, r_concs, r_costs)
                     AS q(id, ord, name, conc, cost)
              WHERE q.cost > q.conc
              GROUP BY q.id) AS o;
      v_dead := v_cover;
      v_over := v_over || v_cover;
      v_over_why := v_over_why || v_cwhy;
    END IF;
    -- Concurrency: per limit, its free slot numbers to its live requesters in claim order
    -- (a requester of cost N takes N of them, all or none; a requester that does not fit
    -- fills the limit for this claim, so later smaller jobs never overtake it).
    FOR v_lim IN
      SELECT q.name, min(q.conc) AS conc, array_agg(q.id ORDER BY q.ord) AS ids,
             array_agg(q.tok ORDER BY q.ord) AS toks,
             array_agg(q.cost ORDER BY q.ord) AS costs
      FROM unnest(r_ids, r_toks, r_ords, r_names, r_concs, r_costs)
             AS q(id, tok, ord, name, conc, cost)
      WHERE q.conc IS NOT NULL
      GROUP BY q.name
      ORDER BY q.name
    LOOP
      SELECT coalesce(array_agg(a.id ORDER BY a.o), '{}'),
             coalesce(array_agg(a.tok ORDER BY a.o), '{}'),
             coalesce(array_agg(a.cost ORDER BY a.o), '{}')
        INTO v_alive, v_atoks, v_acosts
        FROM unnest(v_lim.ids, v_lim.toks, v_lim.costs) WITH ORDINALITY AS a(id, tok, cost, o)
        WHERE NOT a.id = ANY(v_dead);
      CONTINUE WHEN cardinality(v_alive) = 0;
      -- A queue limit's slots: on the job rows unless they moved to slot rows (version 30).
      v_on_rows := left(v_lim.name, 6) = 'queue:'
        AND NOT EXISTS (SELECT 1 FROM {schema}.limits AS f
                        WHERE f.name IN (v_lim.name, 'queue:*') AND f.queue_slot_rows);
      IF v_lim.name = ANY(v_full) THEN
        v_got := '{}';
      ELSIF v_on_rows THEN
        IF v_costly AND EXISTS (SELECT 1 FROM unnest(v_acosts) AS c WHERE c > 1) THEN
          -- A job row holds one number: the client moves this limit's slots to slot rows
          -- (queue_limit_to_slot_rows) and claims again. Nothing of this claim is kept.
          RAISE EXCEPTION 'leaseq: a job of cost above 1 under %', v_lim.name
            USING ERRCODE = 'LQ011', DETAIL = v_lim.name;
        END IF;
        -- A queue limit's slots are on the job rows (jobs.queue_slot, version 16): numbers
        -- free as seen now, passing over those this claim already picked; the claim's
        -- UPDATE writes them, and the unique index decides.
        IF EXISTS (SELECT 1 FROM {schema}.jobs AS h
                   WHERE h.queue_name = substr(v_lim.name, 7) AND h.queue_slot > v_lim.conc)
        THEN
          v_got := '{}';
        ELSE
          v_nums := {schema}.free_queue_slots(substr(v_lim.name, 7), v_lim.conc,
                                              (r_uniq[1] % v_lim.conc)::integer,
                                              cardinality(v_alive), v_qslots);
          v_got := v_alive[1 : cardinality(v_nums)];
          v_qids := v_qids || v_got;
          v_qslots := v_qslots || v_nums;
        END IF;
      -- A limit lowered below slots still held admits nothing until those are freed (for a
      -- queue limit whose slots moved, those still on job rows count too).
      ELSIF EXISTS (SELECT 1 FROM {schema}.limit_slots AS h
                    WHERE h.limit_name = v_lim.name AND h.slot > v_lim.conc)
         OR (left(v_lim.name, 6) = 'queue:'
             AND EXISTS (SELECT 1 FROM {schema}.jobs AS h
                         WHERE h.queue_name = substr(v_lim.name, 7)
                           AND h.queue_slot > v_lim.conc)) THEN
        v_got := '{}';
      ELSE
        -- The primary key decides; free_slots() is a guess at free numbers, passing over
        -- numbers held or being taken by a claim in flight. It starts at the first
        -- candidate's id (mod the limit) and wraps around, so successive claims take fresh
        -- numbers rather than the same few again, whose index entries pile up dead versions
        -- (a slot row is inserted and deleted per job) until a vacuum.
        v_start := (r_uniq[1] % v_lim.conc)::integer;
        -- Probed, not guessed: inserting over a slot whose delete is not yet committed
        -- would wait for that transaction, and a claim never waits on another. As many
        -- numbers as the requesters' costs add up to (at most the limit).
        v_nums := {schema}.free_slots(
          v_lim.name, v_lim.conc, v_start,
          CASE WHEN v_costly THEN (SELECT sum(c)::integer FROM unnest(v_acosts) AS c)
               ELSE cardinality(v_alive) END);
        -- A plain insert (cheaper than ON CONFLICT). It fails only when a claim that
        -- committed after the search's snapshot took one of the numbers (rare): then the
        -- search again, and an insert that skips any number taken meanwhile.
        BEGIN
          IF NOT v_costly THEN
            INSERT INTO {schema}.limit_slots (limit_name, slot, job_id, lease_token)
            SELECT v_lim.name, f.g, r.id, r.tok
            FROM unnest(v_nums) WITH ORDINALITY AS f(g, rn)
            JOIN unnest(v_alive, v_atoks) WITH ORDINALITY AS r(id, tok, rn) USING (rn);
            v_got := v_alive[1 : cardinality(v_nums)];
          ELSE
            -- The longest prefix of requesters whose costs fit in the numbers found, each
            -- requester's units its own run of them.
            WITH e AS (
              SELECT a.id, a.tok, row_number() OVER (ORDER BY a.o, u.u) AS rn
              FROM unnest(v_alive, v_atoks, v_acosts) WITH ORDINALITY AS a(id, tok, cost, o)
              CROSS JOIN LATERAL generate_series(1, a.cost) AS u(u)
            ), fit AS (
              SELECT a.id
              FROM (SELECT a.id, sum(a.cost) OVER (ORDER BY a.o) AS cum
                    FROM unnest(v_alive, v_acosts) WITH ORDINALITY AS a(id, cost, o)) AS a
              WHERE a.cum <= cardinality(v_nums)
            ), ins AS (
              INSERT INTO {schema}.limit_slots (limit_name, slot, job_id, lease_token)
              SELECT v_lim.name, f.g, e.id, e.tok
              FROM unnest(v_nums) WITH ORDINALITY AS f(g, rn)
              JOIN e USING (rn)
              WHERE e.id IN (SELECT fit.id FROM fit)
              RETURNING job_id
            )
            SELECT coalesce(array_agg(DISTINCT ins.job_id), '{}') INTO v_got FROM ins;
            v_got := ARRAY(SELECT a FROM unnest(v_alive) WITH ORDINALITY AS x(a, o)
                           WHERE a = ANY(v_got) ORDER BY x.o);
          END IF;
        EXCEPTION WHEN unique_violation THEN
          v_nums := {schema}.free_slots(
            v_lim.name, v_lim.conc, v_start,
            (SELECT sum(c)::integer FROM unnest(v_acosts) AS c));
          -- Each requester's units, numbers in order; a requester is admitted when all its
          -- units got in, and only the prefix up to the first that did not (the others'
          -- rows go with the refused candidates' below).
          WITH e AS (
            SELECT a.id, a.tok, a.o, row_number() OVER (ORDER BY a.o, u.u) AS rn
            FROM unnest(v_alive, v_atoks, v_acosts) WITH ORDINALITY AS a(id, tok, cost, o)
            CROSS JOIN LATERAL generate_series(1, a.cost) AS u(u)
          ), ins AS (
            INSERT INTO {schema}.limit_slots (limit_name, slot, job_id, lease_token)
            SELECT v_lim.name, f.g, e.id, e.tok
            FROM unnest(v_nums) WITH ORDINALITY AS f(g, rn)
            JOIN e USING (rn)
            ON CONFLICT DO NOTHING
            RETURNING job_id
          ), n AS (
            SELECT a.id, a.o, a.cost, (SELECT count(*) FROM ins WHERE ins.job_id = a.id) AS got
            FROM unnest(v_alive, v_acosts) WITH ORDINALITY AS a(id, cost, o)
          )
          SELECT coalesce(array_agg(n.id ORDER BY n.o), '{}') INTO v_got
          FROM n
          WHERE n.o < coalesce((SELECT min(b.o) FROM n AS b WHERE b.got < b.cost),
                               9223372036854775807);
        END;
        -- Reported to the claim (admission.slot_rows, version 21): the leases' ends must take
        -- the statements that delete slot rows, whatever the claim's own snapshot saw.
        v_slot_rows := v_slot_rows OR cardinality(v_got) > 0;
      END IF;
      IF cardinality(v_got) < cardinality(v_alive) THEN
        v_bit := v_bit || v_lim.name;
        v_full := v_full || v_lim.name;
        v_dead := v_dead || ARRAY(SELECT a FROM unnest(v_alive) AS a WHERE NOT a = ANY(v_got));
      END IF;
    END LOOP;
    IF v_rated THEN
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
    END IF;
    -- Refused candidates give back the slots they took here.
    IF cardinality(v_dead) > 0 THEN
      v_qslots := ARRAY(SELECT q.slot FROM unnest(v_qids, v_qslots) AS q(id, slot)
                        WHERE NOT q.id = ANY(v_dead));
      v_qids := ARRAY(SELECT q FROM unnest(v_qids) AS q WHERE NOT q = ANY(v_dead));
      DELETE FROM {schema}.limit_slots AS s
      USING unnest(r_ids, r_toks) AS d(id, tok)
      WHERE s.job_id = d.id AND s.lease_token = d.tok AND d.id = ANY(v_dead);
    END IF;
    IF cardinality(v_dead) = 0 THEN
      v_picked := v_picked || r_uniq;
    ELSE
      v_picked := v_picked || ARRAY(
        SELECT a.id FROM unnest(r_uniq) WITH ORDINALITY AS a(id, ord)
        WHERE NOT a.id = ANY(v_dead)
        ORDER BY a.ord
      );
    END IF;
    -- Those whose cost no limit of theirs can ever admit: claimed, to be ended dead.
    v_picked := v_picked || v_cover;
    IF cardinality(v_full) > 0 THEN
      EXIT WHEN EXISTS (SELECT 1 FROM unnest(v_full) AS f WHERE left(f, 6) = 'queue:');
    END IF;
  END LOOP;
  -- A concurrency limit refused a claim: mark it (at most once a second, never waiting on
  -- another claim's mark), so the statements that free its slots wake the workers.
  IF cardinality(v_bit) > 0 THEN
    UPDATE {schema}.limits AS l SET refused_at = now()
    WHERE l.name IN (
      SELECT m.name FROM {schema}.limits AS m
      WHERE (m.name = ANY(v_bit)
             OR m.name = ANY(ARRAY(SELECT regexp_replace(b, '[^:]*$', '*')
                                   FROM unnest(v_bit) AS b)))
        AND (m.refused_at IS NULL OR m.refused_at < now() - interval '1 second')
      FOR UPDATE SKIP LOCKED);
  END IF;
  -- Each admitted job's queue slot (NULL: no queue limit), in the order of admitted.
  v_slots := ARRAY(
    SELECT q.slot
    FROM unnest(v_picked) WITH ORDINALITY AS p(id, ord)
    LEFT JOIN unnest(v_qids, v_qslots) AS q(id, slot) ON q.id = p.id
    ORDER BY p.ord);
  RETURN ROW(v_picked, v_slots, v_slot_rows, v_over, v_over_why)::{schema}.admission;
END
$$;

-- The SQL API (docs/sql-api.md) carries cost like the client: checked in _api_check
-- (leaseq.validate.check_cost), stored by the copies of the insert statements.
CREATE OR REPLACE FUNCTION {schema}._api_check(a_job jsonb)
RETURNS jsonb LANGUAGE plpgsql STABLE
AS $fn$
DECLARE
  v_names text[] := ARRAY['task', 'payload', 'queue', 'priority', 'run_at', 'delay',
    'max_attempts', 'payload_version', 'idempotency_key', 'ordering_key', 'key_policy',
    'unique_key', 'unique_for', 'unique_states', 'on_conflict', 'debounce', 'debounce_max',
    'limit_key', 'depends_on', 'on_dead', 'expires', 'fairness_key', 'cost', 'batch_id'];
  v_job jsonb;
  v_unknown text;
  v_given text;
  v_key text;
  v_window float8;
  v_states text[];
  v_wait float8;
  v_cap float8;
  v_mode text;
  v_run_at timestamptz;
  v_delay float8 := 0;
  v_limit integer := coalesce(nullif(current_setting('leaseq.payload_limit', true), ''),
                              '1048576')::integer;
  v_deps bigint[];
  v_expires timestamptz;
  v_expires_in float8;
  v_item jsonb;
  v_out jsonb;
BEGIN
  IF jsonb_typeof(a_job) IS DISTINCT FROM 'object' THEN
    PERFORM {schema}._api_refuse('LQ001', format('a job is a JSON object, got %s',
                                                coalesce(jsonb_typeof(a_job), 'NULL')));
  END IF;
  SELECT string_agg(quote_literal(k), ', ' ORDER BY quote_literal(k)) INTO v_unknown
  FROM jsonb_object_keys(a_job) AS k WHERE k <> ALL(v_names);
  IF v_unknown IS NOT NULL THEN
    PERFORM {schema}._api_refuse('LQ001', 'unknown job option(s): ' || v_unknown);
  END IF;
  IF NOT a_job ? 'task' THEN
    PERFORM {schema}._api_refuse('LQ001', 'a job needs a task');
  END IF;
  -- The defaults (leaseq.jobspec.DEFAULTS); JSON null stands for Python's None.
  v_job := jsonb_build_object('payload', 'null'::jsonb, 'queue', 'default', 'priority', 0,
                              'max_attempts', 8, 'key_policy', 'block', 'on_dead', 'cancel',
                              'cost', 1)
           || a_job;

  -- leaseq.rules.unique.unique_options and check_schedule
  IF coalesce(jsonb_typeof(v_job->'unique_key'), 'null') = 'null' THEN
    SELECT string_agg(n, ', ' ORDER BY o) INTO v_given
    FROM unnest(ARRAY['unique_for', 'unique_states', 'on_conflict', 'debounce',
                      'debounce_max']) WITH ORDINALITY AS u(n, o)
    WHERE coalesce(jsonb_typeof(v_job->n), 'null') <> 'null';
    IF v_given IS NOT NULL THEN
      PERFORM {schema}._api_refuse('LQ001', v_given || ' needs a unique_key');
    END IF;
  ELSE
    v_key := {schema}._api_key('unique_key', v_job->'unique_key', 'no NUL, valid Unicode');
    v_window := {schema}._api_window('unique_for', v_job->'unique_for');
    IF coalesce(jsonb_typeof(v_job->'unique_states'), 'null') = 'null' THEN
      v_states := CASE WHEN v_window IS NOT NULL THEN ARRAY['pending', 'running', 'succeeded']
                       ELSE ARRAY['pending', 'running'] END;
    ELSE
      IF jsonb_typeof(v_job->'unique_states') NOT IN ('array', 'object') THEN
        PERFORM {schema}._api_refuse('LQ001', format(
          'unique_states must be a list of states, got %s',
          {schema}._api_show(v_job->'unique_states')));
      END IF;
      -- A Python mapping iterates over its keys: so does a JSON object here.
      v_states := CASE jsonb_typeof(v_job->'unique_states')
        WHEN 'array' THEN ARRAY(SELECT e #>> '{}' FROM jsonb_array_elements(v_job->'unique_states')
                                WITH ORDINALITY AS t(e, o) ORDER BY o)
        ELSE ARRAY(SELECT jsonb_object_keys(v_job->'unique_states')) END;
      SELECT string_agg(s, ', ' ORDER BY o) INTO v_given
      FROM (SELECT s, min(o) AS o FROM unnest(v_states) WITH ORDINALITY AS u(s, o)
            WHERE s NOT IN ('pending', 'running', 'succeeded', 'dead', 'cancelled')
            GROUP BY s) AS x;
      IF v_given IS NOT NULL THEN
        PERFORM {schema}._api_refuse('LQ001', 'unique_states: unknown state(s) ' || v_given);
      END IF;
      IF NOT v_states @> ARRAY['pending', 'running'] THEN
        PERFORM {schema}._api_refuse('LQ001', 'unique_states must contain pending and running');
      END IF;
      SELECT string_agg(s, ', ' ORDER BY o) INTO v_given
      FROM (SELECT s, min(o) AS o FROM unnest(v_states) WITH ORDINALITY AS u(s, o)
            WHERE s IN ('succeeded', 'dead', 'cancelled') GROUP BY s) AS x;
      IF v_given IS NOT NULL AND v_window IS NULL THEN
        PERFORM {schema}._api_refuse('LQ001', format(
          'unique_states lists %s but no unique_for is given', v_given));
      END IF;
      v_states := ARRAY(SELECT s FROM unnest(ARRAY['pending', 'running', 'succeeded', 'dead',
                                                   'cancelled']) WITH ORDINALITY AS u(s, o)
                        WHERE s = ANY(v_states) ORDER BY o);
    END IF;
    v_wait := {schema}._api_window('debounce', v_job->'debounce');
    v_cap := {schema}._api_window('debounce_max', v_job->'debounce_max');
    IF v_cap IS NOT NULL AND v_wait IS NULL THEN
      PERFORM {schema}._api_refuse('LQ001', 'debounce_max needs debounce');
    END IF;
    IF v_cap < v_wait THEN
      PERFORM {schema}._api_refuse('LQ001', format(
        'debounce_max (%ss) must be at least debounce (%ss)', v_cap, v_wait));
    END IF;
    IF coalesce(jsonb_typeof(v_job->'on_conflict'), 'null') = 'null' THEN
      v_mode := CASE WHEN v_wait IS NOT NULL THEN 'replace' ELSE 'skip' END;
    ELSIF jsonb_typeof(v_job->'on_conflict') <> 'string'
          OR v_job->>'on_conflict' NOT IN ('skip', 'replace', 'raise') THEN
      PERFORM {schema}._api_refuse('LQ001', format(
        'on_conflict must be skip, replace or raise, got %s',
        {schema}._api_show(v_job->'on_conflict')));
    ELSE
      v_mode := v_job->>'on_conflict';
    END IF;
    IF v_wait IS NOT NULL AND v_mode <> 'replace' THEN
      PERFORM {schema}._api_refuse('LQ001', format(
        'debounce replaces the pending job: on_conflict=%s contradicts it', v_mode));
    END IF;
    IF v_wait IS NOT NULL AND (coalesce(jsonb_typeof(v_job->'run_at'), 'null') <> 'null'
                               OR coalesce(jsonb_typeof(v_job->'delay'), 'null') <> 'null') THEN
      PERFORM {schema}._api_refuse('LQ001',
        'debounce sets when the job runs: give no run_at or delay with it');
    END IF;
  END IF;

  -- leaseq.jobspec.schedule: run_at (a timestamp with its offset) or delay (seconds).
  IF coalesce(jsonb_typeof(v_job->'run_at'), 'null') <> 'null'
     AND coalesce(jsonb_typeof(v_job->'delay'), 'null') <> 'null' THEN
    PERFORM {schema}._api_refuse('LQ001', 'give either run_at or delay, not both');
  END IF;
  IF coalesce(jsonb_typeof(v_job->'run_at'), 'null') <> 'null' THEN
    BEGIN
      IF jsonb_typeof(v_job->'run_at') <> 'string'
         OR v_job->>'run_at' !~
              '[0-9]{2}:[0-9]{2}(:[0-9]{2}(\.[0-9]+)?)? *([zZ]|[+-][0-9]{2}(:?[0-9]{2})?)$' THEN
        RAISE EXCEPTION 'naive';
      END IF;
      v_run_at := (v_job->>'run_at')::timestamptz;
    EXCEPTION WHEN OTHERS THEN
      PERFORM {schema}._api_refuse('LQ001', format(
        'run_at must be a timezone-aware datetime, got %s', {schema}._api_show(v_job->'run_at')));
    END;
    IF abs(extract(epoch FROM v_run_at - now())) > 3153600000 THEN
      PERFORM {schema}._api_refuse('LQ001', format('run_at must be within 100 years of now, got %s',
                                                  v_job->>'run_at'));
    END IF;
  ELSIF coalesce(jsonb_typeof(v_job->'delay'), 'null') <> 'null' THEN
    IF jsonb_typeof(v_job->'delay') <> 'number' THEN
      PERFORM {schema}._api_refuse('LQ001', format('delay must be seconds or a timedelta, got %s',
                                                  {schema}._api_show(v_job->'delay')));
    END IF;
    IF (v_job->>'delay')::numeric < 0 THEN
      PERFORM {schema}._api_refuse('LQ001', format('delay must not be negative, got %s',
                                                  v_job->>'delay'));
    END IF;
    IF (v_job->>'delay')::numeric > 3153600000 THEN
      PERFORM {schema}._api_refuse('LQ001', format(
        'delay must be at most 3.1536e+09 seconds (100 years), got %s', v_job->>'delay'));
    END IF;
    v_delay := (v_job->>'delay')::float8;
  END IF;
  IF v_wait IS NOT NULL THEN
    v_delay := v_wait;
  END IF;

  -- The options checked one by one, in leaseq.jobspec.OPTIONS' order.
  v_out := jsonb_build_object(
    'task', {schema}._api_name('task', v_job->'task'),
    'queue', {schema}._api_name('queue', v_job->'queue'),
    'priority', {schema}._api_int('priority', v_job->'priority', -32768, 32767),
    'max_attempts', {schema}._api_int('max_attempts', v_job->'max_attempts', 1, 10000));
  v_out := v_out || jsonb_build_object(
    'payload_version', CASE WHEN coalesce(jsonb_typeof(v_job->'payload_version'), 'null') <> 'null'
      THEN {schema}._api_int('payload_version', v_job->'payload_version', 0, 2147483647) END,
    'idempotency_key', {schema}._api_key('idempotency_key', v_job->'idempotency_key',
                                         'no NUL, valid Unicode'),
    'ordering_key', {schema}._api_key('ordering_key', v_job->'ordering_key',
                                      'no NUL, valid Unicode'),
    'fairness_key', {schema}._api_key('fairness_key', v_job->'fairness_key',
                                      'no NUL, valid Unicode'),
    'cost', {schema}._api_int('cost', v_job->'cost', 1, 1000));
  IF jsonb_typeof(v_job->'key_policy') IS DISTINCT FROM 'string'
     OR v_job->>'key_policy' NOT IN ('block', 'skip') THEN
    PERFORM {schema}._api_refuse('LQ001', format('key_policy must be ''block'' or ''skip'', got %s',
                                                {schema}._api_show(v_job->'key_policy')));
  END IF;
  v_out := v_out || jsonb_build_object(
    'key_policy', v_job->>'key_policy',
    'limit_key', {schema}._api_key('limit_key', v_job->'limit_key', 'no NUL'),
    'batch_id', CASE WHEN coalesce(jsonb_typeof(v_job->'batch_id'), 'null') <> 'null'
      THEN {schema}._api_int('batch_id', v_job->'batch_id', 1, 9223372036854775807) END,
    'payload', {schema}._api_payload(v_job->'payload', v_limit),
    'run_at', v_run_at, 'delay', v_delay,
    'reschedule', coalesce(jsonb_typeof(v_job->'run_at'), 'null') <> 'null'
                  OR coalesce(jsonb_typeof(v_job->'delay'), 'null') <> 'null',
    'unique_key', v_key, 'unique_for', v_window, 'unique_states', to_jsonb(v_states),
    'on_conflict', v_mode, 'debounce', v_wait, 'debounce_max', v_cap);

  -- leaseq.validate.check_expires: an instant (a timestamp with its offset) or seconds.
  IF jsonb_typeof(v_job->'expires') = 'string' THEN
    BEGIN
      IF v_job->>'expires' !~
           '[0-9]{2}:[0-9]{2}(:[0-9]{2}(\.[0-9]+)?)? *([zZ]|[+-][0-9]{2}(:?[0-9]{2})?)$' THEN
        RAISE EXCEPTION 'naive';
      END IF;
      v_expires := (v_job->>'expires')::timestamptz;
    EXCEPTION WHEN OTHERS THEN
      PERFORM {schema}._api_refuse('LQ001', format(
        'expires must be a timezone-aware datetime, got %s', {schema}._api_show(v_job->'expires')));
    END;
  ELSIF jsonb_typeof(v_job->'expires') = 'number' THEN
    IF (v_job->>'expires')::numeric <= 0 OR (v_job->>'expires')::numeric > 3153600000 THEN
      PERFORM {schema}._api_refuse('LQ001', format(
        'expires must be more than 0 and at most 3.1536e+09 seconds, got %s', v_job->>'expires'));
    END IF;
    v_expires_in := (v_job->>'expires')::float8;
  ELSIF coalesce(jsonb_typeof(v_job->'expires'), 'null') <> 'null' THEN
    PERFORM {schema}._api_refuse('LQ001', format(
      'expires must be seconds, a timedelta or an aware datetime, got %s',
      {schema}._api_show(v_job->'expires')));
  END IF;
  v_out := v_out || jsonb_build_object('expires', v_expires, 'expires_in', v_expires_in);

  -- leaseq.rules.deps.check_depends_on (job ids only: Ref and Dep are Python's).
  IF coalesce(jsonb_typeof(v_job->'depends_on'), 'null') <> 'null' THEN
    IF jsonb_typeof(v_job->'on_dead') IS DISTINCT FROM 'string'
       OR v_job->>'on_dead' NOT IN ('cancel', 'run', 'ignore') THEN
      PERFORM {schema}._api_refuse('LQ001', format('on_dead must be one of cancel, run, ignore, got %s',
                                                  {schema}._api_show(v_job->'on_dead')));
    END IF;
    IF jsonb_typeof(v_job->'depends_on') <> 'array' THEN
      PERFORM {schema}._api_refuse('LQ001', 'depends_on must be a list of job ids, Ref or Dep');
    END IF;
    IF jsonb_array_length(v_job->'depends_on') > 100000 THEN
      PERFORM {schema}._api_refuse('LQ001', 'at most 100000 dependencies per job');
    END IF;
    v_deps := '{}';
    FOR v_item IN SELECT e FROM jsonb_array_elements(v_job->'depends_on') WITH ORDINALITY
                  AS t(e, o) ORDER BY o LOOP
      IF jsonb_typeof(v_item) <> 'number' OR v_item::text !~ '^-?[0-9]+$' THEN
        PERFORM {schema}._api_refuse('LQ001', format('a dependency is a job id, Ref or Dep, got %s',
                                                    {schema}._api_show(v_item)));
      END IF;
      IF v_item::text::numeric < 1 THEN
        PERFORM {schema}._api_refuse('LQ001', format(
          'a dependency''s job id must be positive, got %s', v_item::text));
      END IF;
      IF NOT v_item::text::bigint = ANY(v_deps) THEN
        v_deps := v_deps || v_item::text::bigint;
      END IF;
    END LOOP;
    IF cardinality(v_deps) > 0 THEN
      v_out := v_out || jsonb_build_object('depends_on', to_jsonb(v_deps),
                                           'on_dead', v_job->>'on_dead');
    END IF;
  END IF;

  -- leaseq.ops.deps_async._check_deps
  IF v_out->>'batch_id' IS NOT NULL AND v_key IS NOT NULL THEN
    PERFORM {schema}._api_refuse('LQ001', 'a job in a batch cannot have a unique_key');
  END IF;
  IF v_out ? 'depends_on' AND (v_key IS NOT NULL OR v_out->>'ordering_key' IS NOT NULL) THEN
    PERFORM {schema}._api_refuse('LQ001',
      'depends_on cannot be combined with unique_key or ordering_key');
  END IF;
  RETURN v_out;
END
$fn$;

CREATE OR REPLACE FUNCTION {schema}._api_insert(a_job jsonb)
RETURNS bigint LANGUAGE plpgsql
AS $fn$
DECLARE
  p_task text := a_job->>'task';
  p_payload jsonb := a_job->'payload';
  p_queue text := a_job->>'queue';
  p_priority integer := (a_job->>'priority')::integer;
  p_run_at timestamptz := (a_job->>'run_at')::timestamptz;
  p_delay float8 := (a_job->>'delay')::float8;
  p_max_attempts integer := (a_job->>'max_attempts')::integer;
  p_payload_version integer := (a_job->>'payload_version')::integer;
  p_idempotency_key text := a_job->>'idempotency_key';
  p_ordering_key text := a_job->>'ordering_key';
  p_key_policy text := a_job->>'key_policy';
  p_limit_key text := a_job->>'limit_key';
  p_unique_key text := a_job->>'unique_key';
  p_unique_for float8 := (a_job->>'unique_for')::float8;
  p_unique_states text[] := ARRAY(SELECT jsonb_array_elements_text(
    CASE WHEN jsonb_typeof(a_job->'unique_states') = 'array' THEN a_job->'unique_states' END));
  p_debounce float8 := (a_job->>'debounce')::float8;
  p_debounce_max float8 := (a_job->>'debounce_max')::float8;
  p_reschedule boolean := (a_job->>'reschedule')::boolean;
  p_expires timestamptz := (a_job->>'expires')::timestamptz;
  p_expires_in float8 := (a_job->>'expires_in')::float8;
  p_fairness_key text := a_job->>'fairness_key';
  p_cost integer := (a_job->>'cost')::integer;
  p_channel text := {schema}._api_channel();
  p_keys text[];
  p_ids bigint[];
  p_job_ids bigint[];
  p_depends_on bigint[];
  p_on_dead text[];
  p_ended bigint[];
  p_holder bigint;
  p_id bigint;
  p_batch_id bigint;
  v_on_conflict text := a_job->>'on_conflict';
  v_id bigint;
  v_note text;
  v_holder bigint;
  v_held_until timestamptz;
  v_status text;
  v_expired boolean;
  v_state text;
  v_outcome text;
  v_found bigint[];
  v_ended bigint[];
  v_unknown text;
  v_cancelled bigint[];
  v_row record;
BEGIN
  -- A fairness key: its row created or unparked, gen bumped (touch_fair_keys), in this
  -- transaction; the queue's key '' too.
  IF p_fairness_key IS NOT NULL THEN
    INSERT INTO {schema}.fair_keys (queue_name, fairness_key) VALUES (p_queue, '')
    ON CONFLICT (queue_name, fairness_key) DO NOTHING;
    INSERT INTO {schema}.fair_keys AS f (queue_name, fairness_key)
    VALUES (p_queue, p_fairness_key)
    ON CONFLICT (queue_name, fairness_key) DO UPDATE
    SET gen = f.gen + 1, parked_until = NULL, park_step = 0,
        pass = CASE WHEN f.park_step > 0 THEN NULL ELSE f.pass END;
  END IF;
  IF p_ordering_key IS NOT NULL THEN
    p_keys := ARRAY[p_ordering_key];
    FOR v_row IN
-- statement: lock_keys
SELECT pg_advisory_xact_lock(hashtextextended('{schema}.key.' || k, 0))
FROM unnest(p_keys::text[]) AS k
ORDER BY k
-- end: lock_keys
    LOOP
      NULL;
    END LOOP;
  END IF;
  IF p_unique_key IS NOT NULL THEN
    -- leaseq.ops.enqueue_async._enqueue_unique (each statement reads a new snapshot).
    FOR v_try IN 1..20 LOOP
-- statement: insert_unique_job
WITH lock AS (
  INSERT INTO {schema}.unique_keys AS k (unique_key, job_id, held_until)
  VALUES (p_unique_key,
          nextval((SELECT pg_get_serial_sequence('{schema}.jobs', 'id'))::regclass), NULL)
  ON CONFLICT (unique_key) DO NOTHING
  RETURNING k.job_id
), ins AS (
  INSERT INTO {schema}.jobs
    (id, queue_name, task, payload, priority, base_priority, available_at, max_attempts,
     payload_version, idempotency_key, ordering_key, key_policy, blocked, unique_key,
     unique_for, unique_states, debounce_until, limit_key, expires_at, fairness_key,
     cost)
  OVERRIDING SYSTEM VALUE
  SELECT lock.job_id, p_queue, p_task, p_payload::jsonb, p_priority, p_priority,
         coalesce(p_run_at::timestamptz, now() + make_interval(secs => p_delay)),
         p_max_attempts, p_payload_version, p_idempotency_key, p_ordering_key,
         p_key_policy,
         -- As in insert_keyed_job (the caller holds the ordering key's lock).
         p_ordering_key::text IS NOT NULL AND EXISTS (
           SELECT 1 FROM {schema}.jobs AS b
           WHERE b.ordering_key = p_ordering_key AND ((b.status IN ('pending', 'running') AND NOT b.blocked)
 OR (b.status = 'dead' AND b.key_policy = 'block' AND NOT b.key_skipped))
         ),
         p_unique_key, p_unique_for::float8, p_unique_states::text[],
         now() + make_interval(secs => p_debounce_max::float8), p_limit_key,
         coalesce(p_expires::timestamptz, now() + make_interval(secs => p_expires_in::float8)), p_fairness_key, p_cost
  FROM lock
  RETURNING id, queue_name, available_at, blocked
)
SELECT id, CASE WHEN available_at <= now() AND NOT blocked
  THEN pg_notify(p_channel, queue_name)::text END
FROM ins
-- end: insert_unique_job
      INTO v_id, v_note;
      EXIT WHEN FOUND;
-- statement: unique_holder
SELECT k.job_id, k.held_until, j.status::text, k.held_until <= now()
FROM {schema}.unique_keys AS k
LEFT JOIN {schema}.jobs AS j ON j.id = k.job_id
WHERE k.unique_key = p_unique_key
-- end: unique_holder
      INTO v_holder, v_held_until, v_status, v_expired;
      CONTINUE WHEN NOT FOUND;
      IF v_expired THEN
-- statement: take_unique_window
WITH lock AS (
  UPDATE {schema}.unique_keys AS k
  SET job_id = nextval((SELECT pg_get_serial_sequence('{schema}.jobs', 'id'))::regclass),
      held_until = NULL
  WHERE k.unique_key = p_unique_key AND k.held_until <= now()
  RETURNING k.job_id
), ins AS (
  INSERT INTO {schema}.jobs
    (id, queue_name, task, payload, priority, base_priority, available_at, max_attempts,
     payload_version, idempotency_key, ordering_key, key_policy, blocked, unique_key,
     unique_for, unique_states, debounce_until, limit_key, expires_at, fairness_key,
     cost)
  OVERRIDING SYSTEM VALUE
  SELECT lock.job_id, p_queue, p_task, p_payload::jsonb, p_priority, p_priority,
         coalesce(p_run_at::timestamptz, now() + make_interval(secs => p_delay)),
         p_max_attempts, p_payload_version, p_idempotency_key, p_ordering_key,
         p_key_policy,
         -- As in insert_keyed_job (the caller holds the ordering key's lock).
         p_ordering_key::text IS NOT NULL AND EXISTS (
           SELECT 1 FROM {schema}.jobs AS b
           WHERE b.ordering_key = p_ordering_key AND ((b.status IN ('pending', 'running') AND NOT b.blocked)
 OR (b.status = 'dead' AND b.key_policy = 'block' AND NOT b.key_skipped))
         ),
         p_unique_key, p_unique_for::float8, p_unique_states::text[],
         now() + make_interval(secs => p_debounce_max::float8), p_limit_key,
         coalesce(p_expires::timestamptz, now() + make_interval(secs => p_expires_in::float8)), p_fairness_key, p_cost
  FROM lock
  RETURNING id, queue_name, available_at, blocked
)
SELECT id, CASE WHEN available_at <= now() AND NOT blocked
  THEN pg_notify(p_channel, queue_name)::text END
FROM ins
-- end: take_unique_window
        INTO v_id, v_note;
        EXIT WHEN FOUND;
        CONTINUE;
      END IF;
      -- leaseq.rules.unique.holder_state and resolve_conflict
      v_state := coalesce(v_status, CASE WHEN v_held_until IS NOT NULL THEN 'finished'
                                         ELSE 'pending' END);
      v_outcome := CASE WHEN v_on_conflict = 'raise' THEN 'raise'
                        WHEN v_on_conflict = 'skip' OR v_held_until IS NOT NULL THEN 'skip'
                        WHEN v_state = 'pending' THEN 'replace'
                        ELSE 'follow_up' END;
      IF v_outcome = 'raise' THEN
        PERFORM {schema}._api_refuse('LQ003', format('unique key %s is held by job %s (%s)',
                                                    '''' || p_unique_key || '''', v_holder,
                                                    v_state));
      END IF;
      IF v_outcome = 'skip' THEN
        RETURN v_holder;
      END IF;
      p_holder := v_holder;
      IF v_outcome = 'replace' THEN
-- statement: unique_replace
WITH upd AS (
  UPDATE {schema}.jobs AS j
  SET payload = p_payload::jsonb,
      priority = p_priority,
      base_priority = p_priority,
      available_at = CASE
        WHEN p_debounce::float8 IS NOT NULL
          THEN least(now() + make_interval(secs => p_debounce::float8),
                     coalesce(j.debounce_until, 'infinity'))
        WHEN p_reschedule
          THEN coalesce(p_run_at::timestamptz, now() + make_interval(secs => p_delay))
        ELSE j.available_at
      END
  WHERE j.id = p_holder AND j.status = 'pending' AND j.unique_key = p_unique_key
  RETURNING j.id, j.queue_name, j.available_at, j.blocked, j.lease_token, j.attempt_count
), ev AS (
  INSERT INTO {schema}.job_events
    (job_id, event, from_status, to_status, actor, lease_token, attempt, detail)
  SELECT id, 'unique_replaced', 'pending', 'pending', NULL, lease_token, attempt_count,
         'payload replaced by an enqueue of unique key ' || left(p_unique_key, 200)
  FROM upd
)
SELECT id, CASE WHEN available_at <= now() AND NOT blocked
  THEN pg_notify(p_channel, queue_name)::text END
FROM upd
-- end: unique_replace
        INTO v_id, v_note;
        EXIT WHEN FOUND;
        CONTINUE;
      END IF;
-- statement: insert_follow_up
WITH lock AS (
  UPDATE {schema}.unique_keys AS k
  SET job_id = nextval((SELECT pg_get_serial_sequence('{schema}.jobs', 'id'))::regclass)
  WHERE k.unique_key = p_unique_key AND k.job_id = p_holder AND k.held_until IS NULL
    AND EXISTS (SELECT 1 FROM {schema}.jobs AS h
                WHERE h.id = p_holder AND h.status = 'running')
  RETURNING k.job_id
), ins AS (
  INSERT INTO {schema}.jobs
    (id, queue_name, task, payload, priority, base_priority, available_at, max_attempts,
     payload_version, idempotency_key, ordering_key, key_policy, blocked, unique_key,
     unique_for, unique_states, debounce_until, limit_key, expires_at, fairness_key,
     cost)
  OVERRIDING SYSTEM VALUE
  SELECT lock.job_id, p_queue, p_task, p_payload::jsonb, p_priority, p_priority,
         coalesce(p_run_at::timestamptz, now() + make_interval(secs => p_delay)),
         p_max_attempts, p_payload_version, p_idempotency_key, p_ordering_key,
         p_key_policy,
         -- As in insert_keyed_job (the caller holds the ordering key's lock).
         p_ordering_key::text IS NOT NULL AND EXISTS (
           SELECT 1 FROM {schema}.jobs AS b
           WHERE b.ordering_key = p_ordering_key AND ((b.status IN ('pending', 'running') AND NOT b.blocked)
 OR (b.status = 'dead' AND b.key_policy = 'block' AND NOT b.key_skipped))
         ),
         p_unique_key, p_unique_for::float8, p_unique_states::text[],
         now() + make_interval(secs => p_debounce_max::float8), p_limit_key,
         coalesce(p_expires::timestamptz, now() + make_interval(secs => p_expires_in::float8)), p_fairness_key, p_cost
  FROM lock
  RETURNING id, queue_name, available_at, blocked
), ev AS (
  INSERT INTO {schema}.job_events
    (job_id, event, from_status, to_status, actor, lease_token, attempt, detail)
  SELECT h.id, 'superseded', h.status, h.status, NULL, h.lease_token, h.attempt_count,
         'unique key ' || left(h.unique_key, 200) || ' moved to follow-up job ' || ins.id
  FROM ins JOIN {schema}.jobs AS h ON h.id = p_holder
)
SELECT id, CASE WHEN available_at <= now() AND NOT blocked
  THEN pg_notify(p_channel, queue_name)::text END
FROM ins
-- end: insert_follow_up
      INTO v_id, v_note;
      EXIT WHEN FOUND;
    END LOOP;
    IF v_id IS NULL THEN
      PERFORM {schema}._api_refuse('LQ000', format(
        'unique key %s changed hands 20 times during one enqueue; try again',
        '''' || p_unique_key || ''''));
    END IF;
    RETURN v_id;
  END IF;
  IF p_ordering_key IS NULL THEN
-- statement: insert_job
INSERT INTO {schema}.jobs
  (queue_name, task, payload, priority, base_priority, available_at, max_attempts,
   payload_version, idempotency_key, key_policy, limit_key, expires_at, fairness_key, cost)
VALUES (
  p_queue, p_task, p_payload::jsonb, p_priority, p_priority,
  coalesce(p_run_at::timestamptz, now() + make_interval(secs => p_delay)),
  p_max_attempts, p_payload_version, p_idempotency_key, p_key_policy, p_limit_key,
  coalesce(p_expires::timestamptz, now() + make_interval(secs => p_expires_in::float8)), p_fairness_key, p_cost
)
RETURNING id, CASE WHEN available_at <= now() AND NOT blocked
  THEN pg_notify(p_channel, queue_name)::text END
-- end: insert_job
    INTO v_id, v_note;
  ELSE
-- statement: insert_keyed_job
WITH ins AS (
  INSERT INTO {schema}.jobs
    (queue_name, task, payload, priority, base_priority, available_at, max_attempts,
     payload_version, idempotency_key, ordering_key, key_policy, blocked, limit_key,
     expires_at, fairness_key, cost)
  VALUES (
    p_queue, p_task, p_payload::jsonb, p_priority, p_priority,
    coalesce(p_run_at::timestamptz, now() + make_interval(secs => p_delay)),
    p_max_attempts, p_payload_version, p_idempotency_key, p_ordering_key,
    p_key_policy,
    -- Behind any live (or blocking dead) job of its key: wait. The caller holds the key's
    -- advisory lock (lock_keys), so this answer cannot go stale before the commit.
    EXISTS (
      SELECT 1 FROM {schema}.jobs AS b
      WHERE b.ordering_key = p_ordering_key AND ((b.status IN ('pending', 'running') AND NOT b.blocked)
 OR (b.status = 'dead' AND b.key_policy = 'block' AND NOT b.key_skipped))
    ),
    p_limit_key, coalesce(p_expires::timestamptz, now() + make_interval(secs => p_expires_in::float8)), p_fairness_key, p_cost
  )
  RETURNING id, queue_name, available_at, blocked
)
SELECT id, CASE WHEN available_at <= now() AND NOT blocked
  THEN pg_notify(p_channel, queue_name)::text END
FROM ins
-- end: insert_keyed_job
    INTO v_id, v_note;
  END IF;

  IF a_job ? 'depends_on' THEN
    -- leaseq.ops.deps_async._store_deps
    p_ids := ARRAY(SELECT jsonb_array_elements_text(a_job->'depends_on')::bigint ORDER BY 1);
    v_found := '{}';
    v_ended := '{}';
    FOR v_row IN
-- statement: lock_dependency_parents
WITH locked AS (
  SELECT id, has_dependents, status
  FROM {schema}.jobs
  WHERE id = ANY(p_ids::bigint[])
  ORDER BY id
  FOR UPDATE
), flag AS (
  UPDATE {schema}.jobs AS j
  SET has_dependents = true
  FROM locked AS l
  WHERE j.id = l.id AND NOT l.has_dependents
)
SELECT id, status::text FROM locked
-- end: lock_dependency_parents
    LOOP
      v_found := v_found || v_row.id;
      IF v_row.status IN ('succeeded', 'dead', 'cancelled') THEN
        v_ended := v_ended || v_row.id;
      END IF;
    END LOOP;
    SELECT string_agg(i::text, ', ' ORDER BY i) INTO v_unknown
    FROM (SELECT i FROM unnest(p_ids) AS i WHERE i <> ALL(v_found) ORDER BY i LIMIT 10) AS u;
    IF v_unknown IS NOT NULL THEN
      PERFORM {schema}._api_refuse('LQ001',
        'depends_on names job(s) that do not exist: ' || v_unknown);
    END IF;
    p_job_ids := array_fill(v_id, ARRAY[cardinality(p_ids)]);
    p_depends_on := p_ids;
    p_on_dead := array_fill(a_job->>'on_dead', ARRAY[cardinality(p_ids)]);
    p_ids := ARRAY[v_id];
-- statement: insert_deps
WITH edges AS (
  INSERT INTO {schema}.job_deps (job_id, depends_on, on_dead)
  SELECT * FROM unnest(p_job_ids::bigint[], p_depends_on::bigint[], p_on_dead::text[])
  ON CONFLICT DO NOTHING
)
UPDATE {schema}.jobs SET waiting = true WHERE id = ANY(p_ids::bigint[])
-- end: insert_deps
    ;
    IF cardinality(v_ended) > 0 THEN
      p_ended := NULL;
      v_cancelled := '{}';
      FOR v_row IN
-- statement: promote_dependents
WITH c AS MATERIALIZED (
  SELECT j.id,
         NOT EXISTS (
           SELECT 1 FROM (
             SELECT d.depends_on FROM {schema}.job_deps AS d
             WHERE d.job_id = j.id
             ORDER BY d.job_id DESC, d.depends_on DESC
           ) AS d
           JOIN {schema}.jobs AS p ON p.id = d.depends_on
           WHERE p.status IN ('pending', 'running', 'suspended')
         ) AS ready,
         CASE WHEN p_ended::bigint[] IS NULL THEN
           (SELECT d.depends_on || ' ended ' || p.status
              FROM {schema}.job_deps AS d
              JOIN {schema}.jobs AS p ON p.id = d.depends_on
             WHERE d.job_id = j.id AND d.on_dead = 'cancel'
               AND p.status IN ('dead', 'cancelled')
             ORDER BY d.depends_on
             LIMIT 1)
         ELSE
           (SELECT d.depends_on || ' ended ' || p.status
              FROM {schema}.job_deps AS d
              JOIN {schema}.jobs AS p ON p.id = d.depends_on
             WHERE d.job_id = j.id AND d.depends_on = ANY(p_ended::bigint[])
               AND d.on_dead = 'cancel' AND p.status IN ('dead', 'cancelled')
             ORDER BY d.depends_on
             LIMIT 1)
         END AS culprit
  FROM {schema}.jobs AS j
  WHERE j.id = ANY(p_ids::bigint[]) AND j.waiting AND j.status = 'pending'
), upd AS (
  UPDATE {schema}.jobs AS j
  SET waiting = false,
      status = CASE WHEN c.culprit IS NULL THEN 'pending' ELSE 'cancelled' END
               ::{schema}.job_status,
      finished_at = CASE WHEN c.culprit IS NULL THEN NULL ELSE now() END,
      last_error_code = CASE WHEN c.culprit IS NULL THEN j.last_error_code
                             ELSE 'DEPENDENCY_FAILED' END,
      last_error_class = CASE WHEN c.culprit IS NULL THEN j.last_error_class
                              ELSE 'permanent' END,
      last_error_detail = CASE WHEN c.culprit IS NULL THEN j.last_error_detail
                               ELSE 'dependency ' || c.culprit END
  FROM c
  WHERE j.id = c.id AND (c.ready OR c.culprit IS NOT NULL)
  RETURNING j.id, j.status, j.queue_name, j.available_at, j.lease_token, j.attempt_count,
            c.culprit
), ev AS (
  INSERT INTO {schema}.job_events
    (job_id, event, from_status, to_status, actor, lease_token, attempt, error_code,
     error_class, detail)
  SELECT id, CASE WHEN culprit IS NULL THEN 'promoted' ELSE 'dependency_failed' END,
         'pending', status, NULL, lease_token, attempt_count,
         CASE WHEN culprit IS NOT NULL THEN 'DEPENDENCY_FAILED' END,
         CASE WHEN culprit IS NOT NULL THEN 'permanent' END,
         CASE WHEN culprit IS NULL THEN 'all dependencies ended'
              ELSE 'dependency ' || culprit || ' (on_dead cancel)' END
  FROM upd
)
SELECT id, status::text,
       CASE WHEN status = 'pending' AND available_at <= now()
         THEN pg_notify(p_channel, queue_name)::text END
FROM upd
-- end: promote_dependents
      LOOP
        IF v_row.status = 'cancelled' THEN
          v_cancelled := v_cancelled || v_row.id;
        END IF;
      END LOOP;
      PERFORM {schema}._api_promote(v_cancelled);
    END IF;
  END IF;

  IF a_job->>'batch_id' IS NOT NULL THEN
    -- leaseq.ops.deps_async._join_batches
    p_id := (a_job->>'batch_id')::bigint;
    p_batch_id := p_id;
-- statement: lock_open_batch
SELECT state FROM {schema}.batches WHERE id = p_id FOR UPDATE
-- end: lock_open_batch
    INTO v_status;
    IF NOT FOUND THEN
      PERFORM {schema}._api_refuse('LQ001', format('no batch %s', p_id));
    END IF;
    IF v_status <> 'open' THEN
      PERFORM {schema}._api_refuse('LQ001', format('batch %s is %s: no job can join it',
                                                  p_id, v_status));
    END IF;
    p_ids := ARRAY[v_id];
-- statement: join_batch
UPDATE {schema}.jobs
SET batch_id = p_batch_id, has_dependents = true
WHERE id = ANY(p_ids::bigint[])
-- end: join_batch
    ;
  END IF;
  RETURN v_id;
END
$fn$;
