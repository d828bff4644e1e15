-- The autoscaling signal (leaseq.ops.inspect_async.autoscaling, leaseq.ops.admin_async
-- .set_scaling; the view and its rule are in migration 0022, docs/autoscaling.md).


-- name: autoscaling
-- One row per queue (or only %(queue)s): what an autoscaler scales on.
SELECT queue, claimable, running, oldest_wait, paused, concurrency, min_workers,
       max_workers, queue_limit, suggested_workers
FROM {schema}.autoscaling
WHERE %(queue)s::text IS NULL OR queue = %(queue)s
ORDER BY queue;

-- name: set_queue_scaling
INSERT INTO {schema}.queue_scaling
  (queue_name, concurrency, min_workers, max_workers, updated_by, updated_at)
VALUES (%(queue)s, %(concurrency)s, %(min_workers)s, %(max_workers)s, %(actor)s, now())
ON CONFLICT (queue_name) DO UPDATE
SET concurrency = excluded.concurrency, min_workers = excluded.min_workers,
    max_workers = excluded.max_workers, updated_by = excluded.updated_by,
    updated_at = excluded.updated_at;

-- name: clear_queue_scaling
DELETE FROM {schema}.queue_scaling WHERE queue_name = %(queue)s RETURNING queue_name;
