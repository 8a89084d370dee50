-- The baseline people write today for "all due events of one entity, one
-- worker at a time": FOR UPDATE SKIP LOCKED cannot be combined with GROUP BY,
-- so a cursor walks the due rows and tries an advisory lock per group, and
-- the transaction stays open while the worker processes the group.
-- (bench/queue.sh and bench/queue-bound.sh: each starts from a new table.)
SET client_min_messages = warning;
DROP TABLE IF EXISTS recipe_event;
CREATE TABLE recipe_event (
    id        bigserial PRIMARY KEY,
    group_key text NOT NULL,
    run_at    timestamptz NOT NULL,
    state     text NOT NULL DEFAULT 'pending'
);
CREATE INDEX recipe_event_due ON recipe_event (run_at) WHERE state = 'pending';
CREATE INDEX recipe_event_group ON recipe_event (group_key) WHERE state = 'pending';

CREATE OR REPLACE FUNCTION recipe_claim_group() RETURNS SETOF bigint
LANGUAGE plpgsql AS $$
DECLARE
    candidate record;
BEGIN
    FOR candidate IN
        SELECT group_key FROM recipe_event WHERE state = 'pending' AND run_at <= now() ORDER BY run_at
    LOOP
        IF pg_try_advisory_xact_lock(hashtext(candidate.group_key)) THEN
            RETURN QUERY SELECT id FROM recipe_event
                         WHERE group_key = candidate.group_key AND state = 'pending' AND run_at <= now();
            RETURN;
        END IF;
    END LOOP;
END
$$;
