-- pg_throttle.test_clock lives apart: resources and buckets made under a
-- test clock never constrain callers on the real clock, nor the other way
-- round; locks follow the real clock and are shared by both.
BEGIN;
SELECT plan(16);

-- Under a test clock three years ahead: a daily job and a yearly bucket.
SET LOCAL pg_throttle.test_clock = '2030-01-01 00:00:00+00';
SELECT ok(throttle.acquire('tap.clk.job', '1 day'), 'test clock: the daily job is granted');
SELECT ok(throttle.allow('tap.clk.bucket', 1, '1 year', 1), 'test clock: the yearly bucket gives its unit');
SELECT ok(NOT throttle.allow('tap.clk.bucket', 1, '1 year', 1), 'test clock: and is empty');
SELECT ok(throttle.lock('tap.clk.lock') IS NOT NULL, 'test clock: a session lock');

-- Back on the real clock.
SET LOCAL pg_throttle.test_clock = '';
SELECT ok(throttle.acquire('tap.clk.job', '1 day'), 'real clock: the job is not held by the test clock''s grant');
SELECT ok(throttle.allow('tap.clk.bucket', 1, '1 year', 1), 'real clock: the bucket is full');
SELECT ok(NOT throttle.allow('tap.clk.bucket', 1, '1 year', 1), 'real clock: and its own unit is spent');
SELECT is((SELECT count(*) FROM throttle.status WHERE name LIKE 'tap.clk.%' AND kind <> 'lock'), 2::bigint,
    'real clock: status shows the real clock''s resource and bucket');
SELECT ok((SELECT bool_and(granted_at < '2030-01-01') FROM throttle.status WHERE name LIKE 'tap.clk.%' AND kind <> 'lock'),
    'real clock: none of them is the test clock''s');
SELECT is((SELECT count(*) FROM throttle.locks WHERE name = 'tap.clk.lock'), 1::bigint,
    'locks are the same on every clock: the session lock is held');

-- The test clock again: its own entries are still there.
SET LOCAL pg_throttle.test_clock = '2030-01-01 00:00:01+00';
SELECT ok(NOT throttle.acquire('tap.clk.job', '1 day'), 'test clock: its grant still holds the job');
SELECT ok(NOT throttle.allow('tap.clk.bucket', 1, '1 year', 1), 'test clock: its bucket is still empty');
SELECT is((SELECT count(*) FROM throttle.status WHERE name LIKE 'tap.clk.%' AND kind <> 'lock' AND granted_at = '2030-01-01 00:00:00+00'),
    2::bigint, 'test clock: status shows the test clock''s entries');

-- reset clears a name on every clock.
SET LOCAL pg_throttle.test_clock = '';
SELECT is(throttle.reset('tap.clk.job'), 2, 'reset clears the resource on both clocks');
SELECT is(throttle.reset('tap.clk.bucket', 'bucket'), 2, 'and the bucket on both clocks');
SELECT ok(throttle.unlock('tap.clk.lock', (SELECT token FROM throttle.locks WHERE name = 'tap.clk.lock')), 'the lock is released');

SELECT * FROM finish();
ROLLBACK;
