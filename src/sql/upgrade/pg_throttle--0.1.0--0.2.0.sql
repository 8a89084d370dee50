-- pg_throttle 0.1.0 -> 0.2.0. Every definition here is the same as in the
-- install script of 0.2.0 (src/sql): test/integration/upgrade.py compares an
-- updated database with a fresh one, object by object.
\echo Use "ALTER EXTENSION pg_throttle UPDATE TO '0.2.0'" to load this file. \quit

-- A claimed event may have one pending successor with its item_key.
DROP INDEX throttle.event_unfinished_key;
CREATE UNIQUE INDEX event_pending_key ON throttle.event (queue, item_key)
    WHERE state = 'pending';
CREATE INDEX event_claimed_key ON throttle.event (queue, item_key)
    WHERE state = 'claimed';
COMMENT ON COLUMN throttle.event.item_key IS 'Natural key, unique among the pending events of a queue. A claimed event may have one pending successor with its key, which no worker gets before the claimed one ends.';

-- Claims belong to their claimer: a token for every claim and the role that
-- made it. Claims open at the update have no role, so only a superuser may
-- act for them: their workers' 0.1.0 calls (by worker name) are gone, and
-- they end when their lease expires.
ALTER TABLE throttle.event ADD COLUMN claimed_role oid;
COMMENT ON COLUMN throttle.event.claim_token IS 'Token of the current claim, which complete, fail and extend need (the group lease''s token for group claims). The claimer gets it from claim or claim_group; PUBLIC may read every other column, not this one.';
COMMENT ON COLUMN throttle.event.claimed_role IS 'The role that made the current claim (an oid: claimed_role::regrole shows its name): only it, its members and superusers may complete, fail or extend it.';

-- Priority: claim takes higher priorities first.
ALTER TABLE throttle.event ADD COLUMN priority integer NOT NULL DEFAULT 0;
COMMENT ON COLUMN throttle.event.priority IS 'throttle.claim takes due events with a higher priority first, then the oldest.';
DROP INDEX throttle.event_due_single;
CREATE INDEX event_due_single ON throttle.event (queue, priority, run_at, id)
    WHERE state = 'pending' AND group_key IS NULL;

-- Traceability: when the last attempt failed, who cancelled.
ALTER TABLE throttle.event ADD COLUMN failed_at timestamptz;
ALTER TABLE throttle.event ADD COLUMN cancelled_by text;
COMMENT ON COLUMN throttle.event.failed_at IS 'When its last attempt failed: throttle.fail, or the end of a lease that expired. throttle.event_attempt keeps every attempt that ended without completing it.';
COMMENT ON COLUMN throttle.event.cancelled_by IS 'Who cancelled it (throttle.cancel''s caller, as enqueued_by); NULL when a newer run of its item_key superseded it.';

-- Per-key concurrency of events without a group.
ALTER TABLE throttle.event ADD COLUMN concurrency_key text,
    ADD CONSTRAINT event_concurrency_key_ungrouped CHECK (concurrency_key IS NULL OR group_key IS NULL);
COMMENT ON COLUMN throttle.event.concurrency_key IS 'Events of a queue without a group_key that share it are claimed at most throttle.concurrency_policy.max_claimed at once (1 when the queue is not named there), whoever claims them.';
CREATE INDEX event_claimed_concurrency ON throttle.event (queue, concurrency_key)
    WHERE state = 'claimed' AND concurrency_key IS NOT NULL;
CREATE INDEX event_pending_concurrency ON throttle.event (queue, concurrency_key, run_at)
    WHERE state = 'pending' AND concurrency_key IS NOT NULL;

-- Every column but the claim's token.
REVOKE SELECT ON throttle.event FROM PUBLIC;
GRANT SELECT (id, queue, item_key, group_key, payload, run_at, state, attempts, max_attempts,
              enqueued_at, enqueued_by, claimed_at, claimed_by, lease_until, completed_at,
              completed_by, cancelled_at, last_error, claimed_role, priority, failed_at,
              cancelled_by, concurrency_key)
    ON throttle.event TO PUBLIC;
