"""Rate limits with throttle.take: a decision and its HTTP headers.

One throttle.take per request takes `cost` units from the bucket of the
request's key, `rate` units per `per` with bursts of `burst` (GCRA, in the
server's shared memory: every process and host that uses the same database
shares the limit). The bucket's name is `prefix` + key; pg_throttle refuses a
name over 200 bytes, so a longer one raises KeyTooLong before any query (an
HTTP server answers 400: the client's mistake, not the database's).

Headers (the IETF draft's names): RateLimit-Limit (the burst),
RateLimit-Remaining, RateLimit-Reset (whole seconds until the bucket is full,
rounded up) on every answer, and Retry-After on a denial: the whole seconds
until the same request would pass, rounded UP and at least 1 (rounded to the
nearest, 0.4 s would say "come back now" and the client would be refused
again).

RateLimiter works on a psycopg.Connection in autocommit or a
psycopg_pool.ConnectionPool (or a connection string, for a pool of its own);
AsyncRateLimiter on an AsyncConnection in autocommit or an
AsyncConnectionPool, without blocking the event loop. A connection not in
autocommit is refused (ValueError): its first take would open a transaction
nothing ends, and the session would stay idle in transaction. Pooled
connections should be in autocommit too: a take is one statement. The
shape (rate, per, burst, cost) is checked when the limiter is made, as
throttle.take would check it.
"""
from __future__ import annotations

import asyncio
import contextlib
import datetime
from typing import Any, Dict, Optional

import psycopg

from ._conn import Seconds, ensure_version, ensure_version_async, integer, positive

try:
    from psycopg_pool import AsyncConnectionPool as _AsyncPool, ConnectionPool as _SyncPool
except ImportError:                 # psycopg-pool is optional
    _AsyncPool = _SyncPool = None

MAX_BUCKET_NAME = 200              # bytes: pg_throttle's longest key name
MAX_INT = 2_147_483_647            # throttle.take's integers

TAKE = "SELECT allowed, remaining, retry_after, reset_after FROM throttle.take(%s, %s, %s, %s, %s)"


class KeyTooLong(ValueError):
    """The bucket's name (prefix + key) is over pg_throttle's 200 bytes."""


