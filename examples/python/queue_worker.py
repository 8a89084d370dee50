#!/usr/bin/python3
"""A pg_throttle queue worker on the Python client (clients/python): claim, work, complete or fail.

    queue_worker.py QUEUE [--dsn DSN] [--groups] [--lease 30] [--poll 60] ...

It connects with the libpq environment (PGHOST, PGDATABASE, ...) or --dsn.
pg_throttle.Worker does the rest (its module documents how): it LISTENs on
the queue's channel and polls every --poll seconds, claims with
throttle.claim (or claim_group with --groups), extends a claim every lease/3
while it is worked on, and never completes a claim it lost (the lease ran out
or an operator released the group); after a failure in a group claim it
leaves the later events a group in strict order handed back.

SIGTERM (or Ctrl-C): stop claiming, finish the events already claimed, exit 0.
With --on-term handback (or on a second SIGTERM): stop the work at once and
hand the events back with fail(..., retry_in 0), so another worker gets them
at once. A lost database connection ends the worker with an error: run it
under a supervisor that restarts it (its claims are taken over when their
leases end).

Replace handle() with your own work. The demo handle() appends one JSON line
per event to --log, sleeps --work-ms, and fails an event whose payload has
{"fail": true} on its first attempt, so that retries can be seen.
"""
import argparse
import json
import logging
import os
import socket
import sys
import time

try:
    import pg_throttle
except ImportError:             # not installed: the client next to this example
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                    "..", "..", "clients", "python", "src"))
    import pg_throttle


# --- the work: replace this ------------------------------------------------

def handle(event, context, args):
    """Works on one event (a dict of throttle.event's columns). Returns on
    success, raises on failure. context.cancelled is a threading.Event set
    when the claim is lost or a hard stop is asked: long work should check it
    and raise pg_throttle.Cancelled, since its result would be thrown away."""
    started = time.time()
    outcome = "interrupted"         # unless it gets to one of the ends below
    try:
        if context.cancelled.wait(args.work_ms / 1000):
            outcome = "cancelled"
            raise pg_throttle.Cancelled()
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
    parser.add_argument("--concurrency", type=int, default=1, help="claims worked on at once")
    parser.add_argument("--log", help="the demo work appends a JSON line per event here")
    parser.add_argument("--work-ms", type=float, default=0, help="how long the demo work takes")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format=f"%(asctime)s {args.name} %(levelname)s %(message)s")
    worker = pg_throttle.Worker(
        args.queue, lambda event, context: handle(event, context, args), conninfo=args.dsn,
        groups=args.groups, concurrency=args.concurrency, max=args.max if args.max is not None or args.groups else 10, lease=args.lease, poll=args.poll,
        retry_in=args.retry_in, name=args.name, install_signal_handlers=True, on_term=args.on_term,
        on_ready=lambda w: print(f"{w.name}: listening on {w.queue}", flush=True))
    worker.run()
    print(f"{args.name}: stopped", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
