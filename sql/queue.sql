-- The event queue on the test clock.
SET pg_throttle.test_clock = '2031-06-01 12:00:00+00';
SET application_name = 'regress-queue';
\set SHOW_CONTEXT never

-- schedule: an item_key is unique among pending events; scheduling it
-- again moves it and returns the same id.
SELECT throttle.schedule('mail', 'welcome:ann', '2031-06-01 13:00:00+00', '{"to": "ann"}') AS ann \gset
SELECT throttle.schedule('mail', 'welcome:ann', '2031-06-01 12:30:00+00', '{"to": "ann", "v": 2}') = :ann AS same_id;
SELECT throttle.schedule('mail', 'welcome:bob', '2031-06-01 11:00:00+00') AS bob \gset
SELECT throttle.schedule('mail', 'welcome:cy', '2031-06-01 11:30:00+00', max_attempts => 2) AS cy \gset
SELECT item_key, run_at, payload, state, attempts, max_attempts, enqueued_at, enqueued_by
FROM throttle.all_events WHERE queue = 'mail' ORDER BY id;

-- reschedule and cancel act on pending events only.
SELECT throttle.reschedule('mail', 'welcome:ann', '2031-06-01 12:45:00+00') AS rescheduled;
SELECT throttle.reschedule('mail', 'nobody', '2031-06-01 12:45:00+00') AS unknown_key;
SELECT throttle.schedule('mail', 'welcome:dee', '2031-06-02 00:00:00+00') AS dee \gset
SELECT throttle.cancel('mail', 'welcome:dee') AS cancelled, throttle.cancel('mail', 'welcome:dee') AS again;
SELECT state, cancelled_at FROM throttle.all_events WHERE id = :dee;
-- A cancelled key can be scheduled anew: a new event.
SELECT throttle.schedule('mail', 'welcome:dee', '2031-06-02 00:00:00+00') <> :dee AS new_event;

-- claim: due events, oldest first, up to max.
SELECT item_key, state, claimed_by, claimed_role::regrole, attempts, lease_until, claim_token IS NOT NULL AS has_token
FROM throttle.claim('mail', 'worker-1', '1 minute', 10);
SELECT claim_token AS w1 FROM throttle.event WHERE id = :bob \gset
SELECT count(*) AS nothing_more_due FROM throttle.claim('mail', 'worker-2');
-- A claimed event is not pending: cancel and reschedule say so, and it runs.
SELECT throttle.cancel('mail', 'welcome:bob') AS claimed_not_cancelled;
SELECT throttle.reschedule('mail', 'welcome:bob', '2031-06-02 00:00:00+00') AS claimed_not_moved;
-- Only the claim's token completes, fails or extends it.
SELECT throttle.complete(ARRAY[:bob]::bigint[], :w1 - 1) AS other_token_completes;
SELECT throttle.extend(ARRAY[:bob, :cy]::bigint[], :w1, '10 minutes') AS extended;
SELECT throttle.complete(ARRAY[:bob]::bigint[], :w1) AS completed;
SELECT state, completed_at, completed_by FROM throttle.all_events WHERE id = :bob;
SELECT throttle.cancel('mail', 'welcome:bob') AS done_not_cancelled;

-- fail: keeps the error and retries with a backoff; dead after max_attempts.
SELECT throttle.fail(ARRAY[:cy]::bigint[], :w1, 'smtp timeout') AS failed;
SELECT state, attempts, run_at, last_error FROM throttle.all_events WHERE id = :cy;
SET pg_throttle.test_clock = '2031-06-01 12:00:09.999999+00';
SELECT count(*) AS not_due_before_backoff FROM throttle.claim('mail', 'worker-1', max => 5);
SET pg_throttle.test_clock = '2031-06-01 12:00:10+00';
SELECT item_key, attempts, claim_token > :w1 AS new_token FROM throttle.claim('mail', 'worker-1', max => 5);
SELECT claim_token AS w1 FROM throttle.event WHERE id = :cy \gset
SELECT throttle.fail(ARRAY[:cy]::bigint[], :w1, 'smtp timeout again') AS failed_twice;
SELECT state, attempts, last_error, completed_at FROM throttle.all_events WHERE id = :cy;
SELECT throttle.reschedule('mail', 'welcome:cy', '2031-06-02 00:00:00+00') AS dead_not_moved;
-- retry brings a dead event back.
SELECT throttle.retry(:cy) AS retried, throttle.retry(:cy) AS retried_again;
SELECT state, attempts, run_at FROM throttle.all_events WHERE id = :cy;
-- fail with an explicit retry_in.
SELECT item_key, claim_token AS w1 FROM throttle.claim('mail', 'worker-1', max => 5) \gset
SELECT :'item_key' AS item_key;
SELECT throttle.fail(ARRAY[:cy]::bigint[], :w1, 'later', '1 hour');
SELECT state, run_at FROM throttle.all_events WHERE id = :cy;

