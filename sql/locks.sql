-- throttle.lock / unlock / renew on the test clock. Tokens are compared, not
-- printed: they start from the real clock.
SET pg_throttle.test_clock = '2030-01-01 00:00:00+00';

-- A session lock: held until unlocked.
SELECT throttle.lock('lk.mutex') AS t1 \gset
SELECT :t1 > 0 AS granted_with_a_token;
SELECT throttle.lock('lk.mutex') IS NULL AS second_caller_gets_null;
SELECT throttle.lock('lk.mutex', wait => '1 second') IS NULL AS own_lock_never_waits;
SELECT name, session, expires_at, token = :t1 AS same_token, waiters FROM throttle.locks WHERE name = 'lk.mutex';
SELECT throttle.unlock('lk.mutex', :t1 + 1) AS wrong_token;
SELECT throttle.unlock('lk.mutex', :t1) AS right_token;
SELECT throttle.unlock('lk.mutex', :t1) AS already_released;
SELECT count(*) AS shown_after_release FROM throttle.locks WHERE name = 'lk.mutex';
SELECT throttle.lock('lk.mutex') AS t2 \gset
SELECT :t2 > :t1 AS tokens_increase;
SELECT throttle.unlock('lk.mutex', :t2);

-- A lease: expires ttl after the grant, exactly.
SELECT throttle.lock('lk.lease', '10 seconds') AS l1 \gset
SELECT name, session, expires_at FROM throttle.locks WHERE name = 'lk.lease';
SET pg_throttle.test_clock = '2030-01-01 00:00:09.999999+00';
SELECT throttle.lock('lk.lease', '10 seconds') IS NULL AS held_until_the_last_microsecond;
SET pg_throttle.test_clock = '2030-01-01 00:00:10+00';
SELECT throttle.lock('lk.lease', '10 seconds') AS l2 \gset
SELECT :l2 > :l1 AS expired_lease_taken_with_a_greater_token;
-- The first holder's token is stale now: it can neither release nor renew.
SELECT throttle.unlock('lk.lease', :l1) AS stale_unlock;
SELECT throttle.renew('lk.lease', :l1, '1 hour') AS stale_renew;
-- The current holder renews at the last moment, and the lease runs on.
SET pg_throttle.test_clock = '2030-01-01 00:00:19.999999+00';
SELECT throttle.renew('lk.lease', :l2, '30 seconds') AS renewed;
SELECT expires_at FROM throttle.locks WHERE name = 'lk.lease';
SET pg_throttle.test_clock = '2030-01-01 00:00:49.999998+00';
SELECT throttle.lock('lk.lease', '1 second') IS NULL AS still_held;
SET pg_throttle.test_clock = '2030-01-01 00:00:49.999999+00';
SELECT throttle.renew('lk.lease', :l2, '30 seconds') AS renew_after_expiry;
SELECT throttle.unlock('lk.lease', :l2) AS unlock_after_expiry;

-- The "timeout lock" that need not be released: take it, never unlock.
SELECT throttle.lock('lk.timeout', '5 minutes') IS NOT NULL AS first_run;
SET pg_throttle.test_clock = '2030-01-01 00:03:00+00';
SELECT throttle.lock('lk.timeout', '5 minutes') IS NOT NULL AS within_five_minutes;
SET pg_throttle.test_clock = '2030-01-01 00:05:50+00';
SELECT throttle.lock('lk.timeout', '5 minutes') IS NOT NULL AS after_five_minutes;

-- Renewing a session lock is an error.
SELECT throttle.lock('lk.session') AS s1 \gset
SELECT throttle.renew('lk.session', :s1, '1 minute');
SELECT throttle.unlock('lk.session', :s1);

-- Holders.
SELECT throttle.lock('lk.holder', '1 minute', holder => 'worker-7') IS NOT NULL AS taken;
SELECT holder, holder_pid = pg_backend_pid() AS pid FROM throttle.locks WHERE name = 'lk.holder';

-- Bad input.
SELECT throttle.lock(NULL);
SELECT throttle.lock('');
SELECT throttle.lock(repeat('n', 201));
SELECT throttle.lock('lk.bad', '0');
SELECT throttle.lock('lk.bad', '-1 second');
SELECT throttle.lock('lk.bad', NULL, '-1 second');
SELECT throttle.unlock(NULL, 1);
SELECT throttle.unlock('lk.bad', NULL);
SELECT throttle.renew('lk.bad', 1, NULL);
SELECT throttle.renew('lk.bad', 1, '0');
SELECT throttle.lock('lk.bad', '2 hours');
SELECT throttle.renew('lk.lease', 1, '2 hours');
SELECT throttle.unlock('lk.never-taken', -1) AS negative_token;
SELECT throttle.unlock('lk.never-taken', 42) AS unlock_unknown;
SELECT throttle.renew('lk.never-taken', 42, '1 second') AS renew_unknown;
SELECT count(*) AS entries_for_bad_calls FROM throttle.status WHERE name LIKE 'lk.bad%';
RESET pg_throttle.test_clock;
