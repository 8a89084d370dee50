
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
    queue         text NOT NULL,
    item_key      text NOT NULL,
    group_key     text,
    payload       jsonb NOT NULL DEFAULT '{}',
    run_at        timestamptz NOT NULL,
    state         text NOT NULL DEFAULT 'pending',
    attempts      integer NOT NULL DEFAULT 0,
    max_attempts  integer NOT NULL DEFAULT 5,
    enqueued_at   timestamptz NOT NULL,
    enqueued_by   text NOT NULL,
    claimed_at    timestamptz,
    claimed_by    text,
    claim_token   bigint,
    lease_until   timestamptz,
    completed_at  timestamptz,
    completed_by  text,
    cancelled_at  timestamptz,
    last_error    text,
    claimed_role  oid,
    priority      integer NOT NULL DEFAULT 0,
    failed_at     timestamptz,
    cancelled_by  text,
    concurrency_key text
);
COMMENT ON TABLE throttle.event IS
    'The scheduled event queue, the hot table: events pending (waiting for run_at), claimed (a worker holds it until lease_until) and dead (max_attempts used up; throttle.retry brings it back, throttle.purge deletes it when asked). An event that is done or cancelled leaves it, in the same transaction, for throttle.event_history; throttle.all_events shows both.';
COMMENT ON COLUMN throttle.event.item_key IS 'Natural key, unique among the pending events of a queue. A claimed event may have one pending successor with its key, which no worker gets before the claimed one ends.';
COMMENT ON COLUMN throttle.event.group_key IS 'Events of one group are claimed together by throttle.claim_group, by one worker at a time.';
COMMENT ON COLUMN throttle.event.attempts IS 'Claims so far; a claim beyond max_attempts makes the event dead.';
COMMENT ON COLUMN throttle.event.claim_token IS 'Token of the current claim, which complete, fail and extend need (the group lease''s token for group claims). The claimer gets it from claim or claim_group; PUBLIC may read every other column, not this one.';
COMMENT ON COLUMN throttle.event.priority IS 'throttle.claim takes due events with a higher priority first, then the oldest.';
COMMENT ON COLUMN throttle.event.failed_at IS 'When its last attempt failed: throttle.fail, or the end of a lease that expired. throttle.event_attempt keeps every attempt that ended without completing it.';
COMMENT ON COLUMN throttle.event.cancelled_by IS 'Who cancelled it (throttle.cancel''s caller, as enqueued_by); NULL when a newer run of its item_key superseded it.';
COMMENT ON COLUMN throttle.event.concurrency_key IS 'Events of a queue without a group_key that share it are claimed at most throttle.concurrency_policy.max_claimed at once (1 when the queue is not named there), whoever claims them.';
COMMENT ON COLUMN throttle.event.claimed_role IS 'The role that made the current claim (an oid: claimed_role::regrole shows its name): only it, its members and superusers may complete, fail or extend it.';

-- Every function below finds its rows through one of these, whatever the
-- number of pending, claimed or finished events. complete, fail and extend
-- look events up by id; they test the state as upper(state) so that the
-- planner cannot pick a partial index on state instead, which under churn
-- holds many dead entries until vacuum.
CREATE UNIQUE INDEX event_pending_key ON throttle.event (queue, item_key)
    WHERE state = 'pending';
CREATE INDEX event_claimed_key ON throttle.event (queue, item_key)
    WHERE state = 'claimed';
-- Ascending priority: claim finds the highest priority by a backward scan,
-- which starts at the newest events of that priority; a forward scan (or a
-- DESC column) would start at the oldest, past every entry that claims left
-- dead there until vacuum.
CREATE INDEX event_due_single ON throttle.event (queue, priority, run_at, id)
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
CREATE INDEX event_claimed_concurrency ON throttle.event (queue, concurrency_key)
    WHERE state = 'claimed' AND concurrency_key IS NOT NULL;
CREATE INDEX event_pending_concurrency ON throttle.event (queue, concurrency_key, run_at)
    WHERE state = 'pending' AND concurrency_key IS NOT NULL;
CREATE INDEX event_dead ON throttle.event (queue, completed_at)
    WHERE state = 'dead';

-- The rules of a row, checked by a C trigger rather than CHECK constraints,
-- which PostgreSQL builds again at every execution of a statement that
-- writes the table (src/pg/queue/event_check_sql.cpp): the same rules, names
-- and SQLSTATE (23514); and a pending event without attempts left (from a
-- dump of an earlier version) is stored dead.
CREATE FUNCTION throttle._event_check()
RETURNS trigger
AS 'MODULE_PATHNAME', 'pg_throttle_event_check'
LANGUAGE C;
COMMENT ON FUNCTION throttle._event_check() IS
    'Internal: the rules of a row of throttle.event, as a trigger: event_queue_check (queue <> '''' AND octet_length(queue) <= 63), event_item_key_check (item_key <> ''''), event_state_check (state IN (''pending'', ''claimed'', ''dead'')), event_max_attempts_check (max_attempts > 0), event_concurrency_key_ungrouped (concurrency_key IS NULL OR group_key IS NULL); raises 23514 naming the rule. A pending event without attempts left is stored dead, as its next claim would have made it.';
REVOKE EXECUTE ON FUNCTION throttle._event_check() FROM PUBLIC;
CREATE TRIGGER event_check BEFORE INSERT OR UPDATE ON throttle.event
    FOR EACH ROW EXECUTE FUNCTION throttle._event_check();
-- Also under session_replication_role = replica, as CHECK constraints held.
ALTER TABLE throttle.event ENABLE ALWAYS TRIGGER event_check;

-- Every column but the claim's token.
REVOKE SELECT ON throttle.event FROM PUBLIC;
GRANT SELECT (id, queue, item_key, group_key, payload, run_at, state, attempts, max_attempts,
              enqueued_at, enqueued_by, claimed_at, claimed_by, lease_until, completed_at,
              completed_by, cancelled_at, last_error, claimed_role, priority, failed_at,
              cancelled_by, concurrency_key)
    ON throttle.event TO PUBLIC;
SELECT pg_catalog.pg_extension_config_dump('throttle.event', '');
-- The identity's sequence too: restored events keep their ids, and new ones
-- go on after them.
SELECT pg_catalog.pg_extension_config_dump('throttle.event_id_seq', '');

-- Finished events: done (throttle.complete) or cancelled (throttle.cancel, or
-- superseded by a newer run of their item_key). They leave throttle.event in
-- the transaction that finishes them, so the hot table and its indexes hold
-- what is pending, claimed or dead, whatever the history. The columns are
-- throttle.event's, in its order (LIKE); no default, CHECK or identity: only
-- the functions below write here, copying rows that throttle.event checked.
-- Its ids are throttle.event's: TRUNCATE ... RESTART IDENTITY must take both
-- tables or neither, or a new event's id meets a finished one here.
CREATE TABLE throttle.event_history (LIKE throttle.event);  -- its columns, NOT NULLs
ALTER TABLE throttle.event_history ADD PRIMARY KEY (id);
CREATE INDEX event_history_key ON throttle.event_history (queue, item_key);  -- tracing by key
CREATE INDEX event_history_finished ON throttle.event_history (coalesce(completed_at, cancelled_at));
COMMENT ON TABLE throttle.event_history IS
    'Finished events, with throttle.event''s columns: done (completed_at, completed_by) or cancelled (cancelled_at, cancelled_by; NULL when a newer run of its item_key superseded it). Rows come here from throttle.event in the transaction that finishes them and stay until throttle.purge.';
REVOKE SELECT ON throttle.event_history FROM PUBLIC;
GRANT SELECT (id, queue, item_key, group_key, payload, run_at, state, attempts, max_attempts,
              enqueued_at, enqueued_by, claimed_at, claimed_by, lease_until, completed_at,
              completed_by, cancelled_at, last_error, claimed_role, priority, failed_at,
              cancelled_by, concurrency_key)
    ON throttle.event_history TO PUBLIC;
SELECT pg_catalog.pg_extension_config_dump('throttle.event_history', '');

-- Every event, wherever it is now.
CREATE VIEW throttle.all_events AS
    SELECT e.id, e.queue, e.item_key, e.group_key, e.payload, e.run_at, e.state, e.attempts,
           e.max_attempts, e.enqueued_at, e.enqueued_by, e.claimed_at, e.claimed_by,
           e.lease_until, e.completed_at, e.completed_by, e.cancelled_at, e.last_error,
           e.claimed_role, e.priority, e.failed_at, e.cancelled_by, e.concurrency_key
    FROM throttle.event e
    UNION ALL
    SELECT h.id, h.queue, h.item_key, h.group_key, h.payload, h.run_at, h.state, h.attempts,
           h.max_attempts, h.enqueued_at, h.enqueued_by, h.claimed_at, h.claimed_by,
           h.lease_until, h.completed_at, h.completed_by, h.cancelled_at, h.last_error,
           h.claimed_role, h.priority, h.failed_at, h.cancelled_by, h.concurrency_key
    FROM throttle.event_history h;
COMMENT ON VIEW throttle.all_events IS
    'Every event in any state: throttle.event (pending, claimed, dead) and throttle.event_history (done, cancelled), every column but the claim token.';
GRANT SELECT ON throttle.all_events TO PUBLIC;

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

CREATE TABLE throttle.event_attempt (
    id            bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    event_id      bigint NOT NULL,
    attempt       integer NOT NULL,
    claimed_at    timestamptz,
    claimed_by    text,
    claimed_role  oid,
    ended_at      timestamptz NOT NULL,
    outcome       text NOT NULL CHECK (outcome IN ('failed', 'expired', 'released')),
    error         text
);
CREATE INDEX event_attempt_event ON throttle.event_attempt (event_id, id);
COMMENT ON TABLE throttle.event_attempt IS
    'Every attempt that ended without completing its event: failed (throttle.fail, with its error), expired (its lease ended and another claim took the event over) or released (throttle.release_group). The attempt that completes an event, and the one running, are in the event''s own row; throttle.attempt_history shows all of them. throttle.purge deletes them with their event (no foreign key: it would make every purged event cost a look-up here).';
COMMENT ON COLUMN throttle.event_attempt.attempt IS 'The event''s attempts count for that claim: 1 for the first (throttle.retry starts again at 1).';
COMMENT ON COLUMN throttle.event_attempt.ended_at IS 'When it failed or was released; for an expired attempt, the end of its lease.';
GRANT SELECT ON throttle.event_attempt TO PUBLIC;
SELECT pg_catalog.pg_extension_config_dump('throttle.event_attempt', '');
SELECT pg_catalog.pg_extension_config_dump('throttle.event_attempt_id_seq', '');

CREATE VIEW throttle.attempt_history AS
    SELECT a.event_id, a.attempt, a.claimed_at, a.claimed_by, a.claimed_role, a.ended_at,
           a.outcome, a.error
    FROM throttle.event_attempt a
    UNION ALL
    SELECT e.id, e.attempts, e.claimed_at, e.claimed_by, e.claimed_role, NULL, 'claimed', NULL
    FROM throttle.event e
    WHERE e.state = 'claimed'
    UNION ALL
    SELECT h.id, h.attempts, h.claimed_at, h.claimed_by, h.claimed_role, h.completed_at,
           'completed', NULL
    FROM throttle.event_history h
    WHERE h.state = 'done';
COMMENT ON VIEW throttle.attempt_history IS
    'Every attempt of every event: those that ended without completing it (throttle.event_attempt: failed, expired, released), the one that completed it (completed) and the one running (claimed, ended_at NULL).';
GRANT SELECT ON throttle.attempt_history TO PUBLIC;

CREATE TABLE throttle.queue_bucket (
    queue  text PRIMARY KEY CHECK (queue <> '' AND octet_length(queue) <= 63),
    bucket text NOT NULL REFERENCES throttle.bucket (name) ON UPDATE CASCADE ON DELETE CASCADE
);
COMMENT ON TABLE throttle.queue_bucket IS
    'Rate-limited queues: claim and claim_group of the queue hand out at most as many events as the declared bucket allows, one unit per event; the rest stay pending until it refills. throttle.bucket gives the shape; the units are the queue''s own (kind queue_bucket in throttle.status), out of throttle.take''s reach.';
