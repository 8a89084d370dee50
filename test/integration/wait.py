#!/usr/bin/python3
"""throttle.wait with real sessions: how long it sleeps, its timeout, arrival
order, and giving the reservation back when the wait is cancelled.

The sessions share a fixed test clock, so the bucket's arithmetic is exact;
the sleep itself is measured on the real clock.
"""
import os
import sys
import threading
import time

import psycopg2

sys.path.insert(0, os.path.dirname(__file__))
from pgconn import connect, one  # noqa: E402
from tap import Tap  # noqa: E402

CLOCK = "2036-01-01 00:00:00+00"


def session():
    conn = connect()
    with conn.cursor() as cur:
        cur.execute("SET pg_throttle.test_clock = %s", (CLOCK,))
    return conn


def timed(conn, sql, params=None):
    t0 = time.monotonic()
    with conn.cursor() as cur:
        cur.execute(sql, params)
        result = cur.fetchone()[0]
    return result, time.monotonic() - t0


def retry_after(conn, key, rate, per, burst):
    with conn.cursor() as cur:
        cur.execute("SELECT extract(epoch FROM retry_after) FROM throttle.take(%s, %s, %s, %s, 1) "
                    "WHERE NOT allowed", (key, rate, per, burst))
        row = cur.fetchone()
    return float(row[0]) if row else 0.0


def main():
    tap = Tap(13)
    a = session()

    # 1. Sleeps as long as the bucket needs: 4 per second, burst 1 -> 250 ms.
    timed(a, "SELECT throttle.allow('w.time', 4, '1 second', 1)")
    ok, took = timed(a, "SELECT throttle.wait('w.time', 4, '1 second', 1)")
    tap.ok(ok, "wait returns true once allowed")
    tap.ok(0.25 <= took < 0.45, f"and sleeps about 250 ms (took {took * 1000:.0f} ms)")

    # 2. A wait longer than the timeout returns false at once.
    ok, took = timed(a, "SELECT throttle.wait('w.time', 4, '1 second', 1, 1, '100 ms')")
    tap.ok(ok is False, "a wait beyond its timeout returns false")
    tap.ok(took < 0.1, f"at once (took {took * 1000:.0f} ms)")

    # 3. Waiters of one key pass in arrival order, one emission interval apart.
    # The clock stands still, so the i-th to arrive (0-based) sleeps (i + 1) intervals
    # from its own arrival. Arrival and return are read on the server's real
    # clock: a client thread that starts late moves both, not the sleep.
    timed(a, "SELECT throttle.allow('w.fifo', 5, '1 second', 1)")
    waiters = [session() for _ in range(3)]
    finished = {}

    def run(i, conn):
        with conn.cursor() as cur:
            cur.execute("SELECT extract(epoch FROM clock_timestamp()), "
                        "throttle.wait('w.fifo', 5, '1 second', 1), "
                        "extract(epoch FROM clock_timestamp())")
            arrived, _, returned = cur.fetchone()
        finished[i] = (float(arrived), float(returned))

    threads = []
    for i, conn in enumerate(waiters):
        t = threading.Thread(target=run, args=(i, conn))
        t.start()
        threads.append(t)
        time.sleep(0.05)
    for t in threads:
        t.join()
    arrival = sorted(finished, key=lambda i: finished[i][0])
    tap.is_(sorted(finished, key=lambda i: finished[i][1]), arrival,
            "waiters return in arrival order")
    slept = [finished[i][1] - finished[i][0] for i in arrival]
    tap.ok(all(0.2 * (i + 1) <= slept[i] < 0.2 * (i + 1) + 0.15 for i in range(3)),
           "each one emission interval (200 ms) after the one before",
           f"slept {[round(t, 3) for t in slept]} s from arrival")

    # 4. statement_timeout cancels a wait cleanly and gives the reservation back.
    checker = session()
    timed(a, "SELECT throttle.allow('w.cancel', 1, '10 seconds', 1)")
    with a.cursor() as cur:
        cur.execute("SET statement_timeout = '200ms'")
    t0 = time.monotonic()
    try:
        timed(a, "SELECT throttle.wait('w.cancel', 1, '10 seconds', 1)")
        code = None
    except psycopg2.Error as e:
        code = e.pgcode
    took = time.monotonic() - t0
    tap.is_(code, "57014", "statement_timeout interrupts the wait (57014)")
    tap.ok(took < 0.6, f"promptly (took {took * 1000:.0f} ms)")
    tap.ok(abs(retry_after(checker, "w.cancel", 1, "10 seconds", 1) - 10.0) < 1e-6,
           "the cancelled wait gave its reservation back (retry_after 10 s, not 20 s)")
    # A cancelled wait with cost 0 (a peek) reserved nothing and gives nothing back.
    grants = lambda: one(checker, "SELECT grants FROM throttle.status WHERE name = 'w.cancel'")[0]  # noqa: E731
    before = grants()
    for _ in range(2):
        try:
            timed(a, "SELECT throttle.wait('w.cancel', 1, '10 seconds', 1, 0)")
        except psycopg2.Error:
            pass
    tap.is_(grants(), before, "two cancelled peek-waits leave the grant count as it was")
    with a.cursor() as cur:
        cur.execute("RESET statement_timeout")

    # 5. pg_cancel_backend from another session does the same.
    timed(a, "SELECT throttle.allow('w.kill', 1, '10 seconds', 1)")
    with a.cursor() as cur:
        cur.execute("SELECT pg_backend_pid()")
        pid = cur.fetchone()[0]
    errors = []

    def victim():
        try:
            timed(a, "SELECT throttle.wait('w.kill', 1, '10 seconds', 1)")
        except psycopg2.Error as e:
            errors.append(e.pgcode)

    t = threading.Thread(target=victim)
    t.start()
    time.sleep(0.3)
    with checker.cursor() as cur:
        cur.execute("SELECT pg_cancel_backend(%s)", (pid,))
    t.join(timeout=5)
    tap.ok(not t.is_alive() and errors == ["57014"], "pg_cancel_backend interrupts the wait",
           repr(errors))
    tap.ok(abs(retry_after(checker, "w.kill", 1, "10 seconds", 1) - 10.0) < 1e-6,
           "and the reservation was given back")

    # 6. The session is still usable afterwards.
    ok, _ = timed(a, "SELECT throttle.allow('w.after', 1, '1 second', 1)")
    tap.ok(ok, "the interrupted session works normally afterwards")
    for conn in [a, checker, *waiters]:
        conn.close()
    tap.done()


if __name__ == "__main__":
    main()
