-- Locks: error codes and token order, on the test clock.
BEGIN;
SELECT plan(12);
SET LOCAL pg_throttle.test_clock = '2037-01-01 00:00:00+00';

SELECT throws_ok($$SELECT throttle.lock(NULL)$$, '22004', 'name must not be NULL', 'NULL name: 22004');
SELECT throws_ok($$SELECT throttle.lock('')$$, '22023', 'lock name must not be empty', 'empty name: 22023');
SELECT throws_ok($$SELECT throttle.lock(repeat('x', 201))$$, '22023', 'lock name is too long', 'long name: 22023');
SELECT throws_ok($$SELECT throttle.lock('tap.l', '-1 s')$$, '22023', 'ttl must be a positive interval', 'negative ttl: 22023');
SELECT throws_ok($$SELECT throttle.lock('tap.l', NULL, '-1 s')$$, '22023', 'wait must not be negative', 'negative wait: 22023');
SELECT throws_ok($$SELECT throttle.unlock('tap.l', NULL)$$, '22004', 'token must not be NULL', 'NULL token: 22004');
SELECT throws_ok($$SELECT throttle.renew('tap.l', 1, NULL)$$, '22004', 'ttl must not be NULL', 'NULL renew ttl: 22004');
SELECT lives_ok($$SELECT throttle.lock('tap.sess')$$, 'a session lock');
SELECT throws_ok($$SELECT throttle.renew('tap.sess', (SELECT token FROM throttle.locks WHERE name = 'tap.sess'), '1 s')$$,
    '42809', 'lock "tap.sess" is a session lock', 'renewing a session lock: 42809');

-- Tokens grow with every grant, whatever the name.
CREATE TEMP TABLE grants AS
    SELECT g, throttle.lock('tap.order.' || g, '1 minute') AS token FROM generate_series(1, 50) AS g;
SELECT is((SELECT count(*)::int FROM grants WHERE token IS NOT NULL), 50, '50 grants on 50 names');
SELECT ok((SELECT bool_and(token > prev) FROM (SELECT token, lag(token) OVER (ORDER BY g) AS prev FROM grants) t
           WHERE prev IS NOT NULL), 'tokens strictly increase in grant order across names');
SELECT ok((SELECT min(token) FROM grants) > (SELECT token FROM throttle.locks WHERE name = 'tap.sess'),
    'and above every token granted before');

SELECT * FROM finish();
ROLLBACK;
