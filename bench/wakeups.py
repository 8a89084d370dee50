#!/usr/bin/python3
"""Wake-ups at the due time, measured: idle workers that only LISTEN (no poll) claim events as
they fall due; the lateness of each claim is its claimed_at minus the instant the event fell due
(throttle.event_history, the server's clock).

Phases, one after another on the cluster of the libpq environment:
- ahead:   BENCH_WAKEUP_EVENTS (1000) events with run_at spread over BENCH_WAKEUP_SECONDS (60);
- backoff: a fifth as many events, due now; each first attempt fails with a retry_in of 1 to
           10 s, and the lateness is that of the retry's claim;
- lease:   as many, due now; each first claim is left to expire (a lease of 1 to 10 s), and
           the lateness is that of the claim that takes it over;
- polling: the ahead phase with pg_throttle.wakeups off and workers that poll every 5 s (the
           example workers' default before wake-ups), for comparison.
BENCH_WAKEUP_WORKERS (3) workers, each a thread with its own connection.
Prints a table: phase, events, p50 / p99 / max lateness in ms, and whether the targets
(p50 <= 5 ms, p99 <= 50 ms) hold.
"""
import os
import random
import select
import statistics
import threading
import time

import psycopg2

EVENTS = int(os.environ.get("BENCH_WAKEUP_EVENTS", "1000"))
SECONDS = float(os.environ.get("BENCH_WAKEUP_SECONDS", "60"))
WORKERS = int(os.environ.get("BENCH_WAKEUP_WORKERS", "3"))
QUEUE = "bench.wakeups"


def connect():
    conn = psycopg2.connect("")
    conn.autocommit = True
    return conn


class Worker(threading.Thread):
    """LISTENs; on a NOTIFY (or every `poll` seconds) claims until the queue has nothing due.
    `handle(cur, id, attempts)` decides: 'complete', 'fail' (retry_in 1..10 s) or 'abandon'."""

    def __init__(self, name, handle, poll=None):
        super().__init__(daemon=True)
        self.name_ = name
        self.handle = handle
        self.poll = poll
        self.stop = threading.Event()
        self.conn = connect()
        self.conn.cursor().execute(f'LISTEN "{QUEUE}"')
        self.abandoned = {}  # id -> lease_until (epoch) of a claim left to expire

    def run(self):
        cur = self.conn.cursor()
        while not self.stop.is_set():
            self.drain(cur)
            ready = select.select([self.conn], [], [], self.poll or 0.2)[0]
            if ready:
                self.conn.poll()
                self.conn.notifies.clear()

    def drain(self, cur):
        while True:
            cur.execute("SELECT id, claim_token, attempts, extract(epoch FROM lease_until) "
                        "FROM throttle.claim(%s, %s, make_interval(secs => %s), 10)",
                        (QUEUE, self.name_, random.uniform(1, 10)))
            rows = cur.fetchall()
            if not rows:
                return
            for event_id, token, attempts, lease_until in rows:
                action = self.handle(event_id, attempts)
                if action == "complete":
                    cur.execute("SELECT throttle.complete(ARRAY[%s::bigint], %s)", (event_id, token))
                elif action == "fail":
                    cur.execute("SELECT throttle.fail(ARRAY[%s::bigint], %s, 'bench', "
                                "make_interval(secs => %s))",
                                (event_id, token, random.uniform(1, 10)))
                else:
                    self.abandoned[event_id] = float(lease_until)


