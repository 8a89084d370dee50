SELECT throttle.acquire('bench.hot', '1 hour');
