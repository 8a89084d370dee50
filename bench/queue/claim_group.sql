SELECT coalesce(array_agg(id), '{}')::text AS ids, coalesce(min(claim_token), 0) AS token
FROM throttle.claim_group('bench', 'w' || :client_id, '1 minute') \gset
SELECT throttle.complete(:ids::bigint[], :token);
