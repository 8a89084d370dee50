-- throttle.acquire behaviour and error codes, on the test clock.
BEGIN;
SELECT plan(37);

SET LOCAL pg_throttle.test_clock = '2031-03-01 10:00:00+00';

-- The window.
SELECT ok(throttle.acquire('tap.cron', '1 hour'), 'first caller is granted');
SELECT ok(NOT throttle.acquire('tap.cron', '1 hour'), 'second caller is denied');
SET LOCAL pg_throttle.test_clock = '2031-03-01 10:59:59.999999+00';
SELECT ok(NOT throttle.acquire('tap.cron', '1 hour'), 'denied one microsecond before the end');
SET LOCAL pg_throttle.test_clock = '2031-03-01 11:00:00+00';
SELECT ok(throttle.acquire('tap.cron', '1 hour'), 'granted exactly at the end of the window');
SELECT ok(NOT throttle.acquire('tap.cron', '1 hour'), 'and the next window is closed again');
SET LOCAL pg_throttle.test_clock = '2031-03-01 09:00:00+00';
SELECT ok(NOT throttle.acquire('tap.cron', '1 minute'), 'a clock stepped back two hours grants nothing');

-- Exactly one grant per window among many calls.
SET LOCAL pg_throttle.test_clock = '2031-03-01 12:00:00+00';
SELECT is(
    (SELECT count(*)::int FROM generate_series(1, 1000) AS g
     WHERE throttle.acquire('tap.burst', '5 minutes')),
    1, 'one grant among 1000 calls in one window');
SELECT is(
    (SELECT grants::int FROM throttle.status WHERE name = 'tap.burst'), 1, 'status counts 1 grant');
SELECT is(
    (SELECT denials::int FROM throttle.status WHERE name = 'tap.burst'), 999, 'status counts 999 denials');
SELECT is(
    (SELECT next_grant_at FROM throttle.status WHERE name = 'tap.burst'),
    '2031-03-01 12:05:00+00'::timestamptz, 'status tells when it can next be granted');
SELECT is(
    (SELECT granted_at FROM throttle.status WHERE name = 'tap.burst'),
    '2031-03-01 12:00:00+00'::timestamptz, 'status tells when it was granted');

-- "One FOO per minute" over a simulated hour of calls every 10 seconds.
CREATE FUNCTION pg_temp.grants_over(resource text, every interval, start timestamptz,
                                    step interval, calls integer) RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    granted integer := 0;
BEGIN
    FOR i IN 0 .. calls - 1 LOOP
        PERFORM set_config('pg_throttle.test_clock', (start + i * step)::text, true);
        IF throttle.acquire(resource, every) THEN
            granted := granted + 1;
        END IF;
    END LOOP;
    RETURN granted;
END
$$;
SELECT is(pg_temp.grants_over('tap.foo', '1 minute', '2031-03-01 13:00:00+00', '10 seconds', 360),
    60, 'calls every 10 seconds for an hour: 60 grants of one per minute');
SELECT is(
    (SELECT granted_at FROM throttle.status WHERE name = 'tap.foo'),
    '2031-03-01 13:59:00+00'::timestamptz, 'the last grant opened the last minute');

