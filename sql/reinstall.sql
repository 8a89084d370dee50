-- Dropping and re-creating the extension in the same session.
SET pg_throttle.test_clock = '2030-05-01 00:00:00+00';
INSERT INTO throttle.resource (name, every) VALUES ('re.declared', '1 hour');
SELECT throttle.acquire('re.declared') AS before_drop;
DROP EXTENSION pg_throttle;
CREATE EXTENSION pg_throttle;
SET pg_throttle.test_clock = '2030-05-01 00:00:00+00';
-- The catalog is new (the declaration is gone) ...
SELECT throttle.acquire('re.declared');
INSERT INTO throttle.resource (name, every) VALUES ('re.declared', '1 hour'), ('re.new', '1 minute');
-- ... the session's cached catalog query follows the new table, and the
-- registry, which lives in shared memory, still holds the grant made before.
SELECT throttle.acquire('re.declared') AS after_recreate;
SELECT throttle.acquire('re.new') AS new_declaration;
RESET pg_throttle.test_clock;
-- The queue's kept plans (claim, complete) follow a re-created table too.
SELECT throttle.schedule('re.queue', 'a', now()) > 0 AS scheduled;
WITH claimed AS (SELECT array_agg(id) AS ids, min(claim_token) AS token
                 FROM throttle.claim('re.queue', 'worker'))
SELECT cardinality(ids) AS claimed, throttle.complete(ids, token) AS completed FROM claimed;
DROP EXTENSION pg_throttle;
CREATE EXTENSION pg_throttle;
SELECT throttle.schedule('re.queue', 'a', now()) > 0 AS scheduled_again;
WITH claimed AS (SELECT array_agg(id) AS ids, min(claim_token) AS token
                 FROM throttle.claim('re.queue', 'worker'))
SELECT cardinality(ids) AS claimed_again, throttle.complete(ids, token) AS completed_again
FROM claimed;
SELECT state, count(*) FROM throttle.all_events GROUP BY state;
-- The suites after this one number their events from 1.
TRUNCATE throttle.event, throttle.event_history, throttle.event_attempt RESTART IDENTITY;