-- Lease expiry: another worker takes the event over and fences the first.
SET pg_throttle.test_clock = '2031-06-01 13:00:00+00';
SELECT item_key, claimed_by FROM throttle.claim('mail', 'worker-1', '1 minute');
SELECT claim_token AS old_token FROM throttle.event WHERE id = :ann \gset
SET pg_throttle.test_clock = '2031-06-01 13:01:00+00';
SELECT throttle.cancel('mail', 'welcome:ann') AS lease_ended_not_cancelled;
SELECT item_key, claimed_by, attempts FROM throttle.claim('mail', 'worker-2', '1 minute');
SELECT claim_token AS new_token FROM throttle.event WHERE id = :ann \gset
SELECT throttle.complete(ARRAY[:ann]::bigint[], :old_token) AS fenced_old_worker;
SELECT throttle.complete(ARRAY[:ann]::bigint[], :new_token) AS new_worker;

-- Groups: claim_group takes every due event of one group.
SET pg_throttle.test_clock = '2031-06-01 14:00:00+00';
SELECT throttle.schedule('orders', 'o1', '2031-06-01 13:00:00+00', group_key => 'cust:1') AS o1 \gset
SELECT throttle.schedule('orders', 'o2', '2031-06-01 13:10:00+00', group_key => 'cust:1') AS o2 \gset
SELECT throttle.schedule('orders', 'o3', '2031-06-01 13:05:00+00', group_key => 'cust:2') AS o3 \gset
SELECT throttle.schedule('orders', 'o4', '2031-06-01 14:30:00+00', group_key => 'cust:1') AS o4 \gset
SELECT item_key, group_key, claimed_by FROM throttle.claim_group('orders', 'w-a', '1 hour');
SELECT item_key, group_key, claimed_by FROM throttle.claim_group('orders', 'w-b', '1 hour');
SELECT claim_token AS wa FROM throttle.event WHERE id = :o1 \gset
SELECT claim_token AS wb FROM throttle.event WHERE id = :o3 \gset
SELECT count(*) AS no_free_group FROM throttle.claim_group('orders', 'w-c', '10 minutes');
-- plain claim leaves grouped events to claim_group.
SELECT count(*) AS claim_skips_groups FROM throttle.claim('orders', 'w-c', max => 10);
-- A group's lease is an entry of its own kind, not a lock any name reaches.
SELECT kind, name, holder FROM throttle.status WHERE kind = 'group' ORDER BY name;
SELECT count(*) AS no_lock_named_like_a_group FROM throttle.locks WHERE name LIKE '%cust:%';
-- o4 becomes due while w-a holds cust:1: nobody else gets it.
SET pg_throttle.test_clock = '2031-06-01 14:31:00+00';
SELECT count(*) AS held_group_not_handed_out FROM throttle.claim_group('orders', 'w-c', '10 minutes');
-- w-a finishes: the group is free again, with o4.
SELECT throttle.complete(ARRAY[:o1, :o2]::bigint[], :wa) AS completed;
SELECT item_key, claimed_by FROM throttle.claim_group('orders', 'w-c', '1 hour');
-- w-b's lease expires: its group goes to another worker, and w-b is fenced.
SET pg_throttle.test_clock = '2031-06-01 15:00:00+00';
SELECT item_key, claimed_by, attempts FROM throttle.claim_group('orders', 'w-d', '10 minutes');
SELECT throttle.complete(ARRAY[:o3]::bigint[], :wb) AS fenced;

-- The table is the durable truth: with the group's lease gone from shared
-- memory (as after a restart), a held group is still not handed out.
SELECT throttle.schedule('orders', 'o5', '2031-06-01 14:00:00+00', group_key => 'cust:3') AS o5 \gset
SELECT item_key FROM throttle.claim_group('orders', 'w-e', '10 minutes');
SELECT throttle._group_release('orders', 'cust:3', token) AS forgot_in_shared_memory
FROM throttle.status WHERE kind = 'group' AND name = '6:orders:cust:3';
SELECT throttle.schedule('orders', 'o6', '2031-06-01 14:00:00+00', group_key => 'cust:3') AS o6 \gset
SELECT count(*) AS still_held_by_the_table FROM throttle.claim_group('orders', 'w-f', '10 minutes');

