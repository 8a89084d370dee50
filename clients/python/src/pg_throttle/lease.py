"""A lease on a named pg_throttle lock, renewed while it is held.

    with pg_throttle.lease("", "nightly-report", ttl=30) as held:
        ...                  # pass held.fence to what the work writes to
        if held.lost.is_set(): ...

throttle.lock(name, ttl) takes the lock as a lease with a fence token (greater
than every token handed out before it on the server). A thread renews it
every ttl/3 with throttle.renew; when a renewal fails (the lease ran out and
another holder may have it, an operator reset it, or the database could not
answer) `lost` is set and the renewals stop: work that is still running may
overlap with the next holder, and should stop and not write with the old
fence. At exit the lock is released with throttle.unlock (a lost one is not).

The lease runs on a connection of its own (autocommit), whatever it is given:
a libpq connection string, a callable returning a new psycopg.Connection, or a
psycopg.Connection whose parameters are used to open another. Locks are not
transactional, and so the caller's transaction neither holds nor releases it.
"""
from __future__ import annotations

import contextlib
import logging
import threading
from typing import Iterator, Optional, Union

import psycopg

from ._conn import Connect, Seconds, connect, conninfo_of, interval, positive

log = logging.getLogger("pg_throttle.lease")


class LockBusy(Exception):
    """The lock was not had within `wait`: another holder has it."""

    def __init__(self, name: str):
        super().__init__(f"lock {name!r} is held by another holder")
        self.name = name


class LeaseLost(Exception):
    """Raised by Lease.check() once the lease is lost."""


class Lease:
    """A held lease: name, fence (the lock's fence token), ttl (a timedelta),
    lost (a threading.Event set when a renewal failed), renewals (how many
    succeeded)."""

    def __init__(self, name: str, fence: int, ttl):
        self.name, self.fence, self.ttl = name, fence, ttl
        self.lost = threading.Event()
        self.renewals = 0

    @property
    def token(self) -> int:
        return self.fence

    def check(self) -> None:
        """Raises LeaseLost when the lease is lost."""
        if self.lost.is_set():
            raise LeaseLost(f"the lease on {self.name!r} (fence {self.fence}) was lost")


def _renew(conn: psycopg.Connection, held: Lease, every: float, stopped: threading.Event) -> None:
    while not stopped.wait(every):
        try:
            renewed = conn.execute("SELECT throttle.renew(%s, %s, %s)", (held.name, held.fence, held.ttl)).fetchone()[0]
        except psycopg.Error as e:
            # The lease cannot be known to hold any more.
            log.error("renewing the lease on %r failed: %s", held.name, e)
            renewed = False
        if stopped.is_set():
            return
        if not renewed:
            log.warning("the lease on %r (fence %s) was lost", held.name, held.fence)
            held.lost.set()
            return
        held.renewals += 1


@contextlib.contextmanager
def lease(target: Union[Connect, psycopg.Connection], name: str, ttl: Seconds, *,
          wait: Optional[Seconds] = 0, holder: Optional[str] = None,
          renew_every: Optional[Seconds] = None) -> Iterator[Lease]:
    """Holds the lock `name` as a lease of `ttl` (seconds or a timedelta) for
    the with block, renewing it every renew_every (default ttl/3). wait: how
    long to wait for the lock (0: try once; None: no limit); LockBusy when it
    was not had. holder: shown in throttle.locks (default: the session's
    description). Raises VersionError as every entry point does; ValueError
    for a ttl or renew_every not over 0, or renew_every not under the ttl."""
    ttl = positive(ttl, "ttl")
    every = ttl / 3 if renew_every is None else positive(renew_every, "renew_every")
    if every >= ttl:
        raise ValueError(f"renew_every ({every}) must be shorter than the ttl ({ttl}): the lease would run out "
                         "before its renewal")
    every = every.total_seconds()
    if isinstance(target, psycopg.Connection):
        target = conninfo_of(target)
    conn = connect(target)
    try:
        fence = conn.execute("SELECT throttle.lock(%s, ttl => %s, wait => %s, holder => %s)",
                             (name, ttl, None if wait is None else interval(wait), holder)).fetchone()[0]
        if fence is None:
            raise LockBusy(name)
        held = Lease(name, fence, ttl)
        stopped = threading.Event()
        renewer = threading.Thread(target=_renew, args=(conn, held, every, stopped),
                                   name=f"pg_throttle-lease:{name}", daemon=True)
        renewer.start()
        try:
            yield held
        finally:
            stopped.set()
            renewer.join()
            if not held.lost.is_set():
                try:
                    conn.execute("SELECT throttle.unlock(%s, %s)", (name, fence))
                except psycopg.Error as e:
                    # It ends at its ttl anyway.
                    log.error("unlocking %r failed: %s", name, e)
    finally:
        conn.close()
