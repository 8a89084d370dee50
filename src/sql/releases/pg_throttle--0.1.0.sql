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
    'Clears the registry entries named name in this database (kind resource, bucket or lock; NULL: all three) and returns how many; a cleared resource or lock can be granted at once, a cleared bucket is full. For operators after an incident: not granted to PUBLIC.';
REVOKE EXECUTE ON FUNCTION throttle.reset(text, text) FROM PUBLIC;

CREATE FUNCTION throttle.checkpoint()
RETURNS bigint
AS 'MODULE_PATHNAME', 'pg_throttle_checkpoint'
LANGUAGE C VOLATILE PARALLEL UNSAFE;
COMMENT ON FUNCTION throttle.checkpoint() IS
    'Writes the checkpoint of the registry''s resources now (the background worker does so every pg_throttle.checkpoint_interval) and returns how many it wrote. After a crash, resources granted before the last checkpoint come back exactly. For operators: not granted to PUBLIC.';
REVOKE EXECUTE ON FUNCTION throttle.checkpoint() FROM PUBLIC;

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
GRANT SELECT ON throttle.status TO PUBLIC;

CREATE VIEW throttle.locks AS
    SELECT name, owner, holder, holder_pid, granted_at,
           CASE WHEN next_grant_at = 'infinity' THEN NULL ELSE next_grant_at END AS expires_at,
           next_grant_at = 'infinity' AS session, token, waiters
    FROM throttle.registry_entries()
    WHERE kind = 'lock';
COMMENT ON VIEW throttle.locks IS
    'The locks of this database that are held: the role holding it, holder, backend pid, when granted, when the lease expires (NULL: a session lock, held until unlocked or the session ends), fence token (NULL unless the viewer is the owner, a member of it or a superuser), backends waiting.';
GRANT SELECT ON throttle.locks TO PUBLIC;

CREATE FUNCTION throttle.registry_usage(
    OUT scope text, OUT name text, OUT entries bigint, OUT quota bigint)
RETURNS SETOF record
AS 'MODULE_PATHNAME', 'pg_throttle_registry_usage'
LANGUAGE C VOLATILE PARALLEL UNSAFE;
COMMENT ON FUNCTION throttle.registry_usage() IS
    'How many registry entries each role and each database holds (all of them for superusers and pg_read_all_stats; else this database and the roles whose privileges the caller has); see the view throttle.usage.';

CREATE VIEW throttle.usage AS
    SELECT scope, name, entries, quota,
           round(100.0 * entries / current_setting('pg_throttle.max_entries')::bigint, 2)
               AS percent_of_registry
    FROM throttle.registry_usage();
COMMENT ON VIEW throttle.usage IS
    'One row per role (scope ''role'') and per database (scope ''database'') holding registry entries, server-wide: how many, the quota that applies (pg_throttle.role_quota or pg_throttle.database_quota, in entries, by the viewing session''s settings; NULL at 100: no quota) and the share of pg_throttle.max_entries used.';
GRANT SELECT ON throttle.usage TO PUBLIC;

--
-- The scheduled event queue (appended to pg_throttle.sql by the build).
--
-- Events are rows: persisted, transactional, traceable. Times come from
-- throttle.now(), the extension's clock (pg_throttle.test_clock in tests).
-- Group ownership lives in shared memory as a lease of the lock registry
-- (fast), and the claimed rows with their lease_until are the durable truth:
-- a group with a claimed event whose lease holds is never handed to another
-- worker, also after a restart has emptied shared memory.
--
CREATE FUNCTION throttle.now()
RETURNS timestamptz
AS 'MODULE_PATHNAME', 'pg_throttle_now'
LANGUAGE C VOLATILE PARALLEL UNSAFE;
COMMENT ON FUNCTION throttle.now() IS
    'The time as pg_throttle sees it: pg_throttle.test_clock when set, otherwise the real clock (not the transaction start).';

