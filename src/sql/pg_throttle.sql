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
            CHECK (every > interval '0' AND isfinite(every)),
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
-- Rate limits: GCRA token buckets.
--
CREATE TABLE throttle.bucket (
    name    text PRIMARY KEY
            CHECK (name <> '' AND octet_length(name) <= 200),
    rate    integer NOT NULL CHECK (rate > 0),
    per     interval NOT NULL CHECK (per > interval '0' AND isfinite(per)),
    burst   integer CHECK (burst > 0),
    comment text
);
COMMENT ON TABLE throttle.bucket IS
    'Token buckets declared by name: throttle.take(name), throttle.allow(name) and throttle.wait(name) use rate, per and burst from here. A change applies from the next call, without resetting the bucket''s level.';
COMMENT ON COLUMN throttle.bucket.name IS 'The bucket key, as passed to throttle.take (at most 200 bytes).';
COMMENT ON COLUMN throttle.bucket.rate IS 'Units that refill per "per".';
COMMENT ON COLUMN throttle.bucket.per IS 'The refill period.';
COMMENT ON COLUMN throttle.bucket.burst IS 'Capacity of the bucket; NULL means rate.';
COMMENT ON COLUMN throttle.bucket.comment IS 'Free text for operators.';
GRANT SELECT ON throttle.bucket TO PUBLIC;
SELECT pg_catalog.pg_extension_config_dump('throttle.bucket', '');

CREATE FUNCTION throttle.take(key text, rate integer, per interval, burst integer DEFAULT NULL,
                              cost integer DEFAULT 1,
                              OUT allowed boolean, OUT remaining integer,
                              OUT retry_after interval, OUT reset_after interval)
RETURNS record
AS 'MODULE_PATHNAME', 'pg_throttle_take'
LANGUAGE C VOLATILE PARALLEL UNSAFE;
COMMENT ON FUNCTION throttle.take(text, integer, interval, integer, integer) IS
    'Takes cost units from the token bucket "key" (capacity burst, default rate; refilling rate per per). Returns one row: allowed, units remaining, retry_after (exact wait until the same request passes), reset_after (until the bucket is full). cost 0 peeks: it takes nothing, and allowed and retry_after answer for one unit.';

CREATE FUNCTION throttle.take(key text, cost integer DEFAULT 1,
                              OUT allowed boolean, OUT remaining integer,
                              OUT retry_after interval, OUT reset_after interval)
RETURNS record
AS 'MODULE_PATHNAME', 'pg_throttle_take_declared'
LANGUAGE C VOLATILE PARALLEL UNSAFE;
COMMENT ON FUNCTION throttle.take(text, integer) IS
    'throttle.take with rate, per and burst declared for key in throttle.bucket.';

CREATE FUNCTION throttle.allow(key text, rate integer, per interval, burst integer DEFAULT NULL,
                               cost integer DEFAULT 1)
RETURNS boolean
AS 'MODULE_PATHNAME', 'pg_throttle_allow'
LANGUAGE C VOLATILE PARALLEL UNSAFE;
COMMENT ON FUNCTION throttle.allow(text, integer, interval, integer, integer) IS
    'Like throttle.take, but returns only whether the request was allowed.';

CREATE FUNCTION throttle.allow(key text, cost integer DEFAULT 1)
RETURNS boolean
AS 'MODULE_PATHNAME', 'pg_throttle_allow_declared'
LANGUAGE C VOLATILE PARALLEL UNSAFE;
COMMENT ON FUNCTION throttle.allow(text, integer) IS
    'throttle.allow with rate, per and burst declared for key in throttle.bucket.';

CREATE FUNCTION throttle.wait(key text, rate integer, per interval, burst integer DEFAULT NULL,
                              cost integer DEFAULT 1, timeout interval DEFAULT NULL)
RETURNS boolean
AS 'MODULE_PATHNAME', 'pg_throttle_wait'
LANGUAGE C VOLATILE PARALLEL UNSAFE;
COMMENT ON FUNCTION throttle.wait(text, integer, interval, integer, integer, interval) IS
    'Blocks until the request is allowed, then returns true; returns false at once when the wait would exceed timeout (NULL: no limit). Waiters of one key pass in arrival order.';