-- Rollback does not undo a grant (savepoint inside this test's transaction).
SET LOCAL pg_throttle.test_clock = '2031-03-01 14:00:00+00';
SAVEPOINT before_grant;
SELECT ok(throttle.acquire('tap.rollback', '1 day'), 'granted inside a savepoint');
ROLLBACK TO SAVEPOINT before_grant;
SELECT ok(NOT throttle.acquire('tap.rollback', '1 day'), 'still taken after ROLLBACK TO SAVEPOINT');

-- Declared resources.
INSERT INTO throttle.resource (name, every) VALUES ('tap.declared', '2 minutes');
SELECT ok(throttle.acquire('tap.declared'), 'declared interval: first call granted');
SET LOCAL pg_throttle.test_clock = '2031-03-01 14:01:59.999999+00';
SELECT ok(NOT throttle.acquire('tap.declared'), 'declared interval: denied inside it');
SET LOCAL pg_throttle.test_clock = '2031-03-01 14:02:00+00';
SELECT ok(throttle.acquire('tap.declared'), 'declared interval: granted after it');
SELECT ok(throttle.acquire('tap.explicit-null-holder', '1 minute', NULL), 'NULL holder is allowed');

-- Errors and their SQLSTATEs.
SELECT throws_ok($$SELECT throttle.acquire(NULL, '1 hour')$$, '22004', 'resource must not be NULL',
    'NULL resource: 22004');
SELECT throws_ok($$SELECT throttle.acquire('', '1 hour')$$, '22023', 'resource name must not be empty',
    'empty name: 22023');
SELECT throws_ok($$SELECT throttle.acquire(repeat('n', 201), '1 hour')$$, '22023', 'resource name is too long',
    'over-long name: 22023');
SELECT lives_ok($$SELECT throttle.acquire(repeat('n', 200), '1 hour')$$, 'a 200-byte name is accepted');
SELECT throws_ok($$SELECT throttle.acquire('tap.bad', '0')$$, '22023', 'every must be a positive interval',
    'zero interval: 22023');
SELECT throws_ok($$SELECT throttle.acquire('tap.bad', '-5 minutes')$$, '22023', 'every must be a positive interval',
    'negative interval: 22023');
SELECT throws_ok($$SELECT throttle.acquire('tap.bad', '1000000 years')$$, '22008', 'every is out of range',
    'interval beyond the clock range: 22008');
SELECT throws_ok($$SELECT throttle.acquire('tap.undeclared')$$, '42704',
    'resource "tap.undeclared" is not declared', 'no interval and none declared: 42704');
SELECT is((SELECT count(*)::int FROM throttle.status WHERE name IN ('tap.bad', 'tap.undeclared')), 0,
    'failed calls leave no entry');
SELECT throws_ok($$SET pg_throttle.test_clock = 'yesterday-ish'$$, '22023', NULL,
    'an unparsable test clock is refused: 22023');
SELECT throws_ok($$SET pg_throttle.max_entries = 5$$, '55P02', NULL,
    'max_entries is fixed at server start: 55P02');

-- The test clock is superuser-only.
CREATE ROLE tap_throttle_user;
SET LOCAL ROLE tap_throttle_user;
SELECT throws_ok($$SET pg_throttle.test_clock = '2000-01-01 00:00:00+00'$$, '42501', NULL,
    'a non-superuser cannot set the test clock: 42501');
SELECT ok(throttle.acquire('tap.user', '1 hour'), 'a non-superuser can acquire');
SELECT throws_ok($$INSERT INTO throttle.resource VALUES ('tap.user-declared', '1 hour')$$, '42501', NULL,
    'a non-superuser cannot declare resources: 42501');
RESET ROLE;

-- The real clock is back when the test clock is empty.
SET LOCAL pg_throttle.test_clock = '';
SELECT ok(throttle.acquire('tap.real-clock', '1 hour')
          AND (SELECT granted_at BETWEEN clock_timestamp() - interval '1 minute' AND clock_timestamp()
               FROM throttle.status WHERE name = 'tap.real-clock'),
    'with an empty test clock, grants are stamped with the real time');

-- A window past the last int64 microsecond (294277-01-09) never closes: a
-- day before the end of PostgreSQL's timestamps, '30 days' grants once.
SET LOCAL pg_throttle.test_clock = '294276-12-31 00:00:00+00';
SELECT ok(throttle.acquire('tap.end', '30 days'), 'near the end of timestamps: granted');
SET LOCAL pg_throttle.test_clock = '294276-12-31 23:59:59.999999+00';
SELECT ok(NOT throttle.acquire('tap.end', '1 microsecond'), 'and denied up to the last timestamp');
SELECT is(throttle.reset('tap.end', 'resource'), 1, 'reset removes it');

SELECT * FROM finish();
ROLLBACK;
