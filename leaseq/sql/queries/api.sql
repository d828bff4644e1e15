-- The HTTP API's tokens and audit trail (leaseq.ops.tokens_async; migration 0023,
-- docs/http-api.md).


-- name: create_api_token
-- Nothing returned: a token of that name exists (revoked ones too: names are not reused,
-- so the audit trail's actor stays unambiguous).
INSERT INTO {schema}.api_tokens (name, token_hash, scopes, queues, created_by)
VALUES (%(name)s, %(hash)s, %(scopes)s::text[], %(queues)s::text[], %(actor)s)
ON CONFLICT (name) DO NOTHING
RETURNING name;

-- name: revoke_api_token
UPDATE {schema}.api_tokens
SET revoked_at = now()
WHERE name = %(name)s AND revoked_at IS NULL
RETURNING name;

-- name: api_token_by_hash
-- The live token with this hash; its use is noted (at most once a minute, so a busy
-- client does not rewrite the row on every request).
WITH t AS (
  SELECT name, scopes, queues
  FROM {schema}.api_tokens
  WHERE token_hash = %(hash)s AND revoked_at IS NULL
), used AS (
  UPDATE {schema}.api_tokens AS a
  SET last_used_at = now()
  FROM t
  WHERE a.name = t.name
    AND (a.last_used_at IS NULL OR a.last_used_at < now() - interval '1 minute')
)
SELECT name, scopes, queues FROM t;

-- name: list_api_tokens
SELECT name, scopes, queues, created_by, created_at, revoked_at, last_used_at
FROM {schema}.api_tokens
ORDER BY name;

-- name: record_api_request
INSERT INTO {schema}.api_requests (actor, method, path, status, detail)
VALUES (%(actor)s, %(method)s, left(%(path)s, 2000), %(status)s, left(%(detail)s, 4000));

-- name: api_requests
-- The API's audit trail, newest first.
SELECT id, at, actor, method, path, status, detail
FROM {schema}.api_requests
WHERE %(actor)s::text IS NULL OR actor = %(actor)s
ORDER BY id DESC
LIMIT %(limit)s;

-- name: prune_api_requests
-- Retention of the trail, oldest first (api_requests_at_idx), a bounded batch at a time:
-- the worker's pruner ages it out with the jobs.
DELETE FROM {schema}.api_requests
WHERE id = ANY(ARRAY(
  SELECT id FROM {schema}.api_requests
  WHERE at < now() - make_interval(secs => %(older_than)s)
  ORDER BY at
  LIMIT %(limit)s
))
RETURNING 1;
