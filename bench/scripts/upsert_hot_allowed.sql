SELECT upsert_take('hot-allowed', 1000000, 1, 1000000);