-- Priority: claim takes higher priorities first, then the oldest.
SELECT throttle.schedule('prio', 'low', '2031-06-01 13:00:00+00');
SELECT throttle.schedule('prio', 'high', '2031-06-01 13:50:00+00', priority => 10);
SELECT throttle.schedule('prio', 'mid', '2031-06-01 13:40:00+00', priority => 5);
SELECT throttle.schedule('prio', 'not_due', '2031-06-01 16:00:00+00', priority => 99);
SELECT item_key, priority FROM throttle.claim('prio', 'w', max => 1);
SELECT item_key, priority FROM throttle.claim('prio', 'w', max => 10);

-- on_duplicate: what schedule does to a pending event of the same item_key.
SELECT throttle.schedule('dup', 'k', '2031-06-01 18:00:00+00', '{"v": 1}') AS dup \gset
SELECT throttle.schedule('dup', 'k', '2031-06-01 19:00:00+00', '{"v": 2}', on_duplicate => 'keep_earlier') = :dup AS same;
SELECT run_at, payload FROM throttle.all_events WHERE id = :dup;
SELECT throttle.schedule('dup', 'k', '2031-06-01 17:00:00+00', '{"v": 3}', on_duplicate => 'ignore') = :dup AS same;
SELECT run_at, payload FROM throttle.all_events WHERE id = :dup;
SELECT throttle.schedule('dup', 'k', '2031-06-01 20:00:00+00', '{"v": 4}', priority => 3) = :dup AS same;
SELECT run_at, payload, priority FROM throttle.all_events WHERE id = :dup;
SELECT throttle.schedule('dup', 'k', '2031-06-01 20:00:00+00', on_duplicate => 'newest');

-- Operators: release a group whoever holds it; its holder is fenced.
SELECT throttle.schedule('ops', 'p' || g, '2031-06-01 14:00:00+00', group_key => 'cust:9') FROM generate_series(1, 2) g;
SELECT count(*) AS claimed, min(claim_token) AS ops_token FROM throttle.claim_group('ops', 'w-stuck', '1 hour') \gset
SELECT :claimed AS claimed;
SELECT throttle.release_group('ops', 'cust:9') AS released, throttle.release_group('ops', 'cust:9') AS again;
SELECT throttle.complete(ARRAY(SELECT id FROM throttle.all_events WHERE queue = 'ops'), :ops_token) AS fenced_holder;
SELECT item_key, claimed_by, attempts FROM throttle.claim_group('ops', 'w-next', '1 hour');

-- retry many, each with its reason when refused; retry_dead by queue and error.
SELECT throttle.schedule('ops2', 'd' || g, '2031-06-01 14:00:00+00', max_attempts => 1) FROM generate_series(1, 3) g;
SELECT array_agg(id ORDER BY id) AS dead_ids, min(claim_token) AS t FROM throttle.claim('ops2', 'w', max => 3) \gset
SELECT throttle.fail(:'dead_ids'::bigint[], :t, CASE WHEN true THEN 'smtp 451' END) AS died;
UPDATE throttle.event SET last_error = 'bad address' WHERE id = (:'dead_ids'::bigint[])[3];
SELECT throttle.schedule('ops2', 'd2', '2031-06-02 00:00:00+00') AS d2_again \gset
SELECT r.id = (:'dead_ids'::bigint[])[1] AS first, r.retried, r.reason
FROM throttle.retry(ARRAY[(:'dead_ids'::bigint[])[1], (:'dead_ids'::bigint[])[1], (:'dead_ids'::bigint[])[2], -1, NULL]) AS r;
SELECT item_key, retried, reason FROM throttle.retry_dead('ops2', error_like => 'bad%') r JOIN throttle.all_events e USING (id);
SELECT count(*) AS nothing_left FROM throttle.retry_dead('ops2', error_like => 'bad%');
SELECT state, count(*) FROM throttle.all_events WHERE queue = 'ops2' GROUP BY state ORDER BY state;

-- purge removes finished events only, and only old ones; dead events only
-- when asked.
SET pg_throttle.test_clock = '2031-06-03 00:00:00+00';
SELECT count(*) AS dead_before FROM throttle.all_events WHERE state = 'dead';
SELECT throttle.purge('1 day', queue => 'ops2') AS purged_one_queue;
SELECT throttle.purge('1 day') AS purged;
SELECT state, count(*) FROM throttle.all_events GROUP BY state ORDER BY state;
SELECT throttle.purge('1 day', states => '{dead}') AS purged_dead;

