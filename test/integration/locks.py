#!/usr/bin/python3
"""Named locks with real sessions: release at session end and termination,
prompt hand-over to waiters in arrival order, lease expiry, cancelled and
terminated waiters, and a stress test of critical sections.
"""
import os
import sys
import threading
import time

import psycopg2

sys.path.insert(0, os.path.dirname(__file__))
from pgconn import connect, one, pgbench, sql_error  # noqa: E402
from tap import Tap  # noqa: E402


def run(conn, sql, params=None):
    with conn.cursor() as cur:
        cur.execute(sql, params)


def pid_of(conn):
    return one(conn, "SELECT pg_backend_pid()")[0]


def timed_lock(conn, name, wait="5 seconds", ttl=None):
    t0 = time.monotonic()
    token = one(conn, "SELECT throttle.lock(%s, %s, %s)", (name, ttl, wait))[0]
    return token, time.monotonic() - t0


def waiters(conn, name):
    row = one(conn, "SELECT waiters FROM throttle.locks WHERE name = %s", (name,))
    return row[0] if row else None


def main():
    tap = Tap(21)
    observer = connect()

    # 1. A session lock dies with its session.
    holder = connect()
    tap.ok(one(holder, "SELECT throttle.lock('it.session')")[0] is not None, "session lock taken")
    holder.close()
    token, took = timed_lock(observer, "it.session")
    tap.ok(token is not None and took < 1.0,
           f"released when the holder's session ends (took {took * 1000:.0f} ms)")
    one(observer, "SELECT throttle.unlock('it.session', %s)", (token,))

    # 2. ... and with a terminated backend.
    holder = connect()
    one(holder, "SELECT throttle.lock('it.terminated')")
    one(observer, "SELECT pg_terminate_backend(%s)", (pid_of(holder),))
    token, took = timed_lock(observer, "it.terminated")
    tap.ok(token is not None and took < 1.0,
           f"released when the holder's backend is terminated (took {took * 1000:.0f} ms)")
    one(observer, "SELECT throttle.unlock('it.terminated', %s)", (token,))

    # 2b. DISCARD ALL (a pooler's reset between clients) releases the session's
    # locks as it releases advisory locks, and hands them to a waiter; a lease
    # is nobody's session's and stays; a DISCARD ALL that fails releases nothing.
    holder, waiter = connect(), connect()
    session_token = one(holder, "SELECT throttle.lock('it.discard')")[0]
    lease_token = one(holder, "SELECT throttle.lock('it.discard.lease', ttl => '1 minute')")[0]
    holder.autocommit = False
    tap.ok(sql_error(holder, "DISCARD ALL")[0] == "25001" and
           one(observer, "SELECT count(*) FROM throttle.locks WHERE name = 'it.discard'")[0] == 1,
           "DISCARD ALL refused inside a transaction block releases nothing")
    holder.rollback()
    holder.autocommit = True
    got = {}
    t = threading.Thread(target=lambda: got.update(row=one(
        waiter, "SELECT throttle.lock('it.discard', NULL, '10 seconds')")))
    t.start()
    deadline = time.monotonic() + 5
    while waiters(observer, "it.discard") != 1 and time.monotonic() < deadline:
        time.sleep(0.02)
    run(holder, "DISCARD ALL")
    t.join(5)
    tap.ok(got.get("row") is not None and got["row"][0] is not None and
           got["row"][0] > session_token,
           "DISCARD ALL releases the session lock: the waiter gets it, with a greater token",
           repr(got))
    tap.is_(one(observer, "SELECT session FROM throttle.locks WHERE name = 'it.discard.lease'"),
            (False,), "DISCARD ALL leaves the session's lease held")
    one(waiter, "SELECT throttle.unlock('it.discard', %s)", (got["row"][0],))
    one(holder, "SELECT throttle.unlock('it.discard.lease', %s)", (lease_token,))
    holder.close()
    waiter.close()

    # 3. A waiter is woken within milliseconds of the release (server clock).
    holder, waiter = connect(), connect()
    held = one(holder, "SELECT throttle.lock('it.handover')")[0]
    got = {}
    t = threading.Thread(target=lambda: got.update(row=one(
        waiter, "SELECT throttle.lock('it.handover', NULL, '10 seconds'), clock_timestamp()")))
    t.start()
    time.sleep(0.3)
    tap.is_(waiters(observer, "it.handover"), 1, "the status shows one waiter")
    # clock_timestamp() is read before the unlock runs: the delay can't come out negative.
    released_at = one(holder, "SELECT clock_timestamp(), throttle.unlock('it.handover', %s)", (held,))[0]
    t.join(5)
    token, woke_at = got["row"]
    delay_ms = (woke_at - released_at).total_seconds() * 1000
    tap.ok(token is not None and token > held, "the waiter got the lock with a greater token")
    tap.ok(0 <= delay_ms < 25, f"within milliseconds of the release ({delay_ms:.2f} ms)")
    one(waiter, "SELECT throttle.unlock('it.handover', %s)", (token,))

    # 4. Waiters are served in arrival order.
    held = one(holder, "SELECT throttle.lock('it.fifo')")[0]
    queue = [connect() for _ in range(4)]
    tokens = {}

    def wait_then_release(i, conn):
        tok = one(conn, "SELECT throttle.lock('it.fifo', NULL, '10 seconds')")[0]
        tokens[i] = tok
        one(conn, "SELECT throttle.unlock('it.fifo', %s)", (tok,))

    threads = []
    for i, conn in enumerate(queue):
        th = threading.Thread(target=wait_then_release, args=(i, conn))
        th.start()
        threads.append(th)
        time.sleep(0.1)
    tap.is_(waiters(observer, "it.fifo"), 4, "four waiters queued")
    one(holder, "SELECT throttle.unlock('it.fifo', %s)", (held,))
    for th in threads:
        th.join(10)
    order = sorted(tokens, key=tokens.get)
    tap.is_(order, [0, 1, 2, 3], "granted in arrival order")

    # 5. An expiring lease wakes the next waiter when it expires.
    t0 = time.monotonic()
    one(holder, "SELECT throttle.lock('it.lease', '300 milliseconds')")
    token, _ = timed_lock(waiter, "it.lease", ttl="1 minute")
    took = time.monotonic() - t0
    tap.ok(token is not None and 0.28 <= took < 0.6,
           f"a waiter gets the lease when it expires (after {took * 1000:.0f} ms)")

    # 6. A cancelled waiter leaves the queue.
    held = one(holder, "SELECT throttle.lock('it.cancel')")[0]
    run(waiter, "SET statement_timeout = '200ms'")
    try:
        one(waiter, "SELECT throttle.lock('it.cancel', NULL, '10 seconds')")
        code = None
    except psycopg2.Error as e:
        code = e.pgcode
    run(waiter, "RESET statement_timeout")
    tap.is_(code, "57014", "statement_timeout interrupts a waiting lock (57014)")
    tap.is_(waiters(observer, "it.cancel"), 0, "and leaves no waiter behind")
    one(holder, "SELECT throttle.unlock('it.cancel', %s)", (held,))
    tap.ok(timed_lock(observer, "it.cancel", wait="0")[0] is not None,
           "the released lock is free, not handed to the cancelled waiter")

    # 7. A terminated waiter leaves the queue too.
    held = one(holder, "SELECT throttle.lock('it.kill')")[0]
    victim = connect()
    vt = threading.Thread(target=_swallow, args=(
        lambda: one(victim, "SELECT throttle.lock('it.kill', NULL, '30 seconds')"),))
    vt.start()
    time.sleep(0.3)
    one(observer, "SELECT pg_terminate_backend(%s)", (pid_of_from(observer, "it.kill"),))
    vt.join(5)
    time.sleep(0.2)
    tap.is_(waiters(observer, "it.kill"), 0, "a terminated waiter leaves no waiter behind")
    one(holder, "SELECT throttle.unlock('it.kill', %s)", (held,))
    tap.ok(timed_lock(observer, "it.kill", wait="0")[0] is not None,
           "the released lock is free, not handed to the dead waiter")

    # 8. Stress: 12 clients take one lock in a loop and log their critical sections.
    run(observer, "DROP TABLE IF EXISTS it_sections")
    run(observer, "CREATE TABLE it_sections (token bigint PRIMARY KEY, pid int, started timestamptz, "
                  "ended timestamptz, released boolean)")
    calls, failed = pgbench("""
SELECT throttle.lock('it.stress', NULL, '30 seconds') AS tok \\gset
INSERT INTO it_sections (token, pid, started) VALUES (:tok, pg_backend_pid(), clock_timestamp());
UPDATE it_sections SET ended = clock_timestamp() WHERE token = :tok;
UPDATE it_sections SET released = throttle.unlock('it.stress', :tok) WHERE token = :tok;
""", 4, 12)
    sections = one(observer, "SELECT count(*), count(DISTINCT pid), bool_and(released) FROM it_sections")
    tap.ok(failed == 0 and sections[0] == calls and sections[0] > 100,
           f"12 clients, {calls} critical sections, none failed", repr(sections))
    tap.ok(sections[1] == 12 and sections[2], "every client got in, every unlock succeeded",
           repr(sections))
    overlaps = one(observer, """
        SELECT count(*) FROM (SELECT started, ended, lead(started) OVER (ORDER BY started) AS next
                              FROM it_sections) s WHERE next < ended""")[0]
    tap.is_(overlaps, 0, "no two critical sections overlap")
    disorder = one(observer, """
        SELECT count(*) FROM (SELECT token, lag(token) OVER (ORDER BY started) AS prev
                              FROM it_sections) s WHERE token < prev""")[0]
    tap.is_(disorder, 0, "tokens increase in grant order")
    run(observer, "DROP TABLE it_sections")
    tap.done()


def _swallow(fn):
    try:
        fn()
    except psycopg2.Error:
        pass


def pid_of_from(observer, name):
    """The pid of the backend waiting for `name` (from pg_stat_activity)."""
    return one(observer, "SELECT pid FROM pg_stat_activity WHERE query LIKE %s AND pid <> pg_backend_pid()",
               (f"%throttle.lock('{name}', NULL%",))[0]


if __name__ == "__main__":
    main()
