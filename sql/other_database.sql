-- "foo" in database A and "foo" in database B are different resources.
SET pg_throttle.test_clock = '2030-01-01 00:00:00+00';
SELECT throttle.acquire('db.shared-name', '1 hour') AS in_first_database;
SELECT throttle.acquire('db.shared-name', '1 hour') AS again_in_first_database;

CREATE DATABASE pg_throttle_regress_other;
\c pg_throttle_regress_other
CREATE EXTENSION pg_throttle;
SET pg_throttle.test_clock = '2030-01-01 00:00:00+00';
SELECT throttle.acquire('db.shared-name', '1 hour') AS in_second_database;
SELECT throttle.acquire('db.shared-name', '1 hour') AS again_in_second_database;
-- Each database sees only its own entries.
SELECT name, grants, denials FROM throttle.status WHERE name = 'db.shared-name';

\c contrib_regression
SET pg_throttle.test_clock = '2030-01-01 00:00:00+00';
SELECT name, grants, denials FROM throttle.status WHERE name = 'db.shared-name';
DROP DATABASE pg_throttle_regress_other;
