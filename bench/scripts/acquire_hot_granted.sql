SELECT throttle.acquire('bench.hot-granted', '1 microsecond');
