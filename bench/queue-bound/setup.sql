-- The FOR UPDATE SKIP LOCKED recipe's table (bench/queue-bound.sh).
SET client_min_messages = warning;
CREATE EXTENSION IF NOT EXISTS pg_throttle;
DROP TABLE IF EXISTS bound_job;
CREATE TABLE bound_job (
    id     bigserial PRIMARY KEY,
    run_at timestamptz NOT NULL,
    state  text NOT NULL DEFAULT 'pending'
);
CREATE INDEX bound_job_due ON bound_job (run_at, id) WHERE state = 'pending';
