\set k random(1, 100000)
UPDATE task_keys SET last_executed = now()
WHERE name = 'bench.key.' || :k AND last_executed < now() - interval '1 hour' RETURNING true;