def whole_seconds_up(value: datetime.timedelta) -> int:
    """An interval in whole seconds, rounded up (exactly, in microseconds)."""
    micros = value // datetime.timedelta(microseconds=1)
    return -(-micros // 1_000_000)


class Decision:
    """One take's answer: allowed, remaining, retry_after and reset_after (as
    throttle.take returns them), limit (the burst), bucket (its name)."""

    def __init__(self, bucket: str, limit: int, allowed: bool, remaining: int,
                 retry_after: datetime.timedelta, reset_after: datetime.timedelta):
        self.bucket, self.limit = bucket, limit
        self.allowed, self.remaining = allowed, remaining
        self.retry_after, self.reset_after = retry_after, reset_after

    @property
    def headers(self) -> Dict[str, str]:
        """RateLimit-Limit, -Remaining, -Reset, and Retry-After when denied."""
        headers = {
            "RateLimit-Limit": str(self.limit),
            "RateLimit-Remaining": str(self.remaining),
            "RateLimit-Reset": str(whole_seconds_up(self.reset_after)),
        }
        if not self.allowed:
            headers["Retry-After"] = str(max(1, whole_seconds_up(self.retry_after)))
        return headers

    def __repr__(self) -> str:
        return (f"Decision(bucket={self.bucket!r}, allowed={self.allowed}, remaining={self.remaining}, "
                f"retry_after={self.retry_after!r}, reset_after={self.reset_after!r})")


def _at_most(value: int, what: str, most: int) -> int:
    if value > most:
        raise ValueError(f"{what} must be at most {most}, not {value}")
    return value


def _autocommit(conn, kind: str) -> None:
    if not conn.autocommit:
        raise ValueError(f"{kind} needs a connection in autocommit (psycopg.connect(..., autocommit=True)) or "
                         "a pool: on this one the first take would open a transaction that nothing ends, "
                         "leaving the session idle in transaction")


class _Shape:
    def __init__(self, rate: int, per: Seconds, burst: Optional[int], cost: int, prefix: str):
        self.rate = _at_most(integer(rate, "rate", 1), "rate", MAX_INT)
        self.per = positive(per, "per")
        self.burst = rate if burst is None else _at_most(integer(burst, "burst", 1), "burst", MAX_INT)
        if not isinstance(prefix, str):
            raise TypeError(f"prefix must be a str, not {type(prefix).__name__}")
        self.prefix = prefix
        self.cost = self.checked_cost(cost)

    def checked_cost(self, cost: int) -> int:
        """A cost throttle.take accepts: 0 (a peek) to the burst."""
        integer(cost, "cost", 0)
        if cost > self.burst:
            raise ValueError(f"cost ({cost}) must be at most the burst ({self.burst}): such a request would "
                             "never pass")
        return cost

    def bucket(self, key: str) -> str:
        """The bucket's name in pg_throttle for a key: TypeError when the key
        is not a str, KeyTooLong when the name is over 200 bytes."""
        if not isinstance(key, str):
            raise TypeError(f"a rate-limit key must be a str, not {type(key).__name__}")
        name = self.prefix + key
        if len(name.encode()) > MAX_BUCKET_NAME:
            raise KeyTooLong(f"the rate-limit bucket name is over {MAX_BUCKET_NAME} bytes")
        return name

    def params(self, bucket: str, cost: Optional[int]):
        return (bucket, self.rate, self.per, self.burst, self.cost if cost is None else self.checked_cost(cost))

    def decision(self, bucket: str, row) -> Decision:
        return Decision(bucket, self.burst, *row)


class RateLimiter(_Shape):
    """take(key) on `source`: a psycopg.Connection, a psycopg_pool.ConnectionPool
    or a connection string (a pool of its own, up to pool_size connections in
    autocommit; close() closes it)."""

    def __init__(self, source: Any, rate: int, per: Seconds = 1, burst: Optional[int] = None, *,
                 cost: int = 1, prefix: str = "http:", pool_size: int = 4, pool_timeout: float = 5):
        super().__init__(rate, per, burst, cost, prefix)
        if isinstance(source, psycopg.AsyncConnection) or (_AsyncPool is not None and isinstance(source, _AsyncPool)):
            raise TypeError("RateLimiter needs a psycopg.Connection or ConnectionPool: use AsyncRateLimiter "
                            "with an AsyncConnection or AsyncConnectionPool")
        if isinstance(source, psycopg.Connection):
            _autocommit(source, "RateLimiter")
        self._own = isinstance(source, str)
        if self._own:
            from psycopg_pool import ConnectionPool
            source = ConnectionPool(source, min_size=1, max_size=pool_size, timeout=pool_timeout,
                                    kwargs={"autocommit": True})
        self.source = source

    def _connection(self):
        if isinstance(self.source, psycopg.Connection):
            return contextlib.nullcontext(self.source)
        return self.source.connection()

    def take(self, key: str, cost: Optional[int] = None) -> Decision:
        """Takes `cost` (default: the limiter's) units for `key`."""
        bucket = self.bucket(key)
        params = self.params(bucket, cost)
        with self._connection() as conn:
            if conn is self.source:
                _autocommit(conn, "RateLimiter")       # still, at each take
            ensure_version(conn)
            row = conn.execute(TAKE, params).fetchone()
        return self.decision(bucket, row)

    def close(self) -> None:
        if self._own:
            self.source.close()


class AsyncRateLimiter(_Shape):
    """await take(key) on `source`: a psycopg.AsyncConnection, a
    psycopg_pool.AsyncConnectionPool, or a connection string (a pool of its
    own, opened at the first take; await aclose() closes it)."""

    def __init__(self, source: Any, rate: int, per: Seconds = 1, burst: Optional[int] = None, *,
                 cost: int = 1, prefix: str = "http:", pool_size: int = 4, pool_timeout: float = 5):
        super().__init__(rate, per, burst, cost, prefix)
        if isinstance(source, psycopg.Connection) or (_SyncPool is not None and isinstance(source, _SyncPool)):
            raise TypeError("AsyncRateLimiter needs a psycopg.AsyncConnection or AsyncConnectionPool (its takes "
                            "must not block the event loop): use RateLimiter with a Connection or ConnectionPool")
        if isinstance(source, psycopg.AsyncConnection):
            _autocommit(source, "AsyncRateLimiter")
        self._own = isinstance(source, str)
        self._opened = not self._own
        self._opening: Optional[asyncio.Lock] = None
        if self._own:
            from psycopg_pool import AsyncConnectionPool
            source = AsyncConnectionPool(source, min_size=1, max_size=pool_size, timeout=pool_timeout,
                                         kwargs={"autocommit": True}, open=False)
        self.source = source

    async def _open(self) -> None:
        if self._opening is None:
            self._opening = asyncio.Lock()
        async with self._opening:
            if not self._opened:
                await self.source.open()
                self._opened = True

    @contextlib.asynccontextmanager
    async def _connection(self):
        if isinstance(self.source, psycopg.AsyncConnection):
            yield self.source
            return
        if not self._opened:
            await self._open()
        async with self.source.connection() as conn:
            yield conn

    async def take(self, key: str, cost: Optional[int] = None) -> Decision:
        """Takes `cost` (default: the limiter's) units for `key`."""
        bucket = self.bucket(key)
        params = self.params(bucket, cost)
        async with self._connection() as conn:
            if conn is self.source:
                _autocommit(conn, "AsyncRateLimiter")  # still, at each take
            await ensure_version_async(conn)
            cur = await conn.execute(TAKE, params)
            row = await cur.fetchone()
        return self.decision(bucket, row)

    async def aclose(self) -> None:
        if self._own and self._opened:
            await self.source.close()
            self._opened = False
