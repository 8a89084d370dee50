-- The event queue: signatures, error codes, privileges, index use.
BEGIN;
SELECT plan(70);
SET LOCAL pg_throttle.test_clock = '2038-01-01 00:00:00+00';

SELECT has_table('throttle', 'event', 'catalog table throttle.event');
SELECT has_table('throttle', 'queue_bucket', 'catalog table throttle.queue_bucket');
SELECT fk_ok('throttle', 'queue_bucket', 'bucket', 'throttle', 'bucket', 'name');
SELECT ok(has_table_privilege('public', 'throttle.queue_bucket', 'SELECT')
          AND NOT has_table_privilege('public', 'throttle.queue_bucket', 'INSERT')
          AND NOT has_table_privilege('public', 'throttle.queue_bucket', 'DELETE'),
    'everyone may see which queues a bucket limits; only privileged roles may change it');
SELECT has_function('throttle', 'schedule', ARRAY['text', 'text', 'timestamp with time zone', 'jsonb', 'text', 'integer', 'integer', 'text', 'text']);
SELECT function_returns('throttle', 'schedule', ARRAY['text', 'text', 'timestamp with time zone', 'jsonb', 'text', 'integer', 'integer', 'text', 'text'], 'bigint');
SELECT function_returns('throttle', 'schedule_many', ARRAY['text', 'text[]', 'timestamp with time zone[]', 'jsonb[]', 'text[]', 'integer', 'integer', 'text', 'text[]'], 'bigint[]');
SELECT has_function('throttle', 'cancel', ARRAY['text', 'text']);
SELECT has_function('throttle', 'reschedule', ARRAY['text', 'text', 'timestamp with time zone']);
SELECT function_returns('throttle', 'claim', ARRAY['text', 'text', 'interval', 'integer'], 'setof throttle.event');
SELECT function_returns('throttle', 'claim_group', ARRAY['text', 'text', 'interval', 'integer'], 'setof throttle.event');
SELECT function_returns('throttle', 'complete', ARRAY['bigint[]', 'bigint'], 'integer');
SELECT function_returns('throttle', 'fail', ARRAY['bigint[]', 'bigint', 'text', 'interval'], 'integer');
SELECT function_returns('throttle', 'extend', ARRAY['bigint[]', 'bigint', 'interval'], 'integer');
SELECT hasnt_function('throttle', 'complete', ARRAY['bigint[]', 'text'],
    'complete by worker name is gone: a name anyone can type is no claim');
SELECT function_returns('throttle', 'retry', ARRAY['bigint'], 'boolean');
SELECT function_returns('throttle', 'purge', ARRAY['interval', 'text', 'text[]'], 'bigint');
SELECT function_returns('throttle', 'retry', ARRAY['bigint[]'], 'setof record');
SELECT function_returns('throttle', 'retry_dead', ARRAY['text', 'text', 'timestamp with time zone'], 'setof record');
SELECT function_returns('throttle', 'release_group', ARRAY['text', 'text'], 'integer');

SELECT throws_ok($$SELECT throttle.schedule(NULL, 'k', now())$$, '22004', 'queue must not be NULL', 'NULL queue: 22004');
SELECT throws_ok($$SELECT throttle.schedule('q', 'k', now(), max_attempts => 0)$$, '22023', 'max_attempts must be positive', 'max_attempts 0: 22023');
SELECT throws_ok($$SELECT throttle.schedule(repeat('q', 64), 'k', now())$$, '22023', 'queue name must have 1 to 63 bytes', 'long queue: 22023');
SELECT throws_ok($$SELECT throttle.schedule_many('q', ARRAY['a', NULL], ARRAY[now(), now()])$$, '22004', 'item_keys[2] must not be NULL', 'schedule_many, a NULL key: 22004');
SELECT throws_ok($$SELECT throttle.schedule_many('q', ARRAY['a', 'b'], ARRAY[now()])$$, '22023', 'run_at, payloads, group_keys and concurrency_keys must have one element per item_key', 'schedule_many, arrays of other lengths: 22023');
SELECT ok(has_function_privilege('public', 'throttle.schedule_many(text, text[], timestamp with time zone[], jsonb[], text[], integer, integer, text, text[])', 'EXECUTE'),
    'everyone may schedule a batch, as everyone may schedule');