COMMENT ON COLUMN throttle.queue_bucket.bucket IS 'The name of a bucket declared in throttle.bucket.';
GRANT SELECT ON throttle.queue_bucket TO PUBLIC;
SELECT pg_catalog.pg_extension_config_dump('throttle.queue_bucket', '');

CREATE TABLE throttle.group_bucket (
    queue  text PRIMARY KEY CHECK (queue <> '' AND octet_length(queue) <= 63),
    bucket text NOT NULL REFERENCES throttle.bucket (name) ON UPDATE CASCADE ON DELETE CASCADE
);
COMMENT ON TABLE throttle.group_bucket IS
    'Rate-limited groups: each group of the queue has a bucket of its own, of the declared shape, and claim_group hands a group at most as many events as its bucket allows, one unit per event, passing over a group whose bucket is empty (its events stay pending until it refills). Beside the queue''s bucket (throttle.queue_bucket), if any. The units are the group''s own (kind group_bucket in throttle.status), out of throttle.take''s reach.';
COMMENT ON COLUMN throttle.group_bucket.bucket IS 'The name of a bucket declared in throttle.bucket: its rate, per and burst apply to each group.';
GRANT SELECT ON throttle.group_bucket TO PUBLIC;
SELECT pg_catalog.pg_extension_config_dump('throttle.group_bucket', '');

CREATE TABLE throttle.group_policy (
    queue        text PRIMARY KEY CHECK (queue <> '' AND octet_length(queue) <= 63),
    workers      integer NOT NULL DEFAULT 1 CHECK (workers BETWEEN 1 AND 64),
    strict_order boolean NOT NULL DEFAULT false,
    fairness     text NOT NULL DEFAULT 'oldest_first' CHECK (fairness IN ('oldest_first', 'round_robin')),
    CONSTRAINT strict_order_has_one_worker CHECK (NOT strict_order OR workers = 1)
);
COMMENT ON TABLE throttle.group_policy IS
    'How claim_group hands out the groups of a queue; a queue not named here has one worker per group, no strict order, and serves the oldest due event''s group first.';
COMMENT ON COLUMN throttle.group_policy.workers IS 'How many claims may hold one group at once, 1 to 64, each with events no other holds.';
COMMENT ON COLUMN throttle.group_policy.strict_order IS 'A group''s events run in the order they were scheduled (by id): each waits for its run_at and for every earlier event of the group to complete, die or be cancelled; a failed event holds back the later ones. Needs workers = 1.';
COMMENT ON COLUMN throttle.group_policy.fairness IS 'Which free group claim_group serves first, after the groups of expired claims: oldest_first, the group of the oldest due event; round_robin, the due groups in turn by group_key, starting after the group served last in the queue (kept in shared memory: a queue whose turn is not known is served oldest first once, which sets it).';
GRANT SELECT ON throttle.group_policy TO PUBLIC;
SELECT pg_catalog.pg_extension_config_dump('throttle.group_policy', '');

CREATE TABLE throttle.concurrency_policy (
    queue        text PRIMARY KEY CHECK (queue <> '' AND octet_length(queue) <= 63),
    max_claimed  integer NOT NULL DEFAULT 1 CHECK (max_claimed > 0),
    fairness     text NOT NULL DEFAULT 'oldest_first' CHECK (fairness IN ('oldest_first', 'round_robin'))
);
COMMENT ON TABLE throttle.concurrency_policy IS
    'How throttle.claim hands out the events that carry a concurrency_key, per queue: how many of one key at once, and in which order; a queue not named here has one per key, oldest first.';
COMMENT ON COLUMN throttle.concurrency_policy.max_claimed IS 'How many events of one concurrency_key may be claimed at once (claims whose lease holds), whichever workers hold them.';
COMMENT ON COLUMN throttle.concurrency_policy.fairness IS 'Which due events claim takes first, after expired claims: oldest_first, by priority then run_at whatever their key; round_robin, one event per key in turn by concurrency_key (the key''s oldest due event), starting after the key served last in the queue, the events without a key taking their turn after the last key (kept in shared memory: a queue whose turn is not known is served oldest first once, which sets it).';
GRANT SELECT ON throttle.concurrency_policy TO PUBLIC;
SELECT pg_catalog.pg_extension_config_dump('throttle.concurrency_policy', '');

CREATE TABLE throttle.queue_pause (
    queue      text NOT NULL CHECK (queue <> '' AND octet_length(queue) <= 63),
    group_key  text CHECK (octet_length(group_key) <= 1024),
    paused_at  timestamptz NOT NULL,
    paused_by  text NOT NULL,
    CONSTRAINT queue_pause_key UNIQUE NULLS NOT DISTINCT (queue, group_key)
);
COMMENT ON TABLE throttle.queue_pause IS
    'Paused queues and groups (throttle.pause, throttle.resume): claim and claim_group hand out none of a paused queue''s events, claim_group none of a paused group''s; schedule still accepts them. A row per pause; a table, so a pause survives restarts and failover.';
COMMENT ON COLUMN throttle.queue_pause.group_key IS 'The paused group of the queue; NULL: the whole queue.';
COMMENT ON COLUMN throttle.queue_pause.paused_at IS 'When throttle.pause paused it (throttle.now()).';
COMMENT ON COLUMN throttle.queue_pause.paused_by IS 'Who paused it: the caller of throttle.pause, as enqueued_by.';
GRANT SELECT ON throttle.queue_pause TO PUBLIC;
-- (Kept by pg_dump: declared after throttle.recurring below, in the order
-- the update to 0.4.0 declares them.)

CREATE FUNCTION throttle._policy_changes()
RETURNS trigger
AS 'MODULE_PATHNAME', 'pg_throttle_policy_changes'
LANGUAGE C;
COMMENT ON FUNCTION throttle._policy_changes() IS
    'Internal: makes a statement that changes throttle.group_policy or throttle.concurrency_policy wait for the claims in progress (and the claims after it wait for its commit), so a lowered limit holds exactly.';
REVOKE EXECUTE ON FUNCTION throttle._policy_changes() FROM PUBLIC;
CREATE TRIGGER group_policy_changes
    BEFORE INSERT OR UPDATE OR DELETE OR TRUNCATE ON throttle.group_policy
    FOR EACH STATEMENT EXECUTE FUNCTION throttle._policy_changes();
CREATE TRIGGER concurrency_policy_changes
    BEFORE INSERT OR UPDATE OR DELETE OR TRUNCATE ON throttle.concurrency_policy
    FOR EACH STATEMENT EXECUTE FUNCTION throttle._policy_changes();

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

CREATE FUNCTION throttle._require_id(id bigint)
RETURNS bigint
LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    PERFORM throttle._require(id, 'id');
    RETURN id;
END
$$;
COMMENT ON FUNCTION throttle._require_id(bigint) IS 'Internal: id, or 22004 when it is NULL.';

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
-- claim_group takes it natively (src/pg/queue/claim_group_sql.cpp), extend
-- renews it natively (extend_sql.cpp); these end it.
CREATE FUNCTION throttle._group_release(queue text, group_key text, token bigint)
RETURNS boolean
AS 'MODULE_PATHNAME', 'pg_throttle_group_release'
LANGUAGE C VOLATILE PARALLEL UNSAFE;
COMMENT ON FUNCTION throttle._group_release(text, text, bigint) IS
    'Internal: releases a group''s lease held with token.';
REVOKE EXECUTE ON FUNCTION throttle._group_release(text, text, bigint) FROM PUBLIC;

CREATE FUNCTION throttle._group_release_at_commit(queue text, group_key text, token bigint)
RETURNS void
AS 'MODULE_PATHNAME', 'pg_throttle_group_release_at_commit'
LANGUAGE C VOLATILE PARALLEL UNSAFE;
COMMENT ON FUNCTION throttle._group_release_at_commit(text, text, bigint) IS
    'Internal: releases a group''s lease held with token when the calling transaction commits.';
REVOKE EXECUTE ON FUNCTION throttle._group_release_at_commit(text, text, bigint) FROM PUBLIC;

CREATE FUNCTION throttle._caller()
RETURNS text
AS 'MODULE_PATHNAME', 'pg_throttle_caller'
LANGUAGE C VOLATILE PARALLEL SAFE;
COMMENT ON FUNCTION throttle._caller() IS
    'Internal: who is calling, for enqueued_by: the role the session acts as (not the owner of a SECURITY DEFINER function), and its application_name.';

CREATE FUNCTION throttle._caller_role()
RETURNS oid
AS 'MODULE_PATHNAME', 'pg_throttle_caller_role'
LANGUAGE C VOLATILE PARALLEL SAFE;
COMMENT ON FUNCTION throttle._caller_role() IS
    'Internal: the role the session acts as, which a claim belongs to.';

CREATE FUNCTION throttle._acts_as(role oid)
RETURNS boolean
AS 'MODULE_PATHNAME', 'pg_throttle_acts_as'
LANGUAGE C VOLATILE PARALLEL SAFE;
COMMENT ON FUNCTION throttle._acts_as(oid) IS
    'Internal: whether the calling role has the privileges of role (a claim''s); NULL or a dropped role: superusers only.';

-- What schedule_many checks of its scalar arguments (not NULL); schedule_sql.cpp
-- checks the same, with the same messages.
CREATE FUNCTION throttle._check_schedule(queue text, max_attempts integer, on_duplicate text)
RETURNS void
LANGUAGE plpgsql IMMUTABLE AS $$
#variable_conflict use_column
BEGIN
    IF on_duplicate NOT IN ('replace', 'keep_earlier', 'ignore') THEN
        RAISE EXCEPTION 'on_duplicate must be replace, keep_earlier or ignore'
              USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF max_attempts <= 0 THEN
        RAISE EXCEPTION 'max_attempts must be positive' USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF queue = '' OR octet_length(queue) > 63 THEN
        RAISE EXCEPTION 'queue name must have 1 to 63 bytes' USING ERRCODE = 'invalid_parameter_value',
              DETAIL = 'The queue name is also the NOTIFY channel that workers LISTEN on.';
    END IF;
END
$$;
COMMENT ON FUNCTION throttle._check_schedule(text, integer, text) IS
    'Internal: raises 22023 unless on_duplicate, max_attempts and the queue name are valid for schedule_many.';

CREATE FUNCTION throttle.schedule(queue text, item_key text, run_at timestamptz,
                                  payload jsonb DEFAULT '{}', group_key text DEFAULT NULL,
                                  max_attempts integer DEFAULT 5, priority integer DEFAULT 0,
                                  on_duplicate text DEFAULT 'replace',
                                  concurrency_key text DEFAULT NULL)
RETURNS bigint
AS 'MODULE_PATHNAME', 'pg_throttle_schedule'  -- src/pg/queue/schedule_sql.cpp
LANGUAGE C VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp;
COMMENT ON FUNCTION throttle.schedule(text, text, timestamptz, jsonb, text, integer, integer, text, text) IS
    'Schedules an event, or, when item_key names a pending event of the queue, updates it as on_duplicate says (replace: run_at, payload and priority; keep_earlier: the same but the earlier run_at; ignore: nothing; its group_key, concurrency_key and max_attempts stay); returns its id. A pending event that replace or keep_earlier updates is a new run: its attempts start again at 0, whatever its earlier claims used. When the event of item_key is claimed it is left alone and a new event is scheduled, which no worker gets before the claimed one ends. NOTIFYs the channel named after the queue when the event is due.';

-- A batch of schedule calls in one statement: the same rules, applied as if
-- the calls ran one after the other in the order of item_keys.
CREATE FUNCTION throttle.schedule_many(queue text, item_keys text[], run_at timestamptz[],
                                       payloads jsonb[] DEFAULT NULL, group_keys text[] DEFAULT NULL,
                                       max_attempts integer DEFAULT 5, priority integer DEFAULT 0,
                                       on_duplicate text DEFAULT 'replace',
                                       concurrency_keys text[] DEFAULT NULL)
