"""RateLimitMiddleware, driven directly with scope / receive / send, on a fixed
clock (its pool's sessions set pg_throttle.test_clock): the answers and their
headers are exact."""
import asyncio
import datetime
import json

import psycopg
import pytest
from psycopg_pool import AsyncConnectionPool

import pg_throttle

CLOCK = "2026-01-01T00:00:00+00"
FIXED = f"options='-c pg_throttle.test_clock={CLOCK}'"


async def app(scope, receive, send):
    """The application behind the limit: 200 and the path."""
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/plain")]})
    await send({"type": "http.response.body", "body": scope["path"].encode()})


async def request(middleware, api_key=None, path="/hello", client=("10.0.0.1", 5000)):
    headers = [(b"host", b"test")] + ([(b"x-api-key", api_key.encode())] if api_key is not None else [])
    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "GET", "path": path,
             "raw_path": path.encode(), "query_string": b"", "headers": headers, "client": client,
             "server": ("test", 80), "scheme": "http"}
    sent = []

    async def receive():
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message):
        sent.append(message)
    await middleware(scope, receive, send)
    start, body = sent[0], b"".join(m.get("body", b"") for m in sent[1:])
    return start["status"], {k.decode(): v.decode() for k, v in start["headers"]}, body


def limits(answer):
    status, headers, _ = answer
    return (status, headers.get("ratelimit-limit"), headers.get("ratelimit-remaining"),
            headers.get("ratelimit-reset"), headers.get("retry-after"))


def test_burst_then_429_matches_take(conn, name):
    """Rate 1 per 10 s, burst 3: three 200s (remaining 2, 1, 0; reset 10, 20,
    30 s), then 429 with Retry-After 10; a peek with throttle.take on the same
    clock gives the same numbers. Another key has a bucket of its own."""
    async def main():
        middleware = pg_throttle.RateLimitMiddleware(app, FIXED, rate=1, per=10, burst=3, prefix=name + ":")
        try:
            answers = [await request(middleware, "alice") for _ in range(4)]
            other = await request(middleware, "bob")
            by_address = await request(middleware)
        finally:
            await middleware.aclose()
        return answers, other, by_address
    answers, other, by_address = asyncio.run(main())
    assert [limits(a) for a in answers] == [(200, "3", "2", "10", None), (200, "3", "1", "20", None),
                                            (200, "3", "0", "30", None), (429, "3", "0", "30", "10")]
    assert answers[0][2] == b"/hello" and answers[0][1]["content-type"] == "text/plain"
    assert json.loads(answers[3][2]) == {"error": "too many requests", "retry_after_s": 10.0}
    assert limits(other) == (200, "3", "2", "10", None)
    assert limits(by_address) == (200, "3", "2", "10", None)
    conn.execute(f"SET pg_throttle.test_clock = '{CLOCK}'")
    peek = conn.execute("SELECT * FROM throttle.take(%s, 1, '10 seconds', 3, cost => 0)",
                        (f"{name}:key:alice",)).fetchone()
    assert peek == (False, 0, datetime.timedelta(seconds=10), datetime.timedelta(seconds=30))
    assert conn.execute("SELECT remaining FROM throttle.take(%s, 1, '10 seconds', 3, cost => 0)",
                        (f"{name}:addr:10.0.0.1",)).fetchone()[0] == 2


def test_key_too_long_none_and_other_scopes(name):
    called = []

    async def recording(scope, receive, send):
        called.append(scope["type"])
        if scope["type"] == "http":
            await app(scope, receive, send)

    def key(scope):
        path = scope["path"]
        return None if path == "/health" else "k" * (300 if path == "/long" else 10)

    async def main():
        middleware = pg_throttle.RateLimitMiddleware(recording, FIXED, rate=5, key=key, prefix=name + ":")
        try:
            too_long = await request(middleware, path="/long")
            health = await request(middleware, path="/health")
            await middleware({"type": "websocket", "path": "/ws"}, None, None)
        finally:
            await middleware.aclose()
        return too_long, health
    too_long, health = asyncio.run(main())
    assert too_long[0] == 400 and "too long" in json.loads(too_long[2])["error"]
    assert health[0] == 200 and "ratelimit-limit" not in health[1]
    assert called == ["http", "websocket"]          # not the too-long one