SELECT throws_ok($$SELECT * FROM throttle.claim('q', 'w', '0')$$, '22023', 'lease must be a positive interval', 'lease 0: 22023');
SELECT throws_ok($$SELECT * FROM throttle.claim_group('q', NULL)$$, '22004', 'worker must not be NULL', 'NULL worker: 22004');
SELECT ok(NOT has_table_privilege('public', 'throttle.event', 'INSERT')
          AND has_column_privilege('public', 'throttle.event', 'payload', 'SELECT'),
    'everyone may read the queue; changes go through the functions');
SELECT ok(NOT has_column_privilege('public', 'throttle.event', 'claim_token', 'SELECT'),
    'but not the claims'' tokens');
SELECT ok(has_column_privilege('public', 'throttle.event', 'priority', 'SELECT')
          AND has_column_privilege('public', 'throttle.event', 'failed_at', 'SELECT')
          AND has_column_privilege('public', 'throttle.event', 'cancelled_by', 'SELECT')
          AND has_column_privilege('public', 'throttle.event', 'concurrency_key', 'SELECT'),
    'every column but claim_token is readable, the newer ones too');
SELECT has_table('throttle', 'event_history', 'finished events have a table of their own');
SELECT throws_ok($$INSERT INTO throttle.event (queue, item_key, run_at, state, enqueued_at, enqueued_by)
                   VALUES ('tap.q', 'k', now(), 'done', now(), 'tap')$$, '23514', NULL,
    'the hot table holds no finished event: done and cancelled ones are in throttle.event_history');
-- The rules of a row, checked by the trigger event_check (no CHECK constraint: see
-- src/pg/queue/event_check_sql.cpp), on INSERT and on UPDATE, named as constraints were.
SELECT throws_ok($$INSERT INTO throttle.event (queue, item_key, run_at, enqueued_at, enqueued_by)
                   VALUES ('', 'k', now(), now(), 'tap')$$, '23514',
    'new row for relation "event" violates check constraint "event_queue_check"',
    'an empty queue name is refused (event_queue_check)');
SELECT throws_ok($$INSERT INTO throttle.event (queue, item_key, run_at, enqueued_at, enqueued_by)
                   VALUES (repeat('q', 64), 'k', now(), now(), 'tap')$$, '23514',
    'new row for relation "event" violates check constraint "event_queue_check"',
    'a queue name of 64 bytes is refused');
SELECT lives_ok($$INSERT INTO throttle.event (queue, item_key, run_at, enqueued_at, enqueued_by)
                  VALUES (repeat('é', 31) || 'q', 'k', now(), now(), 'tap')$$,
    'a queue name of 63 bytes is taken (31 two-byte characters and one)');
SELECT throws_ok($$INSERT INTO throttle.event (queue, item_key, run_at, enqueued_at, enqueued_by)
                   VALUES (repeat('é', 32), 'k', now(), now(), 'tap')$$, '23514', NULL,
    'a name of 32 characters and 64 bytes is refused: the limit counts bytes');
SELECT throws_ok($$INSERT INTO throttle.event (queue, item_key, run_at, enqueued_at, enqueued_by)
                   VALUES ('tap.rules', '', now(), now(), 'tap')$$, '23514',
    'new row for relation "event" violates check constraint "event_item_key_check"',
    'an empty item_key is refused (event_item_key_check)');
SELECT throws_ok($$INSERT INTO throttle.event (queue, item_key, run_at, enqueued_at, enqueued_by, max_attempts)
                   VALUES ('tap.rules', 'k', now(), now(), 'tap', 0)$$, '23514',
    'new row for relation "event" violates check constraint "event_max_attempts_check"',
    'max_attempts 0 is refused (event_max_attempts_check)');
