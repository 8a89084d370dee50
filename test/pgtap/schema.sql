-- The installed SQL surface: objects, signatures, properties, documentation.
BEGIN;
SELECT plan(41);

SELECT has_schema('throttle');
SELECT has_table('throttle', 'resource', 'catalog table throttle.resource');
SELECT col_is_pk('throttle', 'resource', 'name', 'resource name is the primary key');
SELECT col_type_is('throttle', 'resource', 'every', 'interval', 'every is an interval');
SELECT col_not_null('throttle', 'resource', 'every', 'every is required');
SELECT col_type_is('throttle', 'resource', 'comment', 'text', 'comment is text');
SELECT has_view('throttle', 'status', 'view throttle.status');
SELECT columns_are('throttle', 'status',
    ARRAY['kind', 'name', 'owner', 'holder', 'holder_pid', 'granted_at', 'next_grant_at', 'grants',
          'denials', 'rate', 'per', 'burst', 'remaining', 'token', 'waiters'],
    'throttle.status has the documented columns');
SELECT has_view('throttle', 'usage', 'view throttle.usage');
SELECT columns_are('throttle', 'usage',
    ARRAY['scope', 'name', 'entries', 'quota', 'percent_of_registry'],
    'throttle.usage has the documented columns');

SELECT has_function('throttle', 'acquire', ARRAY['text', 'interval', 'text']);
SELECT has_function('throttle', 'lock', ARRAY['text', 'interval', 'interval', 'text']);
SELECT function_returns('throttle', 'lock', ARRAY['text', 'interval', 'interval', 'text'], 'bigint');
SELECT has_function('throttle', 'unlock', ARRAY['text', 'bigint']);
SELECT has_function('throttle', 'reset', ARRAY['text', 'text']);
SELECT ok(NOT has_function_privilege('public', 'throttle.reset(text, text)', 'EXECUTE'),
    'only privileged roles may reset entries');
SELECT has_function('throttle', 'checkpoint', ARRAY[]::text[]);
SELECT function_returns('throttle', 'checkpoint', ARRAY[]::text[], 'bigint');
SELECT ok(NOT has_function_privilege('public', 'throttle.checkpoint()', 'EXECUTE'),
    'only privileged roles may write a checkpoint');
SELECT has_function('throttle', 'renew', ARRAY['text', 'bigint', 'interval']);
SELECT columns_are('throttle', 'locks',
    ARRAY['name', 'owner', 'holder', 'holder_pid', 'granted_at', 'expires_at', 'session', 'token',
          'waiters'],
    'throttle.locks has the documented columns');
SELECT function_returns('throttle', 'acquire', ARRAY['text', 'interval', 'text'], 'boolean');
SELECT volatility_is('throttle', 'acquire', ARRAY['text', 'interval', 'text'], 'volatile',
    'acquire is volatile: every call is a new decision');
SELECT isnt_strict('throttle', 'acquire', ARRAY['text', 'interval', 'text'],
    'acquire is not strict: a NULL interval means the declared one');

-- Cron expressions: pure functions of the expression, the zone and the time
-- zone data, for everyone.
SELECT function_returns('throttle', 'cron_next', ARRAY['text', 'text', 'timestamp with time zone'],
    'timestamp with time zone');
SELECT function_returns('throttle', 'cron_firings',
    ARRAY['text', 'text', 'timestamp with time zone', 'timestamp with time zone', 'integer'],
    'setof timestamp with time zone');
SELECT volatility_is('throttle', 'cron_next', ARRAY['text', 'text', 'timestamp with time zone'],
    'stable', 'cron_next is stable: an update of the time zone data moves firings');
SELECT volatility_is('throttle', 'cron_firings',
    ARRAY['text', 'text', 'timestamp with time zone', 'timestamp with time zone', 'integer'],
    'stable', 'cron_firings is stable');
SELECT ok(has_function_privilege('public', 'throttle.cron_next(text, text, timestamptz)', 'EXECUTE'),
    'PUBLIC may call cron_next');
SELECT ok(has_function_privilege('public',
    'throttle.cron_firings(text, text, timestamptz, timestamptz, integer)', 'EXECUTE'),
    'PUBLIC may call cron_firings');

SELECT is(
    (SELECT array_agg(p.proname::text ORDER BY p.proname)
     FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
     WHERE n.nspname = 'throttle' AND obj_description(p.oid, 'pg_proc') IS NULL),
    NULL,
    'every function in schema throttle has a COMMENT');
SELECT is(
    (SELECT count(*)::int FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
     WHERE n.nspname = 'throttle' AND c.relkind IN ('r', 'v') AND obj_description(c.oid, 'pg_class') IS NULL),
    0,
    'every table and view in schema throttle has a COMMENT');

SELECT is((SELECT extrelocatable FROM pg_extension WHERE extname = 'pg_throttle'), false,
    'the extension is not relocatable');
SELECT is((SELECT extnamespace::regnamespace::text FROM pg_extension WHERE extname = 'pg_throttle'),
    'throttle', 'the extension lives in schema throttle');
SELECT is(
    (SELECT array_agg(c::regclass::text ORDER BY c::regclass::text) FROM pg_extension e, unnest(e.extconfig) AS c
     WHERE e.extname = 'pg_throttle'),
    ARRAY['throttle.bucket', 'throttle.concurrency_policy', 'throttle.event', 'throttle.event_attempt',
          'throttle.event_attempt_id_seq', 'throttle.event_history', 'throttle.event_id_seq',
          'throttle.group_bucket', 'throttle.group_policy', 'throttle.queue_bucket',
          'throttle.queue_pause', 'throttle.recurring', 'throttle.resource'],
    'pg_dump keeps declared resources and buckets, the event queue and its history, its attempts, its rate limits, its group and key concurrency, its pauses and its recurring schedules');
SELECT is((SELECT extversion FROM pg_extension WHERE extname = 'pg_throttle'),
    (SELECT default_version FROM pg_available_extensions WHERE name = 'pg_throttle'),
    'the installed version is the default version');
SELECT ok(has_table_privilege('public', 'throttle.resource', 'SELECT'),
    'everyone may read declared resources');
SELECT ok(NOT has_table_privilege('public', 'throttle.resource', 'INSERT'),
    'only privileged roles may declare resources');
SELECT ok(has_table_privilege('public', 'throttle.bucket', 'SELECT')
          AND NOT has_table_privilege('public', 'throttle.bucket', 'INSERT'),
    'everyone may read declared buckets, only privileged roles may declare them');
SELECT ok(has_table_privilege('public', 'throttle.group_policy', 'SELECT')
          AND NOT has_table_privilege('public', 'throttle.group_policy', 'INSERT')
          AND NOT has_table_privilege('public', 'throttle.group_policy', 'UPDATE'),
    'everyone may read group concurrency, only privileged roles may declare it');
SELECT ok(has_table_privilege('public', 'throttle.concurrency_policy', 'SELECT')
          AND NOT has_table_privilege('public', 'throttle.concurrency_policy', 'INSERT')
          AND NOT has_table_privilege('public', 'throttle.concurrency_policy', 'UPDATE')
          AND NOT has_table_privilege('public', 'throttle.concurrency_policy', 'DELETE')
          AND NOT has_table_privilege('public', 'throttle.concurrency_policy', 'TRUNCATE'),
    'everyone may read key concurrency, only privileged roles may declare it');

SELECT * FROM finish();
ROLLBACK;
