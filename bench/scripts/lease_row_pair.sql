SELECT lease_take('bench.lease.' || :client_id, interval '1 minute') AS token \gset
SELECT lease_release('bench.lease.' || :client_id, :token);
