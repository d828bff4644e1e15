-- The operators' audit trail (pauses, schedules, limits, replays write to it).


-- name: admin_event
-- The operators' audit trail (schedule changes here; pauses use it too).
INSERT INTO {schema}.admin_events (actor, action, scope, value, reason, detail)
VALUES (%(actor)s, %(action)s, %(scope)s, %(value)s, %(reason)s, %(detail)s);

-- name: admin_events
-- The operators' audit trail, newest first (pauses, schedules, ...), optionally one scope.
SELECT id, at, actor, action, scope, value, reason, detail
FROM {schema}.admin_events
WHERE (%(scope)s::text IS NULL OR scope = %(scope)s)
  AND (%(value)s::text IS NULL OR value = %(value)s)
ORDER BY id DESC
LIMIT %(limit)s;
