SELECT id, claim_token AS token FROM throttle.claim('bound', 'w', '5 minutes', 1) \gset
SELECT throttle.complete(ARRAY[:id]::bigint[], :token);
