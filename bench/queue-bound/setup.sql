-- The tables of bench/queue-bound.sh: the FOR UPDATE SKIP LOCKED recipe's
-- jobs, and the key that the claims in force of queue 'key_range' end at.
SET client_min_messages = warning;
CREATE EXTENSION IF NOT EXISTS pg_throttle;
DROP TABLE IF EXISTS bound_job;
CREATE TABLE bound_job (
    id     bigserial PRIMARY KEY,
    run_at timestamptz NOT NULL,
    state  text NOT NULL DEFAULT 'pending'
);
CREATE INDEX bound_job_due ON bound_job (run_at, id) WHERE state = 'pending';
DROP TABLE IF EXISTS bound_frontier;
CREATE TABLE bound_frontier (run_at timestamptz NOT NULL, id bigint NOT NULL);
