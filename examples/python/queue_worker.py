#!/usr/bin/python3
"""A pg_throttle queue worker (psycopg 3): claim, work, complete or fail.

    queue_worker.py QUEUE [--dsn DSN] [--groups] [--lease 30] [--poll 60] ...

It connects with the libpq environment (PGHOST, PGDATABASE, ...) or --dsn, in
autocommit (a claim must commit to be seen by others, and a group is freed when
its complete commits). It LISTENs on the queue's channel (the channel is the
queue's name: pg_throttle NOTIFYs it whenever an event becomes claimable, also
when a run_at ahead, a retry's backoff or a lease falls due) and also polls
every --poll seconds, since a NOTIFY is only a hint (docs/queue.md).

While an event is worked on, a heartbeat thread extends the claim every
lease/3. If extend renews fewer events than it was given, the claim was lost
(the lease ran out or an operator released the group): another worker may
have the events now, so this one stops the work and never completes them.
So does a complete or fail that ends fewer events than it was given. After a
failure in a group claim (--groups) the worker extends the claim's later
events before it handles them: in a group in strict order the failure handed
them back (they run after the failed event's retry), and extend renewing fewer
than it was given says so. An ungrouped claim's events are never handed back
by a fail, so it skips that extend (a durable commit per failure).

SIGTERM (or Ctrl-C): stop claiming, finish the events already claimed, exit 0.
With --on-term handback (or on a second SIGTERM): stop the work at once and
hand the events back with fail(..., retry_in 0), so another worker gets them
at once: first the one being worked on (in a group in strict order, that
sends the claim's later ones back to pending, their attempt not counted),
then, in one more fail, whatever the claim still holds. Either way nothing is
left claimed until its lease runs out.
A lost database connection ends the worker with an error: run it under a
supervisor that restarts it (its claims are taken over when their leases end).

Replace handle() with your own work. The demo handle() appends one JSON line
per event to --log, sleeps --work-ms, and fails an event whose payload has
{"fail": true} on its first attempt, so that retries can be seen.
"""
import argparse
import datetime
import json
import logging
import os
import select
import signal
import socket
import sys
import threading
import time

import psycopg
from psycopg import sql

log = logging.getLogger("queue_worker")


class Cancelled(Exception):
    """Raised by handle() when it stopped early because it was asked to."""


# --- the work: replace this ------------------------------------------------

def handle(event, cancel, args):
    """Works on one event (a dict of throttle.event's columns). Returns on
    success, raises on failure. `cancel` is a threading.Event set when the
    claim is lost or a hard stop is asked: long work should check it and raise
    Cancelled, since its result would be thrown away."""
    started = time.time()
    outcome = "interrupted"         # unless it gets to one of the ends below
    try:
        if cancel.wait(args.work_ms / 1000):
            outcome = "cancelled"
            raise Cancelled()
        payload = event["payload"]
        if isinstance(payload, dict) and payload.get("fail") and event["attempts"] == 1:
            outcome = "failed"
            raise RuntimeError("the payload asks to fail the first attempt")
        outcome = "done"
    finally:
        if args.log:
            append_line(args.log, {
                "worker": args.name, "pid": os.getpid(), "id": event["id"],
                "item_key": event["item_key"], "group_key": event["group_key"],
                "attempt": event["attempts"], "start": started, "end": time.time(),
                "outcome": outcome})


def append_line(path, record):
    # One write() of one line on an O_APPEND file: lines of several workers
    # sharing the file do not interleave.
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (json.dumps(record) + "\n").encode())
    finally:
        os.close(fd)


# --- the worker ------------------------------------------------------------

class Claim:
    """The events of one claim that this worker still holds."""

    def __init__(self, token, ids):
        self.token = token
        self.held = list(ids)      # not yet completed, failed or handed back
        self.lost = threading.Event()


class Heartbeat(threading.Thread):
    """Extends a claim every lease/3 until stopped; marks it lost (and asks
    the work to stop) when extend renews fewer events than it was given."""

    def __init__(self, worker, claim, cancel):
        super().__init__(daemon=True)
        self.worker, self.claim, self.cancel = worker, claim, cancel
        self.stopped = threading.Event()

    def run(self):
        every = self.worker.lease.total_seconds() / 3
        while not self.stopped.wait(every):
            with self.worker.lock:
                if self.stopped.is_set() or not self.claim.held:
                    return
                try:
                    renewed = self.worker.call("SELECT throttle.extend(%s, %s, %s)",
                                               (self.claim.held, self.claim.token, self.worker.lease))
                except psycopg.Error as e:
                    # Cannot tell whether the lease holds: better stop than
                    # work on events another worker may have by now.
                    log.error("extend failed: %s", e)
                    renewed = -1
                if renewed < len(self.claim.held):
                    log.warning("claim %s lost (extend renewed %s of %s events): stopping its work",
                                self.claim.token, renewed, len(self.claim.held))
                    self.claim.lost.set()
                    self.cancel.set()
                    return