SELECT throws_ok($$INSERT INTO throttle.event (queue, item_key, run_at, enqueued_at, enqueued_by,
                                                group_key, concurrency_key)
                   VALUES ('tap.rules', 'k', now(), now(), 'tap', 'g', 'c')$$, '23514',
    'new row for relation "event" violates check constraint "event_concurrency_key_ungrouped"',
    'a grouped event with a concurrency_key is refused (event_concurrency_key_ungrouped)');
SELECT throws_ok($$INSERT INTO throttle.event (queue, item_key, run_at, enqueued_at, enqueued_by)
                   VALUES (NULL, 'k', now(), now(), 'tap')$$, '23502', NULL,
    'a NULL queue passes the rules, as a CHECK would, and NOT NULL refuses it (23502)');
SELECT lives_ok($$INSERT INTO throttle.event (queue, item_key, run_at, enqueued_at, enqueued_by,
                                               concurrency_key)
                  VALUES ('tap.rules', 'ok', now(), now(), 'tap', 'c')$$,
    'a row within every rule is taken');
SELECT throws_ok($$UPDATE throttle.event SET state = 'done' WHERE queue = 'tap.rules'$$, '23514',
    'new row for relation "event" violates check constraint "event_state_check"',
    'an UPDATE is held to the rules too (event_state_check)');
SELECT throws_ok($$UPDATE throttle.event SET group_key = 'g' WHERE queue = 'tap.rules'$$, '23514',
    'new row for relation "event" violates check constraint "event_concurrency_key_ungrouped"',
    'and to the two-column rule');
SELECT throws_ok($$SELECT throttle._event_check()$$, '39P01', NULL,
    'the trigger function cannot be called as a function');
SELECT ok(NOT has_function_privilege('public', 'throttle._event_check()', 'EXECUTE'),
    'nor is it granted to anyone');
SELECT is(ARRAY(SELECT p.oid::regprocedure::text FROM pg_proc p
                WHERE p.pronamespace = 'throttle'::regnamespace AND 'jit=off' = ANY (p.proconfig)
                ORDER BY 1),
          ARRAY['throttle.claim(text,text,interval,integer)',
                'throttle.claim_group(text,text,interval,integer)',
                'throttle.complete(bigint[],bigint)',
                'throttle.extend(bigint[],bigint,interval)',
                'throttle.fail(bigint[],bigint,text,interval)'],
    'the calls that run kept plans on throttle.event never JIT-compile them (their cost grows with the table)');
SELECT ok((SELECT p.proconfig @> ARRAY['enable_bitmapscan=off', 'enable_sort=off']
            FROM pg_proc p WHERE p.oid = 'throttle.claim(text,text,interval,integer)'::regprocedure),
    'claim scans in the index''s order, whatever the statistics of its kept plans said');
-- A pending event without attempts left, as a dump of 0.3.0 holds (its release_group
-- left them): stored dead, as its next claim would have made it; claim's lean path
-- takes only events with attempts left, and would otherwise pass it over forever.
INSERT INTO throttle.event (queue, item_key, run_at, attempts, max_attempts, enqueued_at,
                            enqueued_by, claimed_by)
VALUES ('tap.spent', 'k1', '2037-12-31 23:59:00+00', 2, 2, '2037-12-31 23:00:00+00', 'tap', 'w-old'),
       ('tap.spent', 'k2', '2037-12-31 23:59:00+00', 3, 2, '2037-12-31 23:00:00+00', 'tap', NULL);
INSERT INTO throttle.event (queue, item_key, run_at, attempts, max_attempts, enqueued_at,
                            enqueued_by, last_error)