-- Bad input.
SELECT throttle.schedule(NULL, 'k', '2031-06-01');
SELECT throttle.schedule('q', NULL, '2031-06-01');
SELECT throttle.schedule('q', 'k', NULL);
SELECT throttle.schedule('q', 'k', '2031-06-01', max_attempts => 0);
SELECT throttle.schedule('', 'k', '2031-06-01');
SELECT throttle.schedule(repeat('q', 64), 'k', '2031-06-01');
SELECT * FROM throttle.claim('q', 'w', '0');
SELECT * FROM throttle.claim('q', 'w', '1 minute', 0);
SELECT * FROM throttle.claim('q', NULL);
SELECT * FROM throttle.claim_group('q', 'w', '-1 minute');
SELECT throttle.fail(ARRAY[1]::bigint[], 1, 'e', '-1 second');
SELECT throttle.complete(ARRAY[1]::bigint[], NULL);
SELECT throttle.purge('-1 day');
SELECT throttle.purge('1 day', states => '{pending}');
SELECT throttle.purge('1 day', states => '{}');
SELECT * FROM throttle.retry(NULL::bigint[]);
SELECT throttle.retry(NULL::bigint);
SELECT throttle.release_group('q', NULL);
RESET pg_throttle.test_clock;
-- A claim is a promise: its transaction commits durably (synchronous_commit
-- on) whatever the session says, and only that transaction.
SET synchronous_commit = off;
SELECT throttle.schedule('durable', 'd1', now() - interval '1 minute') > 0 AS scheduled;
BEGIN;
SELECT count(*) AS nothing_claimed FROM throttle.claim('durable.none', 'w');
SHOW synchronous_commit;
SELECT count(*) AS claimed FROM throttle.claim('durable', 'w');
SHOW synchronous_commit;
COMMIT;
SHOW synchronous_commit;
RESET synchronous_commit;
DELETE FROM throttle.event WHERE queue = 'durable';

SET pg_throttle.test_clock = '2031-06-01 15:00:00+00';
-- schedule_many: a batch of schedule calls in one statement, as if they ran
-- one after the other. An item_key named twice is one event: the first
-- call's group_key, the last call's run_at and payload (replace).
SELECT throttle.schedule_many('many', ARRAY['a', 'b', 'a', 'c'],
       ARRAY['2031-06-01 13:00:00+00', '2031-06-01 16:00:00+00', '2031-06-01 12:00:00+00',
             '2031-06-01 14:30:00+00']::timestamptz[],
       ARRAY['{"n": 1}', '{"n": 2}', '{"n": 3}', '{"n": 4}']::jsonb[],
       ARRAY['g1', NULL, 'g2', NULL], max_attempts => 2, priority => 4) AS many_ids \gset
SELECT (:'many_ids'::bigint[])[1] = (:'many_ids'::bigint[])[3] AS a_once,
       cardinality(:'many_ids'::bigint[]) AS ids;
SELECT item_key, group_key, payload, run_at, max_attempts, priority, state, enqueued_by
FROM throttle.all_events WHERE queue = 'many' ORDER BY item_key;
-- keep_earlier: the earliest run_at of the pending event and the batch, the last payload.
SELECT throttle.schedule_many('many', ARRAY['a', 'b', 'b', 'd'],
       ARRAY['2031-06-01 11:00:00+00', '2031-06-01 17:00:00+00', '2031-06-01 15:00:00+00',
             '2031-06-01 18:00:00+00']::timestamptz[],
       ARRAY['{"n": 5}', '{"n": 6}', '{"n": 7}', '{"n": 8}']::jsonb[],
       on_duplicate => 'keep_earlier') AS ids \gset
SELECT (:'ids'::bigint[])[1:3] = ARRAY[(:'many_ids'::bigint[])[1], (:'many_ids'::bigint[])[2], (:'many_ids'::bigint[])[2]]
           AS same_ids,
       (:'ids'::bigint[])[4] = (SELECT id FROM throttle.all_events WHERE queue = 'many' AND item_key = 'd') AS new_id;
