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

-- The upsert token bucket people write in PL/pgSQL: one row per key, refilled
-- from the time since its last update, one INSERT ... ON CONFLICT per call.
CREATE TABLE bucket_state (key text PRIMARY KEY, tokens double precision NOT NULL,
                           updated_at timestamptz NOT NULL);

CREATE FUNCTION upsert_take(k text, rate double precision, per_seconds double precision,
                            burst double precision) RETURNS boolean
LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO bucket_state AS b (key, tokens, updated_at)
    VALUES (k, burst - 1, clock_timestamp())
    ON CONFLICT (key) DO UPDATE
        SET tokens = least(burst, b.tokens + extract(epoch FROM clock_timestamp() - b.updated_at)
                                             * rate / per_seconds) - 1,
            updated_at = clock_timestamp()
        WHERE least(burst, b.tokens + extract(epoch FROM clock_timestamp() - b.updated_at)
                                      * rate / per_seconds) >= 1;
    RETURN FOUND;
END
$$;

-- The lease table people write: a row per name with a token and an expiry,
-- taken when absent or expired, deleted on release (each a committed, and so
-- flushed, transaction).
CREATE TABLE leases (name text PRIMARY KEY, token bigint NOT NULL, expires_at timestamptz NOT NULL);
CREATE SEQUENCE lease_tokens;

CREATE FUNCTION lease_take(n text, ttl interval) RETURNS bigint
LANGUAGE sql AS $$
    INSERT INTO leases AS l VALUES (n, nextval('lease_tokens'), clock_timestamp() + ttl)
    ON CONFLICT (name) DO UPDATE SET token = excluded.token, expires_at = excluded.expires_at
    WHERE l.expires_at <= clock_timestamp()
    RETURNING token
$$;

CREATE FUNCTION lease_release(n text, t bigint) RETURNS boolean
LANGUAGE sql AS $$
    WITH d AS (DELETE FROM leases WHERE name = n AND token = t RETURNING 1)
    SELECT count(*) > 0 FROM d
$$;
