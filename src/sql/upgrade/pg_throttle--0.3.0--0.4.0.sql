-- pg_throttle 0.3.0 -> 0.4.0 (ALTER EXTENSION pg_throttle UPDATE).
\echo Use "ALTER EXTENSION pg_throttle UPDATE" to load this file. \quit

-- One new table, throttle.queue_pause (at the end), and one new column of
-- throttle.group_policy, fairness (with a default; at the end): a 0.3.0
-- dump restores into 0.4.0 as it is (pg_dump names the columns it copies).

-- Ending another worker's claims takes the claims that never ran their
-- event (a strict group's later events), which give their attempt back; an
-- event whose attempts an ended claim used up is dead, not pending. A new
-- argument: the old function is dropped (only the extension's functions call
-- it).
DROP FUNCTION throttle._fence_claims(bigint[], timestamptz);
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

-- A pending event that replace or keep_earlier updates is a new run, with
-- attempts of its own.
CREATE OR REPLACE FUNCTION throttle.schedule_many(queue text, item_keys text[], run_at timestamptz[],
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

COMMENT ON FUNCTION throttle.schedule(text, text, timestamptz, jsonb, text, integer, integer, text, text) IS
    'Schedules an event, or, when item_key names a pending event of the queue, updates it as on_duplicate says (replace: run_at, payload and priority; keep_earlier: the same but the earlier run_at; ignore: nothing; its group_key, concurrency_key and max_attempts stay); returns its id. A pending event that replace or keep_earlier updates is a new run: its attempts start again at 0, whatever its earlier claims used. When the event of item_key is claimed it is left alone and a new event is scheduled, which no worker gets before the claimed one ends. NOTIFYs the channel named after the queue when the event is due.';

-- In a strict group only the first event of each claim ran; a claim that
-- was an event's last attempt leaves it dead.
CREATE OR REPLACE FUNCTION throttle.release_group(queue text, group_key text)
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

-- An expired claim of the other claimer's kind no longer holds back a newer
-- run of its item_key.
COMMENT ON FUNCTION throttle.claim(text, text, interval, integer) IS
    'Claims up to max due events without a group_key for worker until lease: claims whose lease expired, then pending events with run_at <= now, higher priority first, then oldest first; never waits for rows another worker is claiming. The events carry the claim''s claim_token, which complete, fail and extend need. Grouped events are claimed with throttle.claim_group; an expired claim of claim_group whose item_key has a due run without a group_key is ended first (cancelled, superseded by that run).';

COMMENT ON FUNCTION throttle.claim_group(text, text, interval, integer) IS
    'Claims the due events of one group of the queue (every one, or the oldest max) for worker until lease. While the lease holds no other worker gets any event of that group, including events that become due meanwhile; a queue in throttle.group_policy lets that many claims hold a group at once, each with events no other holds, or keeps a group''s events in strict order. An expired claim of throttle.claim whose item_key has a due grouped run is ended first (cancelled, superseded by that run). Returns no rows when no group is free.';


-- The rules of a row of throttle.event: a C trigger in place of the five
-- CHECK constraints, which PostgreSQL built again at every execution of a
-- statement that writes the table (every claim). The same rules, names and
-- SQLSTATE; no rewrite, no index build.
ALTER TABLE throttle.event
    DROP CONSTRAINT event_queue_check,
    DROP CONSTRAINT event_item_key_check,
    DROP CONSTRAINT event_state_check,
    DROP CONSTRAINT event_max_attempts_check,
    DROP CONSTRAINT event_concurrency_key_ungrouped;
CREATE FUNCTION throttle._event_check()
RETURNS trigger
AS 'MODULE_PATHNAME', 'pg_throttle_event_check'
LANGUAGE C;
COMMENT ON FUNCTION throttle._event_check() IS
    'Internal: the rules of a row of throttle.event, as a trigger: event_queue_check (queue <> '''' AND octet_length(queue) <= 63), event_item_key_check (item_key <> ''''), event_state_check (state IN (''pending'', ''claimed'', ''dead'')), event_max_attempts_check (max_attempts > 0), event_concurrency_key_ungrouped (concurrency_key IS NULL OR group_key IS NULL); raises 23514 naming the rule. A pending event without attempts left is stored dead, as its next claim would have made it.';
REVOKE EXECUTE ON FUNCTION throttle._event_check() FROM PUBLIC;
CREATE TRIGGER event_check BEFORE INSERT OR UPDATE ON throttle.event
    FOR EACH ROW EXECUTE FUNCTION throttle._event_check();
ALTER TABLE throttle.event ENABLE ALWAYS TRIGGER event_check;

-- The queue's native calls run kept plans whose estimated cost grows with
-- throttle.event: past jit_above_cost every execution compiled them (a
-- claim took 20 - 50 ms on a backlog of a million events). JIT off for them.
ALTER FUNCTION throttle.claim(text, text, interval, integer) SET jit = off;
ALTER FUNCTION throttle.claim_group(text, text, interval, integer) SET jit = off;
ALTER FUNCTION throttle.complete(bigint[], bigint) SET jit = off;
ALTER FUNCTION throttle.fail(bigint[], bigint, text, interval) SET jit = off;
ALTER FUNCTION throttle.extend(bigint[], bigint, interval) SET jit = off;
-- And claim's scans in the index's order: a generic plan made when ANALYZE
-- saw few pending events read them all by a bitmap scan and sorted them.
ALTER FUNCTION throttle.claim(text, text, interval, integer) SET enable_bitmapscan = off;
ALTER FUNCTION throttle.claim(text, text, interval, integer) SET enable_sort = off;

-- No call of 0.4.0 leaves a pending event with its attempts used up (a
-- replacing schedule starts its attempts again, an ended claim on its last
-- attempt leaves it dead), and claim's lean path takes only events with
-- attempts left: the ones earlier versions left so become dead now, as
-- their next claim would have made them. After the ALTER TABLE above, whose
-- lock is held until the commit: no 0.3.0 call still running can leave one
-- after this statement's snapshot.
UPDATE throttle.event
SET state = 'dead', completed_at = throttle.now(), completed_by = claimed_by,
    last_error = coalesce(last_error, 'lease expired ' || attempts || ' times')
WHERE state = 'pending' AND attempts >= max_attempts;

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

-- A call that changes fewer events than asked says why, without changing
-- what it returns. complete, fail and extend raise a NOTICE, natively, when
-- the claim token does not hold some of the events given (their comments);
-- cancel and reschedule, when the queue has no pending event of the key,
-- a NOTICE with what became of it (claimed and still running, dead, done,
-- cancelled, or none), to a caller who may read throttle.all_events.
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
    IF FOUND THEN
        RETURN true;
    END IF;
    PERFORM throttle._notice_not_pending(queue, item_key, 'throttle.cancel');
    RETURN false;
END
$$;
COMMENT ON FUNCTION throttle.cancel(text, text) IS
    'Cancels the pending event item_key of the queue; false when there is none, with a NOTICE that says why: the key''s event is claimed (it still runs), dead, done or cancelled, or the queue has none (the reason to roles that may read throttle.all_events). The event moves to throttle.event_history, state cancelled, with cancelled_at and cancelled_by.';

CREATE OR REPLACE FUNCTION throttle.reschedule(queue text, item_key text, run_at timestamptz)
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

COMMENT ON FUNCTION throttle.complete(bigint[], bigint) IS
    'Marks the events done, if the claim token still holds them and the caller is the claim''s role (or may act for it); returns how many. A worker whose claim was taken over gets 0, and a NOTICE says how many of the events given the token did not hold.';
COMMENT ON FUNCTION throttle.fail(bigint[], bigint, text, interval) IS
    'Records a failed attempt (in throttle.event_attempt, and failed_at): keeps the error and retries after retry_in, or 10 s * 2^(attempts-1) up to 1 hour; after max_attempts the event is dead, and when its item_key was scheduled again meanwhile it is cancelled, superseded by that newer run. In a group kept in strict order (throttle.group_policy) the claim''s later events of the group go back to pending behind the failed one, their attempt not counted. Only through the claim token that holds the events, by the claim''s role; returns how many failed, and a NOTICE says how many of the events given the token did not hold.';
COMMENT ON FUNCTION throttle.extend(bigint[], bigint, interval) IS
    'Extends the claim token on the events to lease from now (and the group''s lease), by the claim''s role, while its lease holds: a claim whose lease has ended is not revived. Returns how many, and a NOTICE says how many of the events given the token did not hold with a lease in force.';

-- reset names the kind it refuses, group, and the call that ends a group's
-- claim; the instant a lock's lease ends keeps its two names, each right
-- for its view (status: when the entry next grants, for every kind;
-- locks: when the lease ends), now said in their columns' comments.
COMMENT ON FUNCTION throttle.reset(text, text) IS
    'Clears the registry entries named name in this database (kind resource, bucket, queue_bucket, group_bucket or lock; NULL: all of them; a group''s bucket is named after its queue and group as throttle.status shows it) and returns how many; a cleared resource or lock can be granted at once, a cleared bucket is full. Kind group, a group''s lease, is refused (22023): the claimed events would still hold the group; throttle.release_group ends that claim. For operators after an incident: not granted to PUBLIC.';
COMMENT ON COLUMN throttle.status.kind IS
    'resource, bucket, lock; for the event queue group (a group''s lease, held by a claim_group claim), queue_bucket and group_bucket (throttle.queue_bucket, throttle.group_bucket). throttle.reset clears every kind but group, which throttle.release_group ends.';
COMMENT ON COLUMN throttle.status.next_grant_at IS
    'When the entry next grants a call: for a resource, the end of its interval; for a bucket, when one more unit is back (now when one is left); for a lock or a group''s lease, the end of the lease (infinity for a session lock), which throttle.locks shows as expires_at.';
COMMENT ON COLUMN throttle.locks.expires_at IS
    'When the lease ends unless renewed or released first; NULL for a session lock, held until unlocked or its session ends. throttle.status shows the same instant as next_grant_at.';

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

-- Pausing a queue, or one group of it (docs/queue.md): the pauses, the
-- calls that set and end them, and queue_metrics' two new columns (at the
-- end; its grants are kept).
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
SELECT pg_catalog.pg_extension_config_dump('throttle.queue_pause', '');

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

CREATE OR REPLACE VIEW throttle.queue_metrics AS
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

-- Fair claims between groups (throttle.group_policy.fairness): a column at
-- the end, as a fresh install has it.
ALTER TABLE throttle.group_policy
    ADD COLUMN fairness text NOT NULL DEFAULT 'oldest_first' CHECK (fairness IN ('oldest_first', 'round_robin'));
COMMENT ON TABLE throttle.group_policy IS
    'How claim_group hands out the groups of a queue; a queue not named here has one worker per group, no strict order, and serves the oldest due event''s group first.';
COMMENT ON COLUMN throttle.group_policy.fairness IS 'Which free group claim_group serves first, after the groups of expired claims: oldest_first, the group of the oldest due event; round_robin, the due groups in turn by group_key, starting after the group served last in the queue (kept in shared memory: a queue whose turn is not known is served oldest first once, which sets it).';

-- Round robin between concurrency keys (throttle.concurrency_policy.fairness):
-- a column at the end, as a fresh install has it.
ALTER TABLE throttle.concurrency_policy
    ADD COLUMN fairness text NOT NULL DEFAULT 'oldest_first' CHECK (fairness IN ('oldest_first', 'round_robin'));
COMMENT ON TABLE throttle.concurrency_policy IS
    'How throttle.claim hands out the events that carry a concurrency_key, per queue: how many of one key at once, and in which order; a queue not named here has one per key, oldest first.';
COMMENT ON COLUMN throttle.concurrency_policy.fairness IS 'Which due events claim takes first, after expired claims: oldest_first, by priority then run_at whatever their key; round_robin, one event per key in turn by concurrency_key (the key''s oldest due event), starting after the key served last in the queue, the events without a key taking their turn after the last key (kept in shared memory: a queue whose turn is not known is served oldest first once, which sets it).';