-- pg_dump keeps the event ids' sequence with the events (0.1.0 restored
-- them beside a sequence that started again at 1).
SELECT pg_catalog.pg_extension_config_dump('throttle.event_id_seq', '');
-- Finished events leave the hot table: done and cancelled events move to
-- throttle.event_history, and the hot table keeps an index of its dead
-- events only.
DROP INDEX throttle.event_finished;
CREATE INDEX event_dead ON throttle.event (queue, completed_at)
    WHERE state = 'dead';
COMMENT ON TABLE throttle.event IS
    'The scheduled event queue, the hot table: events pending (waiting for run_at), claimed (a worker holds it until lease_until) and dead (max_attempts used up; throttle.retry brings it back, throttle.purge deletes it when asked). An event that is done or cancelled leaves it, in the same transaction, for throttle.event_history; throttle.all_events shows both.';

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

WITH moved AS (
    DELETE FROM throttle.event e WHERE e.state IN ('done', 'cancelled') RETURNING e.*)
INSERT INTO throttle.event_history
SELECT m.id, m.queue, m.item_key, m.group_key, m.payload, m.run_at, m.state, m.attempts,
       m.max_attempts, m.enqueued_at, m.enqueued_by, m.claimed_at, m.claimed_by,
       m.claim_token, m.lease_until, m.completed_at, m.completed_by, m.cancelled_at,
       m.last_error, m.claimed_role, m.priority, m.failed_at, m.cancelled_by,
       m.concurrency_key
FROM moved m;
-- The hot table refuses finished states from now on.
ALTER TABLE throttle.event DROP CONSTRAINT event_state_check,
    ADD CONSTRAINT event_state_check CHECK (state IN ('pending', 'claimed', 'dead'));
-- New events' ids go on after every event's, in either table: a 0.1.0 dump
-- restored the events beside a sequence that started again at 1.
SELECT pg_catalog.setval('throttle.event_id_seq',
                         greatest((SELECT max(id) FROM throttle.event_history),
                                  (SELECT max(id) FROM throttle.event),
                                  (SELECT last_value FROM throttle.event_id_seq)));

-- complete, fail, extend, schedule, claim_group and purge get new
-- signatures: they are dropped and created again. The privileges an operator
-- gave or took on them are saved here and made again on the new ones at the
-- end (purge was not granted to PUBLIC in 0.1.0 either: the grants an
-- operator made on it are carried over like the others).
SELECT pg_catalog.set_config('pg_throttle_upgrade.acl_' || p.proname,
                             coalesce(p.proacl::text, 'default'), true)
FROM pg_catalog.pg_proc p
WHERE p.oid IN ('throttle.complete(bigint[], text)'::regprocedure,
                'throttle.fail(bigint[], text, text, interval)'::regprocedure,
                'throttle.extend(bigint[], text, interval)'::regprocedure,
                'throttle.schedule(text, text, timestamptz, jsonb, text, integer)'::regprocedure,
                'throttle.claim_group(text, text, interval)'::regprocedure,
                'throttle.purge(interval)'::regprocedure);
DROP FUNCTION throttle.complete(bigint[], text);
DROP FUNCTION throttle.fail(bigint[], text, text, interval);
DROP FUNCTION throttle.extend(bigint[], text, interval);
-- purge takes a queue and the states to purge: dead events only when asked.
DROP FUNCTION throttle.purge(interval);
-- schedule takes a priority and what to do with a pending duplicate.
DROP FUNCTION throttle.schedule(text, text, timestamptz, jsonb, text, integer);

-- Every attempt that ended without completing its event.
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

-- Rate-limited claims: a bucket per queue.
CREATE TABLE throttle.queue_bucket (
    queue  text PRIMARY KEY CHECK (queue <> '' AND octet_length(queue) <= 63),
    bucket text NOT NULL REFERENCES throttle.bucket (name) ON UPDATE CASCADE ON DELETE CASCADE
);
COMMENT ON TABLE throttle.queue_bucket IS
    'Rate-limited queues: claim and claim_group of the queue hand out at most as many events as the declared bucket allows, one unit per event; the rest stay pending until it refills. throttle.bucket gives the shape; the units are the queue''s own (kind queue_bucket in throttle.status), out of throttle.take''s reach.';
