SELECT throttle.allow('bench.allow-denied', 1, '1 hour', 1);
