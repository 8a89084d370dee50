"""The queue worker runtime: claim, work, complete or fail.

A Worker connects in autocommit (a claim must commit to be seen by others, and
a group is freed when its complete commits), LISTENs on the queue's channel
(the channel is the queue's name: pg_throttle NOTIFYs it whenever an event
becomes claimable, also when a run_at ahead, a retry's backoff or a lease
falls due) and also polls every `poll` seconds, since a NOTIFY is only a hint.

The main loop (run()) claims with throttle.claim, or throttle.claim_group
with groups=True, on its own connection, and hands each claim to one of
`concurrency` threads, each with a connection of its own. While a claim is
worked on, a heartbeat thread extends it every lease/3. If extend renews
fewer events than it was given, the claim was lost (the lease ran out or an
operator released the group): another worker may have the events now, so
the handler is told (context.lost, context.cancelled) and they are never
completed. So does a complete or fail that ends fewer events than it was
given. After a failure in a group claim the worker extends the claim's later
events before it handles them: in a group in strict order the failure handed
them back (they run after the failed event's retry), and extend renewing
fewer than it was given says so. An ungrouped claim's events are never handed
back by a fail, so it skips that extend.

stop() (or SIGTERM with install_signal_handlers): claim no more, finish the
events already claimed, return. stop(abort=True) (or a second SIGTERM, or
the first with on_term="handback"): cancel the work at once and hand the
events back with fail(..., retry_in 0), so another worker gets them at once:
first the one being worked on (in a group in strict order, that sends the
claim's later ones back to pending, their attempt not counted), then, in one
more fail, whatever the claim still holds. A handler that has not returned
abort_grace seconds after the abort (it ignores context.cancelled) has its
events handed back by run() itself, which then returns and leaves that
thread behind (a daemon): whatever it returns later, its events are never
completed. A claim that returns after the abort (it waited on a lock) is
handed back at once, never worked on. A statement of a slot that still runs
a second after abort_grace (a complete waiting on a lock) is cancelled
instead, its claim given up and left to its lease, so that run() returns.
A signal after the abort exits the process at once. Otherwise nothing is
left claimed until its lease runs out. The hand-back counts an
attempt, as any fail: an event on its last attempt is dead after it.

What the database refuses in a fail does not end the worker: the error's
text is cleaned first (no NUL, what the connection's encoding cannot carry
replaced, at most MAX_ERROR_CHARS), RetryLater's delay is clamped to 0 ..
MAX_RETRY_IN, and a fail still refused is made again with a plain message
and the queue's backoff. A slot whose connection was lost (the heartbeat's
extend failed, or the server ended the session while it was idle) is
reconnected before it is given another claim.

A TRANSIENT SQL error (40001, 40P01, 55P03, 57014: the statement rolled
back, and may well work when sent again) on a connection that still works
is tried again: a claim after a pause with jitter, the heartbeat's extend at
its next beat, a complete or fail up to END_TRIES times after a short pause.
Each claim has a local deadline: lease less lease_margin from when the
claim, or the last extend that renewed every event, was sent. The heartbeat
gives the claim up (lost) once it passes with no renewal, and no complete or
fail is tried again past it. Any other SQL error while ending a claim's
events leaves them to their lease (another worker takes them over then) and
the worker goes on. A lost connection of the main loop (which claims), any
other SQL error of a claim, or a slot that cannot reconnect, ends run() with
the error: run it under a supervisor that restarts it (its claims are taken
over when their leases end).
"""
from __future__ import annotations

import datetime
import logging
import os
import queue as queue_module
import math
import random
import select
import signal
import socket
import threading
import time
from typing import Any, Callable, Dict, List, Optional

import psycopg
from psycopg import sql
from psycopg.rows import dict_row

from ._conn import Connect, Seconds, connect, integer, interval, positive, seconds

log = logging.getLogger("pg_throttle.worker")

#: The longest retry delay: RetryLater clamps a longer one (run_at must stay
#: in PostgreSQL's timestamp range), and Worker refuses a longer retry_in.
MAX_RETRY_IN = datetime.timedelta(days=36525)

#: The longest error text given to throttle.fail, in characters.
MAX_ERROR_CHARS = 4000
_TRUNCATED = " ...[truncated]"

#: SQLSTATEs of a statement that rolled back and may well succeed when sent
#: again on the same, healthy session: a serialization failure (40001), a
#: deadlock (40P01), a lock not available (55P03, lock_timeout), a statement
#: cancelled (57014, statement_timeout).
TRANSIENT = frozenset({"40001", "40P01", "55P03", "57014"})

#: How many times a complete or fail is sent when it raises a TRANSIENT error.
END_TRIES = 4


def _transient(error: BaseException, conn: Optional[psycopg.Connection]) -> bool:
    """Whether `error` is a TRANSIENT SQL error on a connection that still works."""
    return (isinstance(error, psycopg.Error) and getattr(error, "sqlstate", None) in TRANSIENT
            and conn is not None and not conn.closed and not conn.broken)


def _brief(error: BaseException) -> str:
    """An SQL error's primary message, without its CONTEXT (for a log line)."""
    try:
        primary = error.diag.message_primary  # type: ignore[attr-defined]
    except Exception:  # noqa: BLE001 - not a server's error
        primary = None
    return primary or _safe_str(error)


