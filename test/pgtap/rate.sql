-- throttle.take / allow / wait: signatures, the GCRA formulas against a
-- reference model, error codes. On the test clock.
BEGIN;
SELECT plan(70);

SELECT has_table('throttle', 'bucket', 'catalog table throttle.bucket');
SELECT col_is_pk('throttle', 'bucket', 'name', 'bucket name is the primary key');
SELECT has_function('throttle', 'take', ARRAY['text', 'integer', 'interval', 'integer', 'integer']);
SELECT has_function('throttle', 'take', ARRAY['text', 'integer']);
SELECT has_function('throttle', 'allow', ARRAY['text', 'integer', 'interval', 'integer', 'integer']);
SELECT has_function('throttle', 'allow', ARRAY['text', 'integer']);
SELECT has_function('throttle', 'wait',
    ARRAY['text', 'integer', 'interval', 'integer', 'integer', 'interval']);
SELECT function_returns('throttle', 'allow', ARRAY['text', 'integer', 'interval', 'integer', 'integer'], 'boolean');
SELECT function_returns('throttle', 'wait', ARRAY['text', 'integer', 'interval', 'integer', 'integer', 'interval'], 'boolean');
SELECT has_function('throttle', 'wait', ARRAY['text', 'interval', 'integer'], 'declared wait: wait(key, timeout, cost)');

-- The reference model: the issue's formulas in exact numeric arithmetic.
CREATE TEMP TABLE model (key text PRIMARY KEY, tat numeric);
CREATE FUNCTION pg_temp.model_take(k text, rate integer, per_us numeric, burst integer,
                                   cost integer, now_us numeric,
                                   OUT allowed boolean, OUT remaining integer,
                                   OUT retry_us numeric, OUT reset_us numeric)
LANGUAGE plpgsql AS $$
DECLARE
    t   numeric := ceil(per_us / rate);          -- emission interval, rounded up
    tau numeric := burst * t;
    tat numeric := (SELECT m.tat FROM model m WHERE m.key = k);
    base numeric := greatest(coalesce(tat, now_us), now_us);
    -- A peek (cost 0) answers for one unit and takes nothing.
    new numeric := base + greatest(cost, 1) * t;
BEGIN
    allowed := new - tau <= now_us;
    IF allowed AND cost > 0 THEN
        tat := new;
        INSERT INTO model VALUES (k, tat) ON CONFLICT (key) DO UPDATE SET tat = excluded.tat;
    END IF;
    tat := coalesce(tat, now_us);
    remaining := least(burst, greatest(0, floor((now_us + tau - greatest(tat, now_us)) / t)));
    retry_us := CASE WHEN allowed THEN 0 ELSE new - tau - now_us END;
    reset_us := greatest(tat, now_us) - now_us;
END
$$;

-- Drives pseudo-random calls (steps, costs) through throttle.take and the
-- model; returns how many calls disagreed in any output.
CREATE FUNCTION pg_temp.disagreements(k text, rate integer, per interval, burst integer,
                                      calls integer, seed double precision) RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    per_us numeric := extract(epoch FROM per) * 1000000;
    start timestamptz := '2033-01-01 00:00:00+00';
    now_us numeric := 0;
    cost integer;
    got record;
    want record;
    bad integer := 0;
BEGIN
    PERFORM setseed(seed);
    FOR i IN 1 .. calls LOOP
        now_us := now_us + floor(random() * 3 * ceil(per_us / rate));
        cost := floor(random() * (burst + 1));          -- 0 .. burst
        PERFORM set_config('pg_throttle.test_clock',
                           (start + make_interval(secs => now_us / 1000000))::text, true);
        SELECT * INTO got FROM throttle.take(k, rate, per, burst, cost);
        SELECT * INTO want FROM pg_temp.model_take(k, rate, per_us, burst, cost, now_us);
        IF got.allowed IS DISTINCT FROM want.allowed
           OR got.remaining IS DISTINCT FROM want.remaining
           OR extract(epoch FROM got.retry_after) * 1000000 <> want.retry_us
           OR extract(epoch FROM got.reset_after) * 1000000 <> want.reset_us THEN
            bad := bad + 1;
            RAISE NOTICE 'call % at % cost %: got % want %', i, now_us, cost, got, want;
        END IF;
    END LOOP;
    RETURN bad;