def run_phase(admin, name, handle, prepare, poll=None):
    """Starts the workers, runs `prepare(cur)` (it schedules), waits until every event it
    scheduled is done, and returns the lateness in ms of each event's last claim."""
    workers = [Worker(f"{name}-{i}", handle, poll) for i in range(WORKERS)]
    for w in workers:
        w.start()
    time.sleep(0.5)
    cur = admin.cursor()
    started = time.time()
    prepare(cur)
    expected = one(cur, "SELECT count(*) FROM throttle.event WHERE queue = %s", (QUEUE,))
    deadline = started + SECONDS + 60
    while time.time() < deadline:
        if one(cur, "SELECT count(*) FROM throttle.event WHERE queue = %s", (QUEUE,)) == 0:
            break
        time.sleep(0.5)
    for w in workers:
        w.stop.set()
    for w in workers:
        w.join()
    abandoned = {}
    for w in workers:
        abandoned.update(w.abandoned)
    cur.execute("SELECT id, extract(epoch FROM claimed_at), extract(epoch FROM run_at) "
                "FROM throttle.event_history WHERE queue = %s AND state = 'done'", (QUEUE,))
    lateness = []
    for event_id, claimed_at, run_at in cur.fetchall():
        due = abandoned.get(event_id, float(run_at))  # a lease's end, or the (retry's) run_at
        lateness.append((float(claimed_at) - max(due, float(run_at))) * 1000)
    left = one(cur, "SELECT count(*) FROM throttle.event WHERE queue = %s", (QUEUE,))
    cur.execute("SELECT throttle.purge('0 s', %s)", (QUEUE,))
    for w in workers:
        w.conn.close()
    return expected, lateness, left


def one(cur, sql, args=None):
    cur.execute(sql, args)
    return cur.fetchone()[0]


def spread(cur, count):
    cur.execute("SELECT throttle.schedule_many(%s, array_agg('e' || g), "
                "array_agg(now() + make_interval(secs => 1 + random() * %s)), NULL) "
                "FROM generate_series(1, %s) g", (QUEUE, SECONDS, count))


def due_now(cur, count):
    cur.execute("SELECT throttle.schedule_many(%s, array_agg('e' || g), array_agg(now()), NULL) "
                "FROM generate_series(1, %s) g", (QUEUE, count))


def set_wakeups(admin, on):
    admin.cursor().execute(f"ALTER SYSTEM SET pg_throttle.wakeups = {'on' if on else 'off'}")
    admin.cursor().execute("SELECT pg_reload_conf()")
    time.sleep(1)


def percentile(values, p):
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(p / 100 * (len(ordered) - 1))))]


def main():
    admin = connect()
    admin.cursor().execute("CREATE EXTENSION IF NOT EXISTS pg_throttle")
    few = max(1, EVENTS // 5)
    phases = [
        ("ahead", lambda i, a: "complete", lambda cur: spread(cur, EVENTS), None),
        ("backoff", lambda i, a: "fail" if a == 1 else "complete",
         lambda cur: due_now(cur, few), None),
        ("lease", lambda i, a: "abandon" if a == 1 else "complete",
         lambda cur: due_now(cur, few), None),
        ("polling (wake-ups off, poll 5 s)", lambda i, a: "complete",
         lambda cur: spread(cur, EVENTS), 5.0),
    ]
    print(f"{WORKERS} idle workers that LISTEN; lateness = claimed_at - the instant the event "
          f"fell due (ms)")
    print(f"{'phase':<34} {'events':>7} {'p50':>8} {'p99':>8} {'max':>8}  targets")
    failed = False
    for name, handle, prepare, poll in phases:
        if poll is not None:
            set_wakeups(admin, False)
        expected, lateness, left = run_phase(admin, name.split()[0], handle, prepare, poll)
        if poll is not None:
            set_wakeups(admin, True)
        p50, p99 = percentile(lateness, 50), percentile(lateness, 99)
        verdict = "-"
        if poll is None:
            met = p50 <= 5 and p99 <= 50 and left == 0 and len(lateness) == expected
            verdict = "met" if met else "MISSED"
            failed = failed or not met
        print(f"{name:<34} {len(lateness):>7} {p50:>8.1f} {p99:>8.1f} {max(lateness):>8.1f}  "
              f"{verdict}" + (f" ({left} left undone)" if left else ""), flush=True)
    print(f"lateness targets (p50 <= 5 ms, p99 <= 50 ms): {'MISSED' if failed else 'met'}")


if __name__ == "__main__":
    main()
