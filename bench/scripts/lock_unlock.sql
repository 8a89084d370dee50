SELECT throttle.lock('bench.lock.' || :client_id) AS token \gset
SELECT throttle.unlock('bench.lock.' || :client_id, :token);