END
$$;

SELECT is(pg_temp.disagreements('tap.r1', 100, '1 minute', 20, 2000, 0.1), 0,
    '100/minute burst 20: 2000 random calls agree with the formulas');
SELECT is(pg_temp.disagreements('tap.r2', 3, '1 second', 3, 2000, 0.2), 0,
    '3/second (inexact T, rounded up): 2000 random calls agree');
SELECT is(pg_temp.disagreements('tap.r3', 7, '10 milliseconds', 1, 2000, 0.3), 0,
    '7 per 10 ms burst 1: 2000 random calls agree');
SELECT is(pg_temp.disagreements('tap.r4', 1, '1 day', 5, 500, 0.4), 0,
    '1/day burst 5: 500 random calls agree');

-- Boundaries.
SET LOCAL pg_throttle.test_clock = '2034-01-01 00:00:00+00';
SELECT is((SELECT remaining FROM throttle.take('tap.b', 10, '1 second', 4, 4)), 0, 'cost = burst empties a full bucket');
SELECT ok(NOT (SELECT allowed FROM throttle.take('tap.b', 10, '1 second', 4, 0)), 'a peek (cost 0) of an empty bucket is not allowed');
SELECT is((SELECT retry_after FROM throttle.take('tap.b', 10, '1 second', 4, 0)), interval '0.1 s',
    'a peek of an empty bucket: retry_after until one unit is back');
SELECT is((SELECT remaining FROM throttle.take('tap.b', 10, '1 second', 4, 0)), 0, 'and consumes nothing');
SELECT is((SELECT retry_after FROM throttle.take('tap.b', 10, '1 second', 4, 1)), interval '0.1 s',
    'retry_after is the exact wait');
SET LOCAL pg_throttle.test_clock = '2034-01-01 00:00:00.099999+00';
SELECT ok(NOT (SELECT allowed FROM throttle.take('tap.b', 10, '1 second', 4, 1)), 'denied 1 us before new - tau = now');
SET LOCAL pg_throttle.test_clock = '2034-01-01 00:00:00.1+00';
SELECT ok((SELECT allowed FROM throttle.take('tap.b', 10, '1 second', 4, 1)), 'allowed exactly at new - tau = now');

-- Declared buckets, and the cost-only overloads resolve unambiguously.
INSERT INTO throttle.bucket (name, rate, per, burst) VALUES ('tap.decl', 60, '1 minute', 2);
SELECT ok(throttle.allow('tap.decl'), 'declared: first');
SELECT ok(throttle.allow('tap.decl', 1), 'declared: second, cost given');
SELECT ok(NOT throttle.allow('tap.decl'), 'declared: burst of 2 spent');
SELECT is((SELECT retry_after FROM throttle.take('tap.decl')), interval '1 s', 'declared: retry_after from the declaration');

-- Error codes.
SELECT throws_ok($$SELECT * FROM throttle.take(NULL, 1, '1 s')$$, '22004', 'key must not be NULL', 'NULL key: 22004');
SELECT throws_ok($$SELECT * FROM throttle.take('tap.e', NULL, '1 s')$$, '22004', 'rate must not be NULL', 'NULL rate: 22004');
SELECT throws_ok($$SELECT * FROM throttle.take('tap.e', 0, '1 s')$$, '22023', 'rate must be positive', 'rate 0: 22023');
SELECT throws_ok($$SELECT * FROM throttle.take('tap.e', 1, '0')$$, '22023', 'per must be a positive interval', 'per 0: 22023');
SELECT throws_ok($$SELECT * FROM throttle.take('tap.e', 1, '1 s', 0)$$, '22023', 'burst must be positive', 'burst 0: 22023');
SELECT throws_ok($$SELECT * FROM throttle.take('tap.e', 1, '1 s', 1, -1)$$, '22023', 'cost must not be negative', 'cost < 0: 22023');
SELECT throws_ok($$SELECT * FROM throttle.take('tap.e', 1, '1 s', 1, 2)$$, '22023', 'cost must not exceed burst', 'cost > burst: 22023');
SELECT throws_ok($$SELECT * FROM throttle.take('tap.e', 2000000, '1 s')$$, '22023', 'rate must not exceed one per microsecond', 'rate above 1/us: 22023');
SELECT throws_ok($$SELECT * FROM throttle.take('tap.undeclared')$$, '42704', 'bucket "tap.undeclared" is not declared', 'undeclared: 42704');
SELECT throws_ok($$SELECT throttle.wait('tap.e', 1, '1 s', 1, 1, '-1 s')$$, '22023', 'timeout must not be negative', 'negative timeout: 22023');
SELECT throws_ok($$SELECT throttle.wait('tap.e', 1, '1 s', 1, 2)$$, '22023', 'cost must not exceed burst', 'wait cost > burst: 22023');

