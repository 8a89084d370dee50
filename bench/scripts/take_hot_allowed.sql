SELECT * FROM throttle.take('bench.bucket-allowed', 1000000, '1 second', 1000000);
