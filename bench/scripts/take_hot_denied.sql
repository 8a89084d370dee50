SELECT * FROM throttle.take('bench.bucket-denied', 1, '1 hour', 1);