VALUES ('tap.spent', 'k3', '2037-12-31 23:59:00+00', 1, 1, '2037-12-31 23:00:00+00', 'tap', 'boom');
SELECT results_eq($$SELECT item_key, state, completed_at, completed_by, last_error FROM throttle.event
                    WHERE queue = 'tap.spent' ORDER BY item_key$$,
    $$VALUES ('k1', 'dead', '2038-01-01 00:00:00+00'::timestamptz, 'w-old', 'lease expired 2 times'),
             ('k2', 'dead', '2038-01-01 00:00:00+00'::timestamptz, NULL, 'lease expired 3 times'),
             ('k3', 'dead', '2038-01-01 00:00:00+00'::timestamptz, NULL, 'boom')$$,
    'a pending event without attempts left is stored dead: completed now, by its last worker, its error kept');
SELECT is((SELECT count(*) FROM throttle.claim('tap.spent', 'w', '1 minute', 10)), 0::bigint,
    'and no claim returns it');
SELECT lives_ok($$INSERT INTO throttle.event (queue, item_key, run_at, attempts, max_attempts,
                                               enqueued_at, enqueued_by)
                  VALUES ('tap.spent', 'k4', now(), 1, 2, now(), 'tap')$$,
    'one with an attempt left stays pending');
SELECT is((SELECT state FROM throttle.event WHERE queue = 'tap.spent' AND item_key = 'k4'), 'pending',
    'pending');
SELECT is(ARRAY(SELECT item_key FROM throttle.claim('tap.spent', 'w', '1 minute', 10)), ARRAY['k4'],
    'and claim takes it');
SET LOCAL session_replication_role = replica;
SELECT throws_ok($$INSERT INTO throttle.event (queue, item_key, run_at, state, enqueued_at, enqueued_by)
                   VALUES ('tap.q', 'k', now(), 'done', now(), 'tap')$$, '23514', NULL,
    'the rules hold under session_replication_role = replica too (logical replication), as CHECKs did');
SET LOCAL session_replication_role = origin;
CREATE TABLE public.tap_not_event (queue integer, item_key text, group_key text, state text,
                                   max_attempts integer, concurrency_key text);
CREATE TRIGGER tap_check BEFORE INSERT ON public.tap_not_event
    FOR EACH ROW EXECUTE FUNCTION throttle._event_check();
SELECT throws_ok($$INSERT INTO public.tap_not_event VALUES (1, 'k', NULL, 'pending', 1, NULL)$$,
    '39P01', 'throttle._event_check() runs on throttle.event only',
    'on another table, with a column of another type, the trigger refuses (no crash)');
SET LOCAL synchronous_commit = off;
SELECT ok(throttle.schedule('tap.later', 'k', '2038-01-02 00:00:00+00') IS NOT NULL,
    'an event for later is scheduled');
SELECT is((SELECT count(*) FROM throttle.claim('tap.later', 'w', '1 minute', 10)), 0::bigint,
    'a claim of a queue whose events are not due yet claims nothing');
SELECT is(current_setting('synchronous_commit'), 'off',
    'and leaves the transaction''s synchronous_commit as it was: a claim of nothing asks no durable commit');
SET LOCAL synchronous_commit = on;
SELECT ok(has_column_privilege('public', 'throttle.event_history', 'completed_by', 'SELECT')
          AND has_column_privilege('public', 'throttle.event_history', 'concurrency_key', 'SELECT')
          AND NOT has_column_privilege('public', 'throttle.event_history', 'claim_token', 'SELECT')
          AND NOT has_table_privilege('public', 'throttle.event_history', 'INSERT')
          AND NOT has_table_privilege('public', 'throttle.event_history', 'UPDATE')
          AND NOT has_table_privilege('public', 'throttle.event_history', 'DELETE'),
    'everyone may read the history but its tokens; only the functions write it');
SELECT columns_are('throttle', 'all_events',
    ARRAY(SELECT attname::text FROM pg_attribute
          WHERE attrelid = 'throttle.event'::regclass AND attnum > 0 AND NOT attisdropped
            AND attname <> 'claim_token' ORDER BY attnum),
    'throttle.all_events has every column of throttle.event but claim_token');
