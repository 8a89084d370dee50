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

\echo
\echo '== Rate limit: an API key may make 3 calls, then 1 per second (GCRA bucket, burst 3).'
SET pg_throttle.test_clock = '2030-01-03 09:00:00+00';
SELECT 1 AS call, * FROM throttle.take('api:key-42', 1, '1 second', 3)
UNION ALL SELECT 2, * FROM throttle.take('api:key-42', 1, '1 second', 3)
UNION ALL SELECT 3, * FROM throttle.take('api:key-42', 1, '1 second', 3)
UNION ALL SELECT 4, * FROM throttle.take('api:key-42', 1, '1 second', 3);
\echo '   ... 0.5 s later the 5th call still waits; a second after the 4th it passes:'
SET pg_throttle.test_clock = '2030-01-03 09:00:00.5+00';
SELECT allowed, retry_after FROM throttle.take('api:key-42', 1, '1 second', 3);
SET pg_throttle.test_clock = '2030-01-03 09:00:01+00';
SELECT allowed, remaining FROM throttle.take('api:key-42', 1, '1 second', 3);
RESET pg_throttle.test_clock;

\echo
\echo '== A lease with a fence token: a writer that paused past its lease is refused.'
CREATE TEMP TABLE report (id int PRIMARY KEY, body text, fence bigint NOT NULL DEFAULT 0);
INSERT INTO report VALUES (1, 'empty');
SELECT throttle.lock('report-writer', ttl => '200 milliseconds') AS token_a \gset
\echo '   writer A holds the lease, token' :token_a '- and pauses longer than its ttl:'
SELECT 'paused 300 ms' AS writer_a FROM pg_sleep(0.3);
SELECT throttle.lock('report-writer', ttl => '1 minute') AS token_b \gset
\echo '   writer B takes the expired lease with token' :token_b 'and writes, fenced:'
WITH w AS (UPDATE report SET body = 'written by B', fence = :token_b
           WHERE id = 1 AND fence < :token_b RETURNING 1)
SELECT count(*) AS rows_written_by_b FROM w;
\echo '   A wakes up and writes with its stale token: no row qualifies, and its unlock fails:'
WITH w AS (UPDATE report SET body = 'written by A', fence = :token_a
           WHERE id = 1 AND fence < :token_a RETURNING 1)
SELECT count(*) AS rows_written_by_a FROM w;
SELECT body, fence = :token_b AS fenced_by_b FROM report;
SELECT throttle.unlock('report-writer', :token_a) AS a_unlocks,
       throttle.unlock('report-writer', :token_b) AS b_unlocks;

\echo
\echo '== Scheduled events with group claims: one worker per customer at a time.'
SELECT count(*) AS scheduled FROM (
    SELECT throttle.schedule('orders', 'order:' || n, now() - interval '1 second',
                             jsonb_build_object('order', n), group_key => 'customer:' || (n % 2 + 1))
    FROM generate_series(1, 5) AS n) s;
SELECT group_key AS group_a, array_agg(item_key ORDER BY id) AS events_a,
       min(claim_token) AS token_a
FROM throttle.claim_group('orders', 'worker-a', '1 minute') GROUP BY group_key \gset
\echo '   worker-a claimed' :group_a ':' :events_a
SELECT group_key AS group_b, array_agg(item_key ORDER BY id) AS events_b,
       min(claim_token) AS token_b
FROM throttle.claim_group('orders', 'worker-b', '1 minute') GROUP BY group_key \gset
\echo '   worker-b claimed' :group_b ':' :events_b
\echo '   worker-c finds both customers held, and gets nothing:'
SELECT count(*) AS claimed_by_worker_c FROM throttle.claim_group('orders', 'worker-c', '1 minute');
SELECT throttle.complete(array_agg(id), :token_a) AS completed_by_a
FROM throttle.event WHERE claim_token = :token_a;
SELECT throttle.complete(array_agg(id), :token_b) AS completed_by_b
FROM throttle.event WHERE claim_token = :token_b;
SELECT item_key, group_key, state, claimed_by, completed_by
FROM throttle.event_history WHERE queue = 'orders' ORDER BY group_key, id;
