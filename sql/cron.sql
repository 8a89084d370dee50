-- Cron expressions on PostgreSQL's tzdata: throttle.cron_next and
-- throttle.cron_firings (docs/recurring.md). Instants are shown in UTC and in
-- the schedule's local time.
SET timezone = 'UTC';
SET datestyle = 'ISO, YMD';
SET intervalstyle = 'postgres';

CREATE FUNCTION pg_temp.local(cron text, zone text, after timestamptz, upto timestamptz)
RETURNS TABLE (utc timestamptz, local timestamp, utc_offset interval)
LANGUAGE sql AS $$
    SELECT f, f AT TIME ZONE zone, (f AT TIME ZONE zone) - (f AT TIME ZONE 'UTC')
    FROM throttle.cron_firings(cron, zone, after, upto) AS f
$$;

-- The error of a call, with its SQLSTATE and DETAIL.
CREATE FUNCTION pg_temp.err(cron text, zone text DEFAULT 'UTC',
                            after timestamptz DEFAULT '2026-01-01', max integer DEFAULT 10)
RETURNS text LANGUAGE plpgsql AS $$
DECLARE
    message text;
    detail text;
BEGIN
    PERFORM throttle.cron_firings(cron, zone, after, 'infinity', max);
    RETURN 'accepted';
EXCEPTION WHEN OTHERS THEN
    GET STACKED DIAGNOSTICS message = MESSAGE_TEXT, detail = PG_EXCEPTION_DETAIL;
    RETURN SQLSTATE || ': ' || message || coalesce(nullif(' (' || detail || ')', ' ()'), '');
END
$$;

-- America/New_York, spring forward 2026-03-08: 02:00-02:59 does not exist.
-- A schedule that names its hours fires once, at 03:00 EDT.
SELECT * FROM pg_temp.local('30 2 * * *', 'America/New_York', '2026-03-07', '2026-03-10');
SELECT * FROM pg_temp.local('*/20 2 * * *', 'America/New_York', '2026-03-08 06:00+00', '2026-03-09 06:00+00');
-- Every hour follows real time: nothing for the skipped hour.
SELECT * FROM pg_temp.local('30 * * * *', 'America/New_York', '2026-03-08 05:00+00', '2026-03-08 09:00+00');

-- Fall back 2026-11-01: 01:00-01:59 occurs twice. Named hours: the first only.
SELECT * FROM pg_temp.local('30 1 * * *', 'America/New_York', '2026-10-31', '2026-11-03');
-- Asked from inside the repeated hour, the next one is the next day's.
SELECT throttle.cron_next('45 1 * * *', 'America/New_York', '2026-11-01 06:10+00');
-- Every hour: both occurrences, an hour apart.
SELECT * FROM pg_temp.local('30 * * * *', 'America/New_York', '2026-11-01 04:00+00', '2026-11-01 08:00+00');

-- Europe/Berlin: 2026-03-29 02:00-02:59 skipped, 2026-10-25 02:00-02:59 twice.
SELECT * FROM pg_temp.local('30 2 * * *', 'Europe/Berlin', '2026-03-28', '2026-03-31');
SELECT * FROM pg_temp.local('30 * * * *', 'Europe/Berlin', '2026-03-28 23:00+00', '2026-03-29 03:00+00');
SELECT * FROM pg_temp.local('30 2 * * *', 'Europe/Berlin', '2026-10-24', '2026-10-27');
SELECT * FROM pg_temp.local('30 * * * *', 'Europe/Berlin', '2026-10-24 23:00+00', '2026-10-25 03:00+00');
-- With seconds: in the gap, at 03:00:00 CEST; in the repeat, the first.
SELECT * FROM pg_temp.local('15 30 2 * * *', 'Europe/Berlin', '2026-03-28', '2026-03-30');
SELECT * FROM pg_temp.local('15 30 2 * * *', 'Europe/Berlin', '2026-10-24', '2026-10-26');

-- Australia/Lord_Howe shifts by 30 minutes: 01:30-01:59 repeats on
-- 2026-04-05, 02:00-02:29 is skipped on 2026-10-04.
SELECT * FROM pg_temp.local('45 1 * * *', 'Australia/Lord_Howe', '2026-04-04', '2026-04-06');
SELECT * FROM pg_temp.local('45 * * * *', 'Australia/Lord_Howe', '2026-04-04 13:00+00', '2026-04-04 17:00+00');
-- Beyond its table PostgreSQL repeats a zone's rules every 400 years and
-- answers "no more transitions" at an instant exactly on that boundary: a
-- yearly schedule whose search starts there still fires at 12:00 local.
SELECT * FROM pg_temp.local('0 12 1 7 *', 'America/New_York', '2769-07-02', '2771-01-01');
-- A POSIX zone string whose shift moves the clock back 200 hours, at
-- 2026-03-08 02:00 local (03-04 22:00 UTC), to 02-27 18:00: 12:00 of the days
-- between fires at its first occurrence only, also when asked six days after
-- the shift.
SELECT * FROM pg_temp.local('0 12 * * *', 'AAA-100BBB100,M3.2.0,M11.1.0', '2026-03-01', '2026-03-17');
SELECT throttle.cron_next('0 12 * * *', 'AAA-100BBB100,M3.2.0,M11.1.0', '2026-03-11 00:00+00');
SELECT * FROM pg_temp.local('15 2 * * *', 'Australia/Lord_Howe', '2026-10-03', '2026-10-05');

