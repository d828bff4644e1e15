-- leaseq schema, version 31: a gathering parent is woken by its last child's end
-- (ctx.gather, docs/durable.md), not by its poll.
--
-- A spawned child names its parent (jobs.parent_id, set in the spawning step's
-- transaction) and the parent has a gate row (job_fanin, written there too). The trigger
-- below runs in the transaction of every statement that ends a child (a completion, a
-- failure or a sweep to dead, an expiry, a cancel: any update of its status to a final
-- one), its WHEN clause keeping it off every other update. It takes the parent's gate row
-- (FOR UPDATE, until the commit): two children ending at once, and a child's end and the
-- parent's suspension at its gather (which takes the gate too, after its own row), are
-- decided one after the other, each by a statement that sees what the one before it
-- committed. When every child the gather waits for (job_fanin.children, set by the
-- suspension) has ended, the parent becomes pending (a single-row update, a 'woken' event):
-- the last child's end wakes it once. The parent's row is taken SKIP LOCKED: a cancel that
-- holds it (and waits for this child's row) ends it anyway; a wake skipped for another
-- holder falls back to the gather's poll.
ALTER TABLE {schema}.jobs ADD COLUMN parent_id bigint;

CREATE TABLE {schema}.job_fanin (
  parent_id bigint PRIMARY KEY,
  children bigint[]
);

CREATE FUNCTION {schema}.child_ended()
RETURNS trigger
LANGUAGE plpgsql
AS $fn$
BEGIN
  PERFORM 1 FROM {schema}.job_fanin WHERE parent_id = NEW.parent_id FOR UPDATE;
  WITH woken AS (
    UPDATE {schema}.jobs AS p
    SET status = 'pending', available_at = now(), wake_at = NULL, wait_signal = NULL,
        suspend_reason = NULL
    WHERE p.id = (
        SELECT s.id FROM {schema}.jobs AS s
        WHERE s.id = NEW.parent_id AND s.status = 'suspended'
          AND s.suspend_reason = 'children'
        FOR UPDATE SKIP LOCKED)
      AND EXISTS (
        SELECT 1 FROM {schema}.job_fanin AS f
        WHERE f.parent_id = NEW.parent_id AND f.children IS NOT NULL)
      AND NOT EXISTS (
        SELECT 1 FROM {schema}.job_fanin AS f
        CROSS JOIN LATERAL unnest(f.children) AS c(id)
        JOIN {schema}.jobs AS k ON k.id = c.id
        WHERE f.parent_id = NEW.parent_id
          AND k.status IN ('pending', 'running', 'suspended'))
    RETURNING p.id, p.lease_token, p.attempt_count,
              pg_notify({schema}._api_channel(), p.queue_name)
  )
  INSERT INTO {schema}.job_events
    (job_id, event, from_status, to_status, lease_token, attempt, detail)
  SELECT id, 'woken', 'suspended', 'pending', lease_token, attempt_count,
         'its children ended (job ' || NEW.id || ' last)'
  FROM woken;
  RETURN NULL;
END
$fn$;

CREATE TRIGGER jobs_child_ended
  AFTER UPDATE OF status ON {schema}.jobs
  FOR EACH ROW
  WHEN (NEW.parent_id IS NOT NULL
        AND NEW.status IN ('succeeded', 'dead', 'cancelled')
        AND OLD.status::text IN ('pending', 'running', 'suspended'))
  EXECUTE FUNCTION {schema}.child_ended();