-- timeout before cost: (key, integer, interval) then stays the form above
-- alone, and no positional call can match both.
CREATE FUNCTION throttle.wait(key text, timeout interval DEFAULT NULL, cost integer DEFAULT 1)
RETURNS boolean
AS 'MODULE_PATHNAME', 'pg_throttle_wait_declared'
LANGUAGE C VOLATILE PARALLEL UNSAFE;
COMMENT ON FUNCTION throttle.wait(text, interval, integer) IS
    'throttle.wait with rate, per and burst declared for key in throttle.bucket: throttle.wait(''mail-provider'', timeout => ''30 seconds'').';

--
-- Locks and leases with fence tokens.
--
CREATE FUNCTION throttle.lock(name text, ttl interval DEFAULT NULL, wait interval DEFAULT '0',
                              holder text DEFAULT NULL)
RETURNS bigint
AS 'MODULE_PATHNAME', 'pg_throttle_lock'
LANGUAGE C VOLATILE PARALLEL UNSAFE;
COMMENT ON FUNCTION throttle.lock(text, interval, interval, text) IS
    'Takes the named lock and returns its fence token, or NULL when it could not be had within wait (NULL: no limit). ttl NULL: a session lock, held until unlocked or the session ends; ttl given: a lease that expires ttl after the grant unless renewed. Waiters are served in arrival order.';

CREATE FUNCTION throttle.unlock(name text, token bigint)
RETURNS boolean
AS 'MODULE_PATHNAME', 'pg_throttle_unlock'
LANGUAGE C VOLATILE PARALLEL UNSAFE;
COMMENT ON FUNCTION throttle.unlock(text, bigint) IS
    'Releases the lock if token is its current fence token (the next waiter gets it); false for a stale token or a lock not held, and likewise for another role (unless a member of the holding role or a superuser) or, for a session lock, another session.';

CREATE FUNCTION throttle.renew(name text, token bigint, ttl interval)
RETURNS boolean
AS 'MODULE_PATHNAME', 'pg_throttle_renew'
LANGUAGE C VOLATILE PARALLEL UNSAFE;
COMMENT ON FUNCTION throttle.renew(text, bigint, interval) IS
    'Extends a lease held with token to expire ttl from now; false if the token is no longer current, and likewise for another role (unless a member of the holding role or a superuser).';

--
-- Operator controls.
--
CREATE FUNCTION throttle.reset(name text, kind text DEFAULT NULL)
RETURNS integer
AS 'MODULE_PATHNAME', 'pg_throttle_reset'
LANGUAGE C VOLATILE PARALLEL UNSAFE;
COMMENT ON FUNCTION throttle.reset(text, text) IS
    'Clears the registry entries named name in this database (kind resource, bucket, queue_bucket, group_bucket or lock; NULL: all of them; a group''s bucket is named after its queue and group as throttle.status shows it) and returns how many; a cleared resource or lock can be granted at once, a cleared bucket is full. Kind group, a group''s lease, is refused (22023): the claimed events would still hold the group; throttle.release_group ends that claim. For operators after an incident: not granted to PUBLIC.';
REVOKE EXECUTE ON FUNCTION throttle.reset(text, text) FROM PUBLIC;

CREATE FUNCTION throttle.checkpoint()
RETURNS bigint
AS 'MODULE_PATHNAME', 'pg_throttle_checkpoint'
LANGUAGE C VOLATILE PARALLEL UNSAFE;
COMMENT ON FUNCTION throttle.checkpoint() IS
    'Writes the checkpoint of the registry''s resources now (the background worker does so every pg_throttle.checkpoint_interval) and returns how many it wrote. After a crash, resources granted before the last checkpoint come back exactly. For operators: not granted to PUBLIC.';
REVOKE EXECUTE ON FUNCTION throttle.checkpoint() FROM PUBLIC;

