-- leaseq schema, version 21: invariants (issue 28). admit() says whether it took slot
-- rows (admission.slot_rows).
--
-- The claim reported "this lease may hold slot rows" (Lease.slot_rows) from its own
-- snapshot, while admit() reads the limits with newer ones: a task or key limit created
-- during a claim was enforced (a slot row inserted) but not reported, the plain completion
-- left the row behind, and a limit lowered to 1 then admitted nothing until a sweep. Now
-- the function that inserts the slot rows reports them, in the same statement as the claim.
DROP FUNCTION {schema}.admit(bigint[], integer);

ALTER TYPE {schema}.admission ADD ATTRIBUTE slot_rows boolean;

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
  v_dead bigint[];
  v_alive bigint[];
  v_got bigint[];
  r_uniq bigint[];
  v_rated boolean;
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
BEGIN
  WHILE cardinality(v_picked) < p_want AND v_pos <= v_total LOOP
    v_chunk := p_candidates[v_pos : v_pos + (p_want - cardinality(v_picked)) - 1];
    v_pos := v_pos + cardinality(v_chunk);
    -- Lock the chunk and list, per candidate, the limits it is under (a row with NULLs
    -- for a candidate under none).
    WITH j AS MATERIALIZED (
      SELECT x.id, u.ord, least(x.lease_token, 9223372036854775806) + 1 AS tok,
             x.queue_name, x.task, x.limit_key
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
           array_agg(p.burst),
           -- The locked candidates once each, in claim order, and whether any is under a
           -- rate limit: the common cases skip the rate steps and the re-sort below.
           (SELECT array_agg(j.id ORDER BY j.ord) FROM j),
           coalesce(bool_or(p.rate IS NOT NULL), false)
      INTO r_ids, r_toks, r_ords, r_names, r_concs, r_rates, r_pers, r_bursts, r_uniq,
           v_rated
      FROM (
        SELECT j.id, j.tok, j.ord, k.limit_name, k.concurrency, k.rate, k.per_seconds,
               k.burst
        FROM j
        LEFT JOIN k ON k.queue_name = j.queue_name AND k.task = j.task
                   AND k.limit_key IS NOT DISTINCT FROM j.limit_key
        ORDER BY j.ord, k.limit_name
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
      IF v_lim.name = ANY(v_full) THEN
        v_got := '{}';
      ELSIF left(v_lim.name, 6) = 'queue:' THEN
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
      -- A limit lowered below slots still held admits nothing until those are freed.
      ELSIF EXISTS (SELECT 1 FROM {schema}.limit_slots AS h
                    WHERE h.limit_name = v_lim.name AND h.slot > v_lim.conc) THEN
        v_got := '{}';
      ELSE
        -- The primary key decides; free_slots() is a guess at free numbers, passing over
        -- numbers held or being taken by a claim in flight. It starts at the first
        -- candidate's id (mod the limit) and wraps around, so successive claims take fresh
        -- numbers rather than the same few again, whose index entries pile up dead versions
        -- (a slot row is inserted and deleted per job) until a vacuum.
        v_start := (r_uniq[1] % v_lim.conc)::integer;
        -- Probed, not guessed: inserting over a slot whose delete is not yet committed
        -- would wait for that transaction, and a claim never waits on another.
        v_nums := {schema}.free_slots(v_lim.name, v_lim.conc, v_start, cardinality(v_alive));
        -- A plain insert (cheaper than ON CONFLICT). It fails only when a claim that
        -- committed after the search's snapshot took one of the numbers (rare): then the
        -- search again, and an insert that skips any number taken meanwhile.
        BEGIN
          INSERT INTO {schema}.limit_slots (limit_name, slot, job_id, lease_token)
          SELECT v_lim.name, f.g, r.id, r.tok
          FROM unnest(v_nums) WITH ORDINALITY AS f(g, rn)
          JOIN (SELECT q.id, q.tok, row_number() OVER () AS rn
                FROM unnest(v_lim.ids, v_lim.toks) AS q(id, tok)
                WHERE NOT q.id = ANY(v_dead)) AS r USING (rn);
          v_got := v_alive[1 : cardinality(v_nums)];
        EXCEPTION WHEN unique_violation THEN
          v_nums := {schema}.free_slots(v_lim.name, v_lim.conc, v_start,
                                        cardinality(v_alive));
          WITH ins AS (
            INSERT INTO {schema}.limit_slots (limit_name, slot, job_id, lease_token)
            SELECT v_lim.name, f.g, r.id, r.tok
            FROM unnest(v_nums) WITH ORDINALITY AS f(g, rn)
            JOIN (SELECT q.id, q.tok, row_number() OVER () AS rn
                  FROM unnest(v_lim.ids, v_lim.toks) AS q(id, tok)
                  WHERE NOT q.id = ANY(v_dead)) AS r USING (rn)
            ON CONFLICT DO NOTHING
            RETURNING job_id
          )
          SELECT coalesce(array_agg(job_id), '{}') INTO v_got FROM ins;
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
  RETURN ROW(v_picked, v_slots, v_slot_rows)::{schema}.admission;
END
$$;
