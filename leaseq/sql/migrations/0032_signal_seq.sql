-- leaseq schema, version 32: more than one signal per job and name, each delivered once
-- (ctx.wait_for twice for one name; docs/durable.md).
--
-- A send appends the name's next delivery (seq 1, 2, ...: the largest one stored plus one,
-- read under the job row that every send locks first, so two sends to one job take turns);
-- the primary key (job_id, name, seq) keeps each delivery one row. A job's waits for a name
-- consume the deliveries in their order, each one recorded, with its seq, in the waiting
-- step's record under the fence: a delivery goes to one wait, once. Rows stored before
-- this version are each their name's first delivery.
ALTER TABLE {schema}.job_signals ADD COLUMN seq integer NOT NULL DEFAULT 1;
ALTER TABLE {schema}.job_signals ALTER COLUMN seq DROP DEFAULT;
ALTER TABLE {schema}.job_signals DROP CONSTRAINT job_signals_pkey;
ALTER TABLE {schema}.job_signals ADD PRIMARY KEY (job_id, name, seq);
ALTER TABLE {schema}.job_signals ADD CONSTRAINT job_signals_seq_valid CHECK (seq >= 1);