CREATE FUNCTION throttle.advance_fence(past bigint)
RETURNS bigint
AS 'MODULE_PATHNAME', 'pg_throttle_advance_fence'
LANGUAGE C VOLATILE PARALLEL UNSAFE;
COMMENT ON FUNCTION throttle.advance_fence(bigint) IS
    'Makes every fence token handed out from now on (lock grants, queue claims) greater than past, durably: also after a crash and on a standby promoted later. Returns the floor, the token every later one exceeds (past 0 changes nothing and shows it). After a dump restored into another cluster, pass the old cluster''s floor or the greatest token in the restored data. Server-wide; superusers only, on the primary; past from 0 to 2^62.';
REVOKE EXECUTE ON FUNCTION throttle.advance_fence(bigint) FROM PUBLIC;

--
-- Operator view of the shared-memory registry.
--
CREATE FUNCTION throttle.registry_entries(
    OUT kind text, OUT name text, OUT holder text, OUT holder_pid integer,
    OUT granted_at timestamptz, OUT next_grant_at timestamptz,
    OUT grants bigint, OUT denials bigint,
    OUT rate integer, OUT per interval, OUT burst integer, OUT remaining integer,
    OUT token bigint, OUT waiters integer, OUT owner regrole)
RETURNS SETOF record
AS 'MODULE_PATHNAME', 'pg_throttle_registry_entries'
LANGUAGE C VOLATILE PARALLEL UNSAFE;
COMMENT ON FUNCTION throttle.registry_entries() IS
    'The registry entries of this database that are still in force; see the view throttle.status. A lock''s token is NULL unless the caller is the role holding it, a member of it or a superuser.';

CREATE VIEW throttle.status AS
    SELECT kind, name, owner, holder, holder_pid, granted_at, next_grant_at, grants, denials,
           rate, per, burst, remaining, token, waiters
    FROM throttle.registry_entries();
COMMENT ON VIEW throttle.status IS
    'One row per registry entry of this database still in force: resources whose interval has not passed, buckets that are not full, locks that are held. The role the entry belongs to (its creator; for a lock, the role holding it), who was granted last, when, when it can next be granted, grants and denials since the entry was created; for buckets rate, per, burst and the units remaining; for locks the fence token (NULL unless the viewer is the owner, a member of it or a superuser) and the number of waiters.';
COMMENT ON COLUMN throttle.status.kind IS
    'resource, bucket, lock; for the event queue group (a group''s lease, held by a claim_group claim), queue_bucket and group_bucket (throttle.queue_bucket, throttle.group_bucket). throttle.reset clears every kind but group, which throttle.release_group ends.';
COMMENT ON COLUMN throttle.status.next_grant_at IS
    'When the entry next grants a call: for a resource, the end of its interval; for a bucket, when one more unit is back (now when one is left); for a lock or a group''s lease, the end of the lease (infinity for a session lock), which throttle.locks shows as expires_at.';
GRANT SELECT ON throttle.status TO PUBLIC;

CREATE VIEW throttle.locks AS
    SELECT name, owner, holder, holder_pid, granted_at,
           CASE WHEN next_grant_at = 'infinity' THEN NULL ELSE next_grant_at END AS expires_at,
           next_grant_at = 'infinity' AS session, token, waiters
    FROM throttle.registry_entries()
    WHERE kind = 'lock';
COMMENT ON VIEW throttle.locks IS
    'The locks of this database that are held: the role holding it, holder, backend pid, when granted, when the lease expires (NULL: a session lock, held until unlocked or the session ends), fence token (NULL unless the viewer is the owner, a member of it or a superuser), backends waiting.';
COMMENT ON COLUMN throttle.locks.expires_at IS
    'When the lease ends unless renewed or released first; NULL for a session lock, held until unlocked or its session ends. throttle.status shows the same instant as next_grant_at.';
GRANT SELECT ON throttle.locks TO PUBLIC;

CREATE FUNCTION throttle.registry_usage(
    OUT scope text, OUT name text, OUT entries bigint, OUT quota bigint)