COMMENT ON COLUMN throttle.queue_bucket.bucket IS 'The name of a bucket declared in throttle.bucket.';
GRANT SELECT ON throttle.queue_bucket TO PUBLIC;
SELECT pg_catalog.pg_extension_config_dump('throttle.queue_bucket', '');

-- Rate-limited groups: a bucket per group.
CREATE TABLE throttle.group_bucket (
    queue  text PRIMARY KEY CHECK (queue <> '' AND octet_length(queue) <= 63),
    bucket text NOT NULL REFERENCES throttle.bucket (name) ON UPDATE CASCADE ON DELETE CASCADE
);
COMMENT ON TABLE throttle.group_bucket IS
    'Rate-limited groups: each group of the queue has a bucket of its own, of the declared shape, and claim_group hands a group at most as many events as its bucket allows, one unit per event, passing over a group whose bucket is empty (its events stay pending until it refills). Beside the queue''s bucket (throttle.queue_bucket), if any. The units are the group''s own (kind group_bucket in throttle.status), out of throttle.take''s reach.';
COMMENT ON COLUMN throttle.group_bucket.bucket IS 'The name of a bucket declared in throttle.bucket: its rate, per and burst apply to each group.';
GRANT SELECT ON throttle.group_bucket TO PUBLIC;
SELECT pg_catalog.pg_extension_config_dump('throttle.group_bucket', '');

-- How groups are handed out: per-group concurrency, strict order.
CREATE TABLE throttle.group_policy (
    queue        text PRIMARY KEY CHECK (queue <> '' AND octet_length(queue) <= 63),
    workers      integer NOT NULL DEFAULT 1 CHECK (workers BETWEEN 1 AND 64),
    strict_order boolean NOT NULL DEFAULT false,
    CONSTRAINT strict_order_has_one_worker CHECK (NOT strict_order OR workers = 1)
);
COMMENT ON TABLE throttle.group_policy IS
    'How claim_group hands out the groups of a queue; a queue not named here has one worker per group and no strict order.';
COMMENT ON COLUMN throttle.group_policy.workers IS 'How many claims may hold one group at once, 1 to 64, each with events no other holds.';
COMMENT ON COLUMN throttle.group_policy.strict_order IS 'A group''s events run in the order they were scheduled (by id): each waits for its run_at and for every earlier event of the group to complete, die or be cancelled; a failed event holds back the later ones. Needs workers = 1.';
GRANT SELECT ON throttle.group_policy TO PUBLIC;
SELECT pg_catalog.pg_extension_config_dump('throttle.group_policy', '');

-- How many events of one concurrency_key are claimed at once.
CREATE TABLE throttle.concurrency_policy (
    queue        text PRIMARY KEY CHECK (queue <> '' AND octet_length(queue) <= 63),
    max_claimed  integer NOT NULL DEFAULT 1 CHECK (max_claimed > 0)
);
COMMENT ON TABLE throttle.concurrency_policy IS
    'How many events that share a concurrency_key throttle.claim hands out at once, per queue; a queue not named here has one.';
COMMENT ON COLUMN throttle.concurrency_policy.max_claimed IS 'How many events of one concurrency_key may be claimed at once (claims whose lease holds), whichever workers hold them.';
GRANT SELECT ON throttle.concurrency_policy TO PUBLIC;
SELECT pg_catalog.pg_extension_config_dump('throttle.concurrency_policy', '');

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

-- reset knows the queue buckets and the groups' buckets.
COMMENT ON FUNCTION throttle.reset(text, text) IS
    'Clears the registry entries named name in this database (kind resource, bucket, queue_bucket, group_bucket or lock; NULL: all of them; a group''s bucket is named after its queue and group as throttle.status shows it) and returns how many; a cleared resource or lock can be granted at once, a cleared bucket is full. For operators after an incident: not granted to PUBLIC.';

-- New functions.

CREATE FUNCTION throttle._require_id(id bigint)
RETURNS bigint
LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    PERFORM throttle._require(id, 'id');
    RETURN id;