-- A peek answers for one unit, and takes nothing however often it is made.
SET LOCAL pg_throttle.test_clock = '2034-06-01 00:00:00+00';
SELECT ok((SELECT allowed FROM throttle.take('tap.peek', 2, '1 second', 2, 0)), 'a peek of a full bucket is allowed');
SELECT ok(throttle.allow('tap.peek', 2, '1 second', 2, 1), 'one unit taken');
SELECT ok((SELECT allowed AND remaining = 1 FROM throttle.take('tap.peek', 2, '1 second', 2, 0)),
    'one unit left: a peek is allowed, remaining 1');
SELECT ok(throttle.allow('tap.peek', 2, '1 second', 2, 0), 'allow with cost 0 answers the same');
SELECT ok(throttle.allow('tap.peek', 2, '1 second', 2, 1), 'the peeks took nothing: the last unit passes');
SELECT ok(NOT throttle.allow('tap.peek', 2, '1 second', 2, 0), 'empty: allow with cost 0 is false');

-- The most a bucket lets through in any window (docs/rate-limits.md: rate + burst - 1):
-- calls every `step` for `span`; the busiest half-open window of length `win`
-- starts at a request that passed.
CREATE TEMP TABLE passed (k text, at timestamptz);
CREATE FUNCTION pg_temp.busiest_window(k text, rate integer, per interval, burst integer,
                                       step interval, span interval, win interval) RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE
    t timestamptz := '2036-01-01 00:00:00+00';
    stop timestamptz := t + span;
BEGIN
    WHILE t < stop LOOP
        PERFORM set_config('pg_throttle.test_clock', t::text, true);
        IF throttle.allow(k, rate, per, burst) THEN
            INSERT INTO passed VALUES (k, t);
        END IF;
        t := t + step;
    END LOOP;
    RETURN (SELECT max((SELECT count(*) FROM passed p2
                        WHERE p2.k = p1.k AND p2.at >= p1.at AND p2.at < p1.at + win))
            FROM passed p1 WHERE p1.k = busiest_window.k);
END
$$;
SELECT is(pg_temp.busiest_window('tap.win1', 10, '1 second', 10, '5 ms', '3 s', '1 s'), 19::bigint,
    '10/s burst 10: at most 19 in any second');
SELECT is(pg_temp.busiest_window('tap.win2', 10, '1 second', 1, '5 ms', '3 s', '1 s'), 10::bigint,
    '10/s burst 1: at most 10 in any second');
SELECT is(pg_temp.busiest_window('tap.win3', 6, '1 second', 5, '5 ms', '3 s', '1 s'), 10::bigint,
    '6/s burst 5: at most 10 in any second');
SELECT is(pg_temp.busiest_window('tap.win4', 100, '1 minute', 20, '100 ms', '3 minutes', '1 minute'), 119::bigint,
    '100/minute burst 20: at most 119 in any minute');

-- The declared form of wait.
INSERT INTO throttle.bucket (name, rate, per, burst) VALUES ('tap.declwait', 1, '1 hour', 2);
SELECT ok(throttle.wait('tap.declwait'), 'declared wait: passes at once on a full bucket');
SELECT ok(throttle.wait('tap.declwait', timeout => '0'), 'declared wait with a timeout: the second unit');
SELECT ok(NOT throttle.wait('tap.declwait', timeout => '59 minutes'), 'declared wait: false when the declared rate needs longer');
SELECT ok(NOT throttle.wait('tap.declwait', '59 minutes', 1), 'positional (key, timeout, cost)');
SELECT ok(NOT throttle.wait('tap.declwait', timeout => '59 minutes', cost => 0),
    'declared wait with cost 0 waits for one unit: false within the timeout');