SELECT has_table('throttle', 'event_attempt', 'catalog table throttle.event_attempt');
SELECT has_index('throttle', 'event_attempt', 'event_attempt_event', ARRAY['event_id', 'id'],
    'an event''s attempts are found by index, in order');
SELECT ok(has_table_privilege('public', 'throttle.event_attempt', 'SELECT')
          AND NOT has_table_privilege('public', 'throttle.event_attempt', 'INSERT')
          AND NOT has_table_privilege('public', 'throttle.event_attempt', 'UPDATE')
          AND NOT has_table_privilege('public', 'throttle.event_attempt', 'DELETE'),
    'everyone may read the attempts; only the functions write them');
SELECT columns_are('throttle', 'attempt_history',
    ARRAY['event_id', 'attempt', 'claimed_at', 'claimed_by', 'claimed_role', 'ended_at', 'outcome', 'error'],
    'throttle.attempt_history has the documented columns');
SELECT ok(NOT has_function_privilege('public', 'throttle.purge(interval, text, text[])', 'EXECUTE')
          AND NOT has_function_privilege('public', 'throttle.release_group(text, text)', 'EXECUTE'),
    'only privileged roles may purge and release groups');

-- The functions find rows through indexes, not by scanning the backlog.
INSERT INTO throttle.event (queue, item_key, group_key, run_at, state, enqueued_at, enqueued_by, completed_at)
SELECT 'tap.big', 'k' || g, 'g' || (g % 1000), '2037-01-01'::timestamptz + g * interval '1 second',
       CASE WHEN g % 3 = 0 THEN 'dead' ELSE 'pending' END, now(), 'tap',
       CASE WHEN g % 3 = 0 THEN now() END
FROM generate_series(1, 30000) AS g;
ANALYZE throttle.event;
CREATE FUNCTION pg_temp.plan_of(query text) RETURNS text LANGUAGE plpgsql AS $$
DECLARE
    line record;
    plan text := '';
BEGIN
    FOR line IN EXECUTE 'EXPLAIN ' || query LOOP
        plan := plan || line."QUERY PLAN" || ' ';
    END LOOP;
    RETURN plan;
END
$$;
SELECT alike(pg_temp.plan_of($$SELECT id FROM throttle.event WHERE queue = 'tap.big' AND state = 'pending'
                                AND group_key IS NULL AND priority = 0 AND run_at <= now()
                                ORDER BY run_at, id LIMIT 10 FOR UPDATE SKIP LOCKED$$),
    '%Index Scan using event_due_single%', 'claim''s due scan reads only ungrouped events, by index');
SELECT alike(pg_temp.plan_of($$SELECT priority FROM throttle.event WHERE queue = 'tap.big'
                                AND state = 'pending' AND group_key IS NULL
                                ORDER BY priority DESC LIMIT 1$$),
    '%Index Only Scan Backward using event_due_single%',
    'claim''s priority probe starts at the newest events, past the entries claims left dead');
SELECT alike(pg_temp.plan_of($$SELECT group_key FROM throttle.event WHERE queue = 'tap.big' AND state = 'pending'
                                AND group_key IS NOT NULL AND run_at <= now()
                                AND (run_at, id) > ('-infinity', 0) ORDER BY run_at, id LIMIT 64$$),
    '%Index Scan using event_due_grouped%', 'claim_group''s due scan reads grouped events, by index');
SELECT is((SELECT count(*)::int FROM throttle.claim('tap.big', 'w', '1 minute', 5)), 0,
    'claim leaves grouped events alone');
SELECT is((SELECT count(*)::int FROM throttle.claim_group('tap.big', 'w', '1 minute')), 20,
    'claim_group takes one whole group (20 due events)');

SELECT * FROM finish();
ROLLBACK;