def test_async_key_and_a_given_pool(name):
    """An async key function; a pool of the application's (left open)."""
    async def key(scope):
        await asyncio.sleep(0)
        return "async"

    async def main():
        pool = AsyncConnectionPool(FIXED, min_size=1, max_size=2, kwargs={"autocommit": True}, open=False)
        await pool.open()
        try:
            middleware = pg_throttle.RateLimitMiddleware(app, pool, rate=1, per=datetime.timedelta(minutes=1),
                                                         burst=2, key=key, prefix=name + ":")
            answers = await asyncio.gather(*(request(middleware) for _ in range(3)))
            await middleware.aclose()
            assert not pool.closed
        finally:
            await pool.close()
        return answers
    answers = asyncio.run(main())
    assert sorted(limits(a)[:3] for a in answers) == [(200, "2", "0"), (200, "2", "1"), (429, "2", "0")]


def test_database_away_is_503_without_blocking_the_loop():
    """No server: 503 with Retry-After 1 once the pool gives up (0.3 s), and
    meanwhile the event loop runs other tasks (a ticker every 10 ms)."""
    async def main():
        middleware = pg_throttle.RateLimitMiddleware(app, "host=/nonexistent-pg-throttle-dir", rate=1,
                                                     pool_timeout=0.3)
        ticks = 0

        async def ticker():
            nonlocal ticks
            while True:
                await asyncio.sleep(0.01)
                ticks += 1
        task = asyncio.ensure_future(ticker())
        try:
            answer = await request(middleware, "x")
        finally:
            task.cancel()
            await middleware.aclose()
        return answer, ticks
    (status, headers, body), ticks = asyncio.run(main())
    assert (status, headers.get("retry-after")) == (503, "1")
    assert json.loads(body) == {"error": "rate limit unavailable"}
    assert ticks >= 10, ticks


def test_lifespan_closes_its_own_pool(name):
    async def lifespan_app(scope, receive, send):
        while True:
            message = await receive()
            await send({"type": message["type"] + ".complete"})
            if message["type"] == "lifespan.shutdown":
                return

    async def main():
        middleware = pg_throttle.RateLimitMiddleware(lifespan_app, FIXED, rate=5, prefix=name + ":")
        await middleware.limiter.take("warm")          # opens the pool
        incoming = iter([{"type": "lifespan.startup"}, {"type": "lifespan.shutdown"}])
        sent = []

        async def receive():
            return next(incoming)

        async def send(message):
            sent.append(message["type"])
        await middleware({"type": "lifespan", "asgi": {"version": "3.0"}}, receive, send)
        return sent, middleware.limiter.source.closed
    sent, closed = asyncio.run(main())
    assert sent == ["lifespan.startup.complete", "lifespan.shutdown.complete"] and closed


def test_missing_extension_raises(other_database):
    info = other_database()

    async def main():
        middleware = pg_throttle.RateLimitMiddleware(app, info, rate=1)
        try:
            with pytest.raises(pg_throttle.VersionError):
                await request(middleware, "x")
        finally:
            await middleware.aclose()
    asyncio.run(main())


def test_sync_rate_limiter(conn, name):
    limiter = pg_throttle.RateLimiter(psycopg.connect(FIXED, autocommit=True), 1, 10, 2, prefix=name + ":")
    try:
        decisions = [limiter.take("k") for _ in range(3)]
        assert [(d.allowed, d.remaining) for d in decisions] == [(True, 1), (True, 0), (False, 0)]
        assert decisions[2].headers == {"RateLimit-Limit": "2", "RateLimit-Remaining": "0",
                                        "RateLimit-Reset": "20", "Retry-After": "10"}
        assert decisions[2].bucket == f"{name}:k"
        with pytest.raises(pg_throttle.KeyTooLong):
            limiter.take("k" * 300)
    finally:
        limiter.source.close()
    assert pg_throttle.whole_seconds_up(datetime.timedelta(seconds=9, microseconds=1)) == 10


