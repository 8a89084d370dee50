SELECT pg_try_advisory_lock(:client_id);
SELECT pg_advisory_unlock(:client_id);
