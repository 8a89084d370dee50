#!/usr/bin/python3
"""A clean restart keeps the registry exactly: intervals, bucket levels,
leases and fence tokens; a damaged state file is survived with a WARNING.

Restarts the cluster this suite runs against (pg_ctlcluster, as set up by
pg_virtualenv), so it runs on a cluster of its own.
"""
import os
import subprocess
import sys

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
    tap = Tap(11)
    conn = session()
    one(conn, "CREATE EXTENSION IF NOT EXISTS pg_throttle; SELECT 1")
    data_dir = one(conn, "SHOW data_directory")[0]
    tap.ok(one(conn, "SELECT throttle.acquire('rs.job', '1 hour')")[0], "resource granted before")
    one(conn, "SELECT * FROM throttle.take('rs.bucket', 10, '1 second', 10, 7)")
    lease = one(conn, "SELECT throttle.lock('rs.lease', '1 hour')")[0]
    session_lock = one(conn, "SELECT throttle.lock('rs.session')")[0]
    before = one(conn, "SELECT count(*) FROM throttle.status")[0]
    conn.close()

    pg_ctlcluster("restart", "-m", "fast")
    conn = session()
    tap.ok(not one(conn, "SELECT throttle.acquire('rs.job', '1 hour')")[0],
           "after a clean restart the resource is still taken")
    tap.is_(one(conn, "SELECT remaining FROM throttle.take('rs.bucket', 10, '1 second', 10, 0)")[0], 3,
            "the bucket's level is exactly what it was (3 of 10 left)")
    tap.ok(one(conn, "SELECT throttle.lock('rs.lease', '1 hour')")[0] is None, "the lease is still held")
    tap.is_(one(conn, "SELECT token FROM throttle.locks WHERE name = 'rs.lease'")[0], lease,
            "with the same fence token")
    tap.ok(one(conn, "SELECT throttle.renew('rs.lease', %s, '1 hour')", (lease,))[0],
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
           "after a damaged state file the server starts with an empty registry")
    log = subprocess.run(["bash", "-c", "cat $(ls -t ${PG_VIRTUALENV_LOGDIR:-/tmp}/*.log 2>/dev/null | head -1) "
                          "/tmp/pg_virtualenv.*/log/*.log 2>/dev/null"], capture_output=True, text=True).stdout
    tap.ok("ignoring pg_throttle state file" in log, "and says why in a WARNING")
    conn.close()
    tap.done()


if __name__ == "__main__":
    main()