CREATE TABLE throttle.event (
    id            bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    queue         text NOT NULL CHECK (queue <> '' AND octet_length(queue) <= 63),
    item_key      text NOT NULL CHECK (item_key <> ''),
    group_key     text,
    payload       jsonb NOT NULL DEFAULT '{}',
    run_at        timestamptz NOT NULL,
    state         text NOT NULL DEFAULT 'pending'
                  CHECK (state IN ('pending', 'claimed', 'done', 'dead', 'cancelled')),
    attempts      integer NOT NULL DEFAULT 0,
    max_attempts  integer NOT NULL DEFAULT 5 CHECK (max_attempts > 0),
    enqueued_at   timestamptz NOT NULL,
    enqueued_by   text NOT NULL,
    claimed_at    timestamptz,
    claimed_by    text,
    claim_token   bigint,
    lease_until   timestamptz,
    completed_at  timestamptz,
    completed_by  text,
    cancelled_at  timestamptz,
    last_error    text
);
COMMENT ON TABLE throttle.event IS
    'The scheduled event queue. state: pending (waits for run_at), claimed (a worker holds it until lease_until), done, dead (max_attempts used up; throttle.retry brings it back), cancelled. Rows are kept until throttle.purge.';
COMMENT ON COLUMN throttle.event.item_key IS 'Natural key, unique among the unfinished (pending or claimed) events of a queue.';
COMMENT ON COLUMN throttle.event.group_key IS 'Events of one group are claimed together by throttle.claim_group, by one worker at a time.';
COMMENT ON COLUMN throttle.event.attempts IS 'Claims so far; a claim beyond max_attempts makes the event dead.';
COMMENT ON COLUMN throttle.event.claim_token IS 'Fence token of the current claim (the group lease''s token for group claims).';

-- Every function below finds its rows through one of these, whatever the
-- number of pending, claimed or finished events. complete, fail and extend
-- look events up by id; they test the state as upper(state) so that the
-- planner cannot pick a partial index on state instead, which under churn
-- holds many dead entries until vacuum.
CREATE UNIQUE INDEX event_unfinished_key ON throttle.event (queue, item_key)
    WHERE state IN ('pending', 'claimed');
CREATE INDEX event_due_single ON throttle.event (queue, run_at, id)
    WHERE state = 'pending' AND group_key IS NULL;
CREATE INDEX event_due_grouped ON throttle.event (queue, run_at, id)
    WHERE state = 'pending' AND group_key IS NOT NULL;
CREATE INDEX event_leases_single ON throttle.event (queue, lease_until, id)
    WHERE state = 'claimed' AND group_key IS NULL;
CREATE INDEX event_leases_grouped ON throttle.event (queue, lease_until, id)
    WHERE state = 'claimed' AND group_key IS NOT NULL;
CREATE INDEX event_groups ON throttle.event (queue, group_key, run_at)
    WHERE state IN ('pending', 'claimed') AND group_key IS NOT NULL;
CREATE INDEX event_claimed_groups ON throttle.event (queue, group_key, claim_token)
    WHERE state = 'claimed' AND group_key IS NOT NULL;
CREATE INDEX event_finished ON throttle.event (coalesce(completed_at, cancelled_at))
    WHERE state IN ('done', 'dead', 'cancelled');

GRANT SELECT ON throttle.event TO PUBLIC;
SELECT pg_catalog.pg_extension_config_dump('throttle.event', '');

CREATE FUNCTION throttle._require(value anyelement, what text)
RETURNS void
LANGUAGE plpgsql IMMUTABLE AS $$
#variable_conflict use_column
BEGIN
    IF value IS NULL THEN
        RAISE EXCEPTION '% must not be NULL', what USING ERRCODE = 'null_value_not_allowed';
    END IF;
END
$$;
COMMENT ON FUNCTION throttle._require(anyelement, text) IS 'Internal: raises 22004 naming the argument when it is NULL.';

CREATE FUNCTION throttle._positive(value interval, what text)
RETURNS void
LANGUAGE plpgsql IMMUTABLE AS $$
#variable_conflict use_column
BEGIN
    PERFORM throttle._require(value, what);
    IF value <= interval '0' THEN
        RAISE EXCEPTION '% must be a positive interval', what USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF NOT isfinite(value) THEN  -- PostgreSQL 17 and later have 'infinity'
        RAISE EXCEPTION '% must be a finite interval', what USING ERRCODE = 'invalid_parameter_value';
    END IF;
