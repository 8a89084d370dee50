SELECT throttle.lock('bench.lease.' || :client_id, ttl => '1 minute') AS token \gset
SELECT throttle.unlock('bench.lease.' || :client_id, :token);