SELECT item_key, payload, run_at FROM throttle.all_events WHERE queue = 'many' ORDER BY item_key;
-- ignore: pending events stay as they are; a new key takes its first mention.
SELECT cardinality(throttle.schedule_many('many', ARRAY['c', 'e', 'e'],
       ARRAY['2031-06-01 10:00:00+00', '2031-06-01 19:00:00+00', '2031-06-01 09:00:00+00']::timestamptz[],
       ARRAY['{"n": 9}', '{"n": 10}', '{"n": 11}']::jsonb[], on_duplicate => 'ignore')) AS ids;
SELECT item_key, payload, run_at FROM throttle.all_events WHERE queue = 'many' ORDER BY item_key;
-- The event of a claimed item_key is left alone: a new run waits behind it.
SELECT item_key, claimed_by FROM throttle.claim('many', 'w-many', max => 1);
SELECT throttle.schedule_many('many', ARRAY['c'], ARRAY['2031-06-01 12:00:00+00']::timestamptz[],
                              ARRAY['{"n": 12}']::jsonb[]) <> ARRAY[(:'many_ids'::bigint[])[4]] AS a_new_run;
SELECT item_key, state, payload FROM throttle.all_events WHERE queue = 'many' AND item_key = 'c' ORDER BY id;
-- Arguments: one element per item_key, no NULL keys, times or payloads,
-- keys as schedule takes them; an empty batch schedules nothing.
SELECT throttle.schedule_many('many', '{}', '{}') AS nothing;
SELECT throttle.schedule_many('many', ARRAY['x', 'y'], ARRAY['2031-06-01 12:00:00+00']::timestamptz[]);
SELECT throttle.schedule_many('many', ARRAY['x'], ARRAY['2031-06-01 12:00:00+00']::timestamptz[], group_keys => ARRAY['g', 'h']);
SELECT throttle.schedule_many('many', ARRAY['x', NULL], ARRAY['2031-06-01 12:00:00+00', '2031-06-01 12:00:00+00']::timestamptz[]);
SELECT throttle.schedule_many('many', ARRAY['x', 'y'], ARRAY['2031-06-01 12:00:00+00', NULL]::timestamptz[]);
SELECT throttle.schedule_many('many', ARRAY['x'], ARRAY['2031-06-01 12:00:00+00']::timestamptz[], ARRAY[NULL]::jsonb[]);
SELECT throttle.schedule_many('many', ARRAY['x', ''], ARRAY['2031-06-01 12:00:00+00', '2031-06-01 12:00:00+00']::timestamptz[]);
SELECT throttle.schedule_many('many', ARRAY[repeat('k', 1025)], ARRAY['2031-06-01 12:00:00+00']::timestamptz[]);
SELECT throttle.schedule_many('many', ARRAY['x'], ARRAY['2031-06-01 12:00:00+00']::timestamptz[], group_keys => ARRAY[repeat('g', 1025)]);
SELECT throttle.schedule_many('many', ARRAY[['x', 'y'], ['z', 'w']], ARRAY[['2031-06-01 12:00:00+00', '2031-06-01 12:00:00+00'], ['2031-06-01 12:00:00+00', '2031-06-01 12:00:00+00']]::timestamptz[]);
SELECT throttle.schedule_many('many', ARRAY['x'], ARRAY['2031-06-01 12:00:00+00']::timestamptz[], on_duplicate => 'newest');
SELECT throttle.schedule_many('many', ARRAY['x'], ARRAY['2031-06-01 12:00:00+00']::timestamptz[], max_attempts => 0);
SELECT throttle.schedule_many('', ARRAY['x'], ARRAY['2031-06-01 12:00:00+00']::timestamptz[]);
SELECT throttle.schedule_many('many', NULL, ARRAY['2031-06-01 12:00:00+00']::timestamptz[]);
SELECT count(*) AS nothing_scheduled_by_errors FROM throttle.all_events WHERE queue = 'many' AND item_key IN ('x', 'y', 'z', 'w');
RESET pg_throttle.test_clock;
DELETE FROM throttle.event WHERE queue = 'many';

