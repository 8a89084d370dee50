-- throttle.status: the registry entries of this database still in force.
SET pg_throttle.test_clock = '2040-06-01 12:00:00+00';
SELECT throttle.acquire('st.a', '10 minutes', 'worker-a') AS a;
SELECT throttle.acquire('st.a', '10 minutes', 'worker-b') AS a_again;
SELECT throttle.acquire('st.a', '10 minutes', 'worker-c') AS a_again;
SELECT throttle.acquire('st.b', '1 hour', 'worker-b') AS b;

SELECT kind, name, holder, granted_at, next_grant_at, grants, denials
FROM throttle.status WHERE name LIKE 'st.%' ORDER BY name;

-- An entry whose interval has passed is no longer shown ...
SET pg_throttle.test_clock = '2040-06-01 12:10:00+00';
SELECT name FROM throttle.status WHERE name LIKE 'st.%' ORDER BY name;
-- ... and the next grant starts a new window, counters kept.
SELECT throttle.acquire('st.a', '10 minutes', 'worker-d') AS a_next_window;
SELECT name, holder, granted_at, next_grant_at, grants, denials
FROM throttle.status WHERE name = 'st.a';

\d throttle.status
RESET pg_throttle.test_clock;
