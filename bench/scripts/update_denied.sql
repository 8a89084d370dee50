UPDATE task_keys SET last_executed = now()
WHERE name = 'hot' AND last_executed < now() - interval '1 hour' RETURNING true;