-- Rate-limited claims: a queue named in throttle.queue_bucket hands out at
-- most as many events as its bucket allows, one unit per event.
SET pg_throttle.test_clock = '2031-06-01 12:00:00+00';
INSERT INTO throttle.bucket (name, rate, per, burst) VALUES ('smtp', 3, '1 minute', 3);
INSERT INTO throttle.queue_bucket (queue, bucket) VALUES ('limited', 'smtp');
SELECT count(throttle.schedule('limited', 'e' || g, '2031-06-01 11:00:00+00')) AS scheduled
FROM generate_series(1, 5) g;
SELECT item_key FROM throttle.claim('limited', 'w', max => 10);
SELECT count(*) AS bucket_empty FROM throttle.claim('limited', 'w', max => 10);
SELECT name, remaining, next_grant_at FROM throttle.status WHERE kind = 'queue_bucket';
SET pg_throttle.test_clock = '2031-06-01 12:00:20+00';
SELECT item_key FROM throttle.claim('limited', 'w', max => 10);
-- claim_group: the group's oldest events, as many as the bucket allows; the
-- group stays held, its other events wait for the claim to end.
SELECT count(throttle.schedule('limited', 'g' || g, '2031-06-01 11:00:00+00', group_key => 'G'))
FROM generate_series(1, 4) g;
SET pg_throttle.test_clock = '2031-06-01 12:01:00+00';
SELECT array_agg(item_key ORDER BY item_key) AS g_keys, min(claim_token) AS g_token
FROM throttle.claim_group('limited', 'w-g') \gset
SELECT :'g_keys' AS claimed_keys;
SELECT item_key, state FROM throttle.all_events WHERE queue = 'limited' AND group_key = 'G' ORDER BY id;
SELECT count(*) AS group_held FROM throttle.claim_group('limited', 'w-other');
SELECT throttle.complete(ARRAY(SELECT id FROM throttle.all_events WHERE queue = 'limited' AND state = 'claimed'
                               AND group_key = 'G'), :g_token) AS completed;
SET pg_throttle.test_clock = '2031-06-01 12:02:00+00';
SELECT item_key, claimed_by FROM throttle.claim_group('limited', 'w-other');
-- No throttle.take reaches the queue's units: not even one that pushes a
-- bucket of the same name a thousand years ahead.
SELECT allowed FROM throttle.take('smtp', 1, '1000 years', 1, 1);
SELECT allowed FROM throttle.take('smtp', 1, '1000 years', 1, 1) AS again;
SELECT count(*) AS still_claimable FROM throttle.claim('limited', 'w', max => 10);
-- Dropping the bucket drops the limit with it.
SELECT throttle.schedule('limited', 'e6', '2031-06-01 11:00:00+00') > 0 AS scheduled;
SELECT count(*) AS bucket_empty FROM throttle.claim('limited', 'w', max => 10);
DELETE FROM throttle.bucket WHERE name = 'smtp';
SELECT count(*) AS queue_buckets FROM throttle.queue_bucket;
SELECT count(*) AS unlimited FROM throttle.claim('limited', 'w', max => 10);
RESET pg_throttle.test_clock;
DELETE FROM throttle.event WHERE queue = 'limited';

-- A lease that SQL calls positive but that ends before now on the calendar
-- ('1 month -29 days' on January 31st) is refused, not a claim that has
-- already expired.
SET pg_throttle.test_clock = '2031-01-31 12:00:00+00';
SELECT '1 month -29 days'::interval > interval '0' AS positive_as_sql_compares,
       throttle.now() + interval '1 month -29 days' < throttle.now() AS ends_before_now;
SELECT throttle.schedule('calendar', 'c1', '2031-01-31 11:00:00+00') > 0 AS scheduled;
SELECT throttle.schedule('calendar', 'c2', '2031-01-31 11:00:00+00', group_key => 'g') > 0 AS scheduled;
SELECT * FROM throttle.claim('calendar', 'w', '1 month -29 days');
SELECT * FROM throttle.claim_group('calendar', 'w', '1 month -29 days');
SELECT array_agg(id) AS cal_ids, min(claim_token) AS cal_token FROM throttle.claim('calendar', 'w', '1 day') \gset
SELECT throttle.extend(:'cal_ids', :cal_token, '1 month -29 days');
SELECT throttle.extend(:'cal_ids', :cal_token, '1 month') AS extended;
RESET pg_throttle.test_clock;
DELETE FROM throttle.event WHERE queue = 'calendar';

