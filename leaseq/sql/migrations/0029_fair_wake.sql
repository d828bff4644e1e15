-- leaseq schema, version 29: a fair queue's key is woken by whatever makes one of its jobs
-- claimable, and idle keys can be pruned (docs/fairness.md).
--
-- Until now only an enqueue unparked a key (touch_fair_keys), so a job that became
-- claimable another way (a retry, a replay, a release, the next job of an ordering key
-- whose head ended, a dependency met, a signal) waited for its key's park to end (up to
-- 5 s). The trigger below does, in the transaction of the statement that made the job
-- claimable, what the enqueue does: the key's row is unparked and its gen bumped (a claim
-- that read the key before this commit then parks nothing). Its WHEN clause keeps it off
-- every other update (a claim, a completion, a heartbeat): it fires only for a row that
-- becomes pending and neither blocked nor waiting. A sleeper woken by the claim itself
-- (_wake_due sets available_at to its wake_at) is left to claim_fair_jobs, which unparks
-- that key in the same statement without waiting on another claim's row.
--
-- A key with a job (the trigger's insert) gets its row back if it was pruned meanwhile;
-- a job without a key only unparks the queue's key '' when the queue is fair (it never
-- makes a queue fair). active_at: the last time a key was enqueued to, woken or claimed
-- from; prune_fair_keys deletes keys idle longer than the retention with no live job.
ALTER TABLE {schema}.fair_keys ADD COLUMN active_at timestamptz NOT NULL DEFAULT now();

CREATE FUNCTION {schema}.fair_key_ready()
RETURNS trigger
LANGUAGE plpgsql
AS $fn$
BEGIN
  IF NEW.fairness_key IS NULL THEN
    UPDATE {schema}.fair_keys AS f
    SET gen = f.gen + 1, parked_until = NULL, park_step = 0, active_at = now(),
        pass = CASE WHEN f.park_step > 0 THEN NULL ELSE f.pass END
    WHERE f.queue_name = NEW.queue_name AND f.fairness_key = ''
      -- Once per transaction is enough (a later claim compares gen with its own read).
      AND (f.parked_until IS NOT NULL OR f.xmin <> pg_current_xact_id()::xid);
  ELSE
    INSERT INTO {schema}.fair_keys AS f (queue_name, fairness_key)
    VALUES (NEW.queue_name, NEW.fairness_key)
    ON CONFLICT (queue_name, fairness_key) DO UPDATE
    SET gen = f.gen + 1, parked_until = NULL, park_step = 0, active_at = now(),
        pass = CASE WHEN f.park_step > 0 THEN NULL ELSE f.pass END
    WHERE f.parked_until IS NOT NULL OR f.xmin <> pg_current_xact_id()::xid;
  END IF;
  RETURN NULL;
END
$fn$;

CREATE TRIGGER jobs_fair_ready
  AFTER UPDATE OF status, blocked, waiting ON {schema}.jobs
  FOR EACH ROW
  WHEN (NEW.status = 'pending' AND NOT NEW.blocked AND NOT NEW.waiting
        AND (OLD.status <> 'pending' OR OLD.blocked OR OLD.waiting)
        AND NOT (OLD.status::text = 'suspended' AND NEW.available_at = OLD.wake_at))
  EXECUTE FUNCTION {schema}.fair_key_ready();
