\pset footer off
\echo '== A cron job runs on three instances at 03:00; only the first caller runs it.'
\echo '   (one key per night; throttle.now() is the test clock here, current_date in a real job)'
SET pg_throttle.test_clock = '2030-01-01 03:00:00.010+00';
SELECT 'instance-a' AS instance, throttle.acquire('nightly-report:' || to_char(throttle.now(), 'YYYY-MM-DD'), '10 minutes', 'instance-a') AS runs_the_job
UNION ALL
SELECT 'instance-b', throttle.acquire('nightly-report:' || to_char(throttle.now(), 'YYYY-MM-DD'), '10 minutes', 'instance-b')
UNION ALL
SELECT 'instance-c', throttle.acquire('nightly-report:' || to_char(throttle.now(), 'YYYY-MM-DD'), '10 minutes', 'instance-c');

\echo '== The next night the job runs again, once.'
SET pg_throttle.test_clock = '2030-01-02 03:00:00.020+00';
SELECT 'instance-c' AS instance, throttle.acquire('nightly-report:' || to_char(throttle.now(), 'YYYY-MM-DD'), '10 minutes', 'instance-c') AS runs_the_job
UNION ALL
SELECT 'instance-a', throttle.acquire('nightly-report:' || to_char(throttle.now(), 'YYYY-MM-DD'), '10 minutes', 'instance-a');

\echo '== "No more than one FOO per minute", declared once by an operator.'
INSERT INTO throttle.resource (name, every, comment)
VALUES ('send-digest', '1 minute', 'at most one digest mail per minute');
SET pg_throttle.test_clock = '2030-01-02 12:00:00+00';
SELECT throttle.acquire('send-digest') AS at_12_00_00;
SELECT throttle.acquire('send-digest') AS again_at_12_00_00;
SET pg_throttle.test_clock = '2030-01-02 12:00:59.999999+00';
SELECT throttle.acquire('send-digest') AS at_12_00_59_999999;
SET pg_throttle.test_clock = '2030-01-02 12:01:00+00';
SELECT throttle.acquire('send-digest') AS at_12_01_00;

\echo '== What operators see.'
SELECT kind, name, holder, granted_at, next_grant_at, grants, denials
FROM throttle.status ORDER BY name;

\echo '== On the real clock: 2000 calls in one query, one grant per second.'
RESET pg_throttle.test_clock;
SELECT count(*) FILTER (WHERE throttle.acquire('tick', '1 second')) AS granted, count(*) AS calls
FROM generate_series(1, 2000);