RETURNS SETOF record
AS 'MODULE_PATHNAME', 'pg_throttle_registry_usage'
LANGUAGE C VOLATILE PARALLEL UNSAFE;
COMMENT ON FUNCTION throttle.registry_usage() IS
    'How many registry entries each role and each database holds, and its quota: the one its own settings give it (ALTER ROLE, ALTER DATABASE ... SET, the server''s configuration), not the caller''s (all rows for superusers and pg_read_all_stats; else this database and the roles whose privileges the caller has); see the view throttle.usage.';

CREATE VIEW throttle.usage AS
    SELECT scope, name, entries, quota,
           round(100.0 * entries / current_setting('pg_throttle.max_entries')::bigint, 2)
               AS percent_of_registry
    FROM throttle.registry_usage();
COMMENT ON VIEW throttle.usage IS
    'One row per role (scope ''role'') and per database (scope ''database'') holding registry entries, server-wide: how many, the quota that applies to it (pg_throttle.role_quota for a role''s sessions in this database, pg_throttle.database_quota for the database, in entries, by the settings ALTER ROLE and ALTER DATABASE ... SET stored and the server''s configuration, not by the viewer''s; NULL at 100: no quota) and the share of pg_throttle.max_entries used.';
GRANT SELECT ON throttle.usage TO PUBLIC;

--
-- What an operator graphs and alerts on (monitoring/queries.yaml, for
-- prometheus-postgres-exporter).
--
CREATE FUNCTION throttle.registry_metrics(
    OUT kind text, OUT entries bigint, OUT in_force bigint, OUT capacity bigint,
    OUT grants bigint, OUT denials bigint, OUT waiters bigint)
RETURNS SETOF record
AS 'MODULE_PATHNAME', 'pg_throttle_registry_metrics'
LANGUAGE C VOLATILE PARALLEL UNSAFE;
COMMENT ON FUNCTION throttle.registry_metrics() IS
    'Server-wide totals of the shared-memory registry per kind; see the view throttle.registry_metrics. Sums every database and role: not granted to PUBLIC, granted to pg_read_all_stats (and so to pg_monitor).';
REVOKE EXECUTE ON FUNCTION throttle.registry_metrics() FROM PUBLIC;
GRANT EXECUTE ON FUNCTION throttle.registry_metrics() TO pg_read_all_stats;

CREATE VIEW throttle.registry_metrics AS
    SELECT kind, entries, in_force, capacity, grants, denials, waiters
    FROM throttle.registry_metrics();
COMMENT ON VIEW throttle.registry_metrics IS
    'One row per kind of registry entry (resource, bucket, lock, group, queue_bucket, group_bucket), server-wide: entries held (in force or not yet reclaimed), entries in force by the real clock, the registry''s capacity (pg_throttle.max_entries, shared by every kind), grants and denials since the server started (counters: entries dropped since keep their share; entries restored from a checkpoint bring theirs), and backends waiting for a lock or a group. For superusers and pg_read_all_stats (pg_monitor).';
REVOKE SELECT ON throttle.registry_metrics FROM PUBLIC;
GRANT SELECT ON throttle.registry_metrics TO pg_read_all_stats;

--
-- Scale-out with Citus (docs/operations.md, "Scale-out with Citus").
--
CREATE FUNCTION throttle.distribute(shard_count integer DEFAULT NULL)
RETURNS integer
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $distribute$
DECLARE
    shards integer;
    marked integer;
    fn regprocedure;
    distributed integer := 0;