RETURNS bigint[]
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
#variable_conflict use_column
DECLARE
    now timestamptz := throttle.now();
    caller text := throttle._caller();
    n integer := cardinality(item_keys);
    problem text;
    ids bigint[];
    due bigint[];
BEGIN
    PERFORM throttle._require(queue, 'queue'), throttle._require(item_keys, 'item_keys'),
            throttle._require(run_at, 'run_at'), throttle._require(max_attempts, 'max_attempts'),
            throttle._require(priority, 'priority'), throttle._require(on_duplicate, 'on_duplicate');
    PERFORM throttle._check_schedule(queue, max_attempts, on_duplicate);
    IF coalesce(array_ndims(item_keys), 1) <> 1 OR coalesce(array_ndims(run_at), 1) <> 1
       OR coalesce(array_ndims(payloads), 1) <> 1 OR coalesce(array_ndims(group_keys), 1) <> 1
       OR coalesce(array_ndims(concurrency_keys), 1) <> 1 THEN
        RAISE EXCEPTION 'item_keys, run_at, payloads, group_keys and concurrency_keys must be one-dimensional arrays'
              USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF cardinality(run_at) <> n OR cardinality(payloads) <> n OR cardinality(group_keys) <> n
       OR cardinality(concurrency_keys) <> n THEN
        RAISE EXCEPTION 'run_at, payloads, group_keys and concurrency_keys must have one element per item_key'
              USING ERRCODE = 'invalid_parameter_value',
                    DETAIL = format('%s item_keys, %s run_at, %s payloads, %s group_keys, %s concurrency_keys',
                                    n, cardinality(run_at), coalesce(cardinality(payloads)::text, 'no'),
                                    coalesce(cardinality(group_keys)::text, 'no'),
                                    coalesce(cardinality(concurrency_keys)::text, 'no'));
    END IF;
    IF n = 0 THEN
        RETURN '{}';
    END IF;
    -- Every element checked as schedule checks its arguments; the first
    -- problem, in the order of item_keys, is the error.
    SELECT CASE WHEN b.k IS NULL THEN 'item_keys[' || b.ord || '] must not be NULL'
                WHEN b.r IS NULL THEN 'run_at[' || b.ord || '] must not be NULL'
                WHEN b.p IS NULL AND payloads IS NOT NULL THEN 'payloads[' || b.ord || '] must not be NULL'
                WHEN b.k = '' THEN 'item_keys[' || b.ord || '] must not be empty'
                WHEN octet_length(b.k) > 1024 THEN 'item_keys[' || b.ord || '] must have at most 1024 bytes'
                WHEN octet_length(b.g) > 1024 THEN 'group_keys[' || b.ord || '] must have at most 1024 bytes'
                WHEN octet_length(b.c) > 1024 THEN 'concurrency_keys[' || b.ord || '] must have at most 1024 bytes'
                WHEN b.c = '' THEN 'concurrency_keys[' || b.ord || '] must not be empty'
                ELSE 'item_keys[' || b.ord || ']: an event has a group_key or a concurrency_key, not both' END
    INTO problem
    FROM unnest(item_keys, run_at, payloads, group_keys, concurrency_keys) WITH ORDINALITY
         AS b(k, r, p, g, c, ord)
    WHERE b.k IS NULL OR b.r IS NULL OR (b.p IS NULL AND payloads IS NOT NULL) OR b.k = ''
       OR octet_length(b.k) > 1024 OR octet_length(b.g) > 1024 OR octet_length(b.c) > 1024
       OR b.c = '' OR (b.c IS NOT NULL AND b.g IS NOT NULL)
    ORDER BY b.ord LIMIT 1;
    IF problem IS NOT NULL THEN
        RAISE EXCEPTION '%', problem
              USING ERRCODE = CASE WHEN problem LIKE '%NULL' THEN 'null_value_not_allowed'
                                   ELSE 'invalid_parameter_value' END;
    END IF;
    -- The keys tried first as new events (the common case): a plain INSERT
    -- costs less than ON CONFLICT's speculative one, and less than looking
    -- the keys up first. When one of them has a pending event, or is named
    -- twice, it raises unique_violation, and the general statement below runs.
    -- Ids are drawn in the order of item_keys, as calls of schedule one after
    -- the other would draw them (a group kept in strict order runs in id
    -- order); rows go in in bytewise item_key order (see below).
    BEGIN
        WITH batch AS (
            SELECT b.k AS item_key, b.r AS run_at, coalesce(b.p, '{}') AS payload, b.g AS group_key,
                   b.c AS concurrency_key, b.ord
            FROM unnest(item_keys, run_at, payloads, group_keys, concurrency_keys) WITH ORDINALITY
                 AS b(k, r, p, g, c, ord)),
        numbered AS (
            SELECT o.*, nextval('throttle.event_id_seq') AS id
            FROM (SELECT * FROM batch ORDER BY batch.ord OFFSET 0) AS o),
        scheduled AS (
            INSERT INTO throttle.event AS e (id, queue, item_key, group_key, payload, run_at,
                                             max_attempts, enqueued_at, enqueued_by, priority,
                                             concurrency_key)
            OVERRIDING SYSTEM VALUE
            SELECT b.id, queue, b.item_key, b.group_key, b.payload, b.run_at, max_attempts, now,
                   caller, priority, b.concurrency_key
            FROM numbered b ORDER BY b.item_key COLLATE "C"
            RETURNING e.id, e.item_key, e.run_at)
        SELECT (SELECT array_agg(s.id ORDER BY b.ord) FROM batch b JOIN scheduled s USING (item_key)),
               (SELECT array_agg(s.id ORDER BY s.id) FROM scheduled s WHERE s.run_at <= now)
        INTO ids, due;
        PERFORM pg_notify(queue, d::text) FROM unnest(due) AS d;
        RETURN ids;
    EXCEPTION WHEN unique_violation THEN
        NULL;  -- an item_key with a pending event, or named twice
    END;
    -- An item_key named more than once ends as its calls one after the
    -- other would leave it: the first call's group_key and concurrency_key; the last call's
    -- payload and run_at (replace), the last payload and the earliest run_at
    -- (keep_earlier), or the first call's (ignore). Rows go in in one order
    -- of item_key (bytewise), in both statements, so that two batches never
    -- wait for each other in a circle. A pending event that replace or
    -- keep_earlier updates is a new run, with attempts of its own (0).
    WITH batch AS (
        SELECT b.k AS item_key, b.r AS run_at, coalesce(b.p, '{}') AS payload, b.g AS group_key,
               b.c AS concurrency_key, b.ord
        FROM unnest(item_keys, run_at, payloads, group_keys, concurrency_keys) WITH ORDINALITY
             AS b(k, r, p, g, c, ord)),
    folded AS (
        SELECT b.item_key,
               (array_agg(b.group_key ORDER BY b.ord))[1] AS group_key,
               (array_agg(b.concurrency_key ORDER BY b.ord))[1] AS concurrency_key,
               CASE on_duplicate
                   WHEN 'replace' THEN (array_agg(b.run_at ORDER BY b.ord DESC))[1]
                   WHEN 'keep_earlier' THEN min(b.run_at)
                   ELSE (array_agg(b.run_at ORDER BY b.ord))[1] END AS run_at,
               (array_agg(b.payload ORDER BY b.ord * CASE WHEN on_duplicate = 'ignore' THEN 1 ELSE -1 END))[1]
                   AS payload,
               min(b.ord) AS first
        FROM batch b GROUP BY b.item_key),
    numbered AS (  -- a new event's id, drawn in the order of first mention
        SELECT o.*, nextval('throttle.event_id_seq') AS id
        FROM (SELECT * FROM folded ORDER BY folded.first OFFSET 0) AS o),
    scheduled AS (
        INSERT INTO throttle.event AS e (id, queue, item_key, group_key, payload, run_at,
                                         max_attempts, enqueued_at, enqueued_by, priority,
                                         concurrency_key)
        OVERRIDING SYSTEM VALUE
        SELECT f.id, queue, f.item_key, f.group_key, f.payload, f.run_at, max_attempts, now, caller,
               priority, f.concurrency_key
        FROM numbered f ORDER BY f.item_key COLLATE "C"
        ON CONFLICT (queue, item_key) WHERE state = 'pending'
        DO UPDATE SET run_at = CASE on_duplicate WHEN 'replace' THEN excluded.run_at
                                                  WHEN 'keep_earlier' THEN least(e.run_at, excluded.run_at)
                                                  ELSE e.run_at END,
                      payload = CASE WHEN on_duplicate = 'ignore' THEN e.payload ELSE excluded.payload END,
                      priority = CASE WHEN on_duplicate = 'ignore' THEN e.priority ELSE excluded.priority END,
                      attempts = CASE WHEN on_duplicate = 'ignore' THEN e.attempts ELSE 0 END
        RETURNING e.id, e.item_key, e.run_at)
    SELECT (SELECT array_agg(s.id ORDER BY b.ord) FROM batch b JOIN scheduled s USING (item_key)),
           (SELECT array_agg(s.id ORDER BY s.id) FROM scheduled s WHERE s.run_at <= now)
    INTO ids, due;
    PERFORM pg_notify(queue, d::text) FROM unnest(due) AS d;
    RETURN ids;
END
$$;
COMMENT ON FUNCTION throttle.schedule_many(text, text[], timestamptz[], jsonb[], text[], integer, integer, text, text[]) IS
    'Schedules a batch of events of one queue in one statement: item_keys[i] at run_at[i] with payloads[i], group_keys[i] and concurrency_keys[i] (the arrays have one element per item_key; payloads, group_keys and concurrency_keys may be NULL for none), as if throttle.schedule ran for each in turn (a pending event that replace or keep_earlier updates starts again at 0 attempts); returns their ids in the order of item_keys (an item_key named twice gets one event, and its id twice). NOTIFYs the queue''s channel with each event that is due.';

