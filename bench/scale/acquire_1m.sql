\set k random(1, 1000000)
SELECT throttle.acquire('bench.m.' || :k, '1 hour');
