\set k random(1, 1000000)
SELECT * FROM throttle.take('bench.mb.' || :k, 10, '1 hour', 10);
