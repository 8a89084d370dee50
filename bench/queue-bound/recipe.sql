BEGIN;
SELECT id FROM bound_job WHERE state = 'pending' AND run_at <= now()
ORDER BY run_at, id LIMIT 1 FOR UPDATE SKIP LOCKED \gset
UPDATE bound_job SET state = 'done' WHERE id = :id;
COMMIT;
