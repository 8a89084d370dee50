BEGIN;
SELECT coalesce(array_agg(id), '{}')::text AS ids FROM recipe_claim_group() AS id \gset
UPDATE recipe_event SET state = 'done' WHERE id = ANY (:ids::bigint[]);
COMMIT;
