-- Tables and functions for the SQL recipes pg_throttle is measured against.
CREATE EXTENSION IF NOT EXISTS pg_throttle;

-- The bare recipe: one row per task, UPDATE ... WHERE last_executed < now() - interval.
CREATE TABLE task_keys (name text PRIMARY KEY, last_executed timestamptz NOT NULL);
INSERT INTO task_keys VALUES ('hot', now());

-- The timelocked-resource recipe: claim the row with FOR UPDATE SKIP LOCKED.
CREATE TABLE timelocked_resource (
    id        serial PRIMARY KEY,
    name      text UNIQUE NOT NULL,
    every     interval NOT NULL,
    locked_at timestamptz NOT NULL
);
INSERT INTO timelocked_resource (name, every, locked_at) VALUES
    ('hot-denied', '1 hour', now()),
    ('hot-granted', '0', now());

CREATE FUNCTION timelocked_acquire(resource text) RETURNS boolean
LANGUAGE plpgsql AS $$
BEGIN
    UPDATE timelocked_resource SET locked_at = now()
    WHERE id = (SELECT id FROM timelocked_resource
                WHERE name = resource AND locked_at <= now() - every
                FOR UPDATE SKIP LOCKED);
    RETURN FOUND;
END
$$;