END
$$;
COMMENT ON FUNCTION throttle._require_id(bigint) IS 'Internal: id, or 22004 when it is NULL.';

CREATE FUNCTION throttle._group_release_at_commit(queue text, group_key text, token bigint)
RETURNS void
AS 'MODULE_PATHNAME', 'pg_throttle_group_release_at_commit'
LANGUAGE C VOLATILE PARALLEL UNSAFE;
COMMENT ON FUNCTION throttle._group_release_at_commit(text, text, bigint) IS
    'Internal: releases a group''s lease held with token when the calling transaction commits.';
REVOKE EXECUTE ON FUNCTION throttle._group_release_at_commit(text, text, bigint) FROM PUBLIC;

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
    'Schedules an event, or, when item_key names a pending event of the queue, updates it as on_duplicate says (replace: run_at, payload and priority; keep_earlier: the same but the earlier run_at; ignore: nothing; its group_key and concurrency_key stay); returns its id. When the event of item_key is claimed it is left alone and a new event is scheduled, which no worker gets before the claimed one ends. NOTIFYs the channel named after the queue when the event is due.';

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
    -- wait for each other in a circle.
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
                      priority = CASE WHEN on_duplicate = 'ignore' THEN e.priority ELSE excluded.priority END
        RETURNING e.id, e.item_key, e.run_at)
    SELECT (SELECT array_agg(s.id ORDER BY b.ord) FROM batch b JOIN scheduled s USING (item_key)),
           (SELECT array_agg(s.id ORDER BY s.id) FROM scheduled s WHERE s.run_at <= now)
    INTO ids, due;
    PERFORM pg_notify(queue, d::text) FROM unnest(due) AS d;
    RETURN ids;
END
$$;
COMMENT ON FUNCTION throttle.schedule_many(text, text[], timestamptz[], jsonb[], text[], integer, integer, text, text[]) IS
    'Schedules a batch of events of one queue in one statement: item_keys[i] at run_at[i] with payloads[i], group_keys[i] and concurrency_keys[i] (the arrays have one element per item_key; payloads, group_keys and concurrency_keys may be NULL for none), as if throttle.schedule ran for each in turn; returns their ids in the order of item_keys (an item_key named twice gets one event, and its id twice). NOTIFYs the queue''s channel with each event that is due.';

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
SET enable_seqscan = off;  -- its statements reach events by primary key (claim_lock.cpp)
COMMENT ON FUNCTION throttle.complete(bigint[], bigint) IS
    'Marks the events done, if the claim token still holds them and the caller is the claim''s role (or may act for it); returns how many. A worker whose claim was taken over gets 0.';

CREATE FUNCTION throttle.fail(ids bigint[], token bigint, error text, retry_in interval DEFAULT NULL)
RETURNS integer
AS 'MODULE_PATHNAME', 'pg_throttle_fail'  -- src/pg/queue/fail_sql.cpp
LANGUAGE C VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp
SET enable_seqscan = off;  -- its statements reach events by primary key (claim_lock.cpp)
COMMENT ON FUNCTION throttle.fail(bigint[], bigint, text, interval) IS
    'Records a failed attempt (in throttle.event_attempt, and failed_at): keeps the error and retries after retry_in, or 10 s * 2^(attempts-1) up to 1 hour; after max_attempts the event is dead, and when its item_key was scheduled again meanwhile it is cancelled, superseded by that newer run. In a group kept in strict order (throttle.group_policy) the claim''s later events of the group go back to pending behind the failed one, their attempt not counted. Only through the claim token that holds the events, by the claim''s role; returns how many failed.';

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
SET enable_seqscan = off;  -- its statements reach events by primary key (claim_lock.cpp)
COMMENT ON FUNCTION throttle.extend(bigint[], bigint, interval) IS
    'Extends the claim token on the events to lease from now (and the group''s lease), by the claim''s role, while its lease holds: a claim whose lease has ended is not revived. Returns how many.';

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

