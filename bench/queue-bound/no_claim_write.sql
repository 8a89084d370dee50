-- A claim that writes nothing to the event, as one whose bookkeeping lived in
-- a shared-memory table would: each due row is tested against the claims in
-- force (here: the rows of queue 'no_write' with a claim_token; such a table
-- would answer the same question per row), and the row lock stands for the
-- journal record that such a claim must flush to survive a crash. Then, in a
-- transaction of its own, complete's move to the history, as
-- throttle.complete does it.
SELECT e.id FROM throttle.event e
WHERE e.queue = 'no_write' AND e.state = 'pending' AND e.group_key IS NULL AND e.priority = 0
  AND e.run_at <= now() AND e.claim_token IS NULL
ORDER BY e.run_at, e.id LIMIT 1 FOR UPDATE SKIP LOCKED \gset
WITH done AS (DELETE FROM throttle.event e WHERE e.id = :id RETURNING e.*)
INSERT INTO throttle.event_history
SELECT d.id, d.queue, d.item_key, d.group_key, d.payload, d.run_at, 'done', d.attempts + 1,
       d.max_attempts, d.enqueued_at, d.enqueued_by, now(), 'w', 1, NULL, now(), 'w',
       d.cancelled_at, d.last_error, 10, d.priority, d.failed_at, d.cancelled_by, d.concurrency_key
FROM done d;
