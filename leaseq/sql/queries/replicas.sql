-- Read replicas and several databases (leaseq.ops.reads_async, leaseq.replicas).


-- name: primary_wal_position
-- The primary's flushed WAL position: what a streaming standby can have received so far
-- (read first, then replica_lag on the replica).
SELECT pg_current_wal_flush_lsn()::text;

-- name: replica_lag
-- On the read replica: is it a standby, how many bytes of the primary's WAL (read just
-- before) it has not replayed yet, the age of the newest transaction it replayed
-- (clock_timestamp: the age now, not at the start of this transaction), and which server
-- answered, as host:port (its own address, so also behind a pooler or a multi-host DSN;
-- [addr]:port for IPv6; 'local' over a Unix socket, where inet_server_addr is NULL).
SELECT pg_is_in_recovery(),
       (%(primary_lsn)s::pg_lsn - pg_last_wal_replay_lsn())::bigint,
       extract(epoch FROM clock_timestamp() - pg_last_xact_replay_timestamp())::float8,
       CASE WHEN family(inet_server_addr()) = 6 THEN '[' || host(inet_server_addr()) || ']'
            ELSE coalesce(host(inet_server_addr()), 'local')
       END || ':' || current_setting('port');
