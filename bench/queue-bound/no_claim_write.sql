-- A claim that writes nothing to the event, as one whose bookkeeping lived in
-- shared memory would: each due row of queue :queue is tested against the
-- claims in force (here: its rows with a claim_token; a shared-memory table
-- of claims would answer the same question per row), and the scan starts
-- past (:frontier_at, :frontier_id): '-infinity' and 0 for the claim that
-- tests every row, the key the claims in force end at for one that shared
-- memory kept ordered by (run_at, id) (its best case: claims in force
-- scattered among free events would cost a step each). The row lock stands
-- for the journal record that such a claim must flush to survive a crash.
-- Then, in a transaction of its own, complete's move to the history, as
-- throttle.complete does it.
SELECT e.id FROM throttle.event e
WHERE e.queue = :queue AND e.state = 'pending' AND e.group_key IS NULL AND e.priority = 0
  AND e.run_at <= now() AND e.claim_token IS NULL
  AND (e.run_at, e.id) > (:frontier_at::timestamptz, :frontier_id::bigint)
ORDER BY e.run_at, e.id LIMIT 1 FOR UPDATE SKIP LOCKED \gset
WITH done AS (DELETE FROM throttle.event e WHERE e.id = :id RETURNING e.*)
INSERT INTO throttle.event_history
SELECT d.id, d.queue, d.item_key, d.group_key, d.payload, d.run_at, 'done', d.attempts + 1,
       d.max_attempts, d.enqueued_at, d.enqueued_by, now(), 'w', 1, NULL, now(), 'w',
       d.cancelled_at, d.last_error, 10, d.priority, d.failed_at, d.cancelled_by, d.concurrency_key
FROM done d;