SELECT throws_ok($$SELECT throttle.wait('tap.notdeclared')$$, '42704', 'bucket "tap.notdeclared" is not declared', 'declared wait of an undeclared bucket: 42704');
SELECT throws_ok($$SELECT throttle.wait('tap.declwait', cost => 3)$$, '22023', 'cost must not exceed burst', 'declared wait: cost above the declared burst');
SELECT ok(throttle.wait('tap.pos', 1, '1 hour'), 'wait(key, rate, per) with three positional arguments is the full form');

-- wait with a timeout it cannot meet returns false at once and reserves nothing.
SET LOCAL pg_throttle.test_clock = '2035-01-01 00:00:00+00';
SELECT ok(throttle.allow('tap.w', 1, '1 hour', 1), 'bucket emptied');
SELECT ok(NOT throttle.wait('tap.w', 1, '1 hour', 1, 1, '59 minutes'), 'a wait beyond the timeout returns false');
SELECT is((SELECT retry_after FROM throttle.take('tap.w', 1, '1 hour', 1)), interval '1 hour',
    'and reserved nothing');

-- The ends of the range (issue 39): a bucket's TAT is never clamped to the
-- last int64 microsecond (294277-01-09), which let every call through. Burst
-- 1 per '2561944444 hours', just inside int64: from 2033 even the first
-- call's TAT would be past it, and every form refuses the call.
SET LOCAL pg_throttle.test_clock = '2033-01-01 00:00:00+00';
SELECT throws_ok($$SELECT * FROM throttle.take('tap.far', 1, '2561944444 hours', 1)$$, '22008',
    'burst times per / rate is out of range at this time', 'a TAT past the end of int64: take raises 22008');
SELECT throws_ok($$SELECT throttle.allow('tap.far', 1, '2561944444 hours', 1)$$, '22008',
    'burst times per / rate is out of range at this time', 'allow raises 22008');
SELECT throws_ok($$SELECT throttle.wait('tap.far', 1, '2561944444 hours', 1)$$, '22008',
    'burst times per / rate is out of range at this time', 'wait raises 22008');
-- From 2000-01-01 the first TAT fits: one call passes, the next are denied
-- exactly, and a wait without a limit for the next unit is refused.
SET LOCAL pg_throttle.test_clock = '2000-01-01 00:00:00+00';
SELECT ok(throttle.allow('tap.far', 1, '2561944444 hours', 1), 'from 2000-01-01 the first call passes');
SELECT is((SELECT count(*) FROM generate_series(1, 4) WHERE throttle.allow('tap.far', 1, '2561944444 hours', 1)),
    0::bigint, 'the next four are denied');
SELECT ok((SELECT NOT allowed AND remaining = 0 AND retry_after = interval '2561944444 hours'
           FROM throttle.take('tap.far', 1, '2561944444 hours', 1)),
    'take: denied, retry_after one emission interval');
SELECT ok(NOT throttle.wait('tap.far', 1, '2561944444 hours', 1, 1, '1 hour'), 'wait with a timeout: false');
SELECT throws_ok($$SELECT throttle.wait('tap.far', 1, '2561944444 hours', 1)$$, '22008',
    'burst times per / rate is out of range at this time',
    'wait without a limit: the next unit''s TAT would be past the end, 22008');
SELECT is(throttle.reset('tap.far', 'bucket'), 1, 'reset removes the far bucket');
-- A day before the end of PostgreSQL's timestamps, 1 a day with burst 10:
-- nine units fit before the last microsecond; the tenth is refused, not
-- granted on a clamped TAT.
SET LOCAL pg_throttle.test_clock = '294276-12-31 00:00:00+00';
SELECT is((SELECT count(*) FROM generate_series(1, 9) WHERE throttle.allow('tap.end', 1, '1 day', 10)),
    9::bigint, 'near the end of timestamps: nine units pass');
SELECT throws_ok($$SELECT throttle.allow('tap.end', 1, '1 day', 10)$$, '22008',
    'burst times per / rate is out of range at this time', 'the tenth would move the TAT past the end: 22008');
SELECT is((SELECT remaining FROM throttle.take('tap.end', 1, '1 day', 10, 0)), 1,
    'a peek still counts the unit the tenth asked for');
SELECT is(throttle.reset('tap.end', 'bucket'), 1, 'reset removes the bucket near the end');

SELECT * FROM finish();
ROLLBACK;
