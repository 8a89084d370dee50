-- pg_throttle install script. The Makefile installs it as pg_throttle--<version>.sql.
\echo Use "CREATE EXTENSION pg_throttle" to load this file. \quit

-- The control file's "schema = throttle" creates the schema and puts it first
-- in search_path while this script runs.
GRANT USAGE ON SCHEMA throttle TO PUBLIC;

--
-- Declared resources: intervals that operators configure by name.
--
CREATE TABLE throttle.resource (
    name    text PRIMARY KEY
            CHECK (name <> '' AND octet_length(name) <= 200),
    every   interval NOT NULL
            CHECK (every > interval '0'),
    comment text
);
COMMENT ON TABLE throttle.resource IS
    'Intervals declared by name: throttle.acquire(name) uses "every" when it is called without one.';
COMMENT ON COLUMN throttle.resource.name IS 'The resource name, as passed to throttle.acquire (at most 200 bytes).';
COMMENT ON COLUMN throttle.resource.every IS 'At most one grant per this interval.';
COMMENT ON COLUMN throttle.resource.comment IS 'Free text for operators.';
GRANT SELECT ON throttle.resource TO PUBLIC;
SELECT pg_catalog.pg_extension_config_dump('throttle.resource', '');

--
-- At most once per interval.
--
CREATE FUNCTION throttle.acquire(resource text, every interval DEFAULT NULL, holder text DEFAULT NULL)
RETURNS boolean
AS 'MODULE_PATHNAME', 'pg_throttle_acquire'
LANGUAGE C VOLATILE PARALLEL UNSAFE;
COMMENT ON FUNCTION throttle.acquire(text, interval, text) IS
    'True for the first caller per interval of a resource in this database, false for everyone else until the interval has passed. Not undone by ROLLBACK.';

--
-- Operator view of the shared-memory registry.
--
CREATE FUNCTION throttle.registry_entries(
    OUT kind text, OUT name text, OUT holder text, OUT holder_pid integer,
    OUT granted_at timestamptz, OUT next_grant_at timestamptz,
    OUT grants bigint, OUT denials bigint)
RETURNS SETOF record
AS 'MODULE_PATHNAME', 'pg_throttle_registry_entries'
LANGUAGE C VOLATILE PARALLEL UNSAFE;
COMMENT ON FUNCTION throttle.registry_entries() IS
    'The registry entries of this database that are still in force; see the view throttle.status.';

CREATE VIEW throttle.status AS
    SELECT kind, name, holder, holder_pid, granted_at, next_grant_at, grants, denials
    FROM throttle.registry_entries();
COMMENT ON VIEW throttle.status IS
    'One row per registry entry of this database still in force: who was granted it, when, when it can next be granted, grants and denials since the entry was created.';
GRANT SELECT ON throttle.status TO PUBLIC;