def test_a_key_that_is_not_a_str_is_a_500(name, caplog):
    """A key function returning neither a str nor None is the application's
    bug: 500 and a log line, the application not called (not a crash of the
    connection)."""
    called = []

    async def recording(scope, receive, send):
        called.append(scope["path"])
        await app(scope, receive, send)

    async def main():
        middleware = pg_throttle.RateLimitMiddleware(recording, FIXED, rate=5, key=lambda scope: 42,
                                                     prefix=name + ":")
        try:
            return await request(middleware)
        finally:
            await middleware.aclose()
    status, _, body = asyncio.run(main())
    assert status == 500 and json.loads(body) == {"error": "rate limit check failed"} and called == []
    assert "key function returned int" in caplog.text
    limiter = pg_throttle.RateLimiter(FIXED, rate=1, prefix=name + ":")
    try:
        with pytest.raises(TypeError):
            limiter.take(42)
    finally:
        limiter.close()


@pytest.mark.parametrize("shape", [{"cost": 4, "burst": 3}, {"cost": -1}, {"cost": 1.5}, {"per": 0},
                                   {"per": -1}, {"per": float("inf")}, {"rate": 0}, {"rate": 2.5},
                                   {"burst": 0}, {"rate": 2 ** 31}])
def test_bad_shapes_are_refused_at_construction(shape):
    """What throttle.take would refuse at every request (cost over the burst:
    a request that never passes, 22023) is refused when the limiter is made."""
    shape = {"rate": 5, **shape}
    rate = shape.pop("rate")
    with pytest.raises((ValueError, TypeError)):
        pg_throttle.RateLimiter("", rate, **shape)
    with pytest.raises((ValueError, TypeError)):
        pg_throttle.AsyncRateLimiter("", rate, **shape)
    with pytest.raises((ValueError, TypeError)):
        pg_throttle.RateLimitMiddleware(app, "", rate=rate, **shape)


def test_sources_are_checked(name):
    """A connection not in autocommit is refused (its first take would leave
    the session idle in transaction for good), and so are a sync source for
    AsyncRateLimiter and an async one for RateLimiter."""
    from psycopg_pool import ConnectionPool
    with psycopg.connect(FIXED) as plain:
        with pytest.raises(ValueError, match="autocommit"):
            pg_throttle.RateLimiter(plain, rate=5)
        with pytest.raises(TypeError):
            pg_throttle.AsyncRateLimiter(plain, rate=5)
        assert plain.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
    with psycopg.connect(FIXED, autocommit=True) as c:
        limiter = pg_throttle.RateLimiter(c, rate=5, burst=2, prefix=name + ":")
        assert limiter.take("k").allowed
        with pytest.raises(ValueError):
            limiter.take("k", cost=3)           # over the burst
        c.autocommit = False                    # changed afterwards: refused at the take
        with pytest.raises(ValueError, match="autocommit"):
            limiter.take("k")
        assert c.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
    pool = ConnectionPool(FIXED, open=False)
    with pytest.raises(TypeError):
        pg_throttle.AsyncRateLimiter(pool, rate=5)

    async def main():
        async with await psycopg.AsyncConnection.connect(FIXED) as aplain:
            with pytest.raises(ValueError, match="autocommit"):
                pg_throttle.AsyncRateLimiter(aplain, rate=5)
            with pytest.raises(TypeError):
                pg_throttle.RateLimiter(aplain, rate=5)
        apool = AsyncConnectionPool(FIXED, open=False)
        with pytest.raises(TypeError):
            pg_throttle.RateLimiter(apool, rate=5)
    asyncio.run(main())
