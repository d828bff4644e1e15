-- leaseq schema, version 23: the HTTP API's bearer tokens and its audit trail
-- (docs/http-api.md).
--
-- A token is shown once, when `leaseq tokens create` makes it; only its SHA-256 is kept
-- (the token is 32 random bytes, so a plain hash is as strong as the token). Each token has
-- scopes (enqueue, read, cancel, replay, signal) and, optionally, the queues it may act
-- on. Every request the API answers for a token is a row of api_requests, the token's name
-- as its actor; the operations it runs (cancel, replay) also name it in job_events.
CREATE TABLE {schema}.api_tokens (
  name text PRIMARY KEY,
  token_hash text NOT NULL UNIQUE,
  scopes text[] NOT NULL,
  -- NULL: every queue.
  queues text[],
  created_by text,
  created_at timestamptz NOT NULL DEFAULT now(),
  revoked_at timestamptz,
  last_used_at timestamptz,
  CONSTRAINT api_tokens_name_bounded CHECK (length(name) BETWEEN 1 AND 128),
  CONSTRAINT api_tokens_scopes_known CHECK (
    cardinality(scopes) > 0
    AND scopes <@ ARRAY['enqueue', 'read', 'cancel', 'replay', 'signal']::text[]),
  CONSTRAINT api_tokens_by_bounded CHECK (length(created_by) <= 200)
);

CREATE TABLE {schema}.api_requests (
  id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
  at timestamptz NOT NULL DEFAULT now(),
  actor text NOT NULL,
  method text NOT NULL,
  path text NOT NULL,
  status integer NOT NULL,
  detail text,
  CONSTRAINT api_requests_path_bounded CHECK (length(path) <= 2000),
  CONSTRAINT api_requests_detail_bounded CHECK (length(detail) <= 4000)
);

-- The trail by time (an operator deleting old rows reads it oldest first).
CREATE INDEX api_requests_at_idx ON {schema}.api_requests (at);
