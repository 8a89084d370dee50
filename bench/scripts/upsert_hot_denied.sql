SELECT upsert_take('hot-denied', 1, 3600, 1);
