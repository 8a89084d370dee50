\set k random(1, 100000)
SELECT throttle.allow('bench.bucket.' || :k, 10, '1 second', 10);
