"""Connections and intervals, shared by the modules."""
from __future__ import annotations

import datetime
import math
import weakref
from typing import Callable, Union

import psycopg
from psycopg.conninfo import make_conninfo

from .version import check_version, check_version_async

#: A libpq connection string ("" for the libpq environment: PGHOST, PGDATABASE, ...)
#: or a callable that returns a new psycopg.Connection.
Connect = Union[str, Callable[[], psycopg.Connection]]

Seconds = Union[int, float, datetime.timedelta]

_checked: "weakref.WeakSet[psycopg.Connection]" = weakref.WeakSet()
_checked_async: "weakref.WeakSet[psycopg.AsyncConnection]" = weakref.WeakSet()


def interval(value: Seconds, what: str = "a delay") -> datetime.timedelta:
    """Seconds (a number) or a timedelta, as a timedelta: TypeError for
    anything else, ValueError for NaN or an infinite or out-of-range number."""
    if isinstance(value, datetime.timedelta):
        return value
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{what} must be seconds (a number) or a timedelta, not {type(value).__name__}")
    if not math.isfinite(value):
        raise ValueError(f"{what} must be a finite number of seconds, not {value}")
    try:
        return datetime.timedelta(seconds=value)
    except OverflowError:
        raise ValueError(f"{what} is out of range: {value} seconds") from None


def positive(value: Seconds, what: str) -> datetime.timedelta:
    """interval(), refused unless over zero."""
    result = interval(value, what)
    if result <= datetime.timedelta(0):
        raise ValueError(f"{what} must be positive, not {value}")
    return result


def integer(value, what: str, least: int) -> int:
    """An int (not a bool) of at least `least`: TypeError or ValueError otherwise."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{what} must be an integer, not {type(value).__name__}")
    if value < least:
        raise ValueError(f"{what} must be at least {least}, not {value}")
    return value


def seconds(value: Seconds) -> float:
    return interval(value).total_seconds()


def connect(target: Connect) -> psycopg.Connection:
    """A new connection in autocommit, its extension version checked."""
    if callable(target):
        conn = target()
        if not isinstance(conn, psycopg.Connection):
            raise TypeError("the connection factory must return a psycopg.Connection")
        try:
            if not conn.autocommit:
                conn.autocommit = True      # refused when the factory left a transaction open
        except BaseException:
            conn.close()
            raise
    else:
        conn = psycopg.connect(target, autocommit=True)
    try:
        ensure_version(conn)
    except BaseException:
        conn.close()
        raise
    return conn


def ensure_version(conn: psycopg.Connection) -> None:
    """check_version, once per connection object."""
    if conn not in _checked:
        check_version(conn)
        _checked.add(conn)


async def ensure_version_async(conn: psycopg.AsyncConnection) -> None:
    """check_version_async, once per connection object."""
    if conn not in _checked_async:
        await check_version_async(conn)
        _checked_async.add(conn)


def conninfo_of(conn: psycopg.Connection) -> str:
    """A connection string for a new connection like `conn` (its parameters as
    libpq resolved them, the password included when one was given)."""
    params = {o.keyword.decode(): o.val.decode() for o in conn.pgconn.info if o.val is not None}
    return make_conninfo(**params)