END
$$;
COMMENT ON FUNCTION throttle._positive(interval, text) IS 'Internal: raises 22004 or 22023 unless the interval is positive and finite.';

-- A group's lease: in shared memory, a kind of its own (no throttle.lock name
-- reaches it), not journaled: the claimed rows are the durable truth.
CREATE FUNCTION throttle._group_take(queue text, group_key text, worker text, lease interval)
RETURNS bigint
AS 'MODULE_PATHNAME', 'pg_throttle_group_take'
LANGUAGE C VOLATILE PARALLEL UNSAFE;
COMMENT ON FUNCTION throttle._group_take(text, text, text, interval) IS
    'Internal: takes the lease that holds a group of a queue; its fence token, or NULL when another worker holds it.';
REVOKE EXECUTE ON FUNCTION throttle._group_take(text, text, text, interval) FROM PUBLIC;

CREATE FUNCTION throttle._group_release(queue text, group_key text, token bigint)
RETURNS boolean
AS 'MODULE_PATHNAME', 'pg_throttle_group_release'
LANGUAGE C VOLATILE PARALLEL UNSAFE;
COMMENT ON FUNCTION throttle._group_release(text, text, bigint) IS
    'Internal: releases a group''s lease held with token.';
REVOKE EXECUTE ON FUNCTION throttle._group_release(text, text, bigint) FROM PUBLIC;

CREATE FUNCTION throttle._group_renew(queue text, group_key text, token bigint, lease interval)
RETURNS boolean
AS 'MODULE_PATHNAME', 'pg_throttle_group_renew'
LANGUAGE C VOLATILE PARALLEL UNSAFE;
COMMENT ON FUNCTION throttle._group_renew(text, text, bigint, interval) IS
    'Internal: extends a group''s lease held with token to lease from now.';
REVOKE EXECUTE ON FUNCTION throttle._group_renew(text, text, bigint, interval) FROM PUBLIC;

CREATE FUNCTION throttle._caller()
RETURNS text
LANGUAGE sql STABLE AS $$
    SELECT current_user || coalesce(' (' || nullif(current_setting('application_name'), '') || ')', '')
$$;
COMMENT ON FUNCTION throttle._caller() IS 'Internal: who is calling, for enqueued_by.';

CREATE FUNCTION throttle.schedule(queue text, item_key text, run_at timestamptz,
                                  payload jsonb DEFAULT '{}', group_key text DEFAULT NULL,
                                  max_attempts integer DEFAULT 5)
RETURNS bigint
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
#variable_conflict use_column
DECLARE
    event_id bigint;
    now timestamptz := throttle.now();
BEGIN
    PERFORM throttle._require(queue, 'queue'), throttle._require(item_key, 'item_key'),
            throttle._require(run_at, 'run_at'), throttle._require(payload, 'payload'),
            throttle._require(max_attempts, 'max_attempts');
    IF max_attempts <= 0 THEN
        RAISE EXCEPTION 'max_attempts must be positive' USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF queue = '' OR octet_length(queue) > 63 THEN
        RAISE EXCEPTION 'queue name must have 1 to 63 bytes' USING ERRCODE = 'invalid_parameter_value',
              DETAIL = 'The queue name is also the NOTIFY channel that workers LISTEN on.';
    END IF;
    IF item_key = '' THEN
        RAISE EXCEPTION 'item_key must not be empty' USING ERRCODE = 'invalid_parameter_value';
    END IF;
    INSERT INTO throttle.event AS e (queue, item_key, group_key, payload, run_at, max_attempts,
                                     enqueued_at, enqueued_by)
    VALUES (queue, item_key, group_key, payload, run_at, max_attempts, now, throttle._caller())
    ON CONFLICT (queue, item_key) WHERE state IN ('pending', 'claimed')
    DO UPDATE SET run_at = excluded.run_at, payload = excluded.payload
    RETURNING e.id INTO event_id;
    IF run_at <= now THEN
        PERFORM pg_notify(queue, event_id::text);
    END IF;
    RETURN event_id;
