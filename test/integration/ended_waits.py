#!/usr/bin/python3
"""Waits that end badly give back what they held.

A throttle.wait ended by pg_terminate_backend, or whose client went away,
gives its reservation back (the next unit is as far away as before the wait).
A lock waiter whose client went away is never handed the lease: the next
holder gets it at once. Each client that goes away is a real psql process
killed with SIGKILL, so the server sees a connection that closed, not a
statement that was cancelled.

The bucket's sessions share a fixed test clock, so its arithmetic is exact.
"""
import os
import signal
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(__file__))
from pgconn import connect, one  # noqa: E402
from polling import wait_until  # noqa: E402
from tap import Tap  # noqa: E402

CLOCK = "2037-01-01 00:00:00+00"
BUCKET = "1, '20 seconds', 1"  # one unit per 20 s, burst 1


def clocked():
    conn = connect()
    one(conn, "SET pg_throttle.test_clock = %s; SELECT 1", (CLOCK,))
    return conn


def psql(sql, clock=False):
    """A client running `sql` in a psql process of its own."""
    env = dict(os.environ)
    if clock:
        env["PGOPTIONS"] = "-c pg_throttle.test_clock=" + CLOCK.replace(" ", "\\ ")
    return subprocess.Popen(["psql", "-X", "-q", "-c", sql], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def backend_running(observer, marker):
    """The pid of the backend whose query contains `marker`, once it waits in pg_throttle."""
    found = []

    def look():
        row = one(observer, "SELECT pid FROM pg_stat_activity WHERE query LIKE %s "
                            "AND wait_event_type = 'Extension' AND pid <> pg_backend_pid()",
                  ("%" + marker + "%",))
        if row:
            found.append(row[0])
        return bool(row)

    return found[0] if wait_until(look, 10) else None


def gone(observer, pid):
    return wait_until(lambda: one(observer, "SELECT count(*) FROM pg_stat_activity WHERE pid = %s",
                                  (pid,))[0] == 0, 10)


def next_unit(conn, key):
    """Seconds until one unit of `key` is available (a peek)."""
    return float(one(conn, f"SELECT extract(epoch FROM retry_after) "
                           f"FROM throttle.take(%s, {BUCKET}, 0)", (key,))[0])


def wait_ended(tap, observer, key, end, how):
    conn = clocked()
    one(conn, f"SELECT allowed FROM throttle.take(%s, {BUCKET})", (key,))
    tap.is_(next_unit(conn, key), 20.0, f"{how}: the bucket's next unit is 20 s away")
    client = psql(f"SELECT throttle.wait('{key}', {BUCKET}, 1, timeout => '1 minute')", clock=True)
    pid = backend_running(observer, key)
    reserved = next_unit(conn, key)
    end(client, pid)
    ended = pid is not None and gone(observer, pid)
    client.wait()
    after = next_unit(conn, key)
    tap.ok(ended and reserved == 40.0 and after == 20.0,
           f"{how}: the wait's reservation (next unit 40 s away) is given back (20 s again)",
           repr((pid, ended, reserved, after)))
    conn.close()


def lock_waiter_gone(tap, observer):
    holder = connect()
    token = one(holder, "SELECT throttle.lock('ew.lock', ttl => '30 seconds')")[0]
    client = psql("SELECT throttle.lock('ew.lock', ttl => '30 seconds', wait => '1 minute')")
    pid = backend_running(observer, "ew.lock")
    client.send_signal(signal.SIGKILL)
    client.wait()
    ended = pid is not None and gone(observer, pid)
    tap.ok(ended, "a lock waiter whose client went away leaves the queue (its backend ends)",
           repr(pid))
    one(holder, "SELECT throttle.unlock('ew.lock', %s)", (token,))
    other = connect()
    got = [one(other, "SELECT throttle.lock('ew.lock', ttl => '30 seconds') IS NOT NULL")[0]
           for _ in range(2)]
    tap.ok(got == [True, False], "the lease goes to the next caller, not to the client that left "
           "(then it is held: two calls)", repr(got))
    holder.close()
    other.close()


def main():
    tap = Tap(6)
    observer = connect()
    one(observer, "CREATE EXTENSION IF NOT EXISTS pg_throttle; SELECT 1")
    wait_ended(tap, observer, "ew.terminated",
               lambda client, pid: one(observer, "SELECT pg_terminate_backend(%s)", (pid,)),
               "pg_terminate_backend during a wait")
    wait_ended(tap, observer, "ew.client-gone",
               lambda client, pid: client.send_signal(signal.SIGKILL),
               "a wait whose client went away")
    lock_waiter_gone(tap, observer)
    observer.close()
    tap.done()


if __name__ == "__main__":
    main()