CREATE FUNCTION throttle._fence_claims(ids bigint[], now timestamptz)
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
            -- snapshot: no part joins the events to a list of them, which a
            -- generic plan that expects ten ids runs as a nested loop
            -- (seconds for a claim of 5 000). Superseded (a newer pending
            -- run of its item_key, looked up per row): cancelled into the
            -- history; the others go back to pending, expired ones apart,
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
                       g.cancelled_by, g.concurrency_key,
                       g.lease_until AS ended_lease, g.lease_until <= now AS expired
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
                SET state = 'pending', failed_at = e.lease_until, lease_until = NULL,
                    claim_token = NULL
                WHERE e.id = ANY (ids) AND upper(e.state) = 'CLAIMED' AND e.lease_until <= now
                  AND NOT EXISTS (SELECT 1 FROM throttle.event u  -- event_pending_key
                                  WHERE u.queue = e.queue AND u.item_key = e.item_key
                                    AND u.state = 'pending' OFFSET 0)
                RETURNING e.*),
            released AS (
                UPDATE throttle.event e
                SET state = 'pending', lease_until = NULL, claim_token = NULL
                WHERE e.id = ANY (ids) AND upper(e.state) = 'CLAIMED'
                  AND (e.lease_until <= now) IS NOT TRUE
                  AND NOT EXISTS (SELECT 1 FROM throttle.event u  -- event_pending_key
                                  WHERE u.queue = e.queue AND u.item_key = e.item_key
                                    AND u.state = 'pending' OFFSET 0)
                RETURNING e.*),
            f AS (
                SELECT ROW(h.id, h.queue, h.item_key, h.group_key, h.payload, h.run_at, h.state,
                           h.attempts, h.max_attempts, h.enqueued_at, h.enqueued_by,
                           h.claimed_at, h.claimed_by, h.claim_token, h.lease_until,
                           h.completed_at, h.completed_by, h.cancelled_at, h.last_error,
                           h.claimed_role, h.priority, h.failed_at, h.cancelled_by,
                           h.concurrency_key)::throttle.event AS fenced,
                       h.ended_lease AS lease_until, h.expired
                FROM superseded h
                UNION ALL
                SELECT ROW(x.*)::throttle.event, x.failed_at, true FROM expired x
                UNION ALL
                SELECT ROW(r.*)::throttle.event, NULL, false FROM released r),
            logged AS (
                INSERT INTO throttle.event_attempt (event_id, attempt, claimed_at, claimed_by,
                                                    claimed_role, ended_at, outcome)
                SELECT (f.fenced).id, (f.fenced).attempts, (f.fenced).claimed_at,
                       (f.fenced).claimed_by, (f.fenced).claimed_role,
                       CASE WHEN f.expired THEN f.lease_until ELSE now END,
                       CASE WHEN f.expired THEN 'expired' ELSE 'released' END
                FROM f ORDER BY (f.fenced).id)
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
COMMENT ON FUNCTION throttle._fence_claims(bigint[], timestamptz) IS
    'Internal: ends claims for someone else than their worker: pending again with their attempts kept (cancelled when a newer run of their item_key is pending), without a token. Records each attempt in throttle.event_attempt: expired when its lease had ended, else released.';

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
BEGIN
    PERFORM throttle._require(queue, 'queue'), throttle._require(group_key, 'group_key');
    PERFORM 1 FROM throttle.event x  -- in id order, as complete, fail and extend lock
    WHERE x.queue = release_group.queue AND x.group_key = release_group.group_key
      AND x.group_key IS NOT NULL AND x.state = 'claimed'
    ORDER BY x.id
    FOR UPDATE;
    SELECT array_agg(f) INTO ended
    FROM throttle._fence_claims(ARRAY(SELECT x.id FROM throttle.event x  -- event_claimed_groups
                                      WHERE x.queue = release_group.queue
                                        AND x.group_key = release_group.group_key
                                        AND x.group_key IS NOT NULL AND x.state = 'claimed'),
                                throttle.now()) AS f;
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
    'Ends the claim on a group of a queue, whoever holds it: its claimed events are pending again (due, their attempts kept) and the holder is fenced. Returns how many events it handed back. For operators.';
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

-- The functions whose definitions changed.