-- Seconds.
SELECT * FROM throttle.cron_firings('*/20 * * * * *', 'UTC', '2026-01-01 00:00:30', '2026-01-01 00:01:30');
SELECT throttle.cron_next('59 59 23 31 12 *', 'UTC', '2026-01-01');

-- Month ends: `$` is the last day; the 31st skips short months.
SELECT * FROM throttle.cron_firings('0 0 $ * *', 'UTC', '2027-12-15', '2028-04-01');
SELECT * FROM throttle.cron_firings('0 0 31 * *', 'UTC', '2026-01-31', '2026-08-01');
SELECT * FROM throttle.cron_firings('0 0 $ 2 *', 'UTC', '2099-12-01', '2101-12-01');

-- February 29: 2028, and none in 2100 (eight years from 2096 to 2104).
SELECT throttle.cron_next('0 0 29 2 *', 'UTC', '2026-01-01') AS leap_2028,
       throttle.cron_next('0 0 29 2 *', 'UTC', '2096-03-01') AS leap_2104;

-- Day of month and day of week: either matches when neither starts with '*'
-- (the 13th or a Friday), both when one does.
SELECT * FROM throttle.cron_firings('0 0 13 * fri', 'UTC', '2026-02-01', '2026-03-01');
SELECT * FROM throttle.cron_firings('0 0 */2 * fri', 'UTC', '2026-02-01', '2026-04-01');
SELECT * FROM throttle.cron_firings('0 0 13 * */1', 'UTC', '2026-02-01', '2026-04-01');

-- Names, ranges, lists and steps; shortcuts.
SELECT * FROM throttle.cron_firings('0 9-17/4 * JAN-mar mon-fri,sun', 'UTC', '2026-01-02', '2026-01-05');
SELECT throttle.cron_next('@yearly', 'UTC', '2026-06-01') AS yearly,
       throttle.cron_next('@annually', 'UTC', '2026-06-01') AS annually,
       throttle.cron_next('@monthly', 'UTC', '2026-06-01') AS monthly,
       throttle.cron_next('@weekly', 'UTC', '2026-06-01') AS weekly,
       throttle.cron_next('@daily', 'UTC', '2026-06-01') AS daily,
       throttle.cron_next('@midnight', 'UTC', '2026-06-01') AS midnight,
       throttle.cron_next('@hourly', 'UTC', '2026-06-01') AS hourly;
-- @daily names its hour: on a day whose midnight is skipped it fires at the
-- end of the gap (America/Havana, 2026-03-08).
SELECT * FROM pg_temp.local('@daily', 'America/Havana', '2026-03-07', '2026-03-09');

-- Strictly after: a firing at `after` itself is not the next one.
SELECT throttle.cron_next('0 12 * * *', 'UTC', '2026-01-01 12:00') AS next_day,
       throttle.cron_next('0 12 * * *', 'UTC', '2026-01-01 11:59:59.999999') AS same_day;
-- The defaults: UTC, after throttle.now() (the test clock here).
SET pg_throttle.test_clock = '2032-03-01 10:00:00+00';
SELECT throttle.cron_next('@daily');
RESET pg_throttle.test_clock;
-- In the select list, as well as in FROM.
SELECT throttle.cron_firings('@hourly', 'UTC', '2026-01-01', '2026-01-01 02:00');
-- max bounds the set; none comes after the end of timestamps.
SELECT count(*) FROM throttle.cron_firings('* * * * * *', 'UTC', '2026-01-01', 'infinity', 5);
SELECT throttle.cron_next('0 0 1 1 *', 'UTC', '294276-06-01') AS past_the_end;

-- Refused: 22023 with the field and its byte offset.
SELECT pg_temp.err('0 24 * * *');
SELECT pg_temp.err('60 0 0 * * *');
SELECT pg_temp.err('* * * *');
SELECT pg_temp.err('* * * * * * *');
SELECT pg_temp.err('0 5/10 * * *');
SELECT pg_temp.err('0 */0 * * *');
SELECT pg_temp.err('0 5-3 * * *');
SELECT pg_temp.err('0 0 * * monday');
SELECT pg_temp.err('0 0 * foo *');
SELECT pg_temp.err('0 0 1,$ * *');
SELECT pg_temp.err('0 0 30 2 *');
SELECT pg_temp.err('0 0 31 4,6,9,11 *');
SELECT pg_temp.err('@reboot');
SELECT pg_temp.err('@every_minute');
SELECT pg_temp.err('30 seconds');
SELECT pg_temp.err(E'0 0 * * *\n');
SELECT pg_temp.err('0 0 * * *' || repeat(' ', 248));
SELECT pg_temp.err('0 0 * * *', 'Mars/Olympus');
SELECT pg_temp.err('0 0 * * *', 'UTC', 'infinity');
SELECT pg_temp.err('0 0 * * *', 'UTC', '2026-01-01', 0);
SELECT pg_temp.err('0 0 * * *', 'UTC', '2026-01-01', 100001);
SELECT pg_temp.err(NULL);
SELECT pg_temp.err('0 0 * * *', NULL);
SELECT pg_temp.err('0 0 * * *', 'UTC', NULL);
SELECT pg_temp.err('0 0 * * *', 'UTC', '2026-01-01', NULL);
