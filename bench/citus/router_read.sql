\set k random(1, 100000)
SELECT last_executed FROM task_keys WHERE name = 'bench.key.' || :k;