END
$$;
COMMENT ON FUNCTION throttle.schedule(text, text, timestamptz, jsonb, text, integer) IS
    'Schedules an event, or, when item_key names an unfinished event of the queue, moves it to run_at with the new payload; returns its id. NOTIFYs the channel named after the queue when the event is due.';

CREATE FUNCTION throttle.cancel(queue text, item_key text)
RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
#variable_conflict use_column
BEGIN
    PERFORM throttle._require(queue, 'queue'), throttle._require(item_key, 'item_key');
    UPDATE throttle.event e SET state = 'cancelled', cancelled_at = throttle.now()
    WHERE e.queue = cancel.queue AND e.item_key = cancel.item_key AND e.state = 'pending';
    RETURN FOUND;
END
$$;
COMMENT ON FUNCTION throttle.cancel(text, text) IS
    'Cancels the pending event item_key of the queue; false when there is none. The row stays, state cancelled.';

CREATE FUNCTION throttle.reschedule(queue text, item_key text, run_at timestamptz)
RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
#variable_conflict use_column
DECLARE
    event_id bigint;
BEGIN
    PERFORM throttle._require(queue, 'queue'), throttle._require(item_key, 'item_key'),
            throttle._require(run_at, 'run_at');
    UPDATE throttle.event e SET run_at = reschedule.run_at
    WHERE e.queue = reschedule.queue AND e.item_key = reschedule.item_key AND e.state = 'pending'
    RETURNING e.id INTO event_id;
    IF event_id IS NOT NULL AND run_at <= throttle.now() THEN
        PERFORM pg_notify(queue, event_id::text);
    END IF;
    RETURN event_id IS NOT NULL;
END
$$;
COMMENT ON FUNCTION throttle.reschedule(text, text, timestamptz) IS
    'Moves the pending event item_key of the queue to run_at; false when there is none.';

-- Marks the events `ids` claimed by `worker` until now + lease with `token`;
-- an event whose attempts are used up becomes dead instead.
CREATE FUNCTION throttle._mark_claimed(ids bigint[], worker text, lease interval, token bigint,
                                       now timestamptz)
RETURNS SETOF throttle.event
LANGUAGE sql AS $$
    WITH dead AS (
        UPDATE throttle.event SET state = 'dead', completed_at = now,
               last_error = coalesce(last_error, 'lease expired ' || attempts || ' times')
        WHERE id = ANY (ids) AND attempts >= max_attempts
    )
    UPDATE throttle.event
    SET state = 'claimed', claimed_at = now, claimed_by = worker, lease_until = now + lease,
        claim_token = token, attempts = attempts + 1
    WHERE id = ANY (ids) AND attempts < max_attempts
    RETURNING *
$$;
COMMENT ON FUNCTION throttle._mark_claimed(bigint[], text, interval, bigint, timestamptz) IS
    'Internal: claims events for a worker, or makes dead those whose attempts are used up.';

-- Whether a group of the queue is held by a claim whose lease holds (the durable truth).
CREATE FUNCTION throttle._group_held(queue text, group_key text, now timestamptz)
RETURNS boolean
LANGUAGE sql STABLE AS $$
    -- By group (event_claimed_groups), never by lease time: under churn the
    -- lease index holds many dead entries until vacuum.
    SELECT EXISTS (SELECT 1 FROM throttle.event e
                   WHERE e.queue = _group_held.queue AND e.group_key = _group_held.group_key
                     AND e.state = 'claimed' AND e.group_key IS NOT NULL
                     AND (e.lease_until > now) IS TRUE)
$$;
COMMENT ON FUNCTION throttle._group_held(text, text, timestamptz) IS
    'Internal: whether a claim whose lease holds covers the group.';

CREATE FUNCTION throttle.claim(queue text, worker text, lease interval DEFAULT '5 minutes',
                               max integer DEFAULT 1)
RETURNS SETOF throttle.event
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
#variable_conflict use_column
DECLARE
    now timestamptz := throttle.now();
    expired bigint[];
    due bigint[];