BEGIN
    IF NOT EXISTS (SELECT FROM pg_extension WHERE extname = 'citus') THEN
        RAISE EXCEPTION 'throttle.distribute needs the citus extension'
            USING ERRCODE = '55000',
                  HINT = 'Preload citus before pg_throttle on every node (shared_preload_libraries = ''citus,pg_throttle''), CREATE EXTENSION citus, add the workers, then run throttle.distribute() on the coordinator.';
    END IF;
    IF NOT citus_is_coordinator() THEN
        RAISE EXCEPTION 'throttle.distribute runs on the Citus coordinator'
            USING ERRCODE = '55000';
    END IF;
    IF shard_count IS NOT NULL AND shard_count < 1 THEN
        RAISE EXCEPTION 'shard_count must be positive' USING ERRCODE = '22023';
    END IF;
    IF to_regclass('throttle.key_shard') IS NULL THEN
        -- Keys this node granted would go to workers that never saw them.
        IF EXISTS (SELECT FROM throttle.status
                   WHERE kind IN ('resource', 'bucket', 'lock')) THEN
            RAISE EXCEPTION 'pg_throttle keys are in force on the coordinator'
                USING ERRCODE = '55000',
                      HINT = 'Distribute before the first call, or once throttle.status shows no resource, bucket or lock in force.';
        END IF;
        -- The anchor: its shards are the shards of every key, and its one
        -- row per shard names the shard's first placement (its node and the
        -- OID of its relation there), so that a node tells the shard it was
        -- given at the start from one moved to it.
        CREATE TABLE throttle.key_shard (
            key text PRIMARY KEY,
            shard_id bigint NOT NULL,
            first_group_id bigint NOT NULL,
            first_relid oid NOT NULL);
        COMMENT ON TABLE throttle.key_shard IS
            'Made by throttle.distribute(): the Citus table every key-taking function of pg_throttle is colocated with. One row per shard names its first placement (node group and relation OID). Do not write to it.';
        PERFORM create_distributed_table('throttle.key_shard', 'key', colocate_with => 'none',
            shard_count => coalesce(shard_count, current_setting('citus.shard_count')::integer));
        GRANT SELECT ON throttle.key_shard TO PUBLIC;
        SELECT count(*) INTO shards FROM pg_dist_shard
            WHERE logicalrelid = 'throttle.key_shard'::regclass;
        INSERT INTO throttle.key_shard (key, shard_id, first_group_id, first_relid)
            SELECT DISTINCT ON (k.shard_id) k.key, k.shard_id, p.groupid, 0
            FROM (SELECT i, 'shard ' || i AS key,
                         get_shard_id_for_distribution_column('throttle.key_shard', 'shard ' || i)
                             AS shard_id
                  FROM generate_series(1, 64 * shards) i) k
            JOIN pg_dist_placement p ON p.shardid = k.shard_id
            ORDER BY k.shard_id, k.i;
        -- Run on each shard, tableoid is the shard's relation on its node.
        UPDATE throttle.key_shard SET first_relid = tableoid;
        SELECT count(*) INTO marked FROM throttle.key_shard;
        IF marked <> shards THEN
            RAISE EXCEPTION 'throttle.distribute marked % of % shards', marked, shards;
        END IF;
    ELSIF shard_count IS NOT NULL THEN
        RAISE EXCEPTION 'pg_throttle is already distributed' USING ERRCODE = '55000',
            HINT = 'Call throttle.distribute() without shard_count to distribute functions again.';
    END IF;
    FOR fn IN
        SELECT p.oid::regprocedure FROM pg_proc p
        WHERE p.pronamespace = 'throttle'::regnamespace
          AND p.proname IN ('acquire', 'take', 'allow', 'wait', 'lock', 'unlock', 'renew', 'reset')
        ORDER BY 1
    LOOP
        PERFORM create_distributed_function(fn, '$1', colocate_with => 'throttle.key_shard');
        distributed := distributed + 1;
    END LOOP;
    RETURN distributed;
END
$distribute$;
COMMENT ON FUNCTION throttle.distribute(integer) IS
    'On a Citus coordinator: spreads pg_throttle''s keys over the cluster. Creates and distributes the anchor table throttle.key_shard (shard_count shards; NULL: citus.shard_count) and makes acquire, take, allow, wait, lock, unlock, renew and reset distributed functions colocated with it by their first argument, so that each key''s state lives on the node that holds its shard. Returns how many functions it distributed. Raises 55000 without Citus.';
REVOKE EXECUTE ON FUNCTION throttle.distribute(integer) FROM PUBLIC;