-- A rate-limited claim_group that takes over a group whose expired claims
-- the bucket cannot all cover: it claims what the units cover, and ends the
-- rest for their old worker, whose complete then changes nothing.
SET pg_throttle.test_clock = '2031-06-01 12:00:00+00';
INSERT INTO throttle.bucket (name, rate, per, burst) VALUES ('fence.bucket', 2, '10 minutes', 2);
INSERT INTO throttle.queue_bucket (queue, bucket) VALUES ('fence', 'fence.bucket');
SELECT count(throttle.schedule('fence', 'a' || g, '2031-06-01 11:00:00+00', group_key => 'G'))
FROM generate_series(1, 2) g;
SELECT array_agg(id ORDER BY id) AS f_ids, min(claim_token) AS f_token
FROM throttle.claim_group('fence', 'w1', '1 minute') \gset
SELECT cardinality(:'f_ids'::bigint[]) AS w1_claimed;
SET pg_throttle.test_clock = '2031-06-01 12:05:00+00';
SELECT item_key, claimed_by, attempts FROM throttle.claim_group('fence', 'w2', '1 minute');
SELECT item_key, state, claimed_by, claim_token IS NULL AS fenced FROM throttle.event
WHERE queue = 'fence' ORDER BY item_key;
SELECT throttle.complete(:'f_ids', :f_token) AS old_worker_completes;
RESET pg_throttle.test_clock;
DELETE FROM throttle.queue_bucket WHERE queue = 'fence';
DELETE FROM throttle.bucket WHERE name = 'fence.bucket';
DELETE FROM throttle.event WHERE queue = 'fence';

-- History: every attempt of an event with its outcome, in throttle.event_attempt
-- (those that ended without completing it) and throttle.attempt_history (all).
SET pg_throttle.test_clock = '2031-07-01 12:00:00+00';
SELECT throttle.schedule('hist', 'h1', '2031-07-01 11:00:00+00') AS h1 \gset
SELECT claim_token AS t1 FROM throttle.claim('hist', 'w1', '1 minute') \gset
SELECT throttle.fail(ARRAY[:h1]::bigint[], :t1, 'boom', '0 seconds') AS failed;
SELECT claim_token AS t2 FROM throttle.claim('hist', 'w2', '1 minute') \gset
SET pg_throttle.test_clock = '2031-07-01 12:05:00+00';
SELECT claimed_by, attempts FROM throttle.claim('hist', 'w3', '1 minute');
SELECT attempt, claimed_by, ended_at, outcome, error FROM throttle.attempt_history
WHERE event_id = :h1 ORDER BY claimed_at, attempt;
SELECT claim_token AS t3 FROM throttle.event WHERE id = :h1 \gset
SELECT throttle.complete(ARRAY[:h1]::bigint[], :t3) AS completed;
SELECT attempt, claimed_by, claimed_at, ended_at, outcome, error FROM throttle.attempt_history
WHERE event_id = :h1 ORDER BY claimed_at, attempt;
SELECT state, failed_at, completed_at, completed_by FROM throttle.all_events WHERE id = :h1;
-- An expired claim whose attempts are used up: dead, its last attempt expired.
SELECT throttle.schedule('hist', 'h2', '2031-07-01 11:00:00+00', max_attempts => 1) AS h2 \gset
SELECT count(*) AS claimed FROM throttle.claim('hist', 'w4', '1 minute');
SET pg_throttle.test_clock = '2031-07-01 12:10:00+00';
SELECT count(*) AS nothing_to_claim FROM throttle.claim('hist', 'w5', '1 minute');
SELECT state, failed_at, completed_by, last_error FROM throttle.all_events WHERE id = :h2;
SELECT attempt, claimed_by, ended_at, outcome FROM throttle.attempt_history WHERE event_id = :h2;
-- A group released by an operator, then claimed again.
SELECT throttle.schedule('hist', 'g1', '2031-07-01 11:00:00+00', group_key => 'G') AS g1 \gset
SELECT count(*) AS claimed FROM throttle.claim_group('hist', 'wg1', '1 hour');
SELECT throttle.release_group('hist', 'G') AS released;
SELECT count(*) AS claimed FROM throttle.claim_group('hist', 'wg2', '1 hour');
SELECT attempt, claimed_by, ended_at, outcome FROM throttle.attempt_history
WHERE event_id = :g1 ORDER BY claimed_at, attempt;
SELECT failed_at IS NULL AS a_release_is_no_failure FROM throttle.all_events WHERE id = :g1;
-- cancel records who cancelled.
SELECT throttle.schedule('hist', 'c1', '2031-08-01 00:00:00+00') AS c1 \gset
SELECT throttle.cancel('hist', 'c1') AS cancelled;
SELECT state, cancelled_at, cancelled_by FROM throttle.all_events WHERE id = :c1;
-- The attempts go with their event when purge deletes it.
SET pg_throttle.test_clock = '2031-09-01 00:00:00+00';
SELECT count(*) FILTER (WHERE event_id IN (:h1, :h2)) AS finished_events_attempts,
       count(*) FILTER (WHERE event_id = :g1) AS claimed_events_attempts
