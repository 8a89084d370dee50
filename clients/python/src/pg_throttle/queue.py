"""Producers' helpers: schedule, schedule_many, cancel and reschedule.

They run on the caller's connection and inside its transaction, if one is
open (they neither commit nor roll back): an event scheduled in the same
transaction as the application's own writes exists exactly when they commit.
The first call on a connection checks the extension's version (VersionError).
"""
from __future__ import annotations

import datetime
from typing import Any, Iterable, List, Mapping, Optional, Union

import psycopg
from psycopg.types.json import Json, Jsonb

from ._conn import ensure_version

#: When an event becomes due: a datetime (timezone-aware, or the session's
#: TimeZone for a naive one), a timedelta from the database's throttle.now(),
#: or None: now.
RunAt = Union[datetime.datetime, datetime.timedelta, None]

_OPTIONS = ("group_key", "max_attempts", "priority", "on_duplicate", "concurrency_key")
_MANY_OPTIONS = ("max_attempts", "priority", "on_duplicate")


def _jsonb(payload: Any) -> Any:
    if payload is None:
        return Jsonb({})
    if isinstance(payload, (Json, Jsonb)):
        return payload
    return Jsonb(payload)


def _split(run_at: RunAt):
    """(absolute time or None, offset from throttle.now() or None)."""
    if run_at is None or isinstance(run_at, datetime.datetime):
        return run_at, None
    if isinstance(run_at, datetime.timedelta):
        return None, run_at
    raise TypeError(f"run_at must be a datetime, a timedelta or None, not {type(run_at).__name__}")


_RUN_AT = "coalesce(%s::timestamptz, throttle.now() + coalesce(%s::interval, '0'))"


def schedule(conn: psycopg.Connection, queue: str, item_key: str, run_at: RunAt = None,
             payload: Any = None, *, group_key: Optional[str] = None, max_attempts: Optional[int] = None,
             priority: Optional[int] = None, on_duplicate: Optional[str] = None,
             concurrency_key: Optional[str] = None) -> int:
    """throttle.schedule: schedules an event (or updates the pending one of
    `item_key`, as `on_duplicate` says) and returns its id. `payload` is any
    JSON value (default {}); options left None take the SQL defaults."""
    ensure_version(conn)
    at, offset = _split(run_at)
    given = {name: value for name, value in zip(_OPTIONS, (group_key, max_attempts, priority, on_duplicate,
                                                             concurrency_key)) if value is not None}
    named = "".join(f", {name} => %s" for name in given)
    row = conn.execute(f"SELECT throttle.schedule(%s, %s, {_RUN_AT}, %s{named})",
                       (queue, item_key, at, offset, _jsonb(payload), *given.values())).fetchone()
    return row[0]


def schedule_many(conn: psycopg.Connection, queue: str, events: Iterable[Mapping[str, Any]], *,
                  max_attempts: Optional[int] = None, priority: Optional[int] = None,
                  on_duplicate: Optional[str] = None) -> List[int]:
    """throttle.schedule_many: schedules a batch of events of one queue in one
    statement. Each event is a mapping with `item_key` and optionally `run_at`,
    `payload`, `group_key`, `concurrency_key`. Returns the ids in the order
    given (an item_key given twice: its id twice)."""
    events = list(events)
    if not events:
        return []
    ensure_version(conn)
    unknown = {k for e in events for k in e} - {"item_key", "run_at", "payload", "group_key", "concurrency_key"}
    if unknown:
        raise TypeError(f"schedule_many: unknown event field(s) {sorted(unknown)}")
    keys = [e["item_key"] for e in events]
    times = [_split(e.get("run_at")) for e in events]
    given = {name: value for name, value in zip(_MANY_OPTIONS, (max_attempts, priority, on_duplicate))
             if value is not None}
    groups = [e.get("group_key") for e in events]
    concurrency = [e.get("concurrency_key") for e in events]
    arrays = {"payloads": [_jsonb(e.get("payload")) for e in events]}
    if any(g is not None for g in groups):
        arrays["group_keys"] = groups
    if any(c is not None for c in concurrency):
        arrays["concurrency_keys"] = concurrency
    casts = {"payloads": "jsonb[]", "group_keys": "text[]", "concurrency_keys": "text[]"}
    named = "".join(f", {name} => %s::{casts[name]}" for name in arrays)
    named += "".join(f", {name} => %s" for name in given)
    row = conn.execute(
        f"""SELECT throttle.schedule_many(%s, %s::text[],
                ARRAY(SELECT coalesce(t.at, throttle.now() + coalesce(t.off, '0'))
                      FROM unnest(%s::timestamptz[], %s::interval[]) WITH ORDINALITY AS t(at, off, n)
                      ORDER BY t.n){named})""",
        (queue, keys, [t[0] for t in times], [t[1] for t in times], *arrays.values(),
         *given.values())).fetchone()
    return list(row[0])


def cancel(conn: psycopg.Connection, queue: str, item_key: str) -> bool:
    """throttle.cancel: cancels the pending event `item_key`; False when the
    queue has no pending event with that key (a claimed one is not cancelled)."""
    ensure_version(conn)
    return conn.execute("SELECT throttle.cancel(%s, %s)", (queue, item_key)).fetchone()[0]


def reschedule(conn: psycopg.Connection, queue: str, item_key: str, run_at: RunAt) -> bool:
    """throttle.reschedule: moves the pending event `item_key` to `run_at`
    (its payload, priority and attempts stay); False when there is none."""
    ensure_version(conn)
    at, offset = _split(run_at)
    return conn.execute(f"SELECT throttle.reschedule(%s, %s, {_RUN_AT})",
                        (queue, item_key, at, offset)).fetchone()[0]
