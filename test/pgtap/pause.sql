-- Pausing a queue, or one group of it: the table, the two calls, their
-- privileges and errors, and what claims and queue_metrics make of a pause.
BEGIN;
SELECT plan(24);
SET LOCAL pg_throttle.test_clock = '2038-01-01 00:00:00+00';

SELECT has_table('throttle', 'queue_pause', 'catalog table throttle.queue_pause');
SELECT columns_are('throttle', 'queue_pause', ARRAY['queue', 'group_key', 'paused_at', 'paused_by']);
SELECT col_is_null('throttle', 'queue_pause', 'group_key', 'group_key NULL: the whole queue');
SELECT ok(has_table_privilege('public', 'throttle.queue_pause', 'SELECT')
          AND NOT has_table_privilege('public', 'throttle.queue_pause', 'INSERT')
          AND NOT has_table_privilege('public', 'throttle.queue_pause', 'DELETE'),
    'everyone may see what is paused; only privileged roles may change it');
SELECT ok((SELECT 'throttle.queue_pause'::regclass = ANY (extconfig) FROM pg_extension
           WHERE extname = 'pg_throttle'), 'pg_dump keeps the pauses');
SELECT function_returns('throttle', 'pause', ARRAY['text', 'text'], 'boolean');
SELECT function_returns('throttle', 'resume', ARRAY['text', 'text'], 'boolean');
SELECT ok(NOT has_function_privilege('public', 'throttle.pause(text, text)', 'EXECUTE')
          AND NOT has_function_privilege('public', 'throttle.resume(text, text)', 'EXECUTE'),
    'pause and resume are for operators, as release_group');
SELECT is_definer('throttle', 'pause', ARRAY['text', 'text'], 'pause is SECURITY DEFINER');
SELECT is_definer('throttle', 'resume', ARRAY['text', 'text'], 'resume is SECURITY DEFINER');

SELECT throws_ok($$SELECT throttle.pause(NULL)$$, '22004', 'queue must not be NULL', 'NULL queue: 22004');
SELECT throws_ok($$SELECT throttle.pause('')$$, '22023', 'queue name must have 1 to 63 bytes', 'empty queue: 22023');
SELECT throws_ok($$SELECT throttle.resume(repeat('q', 64))$$, '22023', 'queue name must have 1 to 63 bytes',
    'long queue: 22023');
SELECT throws_ok($$SELECT throttle.pause('tap.p', repeat('g', 1025))$$, '22023',
    'group_key must have at most 1024 bytes', 'long group_key: 22023');

SELECT throttle.schedule('tap.p', k, '2037-12-31 23:00+00', group_key => g)
FROM (VALUES ('a', NULL), ('b', 'B'), ('c', 'C')) v(k, g);
SELECT ok(throttle.pause('tap.p'), 'pause: true');
SELECT ok(NOT throttle.pause('tap.p'), 'pause of a paused queue: false');
SELECT is((SELECT count(*)::int FROM throttle.claim('tap.p', 'w'))
          + (SELECT count(*)::int FROM throttle.claim_group('tap.p', 'w')), 0,
    'claim and claim_group hand out nothing of a paused queue');
SELECT is((SELECT row(paused, paused_groups, due)::text FROM throttle.queue_metrics WHERE queue = 'tap.p'),
    '(t,0,3)', 'queue_metrics: paused, with its due events');
SELECT ok(throttle.pause('tap.p', 'B') AND throttle.resume('tap.p'), 'a group paused, the queue resumed');
SELECT is((SELECT array_agg(item_key ORDER BY id) FROM throttle.claim('tap.p', 'w')), ARRAY['a'],
    'claim hands out the events without a group');
SELECT is((SELECT array_agg(x.item_key) FROM (SELECT item_key FROM throttle.claim_group('tap.p', 'w')
                                              UNION ALL
                                              SELECT item_key FROM throttle.claim_group('tap.p', 'w')) x),
    ARRAY['c'], 'claim_group hands out the group not paused, and not the paused one');
SELECT is((SELECT row(paused, paused_groups)::text FROM throttle.queue_metrics WHERE queue = 'tap.p'),
    '(f,1)', 'queue_metrics: one paused group');
SELECT ok(NOT throttle.resume('tap.p'), 'resume of a queue not paused: false');
SELECT ok(throttle.resume('tap.p', 'B')
          AND (SELECT array_agg(item_key) FROM throttle.claim_group('tap.p', 'w')) = ARRAY['b'],
    'the group resumed is handed out');

SELECT * FROM finish();
ROLLBACK;