BEGIN
    PERFORM throttle._require(queue, 'queue'), throttle._require(worker, 'worker'),
            throttle._require(max, 'max');
    PERFORM throttle._positive(lease, 'lease');
    IF max <= 0 THEN
        RAISE EXCEPTION 'max must be positive' USING ERRCODE = 'invalid_parameter_value';
    END IF;
    -- Claims whose lease expired, then due pending events; oldest first. Rows
    -- another worker is claiming right now are skipped, never waited for.
    -- Events with a group_key belong to throttle.claim_group.
    SELECT array_agg(id) INTO expired FROM (
        SELECT e.id FROM throttle.event e
        WHERE e.queue = claim.queue AND e.state = 'claimed' AND e.lease_until <= now
          AND e.group_key IS NULL
        ORDER BY e.lease_until, e.id LIMIT max FOR UPDATE SKIP LOCKED) AS x;
    SELECT array_agg(id) INTO due FROM (
        SELECT e.id FROM throttle.event e
        WHERE e.queue = claim.queue AND e.state = 'pending' AND e.run_at <= now
          AND e.group_key IS NULL
        ORDER BY e.run_at, e.id LIMIT max - coalesce(cardinality(expired), 0)
        FOR UPDATE SKIP LOCKED) AS x;
    RETURN QUERY SELECT * FROM throttle._mark_claimed(coalesce(expired, '{}') || coalesce(due, '{}'),
                                                     worker, lease, NULL, now)
                 ORDER BY run_at, id;
END
$$;
COMMENT ON FUNCTION throttle.claim(text, text, interval, integer) IS
    'Claims up to max due events without a group_key for worker until lease: claims whose lease expired, then pending events with run_at <= now, oldest first; never waits for rows another worker is claiming. Grouped events are claimed with throttle.claim_group.';

-- Claims the due events of one group if it is free; no rows when it is not.
CREATE FUNCTION throttle._claim_one_group(queue text, group_key text, worker text, lease interval,
                                          now timestamptz)
RETURNS SETOF throttle.event
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    token bigint := throttle._group_take(queue, group_key, worker, lease);
    ids bigint[];
BEGIN
    IF token IS NULL THEN
        RETURN;  -- another worker holds the group (shared memory)
    END IF;
    IF throttle._group_held(queue, group_key, now) THEN
        -- A claim from before a restart still holds it: the table says so.
        PERFORM throttle._group_release(queue, group_key, token);
        RETURN;
    END IF;
    SELECT array_agg(e.id) INTO ids FROM throttle.event e
    WHERE e.queue = _claim_one_group.queue AND e.group_key = _claim_one_group.group_key
      AND e.group_key IS NOT NULL AND e.state IN ('pending', 'claimed')  -- event_groups
      AND (e.state = 'claimed' OR e.run_at <= now);
    RETURN QUERY SELECT * FROM throttle._mark_claimed(ids, worker, lease, token, now)
                 ORDER BY run_at, id;
    IF NOT FOUND THEN  -- every due event was out of attempts
        PERFORM throttle._group_release(queue, group_key, token);
    END IF;
END
$$;
COMMENT ON FUNCTION throttle._claim_one_group(text, text, text, interval, timestamptz) IS
    'Internal: takes the group''s lease and claims its due events, or nothing when the group is held.';

CREATE FUNCTION throttle.claim_group(queue text, worker text, lease interval DEFAULT '5 minutes')
RETURNS SETOF throttle.event
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
#variable_conflict use_column
DECLARE
    now timestamptz := throttle.now();
    candidate record;
    tried text[] := '{}';
    after_at timestamptz;
    after_id bigint;
    seen boolean;
