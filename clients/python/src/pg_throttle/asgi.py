"""A pure-ASGI middleware that rate-limits HTTP requests with throttle.take.

    app = RateLimitMiddleware(app, "dbname=app", rate=2, per=1, burst=3)

Each HTTP request is keyed by key(scope) (default: the X-Api-Key header as
"key:<value>", else the client's address as "addr:<host>"; behind a proxy,
pass a key that reads the address the proxy forwards, and check an API key
before it becomes a bucket: a header nobody checks lets a client take a fresh
bucket for every request). key may be a coroutine function; when it returns
None the request passes without a limit. The take goes through psycopg's
AsyncConnectionPool (or the AsyncConnection given), so the event loop is
never blocked.

Allowed: the application's answer, with RateLimit-Limit, RateLimit-Remaining
and RateLimit-Reset added. Denied: 429 with Retry-After and the same headers,
and a JSON body {"error": "too many requests", "retry_after_s": <exact>}. A key
that makes the bucket's name longer than 200 bytes: 400; a key function
that returns neither a str nor None: 500 and a log line. When the database
cannot answer (or no pooled connection comes within pool_timeout): 503 with
Retry-After 1, failing closed rather than letting requests through; any other
database error: 500. An extension missing or of another version raises
VersionError (the server logs it and answers 500). Other scopes (websocket,
lifespan) pass through; a pool the middleware made itself is closed at
lifespan shutdown (or by await middleware.aclose()).
"""
from __future__ import annotations

import inspect
import json
import logging
from typing import Any, Awaitable, Callable, Dict, Optional, Union

import psycopg

from ._conn import Seconds
from .ratelimit import AsyncRateLimiter, Decision, KeyTooLong

log = logging.getLogger("pg_throttle.asgi")

Scope = Dict[str, Any]
KeyFunction = Callable[[Scope], Union[Optional[str], Awaitable[Optional[str]]]]


def default_key(scope: Scope) -> str:
    """The X-Api-Key header as "key:<value>", else "addr:<client host>"."""
    for name, value in scope.get("headers") or ():
        if name.lower() == b"x-api-key" and value:
            return "key:" + value.decode("latin-1")
    client = scope.get("client")
    return f"addr:{client[0] if client else 'unknown'}"


class RateLimitMiddleware:
    """RateLimitMiddleware(app, source, *, rate, per=1, burst=None, cost=1,
    key=default_key, prefix="http:", pool_size=4, pool_timeout=5).

    source: a libpq connection string (a pool of the middleware's own, in
    autocommit), a psycopg_pool.AsyncConnectionPool or a psycopg
    AsyncConnection. rate units refill per `per` seconds (or a timedelta);
    burst: the bucket's size (default rate); cost: units per request.
    """

    def __init__(self, app: Callable, source: Any, *, rate: int, per: Seconds = 1,
                 burst: Optional[int] = None, cost: int = 1, key: KeyFunction = default_key,
                 prefix: str = "http:", pool_size: int = 4, pool_timeout: float = 5):
        self.app, self.key = app, key
        self.limiter = AsyncRateLimiter(source, rate, per, burst, cost=cost, prefix=prefix,
                                        pool_size=pool_size, pool_timeout=pool_timeout)

    async def aclose(self) -> None:
        """Closes the middleware's own pool (not one it was given)."""
        await self.limiter.aclose()

    async def __call__(self, scope: Scope, receive: Callable, send: Callable) -> None:
        if scope["type"] == "lifespan":
            await self.app(scope, receive, self._lifespan_send(send))
            return
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        key = self.key(scope)
        if inspect.isawaitable(key):
            key = await key
        if key is None:
            await self.app(scope, receive, send)
            return
        if not isinstance(key, str):
            # The application's mistake: refuse the request rather than end the connection.
            log.error("rate limit key function returned %s, not a str (or None)", type(key).__name__)
            await _answer(send, 500, {"error": "rate limit check failed"}, {})
            return
        try:
            decision = await self.limiter.take(key)
        except KeyTooLong:
            # The client's mistake, not the database's: take would refuse it (22023).
            await _answer(send, 400, {"error": "rate-limit key too long"}, {})
            return
        except psycopg.OperationalError as e:
            # The database is away or the pool timed out (PoolTimeout is an
            # OperationalError). Fail closed: without the database there is
            # no limit to enforce.
            log.error("rate limit unavailable: %s", e)
            await _answer(send, 503, {"error": "rate limit unavailable"}, {"Retry-After": "1"})
            return
        except psycopg.Error as e:
            # Any other refusal is a bug here, not an outage: no Retry-After.
            log.error("rate limit check failed: %s", e)
            await _answer(send, 500, {"error": "rate limit check failed"}, {})
            return
        if not decision.allowed:
            await _answer(send, 429, {"error": "too many requests",
                                      "retry_after_s": decision.retry_after.total_seconds()}, decision.headers)
            return
        await self.app(scope, receive, _with_headers(send, decision))

    def _lifespan_send(self, send: Callable) -> Callable:
        async def lifespan_send(message):
            if message.get("type") == "lifespan.shutdown.complete":
                await self.aclose()
            await send(message)
        return lifespan_send


def _encode(headers: Dict[str, str]):
    return [(name.lower().encode("latin-1"), value.encode("latin-1")) for name, value in headers.items()]


def _with_headers(send: Callable, decision: Decision) -> Callable:
    """`send` adding the RateLimit-* headers to the response's start, unless
    the application set them itself."""
    async def send_with_headers(message):
        if message.get("type") == "http.response.start":
            headers = list(message.get("headers") or [])
            present = {bytes(name).lower() for name, _ in headers}
            headers += [h for h in _encode(decision.headers) if h[0] not in present]
            message = {**message, "headers": headers}
        await send(message)
    return send_with_headers


async def _answer(send: Callable, status: int, body: Dict[str, Any], headers: Dict[str, str]) -> None:
    data = (json.dumps(body) + "\n").encode()
    await send({"type": "http.response.start", "status": status,
                "headers": _encode(headers) + [(b"content-type", b"application/json"),
                                               (b"content-length", str(len(data)).encode())]})
    await send({"type": "http.response.body", "body": data})
