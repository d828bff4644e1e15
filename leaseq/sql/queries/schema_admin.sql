-- Migrations and the schema version (leaseq.ops.base_async), the database clock and which
-- database a connection is on.


-- name: migrate_lock
-- Serialises concurrent `leaseq migrate` runs on one schema; released at commit.
SELECT pg_advisory_xact_lock(hashtextextended(%(key)s, 0));

-- name: create_schema
CREATE SCHEMA IF NOT EXISTS {schema};

-- name: create_version_table
CREATE TABLE IF NOT EXISTS {schema}.schema_version (
  version integer PRIMARY KEY,
  name text NOT NULL,
  applied_at timestamptz NOT NULL DEFAULT now()
);

-- name: applied_versions
SELECT version FROM {schema}.schema_version ORDER BY version;

-- name: record_version
INSERT INTO {schema}.schema_version (version, name) VALUES (%(version)s, %(name)s);

-- name: version_table_exists
-- Asked first, so reading the version of a never-migrated schema is not an error.
SELECT to_regclass(%(table)s) IS NOT NULL;

-- name: schema_version
SELECT max(version) FROM {schema}.schema_version;

-- name: db_now
SELECT now();

-- name: database_identity
-- Which database a connection is on (the cluster's system identifier and the database
-- name): a transactional enqueue must be on the database of the queue it names.
SELECT (SELECT system_identifier FROM pg_control_system())::text, current_database();

-- name: transaction_isolation
-- The isolation level a caller's connection runs leaseq's statements at (its open
-- transaction's, or the session default for the implicit one of an autocommit statement):
-- leaseq's "lock, then decide with a new statement" steps need READ COMMITTED.
SELECT current_setting('transaction_isolation');