BEGIN
    PERFORM throttle._require(queue, 'queue'), throttle._require(worker, 'worker');
    PERFORM throttle._positive(lease, 'lease');
    -- Groups left behind by a worker whose lease expired, then groups with
    -- due events, oldest first, read in batches along an index (keyset), so a
    -- call reads only as far as the first free group. A group held by
    -- another worker costs one shared-memory lookup to skip.
    FOR pass IN 1 .. 2 LOOP
        after_at := '-infinity';
        after_id := 0;
        LOOP
            seen := false;
            FOR candidate IN
                SELECT e.group_key, e.at, e.id FROM (
                    SELECT e.group_key, e.lease_until AS at, e.id FROM throttle.event e
                    WHERE pass = 1 AND e.queue = claim_group.queue AND e.state = 'claimed'
                      AND e.group_key IS NOT NULL AND e.lease_until <= now
                      AND (e.lease_until, e.id) > (after_at, after_id)
                    ORDER BY e.lease_until, e.id LIMIT 64) AS e
                UNION ALL
                SELECT e.group_key, e.at, e.id FROM (
                    SELECT e.group_key, e.run_at AS at, e.id FROM throttle.event e
                    WHERE pass = 2 AND e.queue = claim_group.queue AND e.state = 'pending'
                      AND e.group_key IS NOT NULL AND e.run_at <= now
                      AND (e.run_at, e.id) > (after_at, after_id)
                    ORDER BY e.run_at, e.id LIMIT 64) AS e
            LOOP
                seen := true;
                after_at := candidate.at;
                after_id := candidate.id;
                CONTINUE WHEN candidate.group_key = ANY (tried);
                tried := tried || candidate.group_key;
                RETURN QUERY SELECT * FROM throttle._claim_one_group(queue, candidate.group_key, worker,
                                                                    lease, now);
                IF FOUND THEN
                    RETURN;
                END IF;
            END LOOP;
            EXIT WHEN NOT seen;
        END LOOP;
    END LOOP;
END
$$;
COMMENT ON FUNCTION throttle.claim_group(text, text, interval) IS
    'Claims every due event of one group of the queue for worker until lease. While the lease holds no other worker gets any event of that group, including events that become due meanwhile. Returns no rows when no group is free.';

-- Releases group leases whose claims are all finished.
CREATE FUNCTION throttle._release_groups(finished throttle.event[])
RETURNS void
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    g record;
BEGIN
    FOR g IN SELECT DISTINCT f.queue, f.group_key, f.claim_token FROM unnest(finished) AS f
             WHERE f.group_key IS NOT NULL
    LOOP
        IF NOT EXISTS (SELECT 1 FROM throttle.event e
                       WHERE e.queue = g.queue AND e.group_key = g.group_key
                         AND e.state = 'claimed' AND e.group_key IS NOT NULL
                         AND e.claim_token = g.claim_token) THEN
            PERFORM throttle._group_release(g.queue, g.group_key, g.claim_token);
        END IF;
    END LOOP;
END
$$;
COMMENT ON FUNCTION throttle._release_groups(throttle.event[]) IS
    'Internal: releases the group leases of claims that have no claimed event left.';

CREATE FUNCTION throttle.complete(ids bigint[], worker text)
RETURNS integer
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
#variable_conflict use_column
DECLARE
    finished throttle.event[];
BEGIN
    PERFORM throttle._require(ids, 'ids'), throttle._require(worker, 'worker');
    WITH done AS (
        UPDATE throttle.event e SET state = 'done', completed_at = throttle.now(),
               completed_by = worker, lease_until = NULL
        WHERE e.id = ANY (ids) AND upper(e.state) = 'CLAIMED' AND e.claimed_by = worker
        RETURNING e.*)
    SELECT array_agg(d) INTO finished FROM done d;
    PERFORM throttle._release_groups(finished);
    RETURN coalesce(cardinality(finished), 0);
END
$$;
COMMENT ON FUNCTION throttle.complete(bigint[], text) IS
    'Marks the events done, if worker holds their current claim; returns how many. A worker whose claim was taken over gets 0.';

CREATE FUNCTION throttle.fail(ids bigint[], worker text, error text, retry_in interval DEFAULT NULL)
RETURNS integer
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
#variable_conflict use_column
DECLARE
    now timestamptz := throttle.now();
    finished throttle.event[];
