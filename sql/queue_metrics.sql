-- throttle.queue_metrics gives one row per queue whatever the plan: its
-- throttle.now() (the real clock here, which moves during the scan) is read
-- once. With statistics taken while the table was small, the plan rescanned
-- it per event, and each event's own instant made a group of its own
-- (thousands of rows for one queue).
SELECT count(throttle.schedule('qm-small', 'k' || g, now() - interval '1 hour')) AS scheduled
FROM generate_series(1, 3) g;
ANALYZE throttle.event;
SELECT count(throttle.schedule('qm-ha', 'k' || g, now() - interval '1 minute')) AS scheduled
FROM generate_series(1, 20000) g;
SELECT count(*) AS rows, sum(due) AS due, sum(scheduled) AS scheduled,
       min(oldest_due_seconds) >= 60 AS oldest_due_ok
FROM throttle.queue_metrics WHERE queue = 'qm-ha';
SELECT queue, due FROM throttle.queue_metrics WHERE queue LIKE 'qm-%' ORDER BY queue;
-- And with statistics of the full table.
ANALYZE throttle.event;
SELECT count(*) AS rows, sum(due) AS due, sum(scheduled) AS scheduled,
       min(oldest_due_seconds) >= 60 AS oldest_due_ok
FROM throttle.queue_metrics WHERE queue = 'qm-ha';
SELECT queue, due FROM throttle.queue_metrics WHERE queue LIKE 'qm-%' ORDER BY queue;
DELETE FROM throttle.event WHERE queue LIKE 'qm-%';
