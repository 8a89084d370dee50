\set k random(1, 100000)
SELECT throttle.acquire('bench.key.' || :k, '1 hour');