BEGIN
    PERFORM throttle._require(ids, 'ids'), throttle._require(worker, 'worker');
    IF retry_in IS NOT NULL AND retry_in < interval '0' THEN
        RAISE EXCEPTION 'retry_in must not be negative' USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF retry_in IS NOT NULL AND NOT isfinite(retry_in) THEN
        RAISE EXCEPTION 'retry_in must be a finite interval' USING ERRCODE = 'invalid_parameter_value';
    END IF;
    WITH failed AS (
        UPDATE throttle.event e
        SET last_error = error, lease_until = NULL,
            state = CASE WHEN e.attempts >= e.max_attempts THEN 'dead' ELSE 'pending' END,
            completed_at = CASE WHEN e.attempts >= e.max_attempts THEN now END,
            run_at = CASE WHEN e.attempts >= e.max_attempts THEN e.run_at
                          ELSE now + coalesce(retry_in,
                               least(interval '1 hour', interval '10 seconds' * 2 ^ (e.attempts - 1)))
                     END
        WHERE e.id = ANY (ids) AND upper(e.state) = 'CLAIMED' AND e.claimed_by = worker
        RETURNING e.*)
    SELECT array_agg(f) INTO finished FROM failed f;
    PERFORM throttle._release_groups(finished);
    RETURN coalesce(cardinality(finished), 0);
END
$$;
COMMENT ON FUNCTION throttle.fail(bigint[], text, text, interval) IS
    'Records a failed attempt: keeps the error and retries after retry_in, or 10 s * 2^(attempts-1) up to 1 hour; after max_attempts the event is dead. Only the worker holding the current claim; returns how many.';

CREATE FUNCTION throttle.extend(ids bigint[], worker text, lease interval)
RETURNS integer
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
#variable_conflict use_column
DECLARE
    now timestamptz := throttle.now();
    extended integer;
    g record;
BEGIN
    PERFORM throttle._require(ids, 'ids'), throttle._require(worker, 'worker');
    PERFORM throttle._positive(lease, 'lease');
    UPDATE throttle.event e SET lease_until = now + lease
    WHERE e.id = ANY (ids) AND upper(e.state) = 'CLAIMED' AND e.claimed_by = worker;
    GET DIAGNOSTICS extended = ROW_COUNT;
    FOR g IN SELECT DISTINCT e.queue, e.group_key, e.claim_token FROM throttle.event e
             WHERE e.id = ANY (ids) AND upper(e.state) = 'CLAIMED' AND e.claimed_by = worker
               AND e.group_key IS NOT NULL
    LOOP
        PERFORM throttle._group_renew(g.queue, g.group_key, g.claim_token, lease);
    END LOOP;
    RETURN extended;
END
$$;
COMMENT ON FUNCTION throttle.extend(bigint[], text, interval) IS
    'Extends the claim of worker on the events to lease from now (and the group''s lease); returns how many.';

CREATE FUNCTION throttle.retry(id bigint)
RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
#variable_conflict use_column
BEGIN
    PERFORM throttle._require(id, 'id');
    UPDATE throttle.event e SET state = 'pending', attempts = 0, run_at = throttle.now(),
           completed_at = NULL
    WHERE e.id = retry.id AND e.state = 'dead'
      AND NOT EXISTS (SELECT 1 FROM throttle.event u
                      WHERE u.queue = e.queue AND u.item_key = e.item_key
                        AND u.state IN ('pending', 'claimed'));
    RETURN FOUND;
END
$$;
COMMENT ON FUNCTION throttle.retry(bigint) IS
    'Brings a dead event back: pending, due now, attempts reset; false when it is not dead or its item_key is pending again.';

CREATE FUNCTION throttle.purge(older_than interval)
RETURNS bigint
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
#variable_conflict use_column
DECLARE
    purged bigint;
BEGIN
    PERFORM throttle._require(older_than, 'older_than');
    IF older_than < interval '0' THEN
        RAISE EXCEPTION 'older_than must not be negative' USING ERRCODE = 'invalid_parameter_value';
    END IF;
    DELETE FROM throttle.event
    WHERE state IN ('done', 'dead', 'cancelled')
      AND coalesce(completed_at, cancelled_at) < throttle.now() - older_than;
    GET DIAGNOSTICS purged = ROW_COUNT;
    RETURN purged;
END
$$;
COMMENT ON FUNCTION throttle.purge(interval) IS
    'Deletes finished events (done, dead, cancelled) that finished more than older_than ago; returns how many. The only way rows leave the queue.';
REVOKE EXECUTE ON FUNCTION throttle.purge(interval) FROM PUBLIC;
