SELECT coalesce(array_agg(id), '{}')::text AS ids FROM throttle.claim_group('bench', 'w' || :client_id, '1 minute') \gset
SELECT throttle.complete(:ids::bigint[], 'w' || :client_id);