FROM throttle.event_attempt;
SELECT throttle.purge('1 day', queue => 'hist', states => '{done,dead,cancelled}') AS purged;
SELECT count(*) FILTER (WHERE event_id IN (:h1, :h2)) AS finished_events_attempts,
       count(*) FILTER (WHERE event_id = :g1) AS claimed_events_attempts
FROM throttle.event_attempt;
RESET pg_throttle.test_clock;
DELETE FROM throttle.event_attempt WHERE event_id IN (SELECT id FROM throttle.event WHERE queue = 'hist');
DELETE FROM throttle.event WHERE queue = 'hist';

-- A run that replaces a pending event (schedule or schedule_many, replace or
-- keep_earlier) gets attempts of its own: they start again at 0. ignore
-- leaves the event as it is.
SET pg_throttle.test_clock = '2031-10-01 12:00:00+00';
SELECT throttle.schedule('again', 'r', '2031-10-01 11:00:00+00', '{"v": 1}', max_attempts => 2) AS r \gset
SELECT claim_token AS rt FROM throttle.claim('again', 'w1') \gset
SELECT throttle.fail(ARRAY[:r]::bigint[], :rt, 'boom', '1 hour') AS failed;
SELECT throttle.schedule('again', 'r', '2031-10-01 11:00:00+00', '{"v": 2}', on_duplicate => 'ignore') = :r AS same;
SELECT attempts AS ignored_keeps_attempts FROM throttle.event WHERE id = :r;
SELECT throttle.schedule('again', 'r', '2031-10-01 11:00:00+00', '{"v": 3}') = :r AS same;
SELECT attempts AS replaced_starts_again FROM throttle.event WHERE id = :r;
SELECT attempts, payload FROM throttle.claim('again', 'w2');
SELECT claim_token AS rt FROM throttle.event WHERE id = :r \gset
SELECT throttle.fail(ARRAY[:r]::bigint[], :rt, 'boom again', '0 seconds') AS failed;
SELECT state, attempts FROM throttle.event WHERE id = :r;
SELECT throttle.schedule_many('again', ARRAY['r'], ARRAY['2031-10-01 09:00:00+00']::timestamptz[],
                              ARRAY['{"v": 4}']::jsonb[], on_duplicate => 'keep_earlier') = ARRAY[:r]::bigint[] AS same;
SELECT attempts AS batch_starts_again, payload, run_at FROM throttle.event WHERE id = :r;
SELECT attempt, outcome, error FROM throttle.attempt_history WHERE event_id = :r ORDER BY claimed_at, attempt;
-- No claim leaves an event pending with its attempts used up, where the
-- next claim would kill it unrun: a group claim cut short by max ends the
-- expired claims it leaves, dead when that was their last attempt, so a
-- run scheduled after that is a new event and runs.
SELECT count(throttle.schedule('again', 'g' || n, '2031-10-01 11:00:00+00', group_key => 'G', max_attempts => 1))
FROM generate_series(1, 2) n;
SELECT count(*) AS claimed FROM throttle.claim_group('again', 'wg1', '1 minute');
SET pg_throttle.test_clock = '2031-10-01 12:05:00+00';
SELECT count(*) AS claimed FROM throttle.claim_group('again', 'wg2', '1 minute', 1);
SELECT item_key, state, attempts, last_error FROM throttle.event WHERE queue = 'again' AND group_key = 'G' ORDER BY id;
SELECT throttle.schedule('again', 'g2', '2031-10-01 12:00:00+00', '{"v": "new"}', group_key => 'G', max_attempts => 1) AS g2 \gset
SELECT id = :g2 AS the_new_run, item_key, payload, attempts FROM throttle.claim_group('again', 'wg3', '1 minute');
-- release_group ends a claim on its last attempt: dead, not pending.
SELECT throttle.schedule('again', 'h1', '2031-10-01 12:00:00+00', group_key => 'H', max_attempts => 1) AS h1 \gset
SELECT count(*) AS claimed FROM throttle.claim_group('again', 'wh1', '1 hour');
SELECT throttle.release_group('again', 'H') AS released;
SELECT state, attempts, last_error FROM throttle.event WHERE id = :h1;
SELECT attempt, outcome FROM throttle.attempt_history WHERE event_id = :h1;
RESET pg_throttle.test_clock;
DELETE FROM throttle.event_attempt WHERE event_id IN (SELECT id FROM throttle.all_events WHERE queue = 'again');
DELETE FROM throttle.event WHERE queue = 'again';
DELETE FROM throttle.event_history WHERE queue = 'again';
