-- Bad input gives clean errors, never a grant.
SET pg_throttle.test_clock = '2030-01-01 00:00:00+00';

SELECT throttle.acquire(NULL, '1 hour');
SELECT throttle.acquire(NULL);
SELECT throttle.acquire('', '1 hour');
SELECT throttle.acquire(repeat('x', 200), '1 hour') AS two_hundred_bytes_is_fine;
SELECT throttle.acquire(repeat('x', 201), '1 hour');
-- The limit is in bytes: 100 two-byte characters fit, 101 do not.
SELECT throttle.acquire(repeat('é', 100), '1 hour') AS two_hundred_bytes_of_utf8;
SELECT throttle.acquire(repeat('é', 101), '1 hour');

SELECT throttle.acquire('bad.every', '0');
SELECT throttle.acquire('bad.every', '-1 second');
SELECT throttle.acquire('bad.every', '1 day -24 hours');
SELECT throttle.acquire('bad.every', '1 month -31 days');
SELECT throttle.acquire('bad.every', '300000 years');
-- None of the rejected calls created anything.
SELECT count(*) AS entries_for_bad_calls FROM throttle.status WHERE name = 'bad.every';

-- No interval given and none declared.
SELECT throttle.acquire('bad.undeclared');

-- The catalog refuses what acquire would refuse.
INSERT INTO throttle.resource (name, every) VALUES ('', '1 hour');
INSERT INTO throttle.resource (name, every) VALUES ('bad.zero', '0');
INSERT INTO throttle.resource (name, every) VALUES ('bad.null', NULL);
INSERT INTO throttle.resource (name, every) VALUES (repeat('x', 201), '1 hour');

-- A long holder is clipped, not refused; a NULL holder describes the caller.
SELECT throttle.acquire('bad.holder', '1 hour', repeat('h', 500)) AS long_holder;
SELECT octet_length(holder) AS clipped_holder_bytes FROM throttle.status WHERE name = 'bad.holder';
SELECT throttle.acquire('bad.holder.mb', '1 hour', repeat('é', 40)) AS multibyte_holder;
SELECT octet_length(holder) AS clipped_on_character_boundary, holder = repeat('é', 31) AS whole_characters
FROM throttle.status WHERE name = 'bad.holder.mb';
SELECT throttle.acquire('bad.holder.default', '1 hour', NULL) AS default_holder;
SELECT holder ~ '^pg_regress/bad_input pid=[0-9]+ ([0-9.:]+|\[local\])$' AS describes_caller, holder_pid = pg_backend_pid() AS pid
FROM throttle.status WHERE name = 'bad.holder.default';

-- The test clock: only a finite timestamptz, and only for superusers.
SET pg_throttle.test_clock = 'not a time';
SET pg_throttle.test_clock = 'infinity';
SET pg_throttle.test_clock = '2030-01-01 00:00:00+00';
CREATE ROLE throttle_regress_user;
SET ROLE throttle_regress_user;
SET pg_throttle.test_clock = '2031-01-01 00:00:00+00';
SHOW pg_throttle.test_clock;
-- Ordinary users may call acquire and read the catalog and the view ...
SELECT throttle.acquire('bad.as_user', '1 hour') AS user_call;
SELECT count(*) >= 0 AS user_reads_catalog FROM throttle.resource;
-- ... but not declare resources.
INSERT INTO throttle.resource (name, every) VALUES ('bad.by_user', '1 hour');
RESET ROLE;
DROP ROLE throttle_regress_user;

-- Unknown settings under the extension's prefix are refused.
SET pg_throttle.no_such_setting = 1;
SHOW pg_throttle.max_entries;
SET pg_throttle.max_entries = 10;

RESET pg_throttle.test_clock;