class Worker:
    def __init__(self, args):
        self.args = args
        self.lease = datetime.timedelta(seconds=args.lease)
        self.retry_in = None if args.retry_in is None else datetime.timedelta(seconds=args.retry_in)
        self.conn = psycopg.connect(args.dsn, autocommit=True)
        # psycopg 3 connections serialize their statements, but the heartbeat
        # must also read the claim's held events and extend them as one step,
        # so that a complete in between does not look like a lost claim.
        self.lock = threading.Lock()
        self.hinted = False        # a NOTIFY came in during a statement
        self.stopping = False      # SIGTERM: claim no more
        self.hard_stop = threading.Event()  # hand back what is held, now
        self.conn.add_notify_handler(self.on_notify)

    def on_notify(self, _notify):
        self.hinted = True

    def call(self, statement, params=None):
        """Runs a statement that returns one value (the caller holds the lock)."""
        return self.conn.execute(statement, params).fetchone()[0]

    def claim(self):
        if self.args.groups:
            statement = ("SELECT id, item_key, group_key, payload, attempts, claim_token "
                         "FROM throttle.claim_group(%s, %s, %s, %s)")
        else:
            statement = ("SELECT id, item_key, group_key, payload, attempts, claim_token "
                         "FROM throttle.claim(%s, %s, %s, %s)")
        limit = self.args.max
        if limit is None and not self.args.groups:
            limit = 10          # claim takes one event by default: take a few per round trip
        with self.lock:
            cur = self.conn.execute(statement, (self.args.queue, self.args.name, self.lease, limit))
            names = [c.name for c in cur.description]
            return [dict(zip(names, row)) for row in cur.fetchall()]

    def end(self, claim, event, function, *extra):
        """Runs throttle.complete or throttle.fail (with `extra`: the error and
        retry_in) for one event of the claim, unless the claim was lost."""
        placeholders = ", ".join(["%s"] * (2 + len(extra)))
        with self.lock:
            if claim.lost.is_set():
                return
            ended = self.call(f"SELECT throttle.{function}({placeholders})",
                              ([event["id"]], claim.token, *extra))
            claim.held.remove(event["id"])
        if ended < 1:               # fenced: the lease ran out or the group was released
            claim.lost.set()
            log.warning("event %s: %s changed nothing, the claim was lost", event["id"], function)

    def still_held(self, claim):
        """After a failure in a group claim: whether the claim still holds its
        later events. In a group in strict order, fail sends the claim's later
        events back to pending, to run after the failed one's retry: handling
        them now would run them out of order (and complete would refuse them).
        extend renews only the events the claim still holds, so it tells."""
        with self.lock:
            if claim.lost.is_set():
                return False
            if not claim.held:
                return True
            try:
                renewed = self.call("SELECT throttle.extend(%s, %s, %s)", (claim.held, claim.token, self.lease))
            except psycopg.Error as e:
                # As in the heartbeat: the lease cannot be known to hold.
                log.error("extend failed: %s", e)
                renewed = -1
            if renewed < len(claim.held):
                claim.lost.set()
                log.info("claim %s: after a failure extend renewed %s of its %s later events: they are no "
                         "longer held (strict order hands them back after a failure, or the lease ended); "
                         "leaving them", claim.token, renewed, len(claim.held))
                return False
        return True

    HANDED_BACK = "worker stopping: handed back"

    def hand_back(self, claim):
        """Gives back every event the claim still holds, due again at once
        (retry_in 0) for another worker; the claim is over afterwards."""
        if claim.lost.is_set() or not claim.held:
            return
        # The first event on its own: in a group in strict order its fail
        # sends the later ones back to pending without counting an attempt.
        self.end(claim, {"id": claim.held[0]}, "fail", self.HANDED_BACK, datetime.timedelta(0))
        with self.lock:
            rest = list(claim.held)
            if claim.lost.is_set() or not rest:
                return
            ended = self.call("SELECT throttle.fail(%s, %s, %s, %s)",
                              (rest, claim.token, self.HANDED_BACK, datetime.timedelta(0)))
            claim.held.clear()
        if ended < len(rest):
            log.info("claim %s: %s of its %s later events were no longer held (in a group in strict order "
                     "the first one's fail sent them back to pending; else the lease ended)",
                     claim.token, len(rest) - ended, len(rest))

    def work_on(self, events):
        claim = Claim(events[0]["claim_token"], [e["id"] for e in events])
        # One cancel flag per claim: set by the heartbeat (claim lost) or by a
        # hard stop, read by the work. Published before hard_stop is read, so
        # that a signal in between is not missed.
        cancel = self.cancel = threading.Event()
        if self.hard_stop.is_set():
            cancel.set()
        heartbeat = Heartbeat(self, claim, cancel)
        heartbeat.start()
        try:
            for event in events:
                if claim.lost.is_set():
                    break           # another worker may have them: never complete
                if cancel.is_set():
                    self.hand_back(claim)           # does nothing if the claim was lost
                    break
                try:
                    handle(event, cancel, self.args)
                except Cancelled:
                    self.hand_back(claim)
                    break
                except Exception as e:  # noqa: BLE001 - any error of the work fails the event
                    log.info("event %s failed: %s", event["id"], e)
                    self.end(claim, event, "fail", f"{type(e).__name__}: {e}", self.retry_in)
                    if event["group_key"] is not None and not self.still_held(claim):
                        break       # the rest is another claim's now: never handle it here
                else:
                    # Not if the claim was lost meanwhile: the event may be
                    # running elsewhere already.
                    self.end(claim, event, "complete")
        finally:
            heartbeat.stopped.set()
            heartbeat.join()
            self.cancel = None

    def on_signal(self, _signum, _frame):
        if self.stopping or self.args.on_term == "handback":
            self.hard_stop.set()
            if self.cancel is not None:
                self.cancel.set()
        self.stopping = True

    def run(self):
        wake_r, wake_w = socket.socketpair()
        wake_r.setblocking(False)
        wake_w.setblocking(False)
        # A signal writes a byte to wake_w, so that the wait below returns at once.
        signal.set_wakeup_fd(wake_w.fileno())
        self.cancel = None
        for signum in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, self.on_signal)
        with self.lock:
            self.conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(self.args.queue)))
        print(f"{self.args.name}: listening on {self.args.queue}", flush=True)
        while not self.stopping:
            events = self.claim()
            if events:
                self.work_on(events)
                continue
            if self.hinted:         # a NOTIFY arrived while claiming: look again
                self.hinted = False
                continue
            # Sleep until a NOTIFY arrives (the next claim reads it), a signal,
            # or the poll interval passes.
            ready, _, _ = select.select([self.conn.fileno(), wake_r], [], [], self.args.poll)
            if wake_r in ready:
                try:
                    wake_r.recv(64)
                except BlockingIOError:
                    pass
        self.conn.close()
        print(f"{self.args.name}: stopped", flush=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("queue")
    parser.add_argument("--dsn", default="", help="connection string (default: the libpq environment)")
    parser.add_argument("--name", default=f"{socket.gethostname()}:{os.getpid()}",
                        help="the worker's name in claimed_by and completed_by")
    parser.add_argument("--groups", action="store_true", help="claim whole groups with claim_group")
    parser.add_argument("--lease", type=float, default=30, help="seconds a claim holds without extend")
    parser.add_argument("--max", type=int, default=None,
                        help="events per claim (default: 10 for claim, every due event of the group for claim_group)")
    parser.add_argument("--poll", type=float, default=60, help="seconds between polls when no NOTIFY comes")
    parser.add_argument("--retry-in", type=float, default=None,
                        help="seconds before a failed event is retried (default: the queue's backoff)")
    parser.add_argument("--on-term", choices=["finish", "handback"], default="finish",
                        help="what SIGTERM does with the events held (a second SIGTERM always hands back)")
    parser.add_argument("--log", help="the demo work appends a JSON line per event here")
    parser.add_argument("--work-ms", type=float, default=0, help="how long the demo work takes")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format=f"%(asctime)s {args.name} %(levelname)s %(message)s")
    Worker(args).run()
    return 0


if __name__ == "__main__":
    sys.exit(main())
