#!/usr/bin/python3
"""A clean restart keeps the registry exactly: intervals, bucket levels,
leases and fence tokens; a damaged state file is survived with a WARNING; a
crash (a backend killed with SIGKILL) breaks no promise.

Restarts the cluster this suite runs against (pg_ctlcluster, as set up by
pg_virtualenv), so it runs on a cluster of its own.
"""
import os
import signal
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(__file__))
from pgconn import connect  # noqa: E402
from tap import Tap  # noqa: E402

CLOCK = "2039-01-01 00:00:00+00"


def pg_ctlcluster(action, *extra):
    subprocess.run(["pg_ctlcluster", "15", "regress", action, *extra], check=True,
                   capture_output=True, text=True)


def session():
    conn = connect()
    with conn.cursor() as cur:
        cur.execute("SET pg_throttle.test_clock = %s", (CLOCK,))
    return conn


def one(conn, sql, params=None):
    with conn.cursor() as cur:
        cur.execute(sql, params)
        return cur.fetchone()


def main():
    tap = Tap(20)
    conn = session()
    one(conn, "CREATE EXTENSION IF NOT EXISTS pg_throttle; SELECT 1")
    data_dir = one(conn, "SHOW data_directory")[0]
    tap.ok(one(conn, "SELECT throttle.acquire('rs.job', '1 hour')")[0], "resource granted before")
    one(conn, "SELECT * FROM throttle.take('rs.bucket', 10, '1 second', 10, 7)")
    lease = one(conn, "SELECT throttle.lock('rs.lease', '10 seconds')")[0]
    session_lock = one(conn, "SELECT throttle.lock('rs.session')")[0]
    before = one(conn, "SELECT count(*) FROM throttle.status")[0]
    conn.close()

    pg_ctlcluster("restart", "-m", "fast")
    conn = session()
    tap.ok(not one(conn, "SELECT throttle.acquire('rs.job', '1 hour')")[0],
           "after a clean restart the resource is still taken")
    tap.is_(one(conn, "SELECT remaining FROM throttle.take('rs.bucket', 10, '1 second', 10, 0)")[0], 3,
            "the bucket's level is exactly what it was (3 of 10 left)")
    tap.ok(one(conn, "SELECT throttle.lock('rs.lease', '10 seconds')")[0] is None, "the lease is still held")
    tap.is_(one(conn, "SELECT token FROM throttle.locks WHERE name = 'rs.lease'")[0], lease,
            "with the same fence token")
    tap.ok(one(conn, "SELECT throttle.renew('rs.lease', %s, '10 seconds')", (lease,))[0],
           "which its holder can still renew")
    after_token = one(conn, "SELECT throttle.lock('rs.session')")[0]
    tap.ok(after_token is not None, "a session lock died with its session")
    tap.ok(after_token > max(lease, session_lock), "new tokens stay above every token before the restart")
    tap.is_(one(conn, "SELECT count(*) FROM throttle.status")[0], before,
            "status shows the same entries")
    conn.close()

    # A damaged file: a WARNING in the log, an empty registry, a running server.
    pg_ctlcluster("stop", "-m", "fast")
    state = os.path.join(data_dir, "pg_throttle.state")
    with open(state, "r+b") as f:
        f.seek(40)
        f.write(b"\xff\xff\xff\xff")
    pg_ctlcluster("start")
    conn = session()
    tap.ok(one(conn, "SELECT throttle.acquire('rs.job', '1 hour')")[0],
           "after a damaged state file the server starts (the test clock is past the lost window)")
    log = subprocess.run(["bash", "-c", "cat $(ls -t ${PG_VIRTUALENV_LOGDIR:-/tmp}/*.log 2>/dev/null | head -1) "
                          "/tmp/pg_virtualenv.*/log/*.log 2>/dev/null"], capture_output=True, text=True).stdout
    tap.ok("ignoring pg_throttle state file" in log, "and says why in a WARNING")
    conn.close()

    # A crash: SIGKILL a backend; PostgreSQL reinitialises shared memory.
    # First a clean restart, so that the registry is complete again.
    pg_ctlcluster("restart", "-m", "fast")
    real = connect()
    tap.ok(one(real, "SELECT throttle.acquire('cr.job', '1 hour')")[0], "real clock: resource granted")
    one(real, "SELECT * FROM throttle.take('cr.bucket', 10, '1 minute', 10, 10)")
    crash_lease = one(real, "SELECT throttle.lock('cr.lease', '10 seconds')")[0]
    os.kill(one(real, "SELECT pg_backend_pid()")[0], signal.SIGKILL)
    real.close()
    conn = None
    for _ in range(100):
        try:
            conn = connect()
            break
        except Exception:  # noqa: BLE001 - the server is restarting
            time.sleep(0.1)
    tap.ok(conn is not None, "the server came back after the crash")
    tap.ok(not one(conn, "SELECT throttle.acquire('cr.job', '1 hour')")[0],
           "after a crash the resource is not granted again within its interval")
    tap.ok(not one(conn, "SELECT throttle.acquire('cr.unknown', '1 hour')")[0],
           "a resource not known since the crash counts as granted at the restart")
    tap.ok(not one(conn, "SELECT allowed FROM throttle.take('cr.bucket', 10, '1 minute', 10)")[0],
           "the bucket allows no more than it did before the crash (it starts empty)")
    tap.ok(one(conn, "SELECT throttle.lock('cr.lease', '10 seconds')")[0] is None,
           "the lease is not handed to a second holder")
    wait_s = one(conn, "SELECT extract(epoch FROM expires_at - clock_timestamp()) FROM throttle.locks "
                       "WHERE name = 'cr.lease' AND holder LIKE '[unknown%%'")
    tap.ok(wait_s is not None and 0 < float(wait_s[0]) <= 10,
           "held for an unknown holder until the restart plus pg_throttle.max_lease", repr(wait_s))
    time.sleep(float(wait_s[0]) + 0.2 if wait_s else 0)
    token = one(conn, "SELECT throttle.lock('cr.lease', '10 seconds')")[0]
    tap.ok(token is not None and token > crash_lease,
           "after max_lease it is granted, with a token above every earlier one")
    tap.ok(one(conn, "SELECT throttle.lock('cr.other', '10 seconds', wait => '5 seconds')")[0] is not None,
           "a waiter gets a lock once the window after the crash has passed")
    conn.close()
    tap.done()


if __name__ == "__main__":
    main()
