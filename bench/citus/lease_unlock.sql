\set k random(1, 100000)
SELECT throttle.lock('bench.lease.' || :k, ttl => '5 seconds') AS token \gset
SELECT throttle.unlock('bench.lease.' || :k, :token);
