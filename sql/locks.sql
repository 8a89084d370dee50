-- throttle.lock / unlock / renew. Tokens are compared, not printed. Locks
-- expire by the real clock (pg_throttle.test_clock never applies to them:
-- their expiry is shared by every session and survives crashes), so times
-- are checked as exact differences or as lower bounds.

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
SELECT throttle.lock('lk.lease', ttl => '10 seconds') AS l1 \gset
SELECT name, session, expires_at - granted_at AS ttl FROM throttle.locks WHERE name = 'lk.lease';
SELECT throttle.lock('lk.lease', ttl => '10 seconds') IS NULL AS held_by_the_first;
-- A session's test clock does not expire another's lease.
SET pg_throttle.test_clock = '2100-01-01 00:00:00+00';
SELECT throttle.lock('lk.lease', ttl => '10 seconds') IS NULL AS test_clock_cannot_expire_it;
RESET pg_throttle.test_clock;
-- The holder renews: ttl from now.
SELECT throttle.renew('lk.lease', :l1, '30 seconds') AS renewed;
SELECT expires_at - clock_timestamp() > interval '29 seconds' AS runs_on FROM throttle.locks WHERE name = 'lk.lease';
SELECT throttle.unlock('lk.lease', :l1) AS released;

-- An expired lease goes to the next caller, with a greater token: a waiter
-- gets a 200 ms lease no earlier than its end.
SELECT throttle.lock('lk.short', ttl => '200 milliseconds') AS s1 \gset
SELECT clock_timestamp() AS asked \gset
SELECT throttle.lock('lk.short', ttl => '10 seconds', wait => '10 seconds') AS s2 \gset
SELECT clock_timestamp() - :'asked' >= interval '150 milliseconds' AS waited_for_the_end;
SELECT :s2 > :s1 AS expired_lease_taken_with_a_greater_token;
-- The first holder's token is stale now: it can neither release nor renew.
SELECT throttle.unlock('lk.short', :s1) AS stale_unlock;
SELECT throttle.renew('lk.short', :s1, '1 minute') AS stale_renew;
SELECT throttle.unlock('lk.short', :s2) AS current_unlock;

-- The "timeout lock" that need not be released: take it, never unlock.
SELECT throttle.lock('lk.timeout', ttl => '5 minutes') IS NOT NULL AS first_run;
SELECT throttle.lock('lk.timeout', ttl => '5 minutes') IS NOT NULL AS within_five_minutes;

-- Renewing a session lock is an error.
SELECT throttle.lock('lk.session') AS s1 \gset
SELECT throttle.renew('lk.session', :s1, '1 minute');
SELECT throttle.unlock('lk.session', :s1);

-- Holders.
SELECT throttle.lock('lk.holder', ttl => '1 minute', holder => 'worker-7') IS NOT NULL AS taken;
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
