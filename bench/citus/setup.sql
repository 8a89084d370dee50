-- The contenders of bench/citus.py, on the coordinator of a three-node Citus
-- cluster: pg_throttle distributed (throttle.distribute) against the recipe a
-- Citus user would write, a table distributed by the key.
SELECT throttle.distribute(32);
CREATE TABLE task_keys (name text PRIMARY KEY, last_executed timestamptz NOT NULL);
SELECT create_distributed_table('task_keys', 'name', colocate_with => 'throttle.key_shard');
INSERT INTO task_keys SELECT 'bench.key.' || g, now() FROM generate_series(1, 100000) g;