-- A value a NOTICE names, as a SQL string literal that reads back as the
-- value: as format's %L writes it, and as E'...' with \n, \r, \t or \uXXXX
-- for each control character (U+0001-U+001F, U+007F-U+009F), so that a
-- value can neither end the literal early nor send a raw control byte.
CREATE FUNCTION throttle._literal(value text)
RETURNS text
LANGUAGE sql IMMUTABLE AS $$
SELECT CASE
    WHEN value IS NULL OR value !~ E'[\\x01-\\x1f\\x7f-\\x9f]' THEN quote_nullable(value)
    ELSE 'E''' || (SELECT string_agg(CASE ascii(c)
                                         WHEN 9 THEN E'\\t' WHEN 10 THEN E'\\n' WHEN 13 THEN E'\\r'
                                         WHEN 39 THEN '''''' WHEN 92 THEN E'\\\\'
                                         ELSE CASE WHEN c ~ E'[\\x01-\\x1f\\x7f-\\x9f]'
                                                   THEN E'\\u' || lpad(to_hex(ascii(c)), 4, '0')
                                                   ELSE c END
                                     END, '' ORDER BY n)
                   FROM unnest(string_to_array(value, NULL)) WITH ORDINALITY AS t(c, n)) || ''''
END
$$;
COMMENT ON FUNCTION throttle._literal(text) IS
    E'Internal: the value as a SQL string literal that reads back as it, for a message: as format\'s %L writes it, and as E\'...\' with \\n, \\r, \\t or \\uXXXX for each control character (U+0001-U+001F, U+007F-U+009F).';

-- Why cancel or reschedule found no pending event of an item_key, in a
-- NOTICE (they still return false): what throttle.all_events shows of the
-- key, to a caller who may read that view, and nothing more to another.
CREATE FUNCTION throttle._notice_not_pending(queue text, item_key text, caller text)
RETURNS void
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    head text := format('%s found no pending event %s in queue %s', caller,
                        throttle._literal(item_key), throttle._literal(queue));
    e record;
BEGIN
    IF NOT has_table_privilege(throttle._caller_role(), 'throttle.all_events', 'SELECT') THEN
        RAISE NOTICE '%', head
              USING HINT = 'throttle.all_events shows why to a role that may read it.';
        RETURN;
    END IF;
    SELECT x.id, x.claimed_by, x.lease_until INTO e
    FROM throttle.event x  -- event_claimed_key
    WHERE x.queue = _notice_not_pending.queue AND x.item_key = _notice_not_pending.item_key
      AND x.state = 'claimed'
    LIMIT 1;
    IF FOUND AND e.lease_until > throttle.now() THEN
        RAISE NOTICE '%: event % is claimed by % until %, and still runs', head, e.id,
                     throttle._literal(e.claimed_by), e.lease_until
              USING HINT = 'cancel and reschedule change pending events only. A claim ends with '
                           'throttle.complete or throttle.fail, or when its lease ends.';
        RETURN;
    ELSIF FOUND THEN
        RAISE NOTICE '%: event % was claimed by % until %, and the next claim takes it over',
                     head, e.id, throttle._literal(e.claimed_by), e.lease_until
              USING HINT = 'cancel and reschedule change pending events only.';
        RETURN;
    END IF;
    -- The newest of the others: dead, or finished.
    SELECT f.id, f.state, f.at INTO e
    FROM ((SELECT x.id, x.state, x.completed_at AS at
           FROM throttle.event x  -- event_dead
           WHERE x.queue = _notice_not_pending.queue AND x.state = 'dead'
             AND x.item_key = _notice_not_pending.item_key
           ORDER BY x.id DESC LIMIT 1)
          UNION ALL
          (SELECT h.id, h.state, coalesce(h.completed_at, h.cancelled_at)
           FROM throttle.event_history h  -- event_history_key
           WHERE h.queue = _notice_not_pending.queue AND h.item_key = _notice_not_pending.item_key
           ORDER BY h.id DESC LIMIT 1)) AS f
    ORDER BY f.id DESC
    LIMIT 1;
    IF NOT FOUND THEN
        RAISE NOTICE '%: the queue has no event with that item_key', head;
    ELSIF e.state = 'dead' THEN
        RAISE NOTICE '%: event % is dead since %', head, e.id, e.at
              USING HINT = 'Its attempts are used up: throttle.retry brings it back.';
    ELSIF e.state = 'done' THEN
        RAISE NOTICE '%: event % was completed at %', head, e.id, e.at;
    ELSE
        RAISE NOTICE '%: event % was cancelled at %', head, e.id, e.at;
    END IF;
END
$$;
COMMENT ON FUNCTION throttle._notice_not_pending(text, text, text) IS
    'Internal: raises the NOTICE of cancel and reschedule (caller) when the queue has no pending event item_key (item_key, queue and the worker as SQL literals, by throttle._literal): its newest event is claimed (and still runs), dead, done or cancelled, or there is none; only that there is none pending to a caller who may not read throttle.all_events.';
REVOKE EXECUTE ON FUNCTION throttle._notice_not_pending(text, text, text) FROM PUBLIC;

CREATE FUNCTION throttle.cancel(queue text, item_key text)
RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
#variable_conflict use_column
BEGIN
    PERFORM throttle._require(queue, 'queue'), throttle._require(item_key, 'item_key');
    WITH moved AS (
        DELETE FROM throttle.event e  -- event_pending_key
        WHERE e.queue = cancel.queue AND e.item_key = cancel.item_key AND e.state = 'pending'
        RETURNING e.*)
    INSERT INTO throttle.event_history
    SELECT m.id, m.queue, m.item_key, m.group_key, m.payload, m.run_at, 'cancelled', m.attempts,
           m.max_attempts, m.enqueued_at, m.enqueued_by, m.claimed_at, m.claimed_by,
           m.claim_token, m.lease_until, m.completed_at, m.completed_by, throttle.now(),
           m.last_error, m.claimed_role, m.priority, m.failed_at, throttle._caller(),
           m.concurrency_key
    FROM moved m;
    IF FOUND THEN
        RETURN true;
    END IF;
    PERFORM throttle._notice_not_pending(queue, item_key, 'throttle.cancel');
    RETURN false;
END
$$;
COMMENT ON FUNCTION throttle.cancel(text, text) IS
    'Cancels the pending event item_key of the queue; false when there is none, with a NOTICE that says why: the key''s event is claimed (it still runs), dead, done or cancelled, or the queue has none (the reason to roles that may read throttle.all_events). The event moves to throttle.event_history, state cancelled, with cancelled_at and cancelled_by.';

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
    IF event_id IS NULL THEN
        PERFORM throttle._notice_not_pending(queue, item_key, 'throttle.reschedule');
        RETURN false;
    END IF;
    IF run_at <= throttle.now() THEN
        PERFORM pg_notify(queue, event_id::text);
    END IF;
    RETURN true;
END
$$;
COMMENT ON FUNCTION throttle.reschedule(text, text, timestamptz) IS
    'Moves the pending event item_key of the queue to run_at; false when there is none, with a NOTICE that says why, as throttle.cancel.';

-- Marks the events `ids` claimed by `worker` until now + lease with `token`;
-- an event whose attempts are used up becomes dead instead. The caller has
-- locked the rows; an event that is neither pending nor claimed with an
-- expired lease is left alone. Each statement finds the rows by id (the
-- primary key: upper(state) keeps the planner off the partial indexes,
-- which under churn hold many dead entries) and sees what the one before
-- it changed.
CREATE FUNCTION throttle._mark_claimed(ids bigint[], worker text, lease interval, token bigint,
                                       now timestamptz, uncharged bigint[] DEFAULT '{}')
RETURNS SETOF throttle.event
LANGUAGE plpgsql AS $$
#variable_conflict use_column
BEGIN
    -- The expired claims' attempts end at their lease.
    INSERT INTO throttle.event_attempt (event_id, attempt, claimed_at, claimed_by, claimed_role,
                                        ended_at, outcome)
    SELECT e.id, e.attempts, e.claimed_at, e.claimed_by, e.claimed_role, e.lease_until, 'expired'
    FROM throttle.event e
    WHERE e.id = ANY (ids) AND upper(e.state) = 'CLAIMED' AND e.lease_until <= now
    ORDER BY e.id;
    -- A claim that expired while a newer run of its item_key waits: the
    -- newer run replaces it.
    WITH superseded AS (
        DELETE FROM throttle.event e
        WHERE e.id = ANY (ids) AND upper(e.state) = 'CLAIMED' AND e.lease_until <= now
          -- One lookup per row (a scalar subquery, never hashed), whatever
          -- the statistics said when the plan was made.
          AND (SELECT 1 FROM throttle.event u  -- event_pending_key
               WHERE u.queue = e.queue AND u.item_key = e.item_key AND u.state = 'pending'
               LIMIT 1) IS NOT NULL
        RETURNING e.*)
    INSERT INTO throttle.event_history
    SELECT g.id, g.queue, g.item_key, g.group_key, g.payload, g.run_at, 'cancelled', g.attempts,
           g.max_attempts, g.enqueued_at, g.enqueued_by, g.claimed_at, g.claimed_by,
           g.claim_token, NULL, g.completed_at, g.completed_by, now, g.last_error,
           g.claimed_role, g.priority, g.lease_until, g.cancelled_by, g.concurrency_key
    FROM superseded g;
    -- Expired claims in uncharged never ran (they waited behind an earlier
    -- event of their strict group): their attempt is given back, so this
    -- claim leaves their count as it was and never makes them dead.
    UPDATE throttle.event e SET state = 'dead', completed_at = now, completed_by = e.claimed_by,
           last_error = coalesce(e.last_error, 'lease expired ' || e.attempts || ' times'),
           failed_at = CASE WHEN upper(e.state) = 'CLAIMED' THEN e.lease_until ELSE e.failed_at END
    WHERE e.id = ANY (ids) AND e.attempts >= e.max_attempts AND NOT e.id = ANY (uncharged)
      AND (upper(e.state) = 'PENDING' OR (upper(e.state) = 'CLAIMED' AND e.lease_until <= now));
    RETURN QUERY
    UPDATE throttle.event e
    SET state = 'claimed', claimed_at = now, claimed_by = worker, lease_until = now + lease,
        claim_token = token, claimed_role = throttle._caller_role(),
        attempts = e.attempts + CASE WHEN e.id = ANY (uncharged) THEN 0 ELSE 1 END,
        failed_at = CASE WHEN upper(e.state) = 'CLAIMED' THEN e.lease_until ELSE e.failed_at END
    WHERE e.id = ANY (ids) AND (e.attempts < e.max_attempts OR e.id = ANY (uncharged))
      AND (upper(e.state) = 'PENDING' OR (upper(e.state) = 'CLAIMED' AND e.lease_until <= now))
    RETURNING e.*;
END
$$;
COMMENT ON FUNCTION throttle._mark_claimed(bigint[], text, interval, bigint, timestamptz, bigint[]) IS
    'Internal: claims events for a worker and the calling role with token; makes dead those whose attempts are used up, and cancels expired claims superseded by a newer pending run of their item_key. Records the expired claims'' attempts in throttle.event_attempt. Expired claims in uncharged keep their attempts (their earlier claim never ran them).';

CREATE FUNCTION throttle.claim(queue text, worker text, lease interval DEFAULT '5 minutes',
                               max integer DEFAULT 1)
RETURNS SETOF throttle.event
AS 'MODULE_PATHNAME', 'pg_throttle_claim'
LANGUAGE C VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp
SET enable_seqscan = off  -- index lookups, whatever the plans' statistics said
SET jit = off  -- kept plans whose cost grows with the table: no compile per call (a claim: 20 - 50 ms)
-- and scans in the index's order: a plan made when ANALYZE saw few pending
-- events read every pending one by a bitmap scan and sorted them, at every
-- claim until the next ANALYZE (make bench-sustained: a minute at 66 events/s).
-- In the order the update to 0.4.0 sets them.
SET enable_bitmapscan = off
SET enable_sort = off;
COMMENT ON FUNCTION throttle.claim(text, text, interval, integer) IS
    'Claims up to max due events without a group_key for worker until lease: claims whose lease expired, then pending events with run_at <= now, higher priority first, then oldest first; never waits for rows another worker is claiming. The events carry the claim''s claim_token, which complete, fail and extend need. Grouped events are claimed with throttle.claim_group; an expired claim of claim_group whose item_key has a due run without a group_key is ended first (cancelled, superseded by that run).';

CREATE FUNCTION throttle.claim_group(queue text, worker text, lease interval DEFAULT '5 minutes',
                                     max integer DEFAULT NULL)
RETURNS SETOF throttle.event
AS 'MODULE_PATHNAME', 'pg_throttle_claim_group'
LANGUAGE C VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp
SET enable_seqscan = off  -- index lookups, whatever the plans' statistics said
SET jit = off;  -- kept plans whose cost grows with the table: no compile per call (a claim: 20 - 50 ms)
COMMENT ON FUNCTION throttle.claim_group(text, text, interval, integer) IS
    'Claims the due events of one group of the queue (every one, or the oldest max) for worker until lease. While the lease holds no other worker gets any event of that group, including events that become due meanwhile; a queue in throttle.group_policy lets that many claims hold a group at once, each with events no other holds, or keeps a group''s events in strict order. An expired claim of throttle.claim whose item_key has a due grouped run is ended first (cancelled, superseded by that run). Returns no rows when no group is free.';

-- A unique violation of event_pending_key while fail or release_group moves
-- a claimed run back to pending means a newer run of its item_key
-- committed meanwhile: read committed tries again with it in view (true);
-- one transaction snapshot (repeatable read, serializable) cannot see it,
-- so the client retries the transaction (40001). Any other constraint is
-- not this case (false): the caller raises it as it is.
CREATE FUNCTION throttle._newer_run_committed(violated text)
RETURNS boolean
LANGUAGE plpgsql AS $$
BEGIN
    IF violated IS DISTINCT FROM 'event_pending_key' THEN
        RETURN false;
    END IF;
    IF current_setting('transaction_isolation') IN ('repeatable read', 'serializable') THEN
        RAISE EXCEPTION 'a newer run of an item_key was scheduled concurrently'
              USING ERRCODE = 'serialization_failure', HINT = 'Retry the transaction.';
    END IF;
    RETURN true;
END
$$;
COMMENT ON FUNCTION throttle._newer_run_committed(text) IS
    'Internal: whether a unique violation of constraint violated is a newer run that committed meanwhile, to be tried again with it in view; raises 40001 under a transaction snapshot that cannot see it.';

-- Due pending runs of the item_keys of `ended` (scheduled while those ran):
-- claimable now, so their queue's channel hears of them.
CREATE FUNCTION throttle._notify_successors(ended throttle.event[])
RETURNS void
LANGUAGE sql AS $$
    SELECT pg_notify(u.queue, u.id::text) FROM throttle.event u  -- event_pending_key
    WHERE (u.queue, u.item_key) IN (SELECT f.queue, f.item_key FROM unnest(ended) AS f)
      AND u.state = 'pending' AND u.run_at <= throttle.now();
    -- A claim of a concurrency_key ended: the key's oldest due event.
    SELECT pg_notify(k.queue, w.id::text)
    FROM (SELECT DISTINCT f.queue, f.concurrency_key FROM unnest(ended) AS f
          WHERE f.concurrency_key IS NOT NULL) AS k
    CROSS JOIN LATERAL (SELECT u.id FROM throttle.event u  -- event_pending_concurrency
                        WHERE u.queue = k.queue AND u.concurrency_key = k.concurrency_key
                          AND u.state = 'pending' AND u.concurrency_key IS NOT NULL
                          AND u.run_at <= throttle.now()
                        ORDER BY u.run_at LIMIT 1) AS w
$$;
COMMENT ON FUNCTION throttle._notify_successors(throttle.event[]) IS
    'Internal: NOTIFYs the due pending runs of the item_keys of events whose claim ended, and the oldest due event of their concurrency_keys.';

CREATE FUNCTION throttle.complete(ids bigint[], token bigint)
RETURNS integer
AS 'MODULE_PATHNAME', 'pg_throttle_complete'
LANGUAGE C VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp
SET enable_seqscan = off  -- its statements reach events by primary key (claim_lock.cpp)
SET jit = off;  -- kept plans whose cost grows with the table: no compile per call
COMMENT ON FUNCTION throttle.complete(bigint[], bigint) IS
    'Marks the events done, if the claim token still holds them and the caller is the claim''s role (or may act for it); returns how many. A worker whose claim was taken over gets 0, and a NOTICE says how many of the events given the token did not hold.';

CREATE FUNCTION throttle.fail(ids bigint[], token bigint, error text, retry_in interval DEFAULT NULL)
RETURNS integer
AS 'MODULE_PATHNAME', 'pg_throttle_fail'  -- src/pg/queue/fail_sql.cpp
LANGUAGE C VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp
SET enable_seqscan = off  -- its statements reach events by primary key (claim_lock.cpp)
SET jit = off;  -- kept plans whose cost grows with the table: no compile per call
COMMENT ON FUNCTION throttle.fail(bigint[], bigint, text, interval) IS
    'Records a failed attempt (in throttle.event_attempt, and failed_at): keeps the error and retries after retry_in, or 10 s * 2^(attempts-1) up to 1 hour; after max_attempts the event is dead, and when its item_key was scheduled again meanwhile it is cancelled, superseded by that newer run. In a group kept in strict order (throttle.group_policy) the claim''s later events of the group go back to pending behind the failed one, their attempt not counted. Only through the claim token that holds the events, by the claim''s role; returns how many failed, and a NOTICE says how many of the events given the token did not hold.';

CREATE FUNCTION throttle._lock_concurrency_key(queue text, concurrency_key text)
RETURNS void
AS 'MODULE_PATHNAME', 'pg_throttle_lock_concurrency_key'
LANGUAGE C VOLATILE PARALLEL UNSAFE;
COMMENT ON FUNCTION throttle._lock_concurrency_key(text, text) IS
    'Internal: takes the key lock of a queue''s concurrency_key, shared, until the transaction ends, waiting for a claim that holds it (extend, before it renews a keyed claim).';
REVOKE EXECUTE ON FUNCTION throttle._lock_concurrency_key(text, text) FROM PUBLIC;

CREATE FUNCTION throttle.extend(ids bigint[], token bigint, lease interval)
RETURNS integer
AS 'MODULE_PATHNAME', 'pg_throttle_extend'
LANGUAGE C VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp
SET enable_seqscan = off  -- its statements reach events by primary key (claim_lock.cpp)
SET jit = off;  -- kept plans whose cost grows with the table: no compile per call
COMMENT ON FUNCTION throttle.extend(bigint[], bigint, interval) IS
    'Extends the claim token on the events to lease from now (and the group''s lease), by the claim''s role, while its lease holds: a claim whose lease has ended is not revived. Returns how many, and a NOTICE says how many of the events given the token did not hold with a lease in force.';

-- Operator tools: retry dead events (one, many, or by queue and error),
-- release a group, purge finished events.
CREATE FUNCTION throttle.retry(ids bigint[])
RETURNS TABLE (id bigint, retried boolean, reason text)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
#variable_conflict use_column
DECLARE
    wanted bigint;
    wanted_state text;
    ev throttle.event;
    now timestamptz := throttle.now();
    refused jsonb := '{}';  -- dead events not retried: id -> reason
    done bigint[] := '{}';  -- dead events retried
    violated text;
BEGIN
    PERFORM throttle._require(ids, 'ids');
    -- The dead events among ids, locked and brought back in (queue,
    -- item_key, id) order: the order in which their entries go into
    -- event_pending_key, so two retries never wait for each other there in
    -- a circle. Then one row per id, in the order of ids.
    FOR ev IN SELECT * FROM throttle.event e WHERE e.id = ANY (ids) AND e.state = 'dead'
              ORDER BY e.queue, e.item_key, e.id FOR UPDATE
    LOOP
        IF EXISTS (SELECT 1 FROM throttle.event u  -- event_pending_key, event_claimed_key
                   WHERE u.queue = ev.queue AND u.item_key = ev.item_key
                     AND u.state IN ('pending', 'claimed')) THEN
            refused := refused || jsonb_build_object(ev.id, 'its item_key has a newer run, pending or claimed');
            CONTINUE;
        END IF;
        BEGIN
            UPDATE throttle.event e SET state = 'pending', attempts = 0, run_at = now,
                   completed_at = NULL, completed_by = NULL
            WHERE e.id = ev.id;
            PERFORM pg_notify(ev.queue, ev.id::text);
            done := done || ev.id;
        EXCEPTION WHEN unique_violation THEN
            GET STACKED DIAGNOSTICS violated = CONSTRAINT_NAME;
            IF violated IS DISTINCT FROM 'event_pending_key' THEN
                RAISE;
            END IF;
            refused := refused || jsonb_build_object(ev.id, 'its item_key has a newer run, pending or claimed');
        END;
    END LOOP;
    FOREACH wanted IN ARRAY ids LOOP
        id := wanted;
        retried := wanted = ANY (done);
        reason := refused ->> wanted::text;
        IF retried THEN
            done := array_remove(done, wanted);  -- a second mention finds it pending
        ELSIF reason IS NULL THEN
            retried := false;
            SELECT a.state INTO wanted_state FROM throttle.all_events a WHERE a.id = wanted;
            reason := CASE WHEN FOUND THEN 'the event is ' || wanted_state || ', not dead'
                           ELSE 'no such event' END;
        END IF;
        RETURN NEXT;
    END LOOP;
END
$$;
COMMENT ON FUNCTION throttle.retry(bigint[]) IS
    'Brings dead events back: pending, due now, attempts reset. One row per id: whether it was retried and, when not, why (no such event, not dead, or its item_key has a newer run, pending or claimed).';

CREATE FUNCTION throttle.retry(id bigint)
RETURNS boolean
LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
    SELECT r.retried FROM throttle.retry(ARRAY[throttle._require_id(id)]) AS r
$$;
COMMENT ON FUNCTION throttle.retry(bigint) IS
    'Brings a dead event back: pending, due now, attempts reset; false when it is not dead or its item_key has a newer run, pending or claimed (throttle.retry(bigint[]) says why).';

CREATE FUNCTION throttle.retry_dead(queue text, error_like text DEFAULT NULL,
                                    dead_since timestamptz DEFAULT NULL)
RETURNS TABLE (id bigint, retried boolean, reason text)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
#variable_conflict use_column
BEGIN
    PERFORM throttle._require(queue, 'queue');
    RETURN QUERY SELECT * FROM throttle.retry(ARRAY(
        SELECT e.id FROM throttle.event e
        WHERE e.queue = retry_dead.queue AND e.state = 'dead'
          AND (error_like IS NULL OR e.last_error LIKE error_like)
          AND (dead_since IS NULL OR e.completed_at >= dead_since)
        ORDER BY e.id));
END
$$;
COMMENT ON FUNCTION throttle.retry_dead(text, text, timestamptz) IS
    'Retries the dead events of a queue, those whose last_error is LIKE error_like and that died at or after dead_since when given; one row per event, as throttle.retry(bigint[]).';

-- Claims ended by someone else than their worker (release_group; fail,
-- for the later events of a strict group's claim; a claim_group that takes
-- over a group without taking all of its expired claims; a claimer that
-- ends an expired claim of the other kind holding back a newer run):
-- pending again, due, the worker fenced (no token); cancelled instead when a
-- newer run of the item_key is pending. Each claim is an attempt in
-- throttle.event_attempt, as its claim counted it. The claims in uncharged
-- never ran their event (it waited behind an earlier event of its strict
-- group): their attempt is given back. The others keep it, and an event
-- whose attempts are then used up is dead instead of pending: no event is
-- left pending that the next claim would kill unrun. A newer run that
-- commits meanwhile shows as a unique violation: then again. The caller
-- has locked the rows.
CREATE FUNCTION throttle._fence_claims(ids bigint[], now timestamptz, uncharged bigint[] DEFAULT '{}')
RETURNS SETOF throttle.event
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    fenced throttle.event[];
    violated text;
BEGIN
    IF cardinality(ids) = 0 THEN
        RETURN;  -- (a plan for no ids may read a whole index)
    END IF;
    -- The rows are collected inside the block and returned after it: rows
    -- that RETURN QUERY had emitted would stay in the result when a unique
    -- violation rolls the block back.
    FOR attempt IN 1 .. 3 LOOP
        BEGIN
            -- Each event is found by id and tested on its own row, in one
            -- snapshot: no statement joins the events to a list of them,
            -- which a generic plan that expects ten ids runs as a nested
            -- loop (seconds for a claim of 5 000). The attempts first, as
            -- the claims counted them; an expired one ended with its lease.
            INSERT INTO throttle.event_attempt (event_id, attempt, claimed_at, claimed_by,
                                                claimed_role, ended_at, outcome)
            SELECT e.id, e.attempts, e.claimed_at, e.claimed_by, e.claimed_role,
                   CASE WHEN e.lease_until <= now THEN e.lease_until ELSE now END,
                   CASE WHEN e.lease_until <= now THEN 'expired' ELSE 'released' END
            FROM throttle.event e
            WHERE e.id = ANY (ids) AND upper(e.state) = 'CLAIMED'
            ORDER BY e.id;
            IF cardinality(uncharged) > 0 THEN  -- (the set operation hashes both lists)
                UPDATE throttle.event e SET attempts = greatest(e.attempts - 1, 0)
                WHERE e.id = ANY (ARRAY(SELECT unnest(ids) INTERSECT SELECT unnest(uncharged)))
                  AND upper(e.state) = 'CLAIMED';
            END IF;
            -- Superseded (a newer pending run of its item_key, looked up per
            -- row): cancelled into the history; the others go back to
            -- pending, or die with their last attempt, expired ones apart,
            -- so that each part knows the lease it ends.
            WITH gone AS (
                DELETE FROM throttle.event e
                WHERE e.id = ANY (ids) AND upper(e.state) = 'CLAIMED'
                  AND EXISTS (SELECT 1 FROM throttle.event u  -- event_pending_key
                              WHERE u.queue = e.queue AND u.item_key = e.item_key
                                AND u.state = 'pending' OFFSET 0)
                RETURNING e.*),
            superseded AS (
                SELECT g.id, g.queue, g.item_key, g.group_key, g.payload, g.run_at,
                       'cancelled'::text AS state, g.attempts, g.max_attempts, g.enqueued_at,
                       g.enqueued_by, g.claimed_at, g.claimed_by, NULL::bigint AS claim_token,
                       NULL::timestamptz AS lease_until, g.completed_at, g.completed_by,
                       now AS cancelled_at, g.last_error, g.claimed_role, g.priority,
                       CASE WHEN g.lease_until <= now THEN g.lease_until ELSE g.failed_at END
                           AS failed_at,
                       g.cancelled_by, g.concurrency_key
                FROM gone g),
            moved AS (
                INSERT INTO throttle.event_history
                SELECT h.id, h.queue, h.item_key, h.group_key, h.payload, h.run_at, h.state,
                       h.attempts, h.max_attempts, h.enqueued_at, h.enqueued_by, h.claimed_at,
                       h.claimed_by, h.claim_token, h.lease_until, h.completed_at,
                       h.completed_by, h.cancelled_at, h.last_error, h.claimed_role,
                       h.priority, h.failed_at, h.cancelled_by, h.concurrency_key
                FROM superseded h),
            expired AS (
                UPDATE throttle.event e
                SET state = CASE WHEN e.attempts < e.max_attempts THEN 'pending' ELSE 'dead' END,
                    completed_at = CASE WHEN e.attempts < e.max_attempts THEN e.completed_at
                                        ELSE now END,
                    completed_by = CASE WHEN e.attempts < e.max_attempts THEN e.completed_by
                                        ELSE e.claimed_by END,
                    last_error = CASE WHEN e.attempts < e.max_attempts THEN e.last_error
                                      ELSE coalesce(e.last_error,
                                                    'lease expired ' || e.attempts || ' times') END,
                    failed_at = e.lease_until, lease_until = NULL, claim_token = NULL
                WHERE e.id = ANY (ids) AND upper(e.state) = 'CLAIMED' AND e.lease_until <= now
                  AND NOT EXISTS (SELECT 1 FROM throttle.event u  -- event_pending_key
                                  WHERE u.queue = e.queue AND u.item_key = e.item_key
                                    AND u.state = 'pending' OFFSET 0)
                RETURNING e.*),
            released AS (
                UPDATE throttle.event e
                SET state = CASE WHEN e.attempts < e.max_attempts THEN 'pending' ELSE 'dead' END,
                    completed_at = CASE WHEN e.attempts < e.max_attempts THEN e.completed_at
                                        ELSE now END,
                    completed_by = CASE WHEN e.attempts < e.max_attempts THEN e.completed_by
                                        ELSE e.claimed_by END,
                    last_error = CASE WHEN e.attempts < e.max_attempts THEN e.last_error
                                      ELSE coalesce(e.last_error,
                                                    'released on its last attempt') END,
                    lease_until = NULL, claim_token = NULL
                WHERE e.id = ANY (ids) AND upper(e.state) = 'CLAIMED'
                  AND (e.lease_until <= now) IS NOT TRUE
                  AND NOT EXISTS (SELECT 1 FROM throttle.event u  -- event_pending_key
                                  WHERE u.queue = e.queue AND u.item_key = e.item_key
                                    AND u.state = 'pending' OFFSET 0)
                RETURNING e.*),
            f AS (
                SELECT ROW(h.*)::throttle.event AS fenced FROM superseded h
                UNION ALL
                SELECT ROW(x.*)::throttle.event FROM expired x
                UNION ALL
                SELECT ROW(r.*)::throttle.event FROM released r)
            SELECT array_agg(f.fenced ORDER BY (f.fenced).id) INTO fenced FROM f;
            EXIT;
        EXCEPTION WHEN unique_violation THEN
            GET STACKED DIAGNOSTICS violated = CONSTRAINT_NAME;
            IF NOT throttle._newer_run_committed(violated) OR attempt = 3 THEN
                RAISE;
            END IF;
        END;
    END LOOP;
    RETURN QUERY SELECT * FROM unnest(fenced);
END
$$;
COMMENT ON FUNCTION throttle._fence_claims(bigint[], timestamptz, bigint[]) IS
    'Internal: ends claims for someone else than their worker: pending again, without a token (cancelled when a newer run of their item_key is pending). Records each attempt in throttle.event_attempt: expired when its lease had ended, else released. The claims in uncharged never ran their event and give its attempt back; the others keep it, and an event whose attempts are then used up is dead, not pending.';

CREATE FUNCTION throttle._group_reset(queue text, group_key text)
RETURNS boolean
AS 'MODULE_PATHNAME', 'pg_throttle_group_reset'
LANGUAGE C VOLATILE PARALLEL UNSAFE;
COMMENT ON FUNCTION throttle._group_reset(text, text) IS
    'Internal: ends whatever lease holds a group of a queue in shared memory.';
REVOKE EXECUTE ON FUNCTION throttle._group_reset(text, text) FROM PUBLIC;

CREATE FUNCTION throttle.release_group(queue text, group_key text)
RETURNS integer
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
#variable_conflict use_column
DECLARE
    ended throttle.event[];
    held bigint[];
    uncharged bigint[] := '{}';
BEGIN
    PERFORM throttle._require(queue, 'queue'), throttle._require(group_key, 'group_key');
    held := ARRAY(SELECT x.id FROM throttle.event x  -- in id order, as complete, fail and extend lock
                  WHERE x.queue = release_group.queue AND x.group_key = release_group.group_key
                    AND x.group_key IS NOT NULL AND x.state = 'claimed'
                  ORDER BY x.id
                  FOR UPDATE);
    -- In a group kept in strict order each claim ran its first event only:
    -- the later ones waited behind it, and get their attempt back.
    IF EXISTS (SELECT 1 FROM throttle.group_policy p
               WHERE p.queue = release_group.queue AND p.strict_order) THEN
        uncharged := ARRAY(SELECT c.id
                           FROM (SELECT x.id, min(x.id) OVER (PARTITION BY x.claim_token) AS first
                                 FROM throttle.event x
                                 WHERE x.id = ANY (held) AND upper(x.state) = 'CLAIMED') AS c
                           WHERE c.id > c.first);
    END IF;
    SELECT array_agg(f) INTO ended FROM throttle._fence_claims(held, throttle.now(), uncharged) AS f;
    -- Until this commits the rows still say claimed, which keeps the group
    -- from every other worker.
    PERFORM throttle._group_reset(queue, group_key);
    -- The group's due events, and newer runs elsewhere of those it cancelled.
    PERFORM pg_notify(queue, x.id::text) FROM throttle.event x
    WHERE x.queue = release_group.queue AND x.group_key = release_group.group_key
      AND x.group_key IS NOT NULL AND x.state = 'pending' AND x.run_at <= throttle.now();
    PERFORM throttle._notify_successors(ended);
    RETURN coalesce(cardinality(ended), 0);
END
$$;
COMMENT ON FUNCTION throttle.release_group(text, text) IS
    'Ends the claim on a group of a queue, whoever holds it: its claimed events are pending again (due, their attempts kept; dead when the claim was their last attempt) and the holder is fenced. In a group kept in strict order only the first event of each claim ran: the later ones get their attempt back. Returns how many claimed events it ended. For operators.';
REVOKE EXECUTE ON FUNCTION throttle.release_group(text, text) FROM PUBLIC;

CREATE FUNCTION throttle.purge(older_than interval, queue text DEFAULT NULL,
                               states text[] DEFAULT '{done,cancelled}')
RETURNS bigint
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
#variable_conflict use_column
DECLARE
    purged bigint;
    gone_ids bigint[];
    cutoff timestamptz;
BEGIN
    PERFORM throttle._require(older_than, 'older_than'), throttle._require(states, 'states');
    IF older_than < interval '0' THEN
        RAISE EXCEPTION 'older_than must not be negative' USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF cardinality(states) = 0 OR NOT states <@ ARRAY['done', 'dead', 'cancelled']
       OR array_position(states, NULL) IS NOT NULL THEN
        RAISE EXCEPTION 'states must name finished states: done, dead, cancelled'
              USING ERRCODE = 'invalid_parameter_value',
                    DETAIL = 'Pending and claimed events are never purged.';
    END IF;
    -- A value, not throttle.now() (volatile) in the statements: then the
    -- planner bounds the scans of the indexes with it.
    cutoff := throttle.now() - older_than;
    WITH gone AS (
        DELETE FROM throttle.event_history h  -- event_history_finished
        WHERE h.state = ANY (states)
          AND (purge.queue IS NULL OR h.queue = purge.queue)
          AND coalesce(h.completed_at, h.cancelled_at) < cutoff
        RETURNING h.id),
    dead AS (
        DELETE FROM throttle.event e  -- event_dead
        WHERE 'dead' = ANY (states) AND e.state = 'dead'
          AND (purge.queue IS NULL OR e.queue = purge.queue)
          AND e.completed_at < cutoff
        RETURNING e.id)
    SELECT array_agg(x.id) INTO gone_ids FROM (SELECT id FROM gone UNION ALL SELECT id FROM dead) x;
    -- A statement of its own, with a snapshot of its own: a dead event that
    -- was retried and failed again while the first one ran is deleted in its
    -- newest version, with attempts that first statement could not see. No
    -- new attempt can come for these ids: the rows are gone, locked until
    -- commit.
    DELETE FROM throttle.event_attempt a WHERE a.event_id = ANY (gone_ids);
    purged := coalesce(cardinality(gone_ids), 0);
    RETURN purged;
END
$$;
COMMENT ON FUNCTION throttle.purge(interval, text, text[]) IS
    'Deletes finished events that finished more than older_than ago, of one queue or all, in the given states: done and cancelled (throttle.event_history) unless asked; dead events (throttle.event), which nobody has resolved, only when states names them. Returns how many events; their attempts (throttle.event_attempt) go with them. The only way events are deleted.';
REVOKE EXECUTE ON FUNCTION throttle.purge(interval, text, text[]) FROM PUBLIC;

-- Pausing a queue, or one group of it: a row of throttle.queue_pause, which
-- claim reads in the statement it starts with (claim_sql.cpp) and
-- claim_group with its policy (group_policy.cpp). No lock is taken: a claim
-- whose statement began before the pause committed may still hand out
-- events, any claim after it hands out none.
CREATE FUNCTION throttle._check_pause(queue text, group_key text)
RETURNS void
LANGUAGE plpgsql IMMUTABLE AS $$
#variable_conflict use_column
BEGIN
    PERFORM throttle._require(queue, 'queue');
    IF queue = '' OR octet_length(queue) > 63 THEN
        RAISE EXCEPTION 'queue name must have 1 to 63 bytes' USING ERRCODE = 'invalid_parameter_value',
              DETAIL = 'The queue name is also the NOTIFY channel that workers LISTEN on.';
    END IF;
    IF octet_length(group_key) > 1024 THEN
        RAISE EXCEPTION 'group_key must have at most 1024 bytes' USING ERRCODE = 'invalid_parameter_value',
              DETAIL = 'Keys are indexed; an index entry holds at most about 2700 bytes.';
    END IF;
END
$$;
COMMENT ON FUNCTION throttle._check_pause(text, text) IS
    'Internal: raises 22004 or 22023 unless the queue name and group_key are valid for pause and resume, as schedule checks them.';

CREATE FUNCTION throttle.pause(queue text, group_key text DEFAULT NULL)
RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
#variable_conflict use_column
BEGIN
    PERFORM throttle._check_pause(queue, group_key);
    INSERT INTO throttle.queue_pause AS p (queue, group_key, paused_at, paused_by)
    VALUES (queue, group_key, throttle.now(), throttle._caller())
    ON CONFLICT DO NOTHING;
    IF FOUND THEN
        RETURN true;
    END IF;
    RAISE NOTICE '%', CASE WHEN group_key IS NULL
                           THEN format('queue %s is already paused', throttle._literal(queue))
                           ELSE format('group %s of queue %s is already paused',
                                       throttle._literal(group_key), throttle._literal(queue)) END
          USING HINT = 'throttle.queue_pause shows since when and by whom.';
    RETURN false;
END
$$;
COMMENT ON FUNCTION throttle.pause(text, text) IS
    'Pauses a queue (group_key NULL) or one group of it: until throttle.resume, claim and claim_group hand out none of its events (nor take over its expired claims); schedule and the calls that end claims work as before. Exact from the commit on: a claim whose statement began before it may still hand out events, none after. Returns false, with a NOTICE, when it was paused already. For operators.';
REVOKE EXECUTE ON FUNCTION throttle.pause(text, text) FROM PUBLIC;

CREATE FUNCTION throttle.resume(queue text, group_key text DEFAULT NULL)
RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
#variable_conflict use_column
BEGIN
    PERFORM throttle._check_pause(queue, group_key);
    DELETE FROM throttle.queue_pause p
    WHERE p.queue = resume.queue AND p.group_key IS NOT DISTINCT FROM resume.group_key;
    IF NOT FOUND THEN
        RAISE NOTICE '%', CASE WHEN group_key IS NULL
                               THEN format('queue %s is not paused', throttle._literal(queue))
                               ELSE format('group %s of queue %s is not paused',
                                           throttle._literal(group_key), throttle._literal(queue)) END;
        RETURN false;
    END IF;
    -- The workers LISTENing on the queue's channel wake: the oldest due
    -- events it now hands out, and claims whose lease ended meanwhile (the
    -- next claim takes them over); none while the whole queue stays
    -- paused; at most 64.
    PERFORM pg_notify(queue, d.id::text)
    FROM (SELECT e.id, CASE WHEN e.state = 'pending' THEN e.run_at ELSE e.lease_until END AS due_at
          FROM throttle.event e
          WHERE e.queue = resume.queue
            AND ((e.state = 'pending' AND e.run_at <= throttle.now())
                 OR (e.state = 'claimed' AND e.lease_until <= throttle.now()))
            AND (resume.group_key IS NULL OR e.group_key = resume.group_key)
            AND NOT EXISTS (SELECT 1 FROM throttle.queue_pause p
                            WHERE p.queue = e.queue
                              AND (p.group_key IS NULL OR p.group_key = e.group_key))
          ORDER BY due_at, e.id LIMIT 64) AS d;
    RETURN true;
END
$$;
COMMENT ON FUNCTION throttle.resume(text, text) IS
    'Ends the pause of a queue (group_key NULL) or of one group of it, and NOTIFYs the queue''s channel with up to 64 of its oldest due events that claims now hand out, so that LISTENing workers wake. Returns false, with a NOTICE, when it was not paused (resuming the queue does not end the pauses of its groups). For operators.';
REVOKE EXECUTE ON FUNCTION throttle.resume(text, text) FROM PUBLIC;

--
-- What an operator graphs and alerts on, per queue of this database
-- (monitoring/queries.yaml).
--
-- throttle.now() is read once, in a CTE (a volatile one is always
-- materialized): joined as a subquery, a plan that rescans it per event (a
-- nested loop with the events outside) gave each event its own now, and a
-- queue as many rows as distinct instants.
CREATE VIEW throttle.queue_metrics AS
    WITH n AS MATERIALIZED (SELECT throttle.now() AS now),
    m AS (
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
        GROUP BY e.queue, n.now),
    p AS (
        SELECT q.queue, bool_or(q.group_key IS NULL) AS paused, count(q.group_key) AS paused_groups
        FROM throttle.queue_pause q
        GROUP BY q.queue)
    SELECT coalesce(m.queue, p.queue) AS queue,
           coalesce(m.due, 0) AS due,
           coalesce(m.scheduled, 0) AS scheduled,
           coalesce(m.claimed, 0) AS claimed,
           coalesce(m.claims_expired, 0) AS claims_expired,
           coalesce(m.dead, 0) AS dead,
           coalesce(m.oldest_due_seconds, 0)::double precision AS oldest_due_seconds,
           coalesce(p.paused, false) AS paused,
           coalesce(p.paused_groups, 0) AS paused_groups
    FROM m FULL JOIN p ON p.queue = m.queue;
COMMENT ON VIEW throttle.queue_metrics IS
    'One row per queue of this database with events in throttle.event or a pause in throttle.queue_pause: events due (pending, run_at passed; some may wait behind a claimed run of their item_key or a held group), scheduled for later, claimed, claimed whose lease has ended (a worker died or stalled; the next claim takes them over), dead, the age in seconds of the oldest due event (0 when none is due), whether the whole queue is paused and how many of its groups are. Reads the whole of throttle.event: scrape it every few seconds, not in a loop. Readable by everyone, as throttle.event is.';
GRANT SELECT ON throttle.queue_metrics TO PUBLIC;

-- Recurring schedules (docs/recurring.md): a catalog edited with SQL; each
-- firing enqueues one event, exactly once: the firer decides a firing (moves
-- next_firing past it) in the transaction that schedules its event.
CREATE TABLE throttle.recurring (
    name            text PRIMARY KEY CHECK (name <> '' AND octet_length(name) <= 200),
    queue           text NOT NULL CHECK (queue <> '' AND octet_length(queue) <= 63),
    cron            text NOT NULL,
    time_zone       text NOT NULL DEFAULT 'UTC',
    payload         jsonb NOT NULL DEFAULT '{}',
    group_key       text,
    concurrency_key text,
    priority        integer NOT NULL DEFAULT 0,
    max_attempts    integer NOT NULL DEFAULT 5 CHECK (max_attempts > 0),
    catch_up        text NOT NULL DEFAULT 'latest' CHECK (catch_up IN ('none', 'latest', 'all')),
    catch_up_window interval NOT NULL DEFAULT '1 day'
                    CHECK (catch_up_window > '0' AND catch_up_window <= '31 days'),
    on_overlap      text NOT NULL DEFAULT 'run' CHECK (on_overlap IN ('run', 'skip')),
    enabled         boolean NOT NULL DEFAULT true,
    next_firing     timestamptz,
    last_firing     timestamptz,
    last_outcome    text,
    last_event_id   bigint,
    created_at      timestamptz NOT NULL DEFAULT throttle.now(),
    created_by      text NOT NULL DEFAULT throttle._caller(),
    CONSTRAINT recurring_concurrency_key_ungrouped CHECK (concurrency_key IS NULL OR group_key IS NULL),
    CONSTRAINT recurring_keys_check CHECK (octet_length(group_key) <= 1024 AND octet_length(concurrency_key) <= 1024)
);
CREATE INDEX recurring_due ON throttle.recurring (next_firing) WHERE enabled;
COMMENT ON TABLE throttle.recurring IS
    'Recurring schedules: each firing of cron in time_zone enqueues one event into queue (item_key recurring:<name>:<firing in UTC>), exactly once, by the database''s waker. Edited at run time with INSERT, UPDATE and DELETE; next_firing, last_firing, last_outcome and last_event_id are kept by pg_throttle.';
COMMENT ON COLUMN throttle.recurring.cron IS 'A cron expression (docs/recurring.md), checked on every write (22023).';
COMMENT ON COLUMN throttle.recurring.time_zone IS 'The time zone the expression is read in, as AT TIME ZONE reads it (22023 when unknown).';
COMMENT ON COLUMN throttle.recurring.catch_up IS 'What happens to firings missed while no firer ran (the server down, the schedule paused by enabled = false does not count): none skips them, latest enqueues the newest missed one, all enqueues each one within catch_up_window (at most 1 000 at a time).';
COMMENT ON COLUMN throttle.recurring.catch_up_window IS 'With catch_up = all: how far back missed firings are enqueued, at most 31 days.';
COMMENT ON COLUMN throttle.recurring.on_overlap IS 'run enqueues every firing; skip decides a firing skipped while the event of the last one enqueued is still pending or claimed.';
COMMENT ON COLUMN throttle.recurring.next_firing IS 'The first firing not decided yet (NULL when disabled): set from throttle.now() when the schedule is written (a new or changed schedule does not backfill), moved past each firing the firer decides.';
COMMENT ON COLUMN throttle.recurring.last_firing IS 'The last firing decided.';
COMMENT ON COLUMN throttle.recurring.last_outcome IS 'enqueued, skipped: overlap (on_overlap = skip), or skipped: missed (catch_up).';
COMMENT ON COLUMN throttle.recurring.last_event_id IS 'The event of the last firing enqueued.';
GRANT SELECT ON throttle.recurring TO PUBLIC;
SELECT pg_catalog.pg_extension_config_dump('throttle.recurring', '');
SELECT pg_catalog.pg_extension_config_dump('throttle.queue_pause', '');

CREATE FUNCTION throttle._wake_at(instant timestamptz)
RETURNS void
AS 'MODULE_PATHNAME', 'pg_throttle_wake_at'  -- src/pg/queue/waker_sql.cpp
LANGUAGE C STRICT;
COMMENT ON FUNCTION throttle._wake_at(timestamptz) IS
    'Internal: the database''s waker is told, when the transaction commits, that something falls due at instant (a recurring schedule''s next firing).';
REVOKE EXECUTE ON FUNCTION throttle._wake_at(timestamptz) FROM PUBLIC;

-- The rules of a schedule, and its next firing when it is written.
CREATE FUNCTION throttle._recurring_check()
RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    IF TG_OP = 'UPDATE' AND NEW.cron = OLD.cron AND NEW.time_zone = OLD.time_zone
       AND NEW.enabled = OLD.enabled THEN
        NULL;  -- the firer's update, or another column's: next_firing as given
    ELSIF NEW.enabled THEN
        NEW.next_firing := throttle.cron_next(NEW.cron, NEW.time_zone, throttle.now());
    ELSE
        PERFORM throttle.cron_next(NEW.cron, NEW.time_zone, throttle.now());  -- checked all the same
    END IF;
    IF NOT NEW.enabled THEN
        NEW.next_firing := NULL;
    ELSIF NEW.next_firing IS NOT NULL
          AND (TG_OP = 'INSERT' OR NEW.next_firing IS DISTINCT FROM OLD.next_firing) THEN
        PERFORM throttle._wake_at(NEW.next_firing);
    END IF;
    RETURN NEW;
END
$$;
COMMENT ON FUNCTION throttle._recurring_check() IS
    'Internal: the trigger of throttle.recurring: checks cron and time_zone (22023), sets next_firing when a schedule is inserted or its cron, time_zone or enabled change (NULL when disabled), and tells the waker.';
REVOKE EXECUTE ON FUNCTION throttle._recurring_check() FROM PUBLIC;
CREATE TRIGGER recurring_check BEFORE INSERT OR UPDATE ON throttle.recurring
    FOR EACH ROW EXECUTE FUNCTION throttle._recurring_check();

-- The firer: decides every firing due at upto_at, oldest first, each
-- schedule's in one go; returns how many firings it decided. A schedule
-- another transaction is firing is skipped (its row is locked); its
-- next_firing then moves past what that one decided.
CREATE FUNCTION throttle._fire_recurring(upto_at timestamptz)
RETURNS integer
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    r throttle.recurring;
    span interval;
    latest timestamptz;
    firings timestamptz[];
    f timestamptz;
    decided integer := 0;
    outcome text;
    event_id bigint;
    failure text;
BEGIN
    FOR r IN SELECT * FROM throttle.recurring s
             WHERE s.enabled AND s.next_firing <= upto_at
             ORDER BY s.next_firing FOR UPDATE SKIP LOCKED LOOP
      BEGIN
        IF r.catch_up = 'all' THEN
            -- Each firing due, those older than the window skipped; at most
            -- 1 000 this time, the rest at the next pass.
            firings := ARRAY(SELECT x FROM throttle.cron_firings(
                                 r.cron, r.time_zone,
                                 greatest(r.next_firing, upto_at - r.catch_up_window) - interval '1 microsecond',
                                 upto_at, 1000) x);
            IF r.next_firing < upto_at - r.catch_up_window THEN
                decided := decided + 1;
                r.last_outcome := 'skipped: missed';
                r.last_firing := upto_at - r.catch_up_window;  -- an instant before the window
            END IF;
        ELSE
            -- The newest firing due: looked for in ever longer spans before upto_at.
            latest := NULL;
            FOREACH span IN ARRAY ARRAY['1 minute', '1 hour', '1 day', '32 days', '400 days',
                                        '4000 days', '146100 days']::interval[] LOOP
                latest := (SELECT max(x) FROM throttle.cron_firings(
                               r.cron, r.time_zone,
                               greatest(r.next_firing, upto_at - span) - interval '1 microsecond',
                               upto_at, 100000) x);
                EXIT WHEN latest IS NOT NULL OR upto_at - span <= r.next_firing;
            END LOOP;
            firings := CASE WHEN latest IS NULL THEN '{}' ELSE ARRAY[latest] END;
            IF r.catch_up = 'none' AND latest < upto_at - interval '1 minute' THEN
                firings := '{}';  -- missed: a running firer is never that late
                decided := decided + 1;
                r.last_outcome := 'skipped: missed';
                r.last_firing := latest;
            END IF;
        END IF;
        FOREACH f IN ARRAY firings LOOP
            decided := decided + 1;
            r.last_firing := f;
            IF r.on_overlap = 'skip' AND EXISTS (
                   SELECT 1 FROM throttle.event e
                   WHERE e.id = r.last_event_id AND e.state IN ('pending', 'claimed')) THEN
                r.last_outcome := 'skipped: overlap';
                CONTINUE;
            END IF;
            PERFORM set_config('application_name', left('pg_throttle recurring ' || r.name, 63), true);
            event_id := throttle.schedule(
                r.queue, 'recurring:' || r.name || ':'
                         || to_char(f AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"'),
                f, r.payload, r.group_key, r.max_attempts, r.priority, 'ignore',
                r.concurrency_key);
            r.last_outcome := 'enqueued';
            r.last_event_id := event_id;
        END LOOP;
        UPDATE throttle.recurring s
        SET next_firing = throttle.cron_next(r.cron, r.time_zone, greatest(r.last_firing, r.next_firing)),
            last_firing = r.last_firing, last_outcome = r.last_outcome,
            last_event_id = r.last_event_id
        WHERE s.name = r.name;
      EXCEPTION WHEN OTHERS THEN
        -- Nothing of this schedule's firing happened; the others go on, and
        -- it is tried again at the next pass, its last_outcome saying why.
        GET STACKED DIAGNOSTICS failure = MESSAGE_TEXT;
        UPDATE throttle.recurring s SET last_outcome = left('failed: ' || failure, 200)
        WHERE s.name = r.name;
      END;
    END LOOP;
    RETURN decided;
END
$$;
COMMENT ON FUNCTION throttle._fire_recurring(timestamptz) IS
    'Internal, for the waker of the database: decides every firing of throttle.recurring due at upto_at (enqueues its event, or skips it as catch_up and on_overlap say) and moves next_firing past it in the same transaction; returns how many it decided.';
REVOKE EXECUTE ON FUNCTION throttle._fire_recurring(timestamptz) FROM PUBLIC;

CREATE VIEW throttle.recurring_status AS
    SELECT r.name, r.queue, r.cron, r.time_zone, r.enabled, r.last_firing, r.last_outcome,
           r.last_event_id, a.state AS last_event_state, r.next_firing,
           greatest(throttle.now() - r.next_firing, interval '0') AS behind
    FROM throttle.recurring r
    LEFT JOIN LATERAL (SELECT e.state FROM throttle.all_events e WHERE e.id = r.last_event_id) a
           ON true;
COMMENT ON VIEW throttle.recurring_status IS
    'Each recurring schedule: its last firing decided and what became of it (enqueued, skipped: overlap, skipped: missed), the state of the last event it enqueued (pending, claimed, dead, done, cancelled; NULL once purged), its next firing, and how far the firer is behind it (0 when on time). Readable by everyone.';
GRANT SELECT ON throttle.recurring_status TO PUBLIC;

-- Wake-ups (docs/queue.md, "Wake-ups"): the waker of each database calls
-- this when something falls due; it NOTIFYs the channel of each queue with
-- the events that fell due in (after_at, upto_at] (a pending event's run_at,
-- a claim's lease_until), at most 64 per queue and kind, which wake every
-- listener of the queue; and answers the next instant something falls due
-- (NULL: nothing ahead), a recurring schedule's next firing included, after
-- it has fired those due. Index descents only: per queue, one per priority
-- of its pending events without a group_key, and three more.
CREATE FUNCTION throttle._announce_due(after_at timestamptz, upto_at timestamptz)
RETURNS timestamptz
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    q text;
    p integer;
    next_at timestamptz;
BEGIN
  -- The waker's lock_timeout is short: a statement that locks these tables
  -- (DROP EXTENSION, an update's ALTER TABLE) never waits on a pass, nor
  -- deadlocks with one. A pass that would wait gives way, its NOTIFYs
  -- undone, and answers -infinity: the waker runs (after_at, upto_at] again
  -- a second later.
  BEGIN
    -- Recurring schedules first: a firing due enqueues its event (which
    -- schedule NOTIFYs). One a concurrent firer holds, or one that failed,
    -- is tried again a second later.
    IF EXISTS (SELECT 1 FROM throttle.recurring r WHERE r.enabled AND r.next_firing <= upto_at) THEN
        PERFORM throttle._fire_recurring(upto_at);
        IF EXISTS (SELECT 1 FROM throttle.recurring r
                   WHERE r.enabled AND r.next_firing <= upto_at) THEN
            next_at := upto_at + interval '1 second';
        END IF;
    END IF;
    next_at := least(next_at, (SELECT min(r.next_firing) FROM throttle.recurring r
                               WHERE r.enabled AND r.next_firing > upto_at));
    FOR q IN
        WITH RECURSIVE pending(queue) AS (       -- event_pending_key
            SELECT min(e.queue) FROM throttle.event e WHERE e.state = 'pending'
            UNION ALL
            SELECT (SELECT min(e.queue) FROM throttle.event e
                    WHERE e.state = 'pending' AND e.queue > pending.queue)
            FROM pending WHERE pending.queue IS NOT NULL),
        claimed(queue) AS (                      -- event_claimed_key
            SELECT min(e.queue) FROM throttle.event e WHERE e.state = 'claimed'
            UNION ALL
            SELECT (SELECT min(e.queue) FROM throttle.event e
                    WHERE e.state = 'claimed' AND e.queue > claimed.queue)
            FROM claimed WHERE claimed.queue IS NOT NULL)
        SELECT pending.queue FROM pending WHERE pending.queue IS NOT NULL
        UNION
        SELECT claimed.queue FROM claimed WHERE claimed.queue IS NOT NULL
    LOOP
        -- Pending without a group_key, one priority at a time (event_due_single).
        p := (SELECT min(e.priority) FROM throttle.event e
              WHERE e.queue = q AND e.state = 'pending' AND e.group_key IS NULL);
        WHILE p IS NOT NULL LOOP
            PERFORM pg_notify(q, d.id::text)
            FROM (SELECT e.id FROM throttle.event e
                  WHERE e.queue = q AND e.state = 'pending' AND e.group_key IS NULL
                    AND e.priority = p AND e.run_at > after_at AND e.run_at <= upto_at
                  ORDER BY e.run_at LIMIT 64) d;
            next_at := least(next_at, (SELECT min(e.run_at) FROM throttle.event e
                                       WHERE e.queue = q AND e.state = 'pending'
                                         AND e.group_key IS NULL AND e.priority = p
                                         AND e.run_at > upto_at));
            EXIT WHEN p = 2147483647;
            p := (SELECT min(e.priority) FROM throttle.event e
                  WHERE e.queue = q AND e.state = 'pending' AND e.group_key IS NULL
                    AND e.priority > p);
        END LOOP;
        -- Pending with a group_key (event_due_grouped).
        PERFORM pg_notify(q, d.id::text)
        FROM (SELECT e.id FROM throttle.event e
              WHERE e.queue = q AND e.state = 'pending' AND e.group_key IS NOT NULL
                AND e.run_at > after_at AND e.run_at <= upto_at
              ORDER BY e.run_at LIMIT 64) d;
        next_at := least(next_at, (SELECT min(e.run_at) FROM throttle.event e
                                   WHERE e.queue = q AND e.state = 'pending'
                                     AND e.group_key IS NOT NULL AND e.run_at > upto_at));
        -- Claims whose lease ends (event_leases_single, event_leases_grouped).
        PERFORM pg_notify(q, d.id::text)
        FROM (SELECT e.id FROM throttle.event e
              WHERE e.queue = q AND e.state = 'claimed' AND e.group_key IS NULL
                AND e.lease_until > after_at AND e.lease_until <= upto_at
              ORDER BY e.lease_until LIMIT 64) d;
        next_at := least(next_at, (SELECT min(e.lease_until) FROM throttle.event e
                                   WHERE e.queue = q AND e.state = 'claimed'
                                     AND e.group_key IS NULL AND e.lease_until > upto_at));
        PERFORM pg_notify(q, d.id::text)
        FROM (SELECT e.id FROM throttle.event e
              WHERE e.queue = q AND e.state = 'claimed' AND e.group_key IS NOT NULL
                AND e.lease_until > after_at AND e.lease_until <= upto_at
              ORDER BY e.lease_until LIMIT 64) d;
        next_at := least(next_at, (SELECT min(e.lease_until) FROM throttle.event e
                                   WHERE e.queue = q AND e.state = 'claimed'
                                     AND e.group_key IS NOT NULL AND e.lease_until > upto_at));
    END LOOP;
  EXCEPTION WHEN lock_not_available THEN
    RETURN '-infinity';
  END;
    RETURN next_at;
END
$$;
COMMENT ON FUNCTION throttle._announce_due(timestamptz, timestamptz) IS
    'Internal, for the waker of the database: fires the recurring schedules due, NOTIFYs each queue''s channel with the ids of the events that fell due in (after_at, upto_at] (a pending event''s run_at, a claim''s lease_until; at most 64 per queue and kind) and returns the next instant something falls due, NULL when none; -infinity when it gave way to a lock (nothing done).';
REVOKE EXECUTE ON FUNCTION throttle._announce_due(timestamptz, timestamptz) FROM PUBLIC;

CREATE FUNCTION throttle._waker_start()
RETURNS void
AS 'MODULE_PATHNAME', 'pg_throttle_waker_start'  -- src/pg/queue/waker_sql.cpp
LANGUAGE C;
COMMENT ON FUNCTION throttle._waker_start() IS
    'Internal: once the transaction commits, this database gets a waker, whose first pass announces every event due (called by the install and update scripts).';
REVOKE EXECUTE ON FUNCTION throttle._waker_start() FROM PUBLIC;
SELECT throttle._waker_start();

-- Cron expressions (docs/recurring.md): when one fires in a time zone, for
-- checking an expression, and for the recurring schedules to come. STABLE
-- rather than IMMUTABLE: an update of the time zone data moves firings.
CREATE FUNCTION throttle.cron_next(cron text, time_zone text DEFAULT 'UTC',
                                   after timestamptz DEFAULT throttle.now())
RETURNS timestamptz
AS 'MODULE_PATHNAME', 'pg_throttle_cron_next'  -- src/pg/queue/cron_sql.cpp
LANGUAGE C STABLE PARALLEL SAFE;
COMMENT ON FUNCTION throttle.cron_next(text, text, timestamptz) IS
    'The first instant after after at which the cron expression fires in time_zone (five fields, or six with leading seconds; docs/recurring.md, DST rule included); NULL when none comes before timestamps end. 22023 for an invalid expression (the DETAIL names the field and byte offset) or an unknown time zone.';

CREATE FUNCTION throttle.cron_firings(cron text, time_zone text, after timestamptz,
                                      upto timestamptz, max integer DEFAULT 1000)
RETURNS SETOF timestamptz
AS 'MODULE_PATHNAME', 'pg_throttle_cron_firings'  -- src/pg/queue/cron_sql.cpp
LANGUAGE C STABLE PARALLEL SAFE ROWS 100;
COMMENT ON FUNCTION throttle.cron_firings(text, text, timestamptz, timestamptz, integer) IS
    'The instants after after and at most upto at which the cron expression fires in time_zone, in order, at most max of them (1 to 100000), as throttle.cron_next finds them one after another.';
