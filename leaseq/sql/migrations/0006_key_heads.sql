-- leaseq schema, version 6: find a key's current head(s) without walking its backlog.
-- One entry per ordering key at most (its unblocked pending job), so it stays tiny.
CREATE INDEX jobs_key_heads_idx
  ON {schema}.jobs (ordering_key)
  WHERE ordering_key IS NOT NULL AND status = 'pending' AND NOT blocked;
