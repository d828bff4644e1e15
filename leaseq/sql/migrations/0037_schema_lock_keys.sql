-- leaseq schema, version 37: the advisory locks a claim takes on the slots and rate buckets it
-- is taking are keyed on the schema as well as the limit.
--
-- free_slots(), free_queue_slots() and admit() try-lock a slot number (or a rate bucket) that a
-- claim in flight is taking, and pass over one another transaction holds. The keys were
-- 'leaseq.slot.<limit>#<n>' and 'leaseq.bucket.<limit>' in every schema: two leaseq schemas in
-- one database (two apps, or test schemas side by side) that both have a limit of one name took
-- the same keys, and a claim in one schema passed over a slot, or a whole rate bucket, that only
-- a claim in the other was taking. No slot was ever double-held (the slot rows and the queue
-- slot index decide that), but a claim admitted fewer jobs than its limits allowed. The keys now
-- begin with the schema, as the ordering keys' always did. During the upgrade a claim still in
-- the old function and one in the new take different keys for one slot: the unique indexes on
-- the slot rows and on jobs' queue slots, which decide who holds a slot (the locks only keep
-- claims in flight out of each other's way), still refuse a second holder, and a refused
-- claim already searches again (admit()'s slot-row insert) or tries again (the client's claim,
-- params.CLAIM_ATTEMPTS), as for a number taken by a claim that committed meanwhile.

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
      ELSE pg_try_advisory_xact_lock(hashtextextended('{schema}.slot.' || p_name || '#' || n.g, 0))
    END
    LIMIT p_n);
END
$$;

CREATE OR REPLACE FUNCTION {schema}.free_queue_slots(p_queue text, p_conc integer, p_start integer,
                                          p_n integer, p_taken integer[])
RETURNS integer[]
LANGUAGE plpgsql
SET enable_seqscan = off
AS $$
BEGIN
  RETURN ARRAY(
    SELECT n.g
    FROM (SELECT (p_start + generate_series(0, p_conc - 1)) % p_conc + 1 AS g) AS n
    WHERE NOT n.g = ANY(p_taken)
      AND CASE
        WHEN EXISTS (SELECT 1 FROM {schema}.jobs AS t
                     WHERE t.queue_name = p_queue AND t.queue_slot = n.g OFFSET 0) THEN false
        ELSE pg_try_advisory_xact_lock(
               hashtextextended('{schema}.slot.queue:' || p_queue || '#' || n.g, 0))
      END
    LIMIT p_n);
END
$$;

CREATE OR REPLACE FUNCTION {schema}.admit(p_candidates bigint[], p_want integer)
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
           AND pg_try_advisory_xact_lock(hashtextextended('{schema}.bucket.' || v_lim.name, 0))
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
