-- throttle.acquire: at most one grant per interval, on the test clock.
SET pg_throttle.test_clock = '2030-01-01 00:00:00+00';

-- The first caller gets true, everyone else false until the interval has passed.
SELECT throttle.acquire('acq.job', '1 hour') AS first_call;
SELECT throttle.acquire('acq.job', '1 hour') AS second_call;
SET pg_throttle.test_clock = '2030-01-01 00:59:59.999999+00';
SELECT throttle.acquire('acq.job', '1 hour') AS one_microsecond_early;
SET pg_throttle.test_clock = '2030-01-01 01:00:00+00';
SELECT throttle.acquire('acq.job', '1 hour') AS exactly_on_time;
SELECT throttle.acquire('acq.job', '1 hour') AS right_after;

-- Resources are independent of each other.
SELECT throttle.acquire('acq.other', '1 hour') AS other_resource;

-- The window is the one opened by the grant: a shorter interval asked by a
-- later caller does not cut it short.
SELECT throttle.acquire('acq.job', '1 second') AS shorter_interval_denied;
SET pg_throttle.test_clock = '2030-01-01 02:00:00+00';
SELECT throttle.acquire('acq.job', '1 second') AS shorter_interval_after_window;
SET pg_throttle.test_clock = '2030-01-01 02:00:01+00';
SELECT throttle.acquire('acq.job', '1 hour') AS one_second_window_has_passed;

-- A clock that steps back never produces an extra grant.
SET pg_throttle.test_clock = '2030-01-01 01:30:00+00';
SELECT throttle.acquire('acq.job', '1 second') AS clock_stepped_back;

-- Grants are not transactional: a rollback does not give the grant back.
SET pg_throttle.test_clock = '2030-01-01 00:00:00+00';
BEGIN;
SELECT throttle.acquire('acq.rollback', '10 minutes') AS in_rolled_back_transaction;
ROLLBACK;
SELECT throttle.acquire('acq.rollback', '10 minutes') AS after_rollback;

-- Declared resources: the interval comes from throttle.resource.
INSERT INTO throttle.resource (name, every, comment)
VALUES ('acq.declared', '15 minutes', 'nightly report');
SELECT throttle.acquire('acq.declared') AS declared_first;
SET pg_throttle.test_clock = '2030-01-01 00:14:59+00';
SELECT throttle.acquire('acq.declared') AS declared_early;
SET pg_throttle.test_clock = '2030-01-01 00:15:00+00';
SELECT throttle.acquire('acq.declared') AS declared_on_time;
-- An explicit interval wins over the declared one.
SET pg_throttle.test_clock = '2030-01-01 00:15:01+00';
SELECT throttle.acquire('acq.declared', '1 second') AS explicit_still_denied;
SET pg_throttle.test_clock = '2030-01-01 00:30:00+00';
SELECT throttle.acquire('acq.declared', '1 second') AS explicit_interval;
SET pg_throttle.test_clock = '2030-01-01 00:30:01+00';
SELECT throttle.acquire('acq.declared') AS declared_after_explicit;
-- A changed declaration applies to the next grant.
UPDATE throttle.resource SET every = '1 minute' WHERE name = 'acq.declared';
SET pg_throttle.test_clock = '2030-01-01 00:31:01+00';
SELECT throttle.acquire('acq.declared') AS window_opened_before_change_holds;
SET pg_throttle.test_clock = '2030-01-01 00:45:01+00';
SELECT throttle.acquire('acq.declared') AS after_old_window;
SET pg_throttle.test_clock = '2030-01-01 00:46:01+00';
SELECT throttle.acquire('acq.declared') AS new_declaration_in_force;

-- Intervals are exact to the microsecond, and months count as 30 days.
SET pg_throttle.test_clock = '2030-01-01 00:00:00+00';
SELECT throttle.acquire('acq.micro', '1 microsecond') AS micro_1,
       throttle.acquire('acq.micro', '1 microsecond') AS micro_2;
SET pg_throttle.test_clock = '2030-01-01 00:00:00.000001+00';
SELECT throttle.acquire('acq.micro', '1 microsecond') AS micro_3;
SET pg_throttle.test_clock = '2030-01-01 00:00:00+00';
SELECT throttle.acquire('acq.month', '1 month') AS month_1;
SET pg_throttle.test_clock = '2030-01-30 23:59:59.999999+00';
SELECT throttle.acquire('acq.month', '1 month') AS month_29_days;
SET pg_throttle.test_clock = '2030-01-31 00:00:00+00';
SELECT throttle.acquire('acq.month', '1 month') AS month_30_days;

-- Names are compared byte for byte.
SELECT throttle.acquire('acq.Case', '1 hour') AS upper_case,
       throttle.acquire('acq.case', '1 hour') AS lower_case,
       throttle.acquire('acq.case ', '1 hour') AS trailing_space;

-- In a query over many rows, each row is its own call.
SELECT count(*) FILTER (WHERE granted) AS granted, count(*) FILTER (WHERE NOT granted) AS denied
FROM (SELECT throttle.acquire('acq.many.' || (g % 10), '1 hour') AS granted
      FROM generate_series(1, 100) AS g) AS calls;

RESET pg_throttle.test_clock;
