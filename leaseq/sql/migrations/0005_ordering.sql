-- leaseq schema, version 5: strict per-key ordering and priority aging.
--
-- A job with an ordering_key is claimable only while it is its key's head: no earlier job
-- of the key is pending, running, or dead under the "block" policy. Jobs behind the head
-- are stored pending but `blocked`, outside the claim index; when a head finishes, the
-- same transaction unblocks the next one (see promote_keys in queries.sql). Every change to
-- a key's jobs takes a transaction-scoped advisory lock on the key first, so an enqueue and
-- a head's completion can never both decide "someone else will unblock it".

ALTER TABLE {schema}.jobs
  ADD COLUMN ordering_key text,
  ADD COLUMN blocked boolean NOT NULL DEFAULT false,
  -- What a dead head does to its key: block (wait for replay or skip) or skip.
  ADD COLUMN key_policy text NOT NULL DEFAULT 'block',
  -- An operator skipped this dead head: it no longer blocks its key.
  ADD COLUMN key_skipped boolean NOT NULL DEFAULT false,
  -- The priority given at enqueue; `priority` may grow with aging.
  ADD COLUMN base_priority integer NOT NULL DEFAULT 0,
  ADD CONSTRAINT jobs_ordering_key_bounded CHECK (length(ordering_key) <= 200),
  ADD CONSTRAINT jobs_key_policy_known CHECK (key_policy IN ('block', 'skip')),
  ADD CONSTRAINT jobs_only_keyed_jobs_block CHECK (NOT blocked OR ordering_key IS NOT NULL);

UPDATE {schema}.jobs SET base_priority = priority WHERE priority <> 0;

-- Claims must never see blocked jobs: the claim index leaves them out.
DROP INDEX {schema}.jobs_claimable_idx;
CREATE INDEX jobs_claimable_idx
  ON {schema}.jobs (queue_name, priority DESC, available_at, id)
  WHERE status = 'pending' AND NOT blocked;

-- A key's live jobs in order: finds a key's head and the next job to unblock.
CREATE INDEX jobs_ordering_idx
  ON {schema}.jobs (ordering_key, id)
  WHERE ordering_key IS NOT NULL AND status IN ('pending', 'running', 'dead');
