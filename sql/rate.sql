-- throttle.take / allow: GCRA token buckets on the test clock.
SET pg_throttle.test_clock = '2030-01-01 00:00:00+00';

-- 100 per minute, bursts of 20: T = 600 ms, tau = 12 s.
SELECT * FROM throttle.take('rate.user:1', 100, '1 minute', 20);
SELECT * FROM throttle.take('rate.user:1', 100, '1 minute', 20, 18);
SELECT * FROM throttle.take('rate.user:1', 100, '1 minute', 20);
-- Empty: denied, with the exact wait and nothing consumed.
SELECT * FROM throttle.take('rate.user:1', 100, '1 minute', 20);
SELECT * FROM throttle.take('rate.user:1', 100, '1 minute', 20, 5);
-- Exactly at new - tau = now it passes; one microsecond earlier it does not.
SET pg_throttle.test_clock = '2030-01-01 00:00:00.599999+00';
SELECT * FROM throttle.take('rate.user:1', 100, '1 minute', 20);
SET pg_throttle.test_clock = '2030-01-01 00:00:00.6+00';
SELECT * FROM throttle.take('rate.user:1', 100, '1 minute', 20);
-- Another key has its own bucket.
SELECT * FROM throttle.take('rate.user:2', 100, '1 minute', 20);

-- burst defaults to rate; cost 0 peeks.
SELECT * FROM throttle.take('rate.default-burst', 3, '1 second');
SELECT * FROM throttle.take('rate.default-burst', 3, '1 second', NULL, 2);
SELECT * FROM throttle.take('rate.default-burst', 3, '1 second', NULL, 0);
SELECT * FROM throttle.take('rate.default-burst', 3, '1 second', NULL, 1);
SELECT * FROM throttle.take('rate.default-burst', 3, '1 second', NULL, 0);

-- cost = burst empties a full bucket at once, and needs it full again.
SELECT allowed, remaining, reset_after FROM throttle.take('rate.whole', 10, '1 second', 4, 4);
SET pg_throttle.test_clock = '2030-01-01 00:00:00.999999+00';
SELECT allowed, retry_after FROM throttle.take('rate.whole', 10, '1 second', 4, 4);
SET pg_throttle.test_clock = '2030-01-01 00:00:01+00';
SELECT allowed, retry_after FROM throttle.take('rate.whole', 10, '1 second', 4, 4);

-- allow: the same decision as a boolean.
SET pg_throttle.test_clock = '2030-01-01 00:00:00+00';
SELECT throttle.allow('rate.bool', 1, '1 hour') AS first, throttle.allow('rate.bool', 1, '1 hour') AS second;

-- An inexact rate: 3 per second rounds T up to 333334 us, never down.
SELECT allowed, remaining, reset_after FROM throttle.take('rate.third', 3, '1 second', 1);
SELECT allowed, retry_after FROM throttle.take('rate.third', 3, '1 second', 1);

-- A clock stepped back grants nothing extra.
SET pg_throttle.test_clock = '2029-12-31 23:00:00+00';
SELECT allowed, remaining FROM throttle.take('rate.third', 3, '1 second', 1);

-- Declared buckets.
SET pg_throttle.test_clock = '2030-01-01 00:00:00+00';
INSERT INTO throttle.bucket (name, rate, per, burst, comment)
VALUES ('rate.api', 10, '1 second', 3, 'public API');
SELECT throttle.allow('rate.api') AS a1, throttle.allow('rate.api') AS a2,
       throttle.allow('rate.api') AS a3, throttle.allow('rate.api') AS a4;
SELECT * FROM throttle.take('rate.api', 0);
-- A changed declaration applies from the next call and keeps the level: the
-- bucket owes 0.2 s at 00:00:00.1 under the old rate, and still does.
UPDATE throttle.bucket SET rate = 1, burst = 1 WHERE name = 'rate.api';
SET pg_throttle.test_clock = '2030-01-01 00:00:00.1+00';
SELECT * FROM throttle.take('rate.api');
SET pg_throttle.test_clock = '2030-01-01 00:00:00.3+00';
SELECT * FROM throttle.take('rate.api');
-- burst NULL means rate.
UPDATE throttle.bucket SET rate = 2, burst = NULL WHERE name = 'rate.api';
SELECT * FROM throttle.take('rate.api', 0);

-- Bad input.
SELECT * FROM throttle.take(NULL, 1, '1 second');
SELECT * FROM throttle.take('rate.bad', NULL, '1 second');
SELECT * FROM throttle.take('rate.bad', 1, NULL);
SELECT * FROM throttle.take('rate.bad', 1, '1 second', 1, NULL);
SELECT * FROM throttle.take('rate.bad', 0, '1 second');
SELECT * FROM throttle.take('rate.bad', -1, '1 second');
SELECT * FROM throttle.take('rate.bad', 1, '0');
SELECT * FROM throttle.take('rate.bad', 1, '-1 second');
SELECT * FROM throttle.take('rate.bad', 1, '1 second', 0);
SELECT * FROM throttle.take('rate.bad', 1, '1 second', -3);
SELECT * FROM throttle.take('rate.bad', 1, '1 second', 2, -1);
SELECT * FROM throttle.take('rate.bad', 1, '1 second', 2, 3);
SELECT * FROM throttle.take('rate.bad', 2000000, '1 second');
SELECT * FROM throttle.take('rate.bad', 1, '200000 years', 2000000000);
SELECT * FROM throttle.take('', 1, '1 second');
SELECT * FROM throttle.take(repeat('b', 201), 1, '1 second');
SELECT * FROM throttle.take('rate.undeclared');
SELECT throttle.allow('rate.undeclared', 1);
SELECT throttle.allow(NULL);
SELECT throttle.allow('rate.api', NULL);
INSERT INTO throttle.bucket (name, rate, per) VALUES ('rate.zero', 0, '1 second');
INSERT INTO throttle.bucket (name, rate, per, burst) VALUES ('rate.zero', 1, '1 second', 0);
INSERT INTO throttle.bucket (name, rate, per) VALUES ('rate.zero', 1, '0');
SELECT count(*) AS entries_for_bad_calls FROM throttle.status WHERE name LIKE 'rate.bad%';

-- throttle.status shows buckets that are still counting.
SET pg_throttle.test_clock = '2030-01-01 00:00:00+00';
SELECT * FROM throttle.take('rate.shown', 100, '1 minute', 20, 5);
SELECT throttle.allow('rate.shown', 100, '1 minute', 20, 20) AS denied;
SELECT kind, name, granted_at, next_grant_at, grants, denials, rate, per, burst, remaining
FROM throttle.status WHERE name = 'rate.shown';
-- A full bucket is the same as an absent one: not shown.
SET pg_throttle.test_clock = '2030-01-01 00:00:03+00';
SELECT count(*) AS full_buckets_shown FROM throttle.status WHERE name = 'rate.shown';
RESET pg_throttle.test_clock;