CREATE OR REPLACE FUNCTION throttle._caller()
RETURNS text
AS 'MODULE_PATHNAME', 'pg_throttle_caller'
LANGUAGE C VOLATILE PARALLEL SAFE;
COMMENT ON FUNCTION throttle._caller() IS
    'Internal: who is calling, for enqueued_by: the role the session acts as (not the owner of a SECURITY DEFINER function), and its application_name.';

CREATE OR REPLACE FUNCTION throttle.cancel(queue text, item_key text)
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
    RETURN FOUND;
END
$$;
COMMENT ON FUNCTION throttle.cancel(text, text) IS
    'Cancels the pending event item_key of the queue; false when there is none. The event moves to throttle.event_history, state cancelled, with cancelled_at and cancelled_by.';

-- _mark_claimed learns which expired claims are not charged an attempt.
DROP FUNCTION throttle._mark_claimed(bigint[], text, interval, bigint, timestamptz);
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

CREATE OR REPLACE FUNCTION throttle.claim(queue text, worker text, lease interval DEFAULT '5 minutes',
                               max integer DEFAULT 1)
RETURNS SETOF throttle.event
AS 'MODULE_PATHNAME', 'pg_throttle_claim'
LANGUAGE C VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp
SET enable_seqscan = off;  -- index lookups, whatever the plans' statistics said
COMMENT ON FUNCTION throttle.claim(text, text, interval, integer) IS
    'Claims up to max due events without a group_key for worker until lease: claims whose lease expired, then pending events with run_at <= now, higher priority first, then oldest first; never waits for rows another worker is claiming. The events carry the claim''s claim_token, which complete, fail and extend need. Grouped events are claimed with throttle.claim_group.';

-- claim_group gains max: a new signature.
DROP FUNCTION throttle.claim_group(text, text, interval);
CREATE FUNCTION throttle.claim_group(queue text, worker text, lease interval DEFAULT '5 minutes',
                                     max integer DEFAULT NULL)
RETURNS SETOF throttle.event
AS 'MODULE_PATHNAME', 'pg_throttle_claim_group'
LANGUAGE C VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp
SET enable_seqscan = off;  -- index lookups, whatever the plans' statistics said
COMMENT ON FUNCTION throttle.claim_group(text, text, interval, integer) IS
    'Claims the due events of one group of the queue (every one, or the oldest max) for worker until lease. While the lease holds no other worker gets any event of that group, including events that become due meanwhile; a queue in throttle.group_policy lets that many claims hold a group at once, each with events no other holds, or keeps a group''s events in strict order. Returns no rows when no group is free.';

-- complete and fail release emptied groups natively (src/pg/queue/claim_end.cpp).
DROP FUNCTION throttle._release_groups(throttle.event[]);

CREATE OR REPLACE FUNCTION throttle.retry(id bigint)
RETURNS boolean
LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
    SELECT r.retried FROM throttle.retry(ARRAY[throttle._require_id(id)]) AS r
$$;
COMMENT ON FUNCTION throttle.retry(bigint) IS
    'Brings a dead event back: pending, due now, attempts reset; false when it is not dead or its item_key has a newer run, pending or claimed (throttle.retry(bigint[]) says why).';

-- claim_group is native (src/pg/queue/claim_group_sql.cpp): its PL/pgSQL helpers go.
DROP FUNCTION throttle._claim_one_group(text, text, text, interval, timestamptz);
DROP FUNCTION throttle._group_held(text, text, timestamptz);
DROP FUNCTION throttle._group_take(text, text, text, interval);
-- So is extend (src/pg/queue/extend_sql.cpp), which renews the group's lease itself.
DROP FUNCTION throttle._group_renew(text, text, bigint, interval);

