-- no_claim_write.sql, with its scan started past the claims in force, as a
-- claim could if shared memory kept them ordered by (run_at, id): the claims
-- in force of queue 'key_range' all end at one key (pgbench -D frontier_at,
-- frontier_id), its best case; claims in force scattered among free events
-- would cost a step each.
SELECT e.id FROM throttle.event e
WHERE e.queue = 'key_range' AND e.state = 'pending' AND e.group_key IS NULL AND e.priority = 0
  AND e.run_at <= now() AND e.claim_token IS NULL
  AND (e.run_at, e.id) > (:frontier_at::timestamptz, :frontier_id::bigint)
ORDER BY e.run_at, e.id LIMIT 1 FOR UPDATE SKIP LOCKED \gset
WITH done AS (DELETE FROM throttle.event e WHERE e.id = :id RETURNING e.*)
INSERT INTO throttle.event_history
SELECT d.id, d.queue, d.item_key, d.group_key, d.payload, d.run_at, 'done', d.attempts + 1,
       d.max_attempts, d.enqueued_at, d.enqueued_by, now(), 'w', 1, NULL, now(), 'w',
       d.cancelled_at, d.last_error, 10, d.priority, d.failed_at, d.cancelled_by, d.concurrency_key
FROM done d;
