\set k random(1, 100000)
SELECT * FROM throttle.take('bench.bucket.' || :k, 10, '1 second', 10);