def _backoff(attempt: int, base: float, cap: float) -> float:
    """A retry's pause: base * 2^(attempt - 1), at most cap, times a random
    factor from 0.5 to 1.5 (so that workers that collided do not collide
    again), in seconds."""
    return min(base * 2 ** (attempt - 1), cap) * (0.5 + random.random())


def lease_margin(lease: float) -> float:
    """The margin, in seconds, before a lease of `lease` seconds may end at
    which the worker gives a claim up when no extend renewed it: a sixth of
    the lease, at most 2 s (as the Node client)."""
    return min(lease / 6, 2.0)

#: An event: a dict of throttle.event's columns (id, queue, item_key,
#: group_key, payload, attempts, claim_token, ...).
Event = Dict[str, Any]


class Cancelled(Exception):
    """Raised by a handler that stopped early because context.cancelled was
    set (the claim was lost, or the worker is aborting): its events are
    handed back unless the claim was lost."""


def retry_delay(value: Seconds) -> datetime.timedelta:
    """A retry delay (seconds or a timedelta) clamped to 0 .. MAX_RETRY_IN: a
    negative one means now, an infinite or huge one the longest. TypeError
    when not a number or a timedelta, ValueError for NaN."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        if math.isnan(value):
            raise ValueError("retry_in must be a number of seconds, not NaN")
        value = min(max(value, 0), MAX_RETRY_IN.total_seconds())
    return min(max(interval(value, "retry_in"), datetime.timedelta(0)), MAX_RETRY_IN)


def _safe_str(value: Any) -> str:
    try:
        return str(value)
    except Exception as e:  # noqa: BLE001 - a __str__ that raises must not end the worker
        return f"<str() raised {type(e).__name__}>"


def _ascii(text: str) -> str:
    return text.replace("\x00", "").encode("ascii", "replace").decode("ascii")


def error_text(error: BaseException, encoding: str = "utf-8") -> str:
    """"Type: message" for throttle.fail, as PostgreSQL can store it: NUL
    removed, at most MAX_ERROR_CHARS characters, and what `encoding` (the
    connection's) cannot carry (a lone surrogate, say) replaced by "?"."""
    text = f"{type(error).__name__}: {_safe_str(error)}".replace("\x00", "")
    if len(text) > MAX_ERROR_CHARS:
        text = text[:MAX_ERROR_CHARS - len(_TRUNCATED)] + _TRUNCATED
    try:
        return text.encode(encoding, "replace").decode(encoding)
    except LookupError:
        return _ascii(text)


class RetryLater(Exception):
    """Raised by a handler to fail the event(s) with a retry delay of its own
    (seconds or a timedelta) instead of the worker's retry_in; a negative
    delay is taken as 0 (now), an infinite or longer one as MAX_RETRY_IN."""

    def __init__(self, retry_in: Seconds, message: str = "retry later"):
        super().__init__(message)
        self.retry_in = retry_delay(retry_in)


class Context:
    """What a handler gets besides its event(s), for one claim.

    worker: the Worker; name: the worker's name (claimed_by); queue;
    token / fence: the claim's claim_token, a fence token (greater than any
    handed out before it) to pass to systems that reject stale writers;
    events: every event of the claim; lost: a threading.Event set when the
    claim was lost (never complete: another worker may have the events), or
    given up by the worker (handed back after abort_grace, or left to its
    lease after an error in the database);
    cancelled: a threading.Event set when the claim was lost or the worker is
    aborting: long work should check it (or wait on it) and raise Cancelled.
    """

    def __init__(self, worker: "Worker", claim: "_Claim", cancelled: threading.Event, events: List[Event]):
        self.worker = worker
        self.name = worker.name
        self.queue = worker.queue
        self.token = self.fence = claim.token
        self.events = events
        self.lost = claim.lost
        self.cancelled = cancelled

    @property
    def stopping(self) -> bool:
        """Whether the worker was asked to stop (it finishes this claim first)."""
        return self.worker.stopping

    def check(self) -> None:
        """Raises Cancelled when the work should stop."""
        if self.cancelled.is_set():
            raise Cancelled()

    def sleep(self, secs: Seconds) -> None:
        """Sleeps, or raises Cancelled as soon as the work should stop."""
        if self.cancelled.wait(seconds(secs)):
            raise Cancelled()


class _Claim:
    """The events of one claim that this worker still holds, and its local
    deadline: the lease runs from when the claim, or the last extend that
    renewed every event, was sent (renewed_at, time.monotonic()); the claim
    is given up once lease less lease_margin has passed since then with no
    newer renewal."""

    def __init__(self, token: int, ids: List[int], sent_at: float, lease: float):
        self.token = token
        self.held = list(ids)      # not yet completed, failed or handed back
        self.lost = threading.Event()
        self.renewed_at = sent_at
        self.keep = lease - lease_margin(lease)

    def renewed(self, sent_at: float) -> None:
        self.renewed_at = max(self.renewed_at, sent_at)

    def left(self) -> float:
        """Seconds until the local deadline (0 or less: passed)."""
        return self.renewed_at + self.keep - time.monotonic()


class _Slot:
    """One of the worker's `concurrency` threads, with its connection. The
    heartbeat must read the claim's held events and extend them as one step,
    so that a complete in between does not look like a lost claim: `lock`."""

    def __init__(self, worker: "Worker", index: int):
        self.worker, self.index = worker, index
        self.conn: Optional[psycopg.Connection] = None
        self.pid: Optional[int] = None                   # its backend's, for pg_cancel_backend
        # Reentrant: the hand-back of a stuck claim (Worker._give_up) holds it
        # across the fails it runs, so that the slot's own thread cannot end
        # the claim's events in between.
        self.lock = threading.RLock()
        self.inbox: "queue_module.SimpleQueue[Optional[tuple]]" = queue_module.SimpleQueue()
        self.cancel: Optional[threading.Event] = None    # the current claim's
        # The current claim: set by run() when it hands the claim over, so
        # that a hand-back after abort_grace (Worker._give_up) finds it even
        # before the slot's thread has started on it.
        self.claim: Optional[_Claim] = None
        self.thread = threading.Thread(target=self.run, name=f"pg_throttle-worker-{index}", daemon=True)

    def call(self, statement: str, params=None):
        """Runs a statement that returns one value (the caller holds the lock)."""
        return self.conn.execute(statement, params).fetchone()[0]

    def connect(self) -> None:
        self.conn = connect(self.worker.conninfo)
        self.pid = self.conn.info.backend_pid

    def run(self) -> None:
        while True:
            item = self.inbox.get()
            if item is None:
                return
            events, claim = item
            try:
                self.worker._work_on(self, events, claim)
            except psycopg.Error as e:
                # A complete or fail the database did not take (the connection
                # was lost, or it refused even the plain retry of a fail): the
                # claim's events are left to their lease, and another worker
                # takes them over then. The worker goes on; a lost connection
                # is reopened before this slot is given another claim.
                log.error("worker %s: ending the events of a claim failed (%s: %s): they are left to their "
                          "lease", self.worker.name, type(e).__name__, _safe_str(e))
            except BaseException as e:  # noqa: BLE001 - ends the worker, as run() says
                self.worker._failed(e)
            finally:
                self.worker._slot_free(self)


class _Heartbeat(threading.Thread):
    """Extends a claim every lease/3 until stopped; marks it lost (and asks
    the work to stop) when extend renews fewer events than it was given, or
    raises an error other than a TRANSIENT one on a working connection, or
    when extends refused by TRANSIENT errors (each tried again at the next
    beat, the deadline at the latest) reach the claim's local deadline."""

    def __init__(self, slot: _Slot, claim: _Claim, cancel: threading.Event):
        super().__init__(daemon=True, name=f"pg_throttle-heartbeat-{slot.index}")
        self.slot, self.claim, self.cancel = slot, claim, cancel
        self.stopped = threading.Event()

    def run(self) -> None:
        worker = self.slot.worker
        every = worker.lease.total_seconds() / 3
        wait = every
        while not self.stopped.wait(wait):
            wait = every
            claim = self.claim
            with self.slot.lock:
                if self.stopped.is_set() or claim.lost.is_set() or not claim.held:
                    return
                sent_at = time.monotonic()
                try:
                    renewed = self.slot.call("SELECT throttle.extend(%s, %s, %s)",
                                             (claim.held, claim.token, worker.lease))
                except psycopg.Error as e:
                    if _transient(e, self.slot.conn) and claim.left() > 0:
                        # Rolled back, the session works, the lease holds
                        # still: again at the next beat, or at the deadline
                        # (an extend that renews everything then still
                        # proves the claim held; one that fails gives it up).
                        wait = min(every, claim.left())
                        log.warning("extend of claim %s raised %s (%s): trying again in %.1f s",
                                    claim.token, e.sqlstate, _brief(e), wait)
                        continue
                    if _transient(e, self.slot.conn):
                        log.warning("claim %s lost (no extend renewed it within its lease of %s s less %s s): "
                                    "stopping its work", claim.token, worker.lease.total_seconds(),
                                    lease_margin(worker.lease.total_seconds()))
                        claim.lost.set()
                        self.cancel.set()
                        return
                    # Cannot tell whether the lease holds: better stop than
                    # work on events another worker may have by now. (A lost
                    # connection is reopened before the slot's next claim.)
                    log.error("extend failed: %s", _safe_str(e))
                    renewed = -1
                if renewed < len(claim.held):
                    log.warning("claim %s lost (extend renewed %s of %s events): stopping its work",
                                claim.token, renewed, len(claim.held))
                    claim.lost.set()
                    self.cancel.set()
                    return
                claim.renewed(sent_at)


class Worker:
    """Works on the events of one queue; see the module's documentation.

    queue: the queue's name. handler(event, context) works on one event (a
    dict of throttle.event's columns): it returns on success (the event is
    completed) and raises on failure (the event is failed with the error's
    text, to be retried after retry_in or the queue's backoff; RetryLater
    gives a delay of its own). With batch=True it is handler(events,
    context), called once per claim with the events the claim holds.

    conninfo: a libpq connection string ("" for the libpq environment) or a
    callable returning a new psycopg.Connection; the worker opens
    concurrency + 1 connections. groups: claim whole groups with claim_group.
    concurrency: claims worked on at once, each in its own thread. max:
    events per claim (default 1 for claim, as throttle.claim's own default;
    every due event of the group for claim_group). lease: seconds (or a timedelta) a claim holds without
    extend. poll: seconds between claims when no NOTIFY comes. retry_in:
    seconds before a failed event is retried (None: the queue's backoff; 0 to
    MAX_RETRY_IN).
    name: the worker's name in claimed_by and completed_by (default
    host:pid). listen: LISTEN on the queue's channel (off behind a pooler in
    transaction mode: poll only). install_signal_handlers: run() handles
    SIGTERM and SIGINT (run() must then be called in the main thread): the
    first finishes the claims held (or hands them back, with
    on_term="handback"), the second hands them back. on_ready(worker): called
    by run() once it listens and is about to claim. abort_grace: seconds an
    aborted handler has to return before run() hands its events back itself
    and returns without it.

    Options are checked here: TypeError or ValueError rather than a failure
    inside run().
    """

    HANDED_BACK = "worker stopping: handed back"

    def __init__(self, queue: str, handler: Callable[..., Any], *, conninfo: Connect = "",
                 groups: bool = False, concurrency: int = 1, max: Optional[int] = None,  # noqa: A002
                 lease: Seconds = 30, poll: Seconds = 60, retry_in: Optional[Seconds] = None,
                 name: Optional[str] = None, batch: bool = False, listen: bool = True,
                 install_signal_handlers: bool = False, on_term: str = "finish",
                 on_ready: Optional[Callable[["Worker"], Any]] = None, abort_grace: Seconds = 2):
        if not callable(handler):
            raise TypeError("handler must be callable")
        integer(concurrency, "concurrency", 1)
        if max is not None:
            integer(max, "max", 1)
        if on_term not in ("finish", "handback"):
            raise ValueError("on_term must be 'finish' or 'handback'")
        self.queue, self.handler, self.conninfo = queue, handler, conninfo
        self.groups, self.concurrency, self.max, self.batch = groups, concurrency, max, batch
        self.lease = positive(lease, "lease")
        self.poll = positive(poll, "poll").total_seconds()
        self.retry_in = None if retry_in is None else interval(retry_in, "retry_in")
        if self.retry_in is not None and not datetime.timedelta(0) <= self.retry_in <= MAX_RETRY_IN:
            raise ValueError(f"retry_in must be 0 to {MAX_RETRY_IN.days} days (or None), not {retry_in}")
        self.abort_grace = interval(abort_grace, "abort_grace").total_seconds()
        if self.abort_grace < 0:
            raise ValueError(f"abort_grace must be 0 or more, not {abort_grace}")
        self.name = name or f"{socket.gethostname()}:{os.getpid()}"
        self.listen = listen
        self.install_signal_handlers, self.on_term, self.on_ready = install_signal_handlers, on_term, on_ready
        #: Set once run() listens and claims.
        self.ready = threading.Event()
        #: The exception that ended a run() started with start(), else None.
        self.error: Optional[BaseException] = None
        self._stopping = threading.Event()       # claim no more
        self._hard_stop = threading.Event()      # hand back what is held, now
        self._abort_at: Optional[float] = None   # when (time.monotonic()), for abort_grace
        self._hinted = False                     # a NOTIFY came in during a statement
        self._mutex = threading.Lock()
        self._idle: List[_Slot] = []
        self._slots: List[_Slot] = []
        self._fatal: Optional[BaseException] = None
        self._thread: Optional[threading.Thread] = None
        self._ran = False
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)

    # --- control ---------------------------------------------------------

    @property
    def stopping(self) -> bool:
        return self._stopping.is_set()

    def stop(self, abort: bool = False, wait: bool = True) -> None:
        """Claim no more; with abort, also cancel the work and hand back
        what is held (run() does it itself for a handler still running
        abort_grace seconds later). With wait (and a worker started by
        start(), stopped from another thread), returns once it has stopped.
        Safe to call from a signal handler with wait=False."""
        if abort:
            if self._abort_at is None:
                self._abort_at = time.monotonic()
            self._hard_stop.set()
            for slot in self._slots:
                cancel = slot.cancel
                if cancel is not None:
                    cancel.set()
        self._stopping.set()
        self._wake()
        thread, current = self._thread, threading.current_thread()
        # Not from the worker's own threads (a handler): they are what it waits for.
        if wait and thread is not None and thread is not current and all(s.thread is not current
                                                                         for s in self._slots):
            thread.join()

    def start(self) -> "Worker":
        """Runs run() in a thread (without signal handlers); returns once the
        worker listens, or raises what ended it before."""
        if self.install_signal_handlers:
            raise ValueError("install_signal_handlers needs run() in the main thread, not start()")

        def target():
            try:
                self.run()
            except BaseException as e:  # noqa: BLE001 - kept for start() and the caller
                self.error = e

        self._thread = threading.Thread(target=target, name=f"pg_throttle-worker:{self.queue}", daemon=True)
        self._thread.start()
        while not self.ready.wait(0.05):
            if not self._thread.is_alive():
                self._thread.join()
                if self.error is not None:
                    raise self.error
                break
        return self

    def join(self, timeout: Optional[float] = None) -> bool:
        """Waits for a worker started by start() to end; whether it has."""
        if self._thread is None:
            return True
        self._thread.join(timeout)
        return not self._thread.is_alive()

    def _wake(self) -> None:
        try:
            self._wake_w.send(b"x")
        except OSError:             # full (it will wake anyway) or closed
            pass

    def _on_signal(self, signum, _frame) -> None:
        if self._hard_stop.is_set():
            # Already aborting: the signal's default action, at once (the
            # events not yet handed back are taken over after their lease).
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)
            return
        self.stop(abort=self.stopping or self.on_term == "handback", wait=False)

    # --- the main loop ---------------------------------------------------

    def run(self) -> None:
        """Claims and works until stop(); raises what ended it otherwise
        (VersionError, a lost connection, an error from a slot)."""
        if self._ran:
            raise RuntimeError("a Worker runs once: make a new one")
        self._ran = True
        previous = {}
        if self.install_signal_handlers:
            for signum in (signal.SIGTERM, signal.SIGINT):
                previous[signum] = signal.signal(signum, self._on_signal)
        conn = None
        try:
            conn = connect(self.conninfo)
            conn.add_notify_handler(self._on_notify)
            for index in range(self.concurrency):
                slot = _Slot(self, index)
                slot.connect()
                self._slots.append(slot)
                self._idle.append(slot)
                slot.thread.start()
            if self.listen:
                conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(self.queue)))
            self.ready.set()
            if self.on_ready is not None:
                self.on_ready(self)
            self._loop(conn)
        finally:
            self._stopping.set()
            for slot in self._slots:
                slot.inbox.put(None)
            self._join_slots(conn)
            for slot in self._slots:
                # A slot left behind ends nothing on it any more (_give_up).
                # One whose statement still runs though cancelled keeps its
                # connection (closing it under the statement is unsafe): its
                # thread is a daemon.
                if not slot.lock.acquire(timeout=self._CANCEL_WAIT):
                    log.error("worker %s: a statement of slot %s still runs after its cancel: leaving its "
                              "connection to its thread", self.name, slot.index)
                    continue
                try:
                    if slot.conn is not None:
                        slot.conn.close()
                finally:
                    slot.lock.release()
            if conn is not None:
                conn.close()
            for signum, handler in previous.items():
                signal.signal(signum, handler)
            self._wake_r.close()
            self._wake_w.close()
        if self._fatal is not None:
            raise self._fatal

    def _on_notify(self, _notify) -> None:
        self._hinted = True

    def _loop(self, conn: psycopg.Connection) -> None:
        failures = 0                        # TRANSIENT errors of claim in a row
        lease = self.lease.total_seconds()
        while not self._stopping.is_set():
            with self._mutex:
                slot = self._idle.pop() if self._idle else None
            if slot is None:                # every slot busy: until one is free
                self._wait(None, None)
                continue
            claiming = False
            try:
                self._check_connection(slot)    # never claim for a slot that cannot complete
                claiming = True
                sent_at = time.monotonic()
                events = self._claim(conn)
            except BaseException as e:
                with self._mutex:
                    self._idle.append(slot)
                if not (claiming and _transient(e, conn)):
                    raise
                # The claim rolled back and the session works: claim again,
                # after a pause with jitter (stop() cuts it short).
                failures += 1
                pause = _backoff(failures, 0.05, min(2.0, self.poll))
                log.warning("worker %s: claim raised %s (%s): claiming again in %.2f s", self.name,
                            e.sqlstate, _brief(e), pause)
                self._wait(None, pause)
                continue
            failures = 0
            if events and self._hard_stop.is_set():
                # Aborted while the claim was in flight: no slot starts on it
                # (run() may close the slots' connections before one would).
                self._hand_back_unworked(conn, events)
                with self._mutex:
                    self._idle.append(slot)
                continue
            if events:
                claim = _Claim(events[0]["claim_token"], [e["id"] for e in events], sent_at, lease)
                slot.claim = claim
                slot.inbox.put((events, claim))
                continue
            with self._mutex:
                self._idle.append(slot)
            if self._hinted:                # a NOTIFY arrived while claiming: look again
                self._hinted = False
                continue
            # Sleep until a NOTIFY arrives (the next claim reads it), stop()
            # or a signal, or the poll interval passes.
            self._wait(conn, self.poll)

    def _wait(self, conn: Optional[psycopg.Connection], timeout: Optional[float]) -> None:
        if self._stopping.is_set():
            return
        fds = [self._wake_r] + ([conn.fileno()] if conn is not None else [])
        ready, _, _ = select.select(fds, [], [], timeout)
        if self._wake_r in ready:
            try:
                while self._wake_r.recv(64):
                    pass
            except (BlockingIOError, OSError):
                pass

    #: Seconds run() waits for a slot's statement after abort_grace, and again
    #: after cancelling it, before it leaves the slot behind.
    _CANCEL_WAIT = 1.0

    def _hand_back_unworked(self, conn: psycopg.Connection, events: List[Event]) -> None:
        """Hands back, on the main connection, the events of a claim that
        returned after an abort: the first event alone (in a group in strict
        order its fail sends the later ones back to pending without counting
        an attempt), then the rest."""
        ids, token, zero = [e["id"] for e in events], events[0]["claim_token"], datetime.timedelta(0)
        log.info("worker %s: a claim returned %s event(s) after the abort: handing them back", self.name,
                 len(ids))
        try:
            conn.execute("SELECT throttle.fail(%s, %s, %s, %s)", (ids[:1], token, self.HANDED_BACK, zero))
            rest = ids[1:]
            if rest:
                ended = conn.execute("SELECT throttle.fail(%s, %s, %s, %s)",
                                     (rest, token, self.HANDED_BACK, zero)).fetchone()[0]
                if 0 <= ended < len(rest):
                    log.info("claim %s: %s of its %s later events were no longer held (in a group in strict "
                             "order the first one's fail sent them back to pending; else the lease ended)",
                             token, len(rest) - ended, len(rest))
        except psycopg.Error as e:
            log.error("worker %s: handing back failed (%s): the events are left to their lease",
                      self.name, _safe_str(e))

    def _join_slots(self, conn: Optional[psycopg.Connection]) -> None:
        """Waits for the slots' threads to end; once abort_grace has passed
        since an abort, hands back the claims of those still running instead
        and returns without them."""
        while True:
            busy = [slot for slot in self._slots if slot.thread.is_alive()]
            if not busy:
                return
            if self._hard_stop.is_set() and time.monotonic() >= (self._abort_at or 0) + self.abort_grace:
                for slot in busy:
                    self._give_up(slot, conn)
                return
            busy[0].thread.join(0.05)

    def _cancel_statement(self, conn: Optional[psycopg.Connection], slot: _Slot) -> None:
        """Cancels the statement a slot's connection runs: pg_cancel_backend
        on the main connection, else a cancel request of its own."""
        try:
            if conn is None or slot.pid is None:
                raise psycopg.OperationalError("no main connection")
            conn.execute("SELECT pg_cancel_backend(%s)", (slot.pid,))
        except psycopg.Error as e:
            log.warning("worker %s: pg_cancel_backend failed (%s): sending a cancel request", self.name,
                        _safe_str(e))
            try:
                slot.conn.cancel()
            except Exception as e2:  # noqa: BLE001 - run() returns all the same
                log.error("worker %s: cancelling slot %s failed: %s", self.name, slot.index, _safe_str(e2))

    def _give_up(self, slot: _Slot, conn: Optional[psycopg.Connection] = None) -> None:
        """Hands back the events of a claim whose handler did not return
        within abort_grace, and makes sure nothing ends them afterwards: the
        claim is marked lost under the slot's lock, which the heartbeat and
        every complete or fail take first. When a statement of the slot's
        holds the lock _CANCEL_WAIT seconds more (a complete waiting on a
        lock), the claim is marked lost at once (nothing of it is sent, or
        sent again, afterwards; its events are left to their lease) and the
        statement is cancelled."""
        claim = slot.claim
        if claim is None:
            return
        if not slot.lock.acquire(timeout=self._CANCEL_WAIT):
            claim.lost.set()
            log.warning("worker %s: a statement of slot %s still runs %s s after the abort: cancelling it; its "
                        "claim's events are left to their lease", self.name, slot.index, self.abort_grace)
            self._cancel_statement(conn, slot)
            return
        try:                        # the lock is held
            if claim.lost.is_set() or not claim.held:
                return
            log.warning("worker %s: a handler did not return %s s after the abort: handing back its claim's "
                        "%s event(s) and leaving its thread", self.name, self.abort_grace, len(claim.held))
            try:
                self._hand_back(slot, claim)
            except psycopg.Error as e:
                log.error("worker %s: handing back failed (%s): the events are left to their lease",
                          self.name, _safe_str(e))
            claim.lost.set()
        finally:
            slot.lock.release()

    def _check_connection(self, slot: _Slot) -> None:
        """Reconnects an idle slot whose connection is lost: closed, broken
        (a statement on it failed so), or readable while idle, which is the
        server's goodbye (or EOF) when a ping says so. Raises when it cannot
        reconnect."""
        conn = slot.conn
        if conn is not None and not conn.closed and not conn.broken:
            try:
                readable = select.select([conn.fileno()], [], [], 0)[0]
            except (OSError, ValueError):
                readable = True
            if not readable:
                return
            try:
                conn.execute("SELECT 1")
                return
            except psycopg.Error:
                pass
        log.warning("worker %s: the connection of slot %s was lost: reconnecting", self.name, slot.index)
        if conn is not None:
            conn.close()
        slot.conn = None
        slot.connect()

    def _slot_free(self, slot: _Slot) -> None:
        with self._mutex:
            self._idle.append(slot)
        self._wake()

    def _failed(self, error: BaseException) -> None:
        log.error("worker %s: %s: %s", self.name, type(error).__name__, _safe_str(error))
        if self._fatal is None:
            self._fatal = error
        self.stop(wait=False)

    def _claim(self, conn: psycopg.Connection) -> List[Event]:
        function = "claim_group" if self.groups else "claim"
        limit = self.max
        if limit is None and not self.groups:
            limit = 1           # throttle.claim's default, and the Node client's
        with conn.cursor(row_factory=dict_row) as cur:
            cur.execute(f"SELECT * FROM throttle.{function}(%s, %s, %s, %s)",
                        (self.queue, self.name, self.lease, limit))
            return cur.fetchall()

    # --- one claim -------------------------------------------------------

    def _end(self, slot: _Slot, claim: _Claim, ids: List[int], function: str, *extra) -> int:
        """Runs throttle.complete or throttle.fail (with `extra`: the error and
        retry_in) for events of the claim, unless the claim was lost; how many
        it ended (-1: lost before). A TRANSIENT error is sent again, END_TRIES
        times at most, after a short pause (the slot's lock released), while
        the connection works, the claim is not lost and its local deadline
        has not passed."""
        placeholders = ", ".join(["%s"] * (2 + len(extra)))
        statement = f"SELECT throttle.{function}({placeholders})"
        attempt = 0
        while True:
            attempt += 1
            with slot.lock:
                if claim.lost.is_set():
                    return -1
                ids = [event_id for event_id in ids if event_id in claim.held]
                if not ids:
                    return -1
                try:
                    ended = self._end_call(slot, claim, statement, ids, function, extra)
                except psycopg.Error as e:
                    if attempt >= END_TRIES or claim.lost.is_set() or claim.left() <= 0 \
                            or not _transient(e, slot.conn):
                        raise
                    pause = min(_backoff(attempt, 0.05, 0.4), max(claim.left(), 0))
                    log.warning("%s of event(s) %s raised %s (%s): sending it again in %.2f s", function, ids,
                                e.sqlstate, _brief(e), pause)
                else:
                    for event_id in ids:
                        claim.held.remove(event_id)
                    return ended
            time.sleep(pause)

    def _end_call(self, slot: _Slot, claim: _Claim, statement: str, ids: List[int], function: str, extra) -> int:
        try:
            return slot.call(statement, (ids, claim.token, *extra))
        except (psycopg.DataError, psycopg.ProgrammingError, ValueError) as e:
            # The error's text or the delay refused, though cleaned: fail
            # once more with a plain message and the queue's backoff, so
            # that the event cannot end every worker that claims it.
            if function != "fail" or slot.conn.closed or slot.conn.broken:
                raise
            sqlstate = getattr(e, "sqlstate", None)
            reason = f"SQLSTATE {sqlstate}" if sqlstate else type(e).__name__
            message = f"{_ascii(str(extra[0]).split(':', 1)[0])} (its error could not be recorded: {reason})"
            log.error("throttle.fail refused the error of event(s) %s (%s): failing with %r and the queue's "
                      "backoff instead", ids, _safe_str(e), message)
            return slot.call(statement, (ids, claim.token, message, None))

    def _end_one(self, slot: _Slot, claim: _Claim, event_id: int, function: str, *extra) -> None:
        ended = self._end(slot, claim, [event_id], function, *extra)
        if ended == 0:               # fenced: the lease ran out or the group was released
            claim.lost.set()
            log.warning("event %s: %s changed nothing, the claim was lost", event_id, function)

    def _still_held(self, slot: _Slot, claim: _Claim) -> bool:
        """After a failure in a group claim: whether the claim still holds its
        later events. In a group in strict order, fail sends the claim's later
        events back to pending, to run after the failed one's retry: handling
        them now would run them out of order (and complete would refuse them).
        extend renews only the events the claim still holds, so it tells. As
        in the heartbeat, a TRANSIENT error is tried again (after a short
        pause) until the claim's local deadline."""
        attempt = 0
        while True:
            attempt += 1
            with slot.lock:
                if claim.lost.is_set():
                    return False
                if not claim.held:
                    return True
                sent_at = time.monotonic()
                try:
                    renewed = slot.call("SELECT throttle.extend(%s, %s, %s)",
                                        (claim.held, claim.token, self.lease))
                except psycopg.Error as e:
                    if not (_transient(e, slot.conn) and claim.left() > 0):
                        # The lease cannot be known to hold.
                        log.error("extend failed: %s", _safe_str(e))
                        claim.lost.set()
                        return False
                    pause = min(_backoff(attempt, 0.05, 1.0), claim.left())
                    log.warning("extend of claim %s raised %s (%s): trying again in %.2f s", claim.token,
                                e.sqlstate, _brief(e), pause)
                else:
                    if renewed < len(claim.held):
                        claim.lost.set()
                        log.info("claim %s: after a failure extend renewed %s of its %s later events: they are "
                                 "no longer held (strict order hands them back after a failure, or the lease "
                                 "ended); leaving them", claim.token, renewed, len(claim.held))
                        return False
                    claim.renewed(sent_at)
                    return True
            time.sleep(pause)

    def _hand_back(self, slot: _Slot, claim: _Claim) -> None:
        """Gives back every event the claim still holds, due again at once
        (retry_in 0) for another worker; the claim is over afterwards. Under
        the slot's lock throughout: run() may hand back a stuck claim from
        its own thread (_give_up) while the slot's thread hands it back too."""
        with slot.lock:
            if claim.lost.is_set() or not claim.held:
                return
            zero = datetime.timedelta(0)
            # The first event on its own: in a group in strict order its fail
            # sends the later ones back to pending without counting an attempt.
            self._end_one(slot, claim, claim.held[0], "fail", self.HANDED_BACK, zero)
            rest = list(claim.held)
            if claim.lost.is_set() or not rest:
                return
            ended = self._end(slot, claim, rest, "fail", self.HANDED_BACK, zero)
            if 0 <= ended < len(rest):
                log.info("claim %s: %s of its %s later events were no longer held (in a group in strict order "
                         "the first one's fail sent them back to pending; else the lease ended)",
                         claim.token, len(rest) - ended, len(rest))

    def _hand_back_before_raising(self, slot: _Slot, claim: _Claim, error: BaseException) -> None:
        """A handler raised SystemExit, KeyboardInterrupt or another
        BaseException, which ends the worker: its events are handed back first
        rather than left claimed until their lease ends."""
        log.error("worker %s: a handler raised %s: handing back its claim's events, then ending",
                  self.name, type(error).__name__)
        try:
            self._hand_back(slot, claim)
        except Exception as e:  # noqa: BLE001 - the handler's exception is the one to raise
            log.error("worker %s: handing back failed (%s): the events are left to their lease",
                      self.name, _safe_str(e))

    def _fail_args(self, slot: _Slot, error: Exception):
        """throttle.fail's error and retry_in for a handler's exception, both
        such as the database takes (error_text, retry_delay)."""
        retry_in = self.retry_in
        if isinstance(error, RetryLater):
            try:
                retry_in = retry_delay(error.retry_in)
            except (TypeError, ValueError) as e:      # a retry_in changed after RetryLater() checked it
                log.error("RetryLater's retry_in is no delay (%s): the worker's retry_in instead", e)
        try:
            encoding = slot.conn.info.encoding
        except Exception:  # noqa: BLE001 - a closed connection: the fail will say so
            encoding = "utf-8"
        return error_text(error, encoding), retry_in

    def _work_on(self, slot: _Slot, events: List[Event], claim: _Claim) -> None:
        # One cancel flag per claim: set by the heartbeat (claim lost) or by
        # stop(abort=True), read by the work. Published before hard_stop is
        # read, so that an abort in between is not missed.
        cancel = slot.cancel = threading.Event()
        slot.claim = claim
        if self._hard_stop.is_set():
            cancel.set()
        context = Context(self, claim, cancel, events)
        heartbeat = _Heartbeat(slot, claim, cancel)
        heartbeat.start()
        try:
            if self.batch:
                self._work_on_batch(slot, claim, cancel, events, context)
                return
            for event in events:
                if claim.lost.is_set():
                    break           # another worker may have them: never complete
                if cancel.is_set():
                    self._hand_back(slot, claim)        # does nothing if the claim was lost
                    break
                try:
                    self.handler(event, context)
                except Cancelled:
                    self._hand_back(slot, claim)
                    break
                except Exception as e:  # noqa: BLE001 - any error of the work fails the event
                    error, retry_in = self._fail_args(slot, e)
                    log.info("event %s failed: %s", event["id"], error)
                    self._end_one(slot, claim, event["id"], "fail", error, retry_in)
                    if event["group_key"] is not None and not self._still_held(slot, claim):
                        break       # the rest is another claim's now: never handle it here
                except BaseException as e:
                    self._hand_back_before_raising(slot, claim, e)
                    raise
                else:
                    # Not if the claim was lost meanwhile: the event may be
                    # running elsewhere already.
                    self._end_one(slot, claim, event["id"], "complete")
        finally:
            heartbeat.stopped.set()
            heartbeat.join()
            slot.cancel = None
            slot.claim = None

    def _work_on_batch(self, slot: _Slot, claim: _Claim, cancel: threading.Event, events: List[Event],
                       context: Context) -> None:
        if cancel.is_set():
            self._hand_back(slot, claim)
            return
        try:
            self.handler(events, context)
        except Cancelled:
            self._hand_back(slot, claim)
            return
        except Exception as e:  # noqa: BLE001 - any error of the work fails the claim's events
            error, retry_in = self._fail_args(slot, e)
            log.info("claim %s (%s events) failed: %s", claim.token, len(events), error)
            self._fail_batch(slot, claim, events, error, retry_in)
            return
        except BaseException as e:
            self._hand_back_before_raising(slot, claim, e)
            raise
        ids = list(claim.held)
        ended = self._end(slot, claim, ids, "complete")
        if 0 <= ended < len(ids):
            claim.lost.set()
            log.warning("claim %s: complete ended %s of its %s events, the claim was lost",
                        claim.token, ended, len(ids))

    def _fail_batch(self, slot: _Slot, claim: _Claim, events: List[Event], error: str, retry_in) -> None:
        """Fails a batch's events. Out of groups, in one fail (a fail hands
        nothing back there). In a group, as the one-at-a-time path does: the
        first held event alone, since in a group kept in strict order its fail
        sends the later ones back to pending, their attempt not counted (one
        fail of them all would count an attempt on each, and kill those on
        their last); then extend tells whether the claim still holds the
        rest, which are failed only then."""
        if events[0]["group_key"] is None:
            ids = list(claim.held)
            ended = self._end(slot, claim, ids, "fail", error, retry_in)
            if 0 <= ended < len(ids):
                claim.lost.set()
                log.warning("claim %s: fail ended %s of its %s events, the claim was lost",
                            claim.token, ended, len(ids))
            return
        if not claim.held:
            return
        self._end_one(slot, claim, claim.held[0], "fail", error, retry_in)
        if claim.held and self._still_held(slot, claim):
            rest = list(claim.held)
            ended = self._end(slot, claim, rest, "fail", error, retry_in)
            if 0 <= ended < len(rest):
                claim.lost.set()
                log.warning("claim %s: fail ended %s of its %s later events, the claim was lost",
                            claim.token, ended, len(rest))
