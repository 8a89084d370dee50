-- pg_throttle 0.2.0 -> 0.3.0 (ALTER EXTENSION pg_throttle UPDATE).
\echo Use "ALTER EXTENSION pg_throttle UPDATE" to load this file. \quit

-- No table changes: a 0.2.0 dump restores into 0.3.0 as it is.

-- throttle.now() is read once, in a CTE (a volatile one is always
-- materialized): joined as a subquery, a plan that rescans it per event (a
-- nested loop with the events outside) gave each event its own now, and a
-- queue as many rows as distinct instants.
CREATE OR REPLACE VIEW throttle.queue_metrics AS
    WITH n AS MATERIALIZED (SELECT throttle.now() AS now)
    SELECT e.queue,
           count(*) FILTER (WHERE e.state = 'pending' AND e.run_at <= n.now) AS due,
           count(*) FILTER (WHERE e.state = 'pending' AND e.run_at > n.now) AS scheduled,
           count(*) FILTER (WHERE e.state = 'claimed') AS claimed,
           count(*) FILTER (WHERE e.state = 'claimed' AND e.lease_until <= n.now) AS claims_expired,
           count(*) FILTER (WHERE e.state = 'dead') AS dead,
           coalesce(extract(epoch FROM n.now - min(e.run_at) FILTER (
               WHERE e.state = 'pending' AND e.run_at <= n.now)), 0)::double precision
               AS oldest_due_seconds
    FROM throttle.event e CROSS JOIN n
    GROUP BY e.queue, n.now;
-- (CREATE OR REPLACE keeps its comment and the privileges an operator set.)

-- The dead events, for operators: throttle.event's claim_token is not
-- granted, so SELECT * on the table is refused to all but its owner.
CREATE VIEW throttle.dead_events AS
    SELECT e.id, e.queue, e.item_key, e.group_key, e.payload, e.run_at, e.state, e.attempts,
           e.max_attempts, e.enqueued_at, e.enqueued_by, e.claimed_at, e.claimed_by,
           e.lease_until, e.completed_at, e.completed_by, e.cancelled_at, e.last_error,
           e.claimed_role, e.priority, e.failed_at, e.cancelled_by, e.concurrency_key
    FROM throttle.event e
    WHERE e.state = 'dead';
COMMENT ON VIEW throttle.dead_events IS
    'The dead events (max_attempts used up), every column but the claim token: completed_at is when it died, last_error why. throttle.retry brings one back, throttle.purge deletes them when asked.';
GRANT SELECT ON throttle.dead_events TO PUBLIC;

-- throttle.usage shows each row's own quota (src/pg/registry/quota_settings.cpp).
COMMENT ON FUNCTION throttle.registry_usage() IS
    'How many registry entries each role and each database holds, and its quota: the one its own settings give it (ALTER ROLE, ALTER DATABASE ... SET, the server''s configuration), not the caller''s (all rows for superusers and pg_read_all_stats; else this database and the roles whose privileges the caller has); see the view throttle.usage.';
COMMENT ON VIEW throttle.usage IS
    'One row per role (scope ''role'') and per database (scope ''database'') holding registry entries, server-wide: how many, the quota that applies to it (pg_throttle.role_quota for a role''s sessions in this database, pg_throttle.database_quota for the database, in entries, by the settings ALTER ROLE and ALTER DATABASE ... SET stored and the server''s configuration, not by the viewer''s; NULL at 100: no quota) and the share of pg_throttle.max_entries used.';

-- Carrying fence tokens over a migration (a dump restored into another cluster).
CREATE FUNCTION throttle.advance_fence(past bigint)
RETURNS bigint
AS 'MODULE_PATHNAME', 'pg_throttle_advance_fence'
LANGUAGE C VOLATILE PARALLEL UNSAFE;
COMMENT ON FUNCTION throttle.advance_fence(bigint) IS
    'Makes every fence token handed out from now on (lock grants, queue claims) greater than past, durably: also after a crash and on a standby promoted later. Returns the floor, the token every later one exceeds (past 0 changes nothing and shows it). After a dump restored into another cluster, pass the old cluster''s floor or the greatest token in the restored data. Server-wide; superusers only, on the primary; past from 0 to 2^62.';
REVOKE EXECUTE ON FUNCTION throttle.advance_fence(bigint) FROM PUBLIC;