-- The saved privileges, made again on the new signatures (by the extension
-- owner: a grant another role made is now the owner's). A function that had
-- the default privileges gets PUBLIC's EXECUTE, as under 0.1.0, whatever
-- ALTER DEFAULT PRIVILEGES says now.
DO $$
DECLARE
    f record;
    acl text;
    granted record;
BEGIN
    FOR f IN SELECT * FROM (VALUES
                 ('complete', 'throttle.complete(bigint[], bigint)'),
                 ('fail', 'throttle.fail(bigint[], bigint, text, interval)'),
                 ('extend', 'throttle.extend(bigint[], bigint, interval)'),
                 ('schedule', 'throttle.schedule(text, text, timestamptz, jsonb, text, integer, integer, text, text)'),
                 ('claim_group', 'throttle.claim_group(text, text, interval, integer)'),
                 ('purge', 'throttle.purge(interval, text, text[])')) AS v(name, signature)
    LOOP
        acl := current_setting('pg_throttle_upgrade.acl_' || f.name, true);
        IF coalesce(acl, '') = '' THEN
            CONTINUE;  -- not saved
        ELSIF acl = 'default' THEN
            IF NOT has_function_privilege('public', f.signature, 'EXECUTE') THEN
                EXECUTE format('GRANT EXECUTE ON FUNCTION %s TO PUBLIC', f.signature);
            END IF;
        ELSE
            EXECUTE format('REVOKE EXECUTE ON FUNCTION %s FROM PUBLIC', f.signature);
            FOR granted IN SELECT a.grantee, a.is_grantable
                           FROM pg_catalog.aclexplode(acl::aclitem[]) AS a
                           WHERE a.privilege_type = 'EXECUTE'
            LOOP
                EXECUTE format('GRANT EXECUTE ON FUNCTION %s TO %s%s', f.signature,
                               CASE WHEN granted.grantee = 0 THEN 'PUBLIC'
                                    ELSE quote_ident(pg_catalog.pg_get_userbyid(granted.grantee)) END,
                               CASE WHEN granted.is_grantable THEN ' WITH GRANT OPTION' ELSE '' END);
            END LOOP;
        END IF;
        -- Granted inside the extension's script, they would be recorded as
        -- its initial privileges, which pg_dump leaves out: a dump restored
        -- elsewhere would give PUBLIC back what the operator took. The
        -- initial privileges stay those of a fresh install (purge's: its
        -- owner's alone; the others': the default, with no record).
        IF f.name = 'purge' THEN
            UPDATE pg_catalog.pg_init_privs i
            SET initprivs = ARRAY[pg_catalog.makeaclitem(p.proowner, p.proowner, 'EXECUTE', false)]
            FROM pg_catalog.pg_proc p
            WHERE p.oid = f.signature::regprocedure AND i.objoid = p.oid
              AND i.classoid = 'pg_catalog.pg_proc'::regclass AND i.objsubid = 0;
        ELSE
            DELETE FROM pg_catalog.pg_init_privs
            WHERE objoid = f.signature::regprocedure
              AND classoid = 'pg_catalog.pg_proc'::regclass AND objsubid = 0;
        END IF;
    END LOOP;
END
$$;

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
-- What an operator graphs and alerts on, per queue of this database
-- (monitoring/queries.yaml).
--
CREATE VIEW throttle.queue_metrics AS
    SELECT e.queue,
           count(*) FILTER (WHERE e.state = 'pending' AND e.run_at <= n.now) AS due,
           count(*) FILTER (WHERE e.state = 'pending' AND e.run_at > n.now) AS scheduled,
           count(*) FILTER (WHERE e.state = 'claimed') AS claimed,
           count(*) FILTER (WHERE e.state = 'claimed' AND e.lease_until <= n.now) AS claims_expired,
           count(*) FILTER (WHERE e.state = 'dead') AS dead,
           coalesce(extract(epoch FROM n.now - min(e.run_at) FILTER (
               WHERE e.state = 'pending' AND e.run_at <= n.now)), 0)::double precision
               AS oldest_due_seconds
    FROM throttle.event e CROSS JOIN (SELECT throttle.now() AS now) n
    GROUP BY e.queue, n.now;
COMMENT ON VIEW throttle.queue_metrics IS
    'One row per queue of this database with events in throttle.event: events due (pending, run_at passed; some may wait behind a claimed run of their item_key or a held group), scheduled for later, claimed, claimed whose lease has ended (a worker died or stalled; the next claim takes them over), dead, and the age in seconds of the oldest due event (0 when none is due). Reads the whole of throttle.event: scrape it every few seconds, not in a loop. Readable by everyone, as throttle.event is.';
GRANT SELECT ON throttle.queue_metrics TO PUBLIC;

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
