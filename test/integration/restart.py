#!/usr/bin/python3
"""A clean restart keeps the registry exactly: intervals, bucket levels,
leases and fence tokens; a damaged state file is survived with a WARNING; a
crash (a backend killed with SIGKILL, then the postmaster killed with
SIGKILL) breaks no promise; the periodic checkpoint brings resources back
exactly after a crash, and a reset is never undone by one; a damaged fence
file is survived with a WARNING and tokens still grow; so is a damaged
checkpoint.

Restarts the cluster this suite runs against (pg_ctlcluster, as set up by
pg_virtualenv), so it runs on a cluster of its own.
"""
import glob
import os
import signal
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(__file__))
from crash_rules import check_nothing_granted_twice, grant_before  # noqa: E402
from pgconn import connect, one  # noqa: E402
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


def server_log():
    return subprocess.run(["bash", "-c", "cat /tmp/pg_virtualenv.*/log/*.log 2>/dev/null"],
                          capture_output=True, text=True).stdout


def reconnect():
    for _ in range(300):
        try:
            return connect()
        except Exception:  # noqa: BLE001 - the server is restarting
            time.sleep(0.1)
    return None


def next_grant(conn, name):
    row = one(conn, "SELECT next_grant_at FROM throttle.status WHERE kind = 'resource' AND name = %s",
              (name,))
    return row[0] if row else None


def wait_for_checkpoint(path, name, seconds=10):
    """Waits until the checkpoint file holds resource `name` (its records
    carry names as plain bytes)."""
    deadline = time.time() + seconds
    while time.time() < deadline:
        try:
            with open(path, "rb") as f:
                if name.encode() in f.read():
                    return True
        except FileNotFoundError:
            pass
        time.sleep(0.1)
    return False


def gone(pid):
    """Whether process `pid` has exited (a zombie counts)."""
    try:
        with open("/proc/%d/stat" % pid) as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


def execute(conn, sql):
    with conn.cursor() as cur:
        cur.execute(sql)


def main():
    tap = Tap(43)
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

    # A smart shutdown (waits for sessions to end) keeps it all the same way.
    pg_ctlcluster("restart", "-m", "smart")
    conn = session()
    tap.is_(one(conn, "SELECT remaining FROM throttle.take('rs.bucket', 10, '1 second', 10, 0)")[0], 3,
            "after a smart restart the bucket's level is still exactly 3")
    tap.is_(one(conn, "SELECT token FROM throttle.locks WHERE name = 'rs.lease'")[0], lease,
            "and the lease keeps its token")
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
    tap.ok("ignoring pg_throttle state file" in server_log(), "and says why in a WARNING")
    conn.close()

    # A crash: SIGKILL a backend; PostgreSQL reinitialises shared memory.
    # First a clean restart, so that the registry is complete again.
    pg_ctlcluster("restart", "-m", "fast")
    real = connect()
    checkpoint = os.path.join(data_dir, "pg_throttle.checkpoint")
    # The background worker's checkpoint, every second for this part.
    execute(real, "ALTER SYSTEM SET pg_throttle.checkpoint_interval = '1s'")
    one(real, "SELECT pg_reload_conf()")
    tap.ok(one(real, "SELECT throttle.acquire('ck.early', '1 hour')")[0], "real clock: resource granted")
    early = next_grant(real, "ck.early")
    tap.ok(wait_for_checkpoint(checkpoint, "ck.early"), "the background worker writes a checkpoint")
    execute(real, "ALTER SYSTEM RESET pg_throttle.checkpoint_interval")
    one(real, "SELECT pg_reload_conf()")
    tokens_before = [one(real, "SELECT throttle.lock('cr.t%s', '10 seconds')" % i)[0] for i in range(5)]
    crash_lease = grant_before(tap, real, "cr")
    os.kill(one(real, "SELECT pg_backend_pid()")[0], signal.SIGKILL)
    real.close()
    conn = reconnect()
    tap.ok(conn is not None, "the server came back after the crash")
    check_nothing_granted_twice(tap, conn, "cr", "a backend crash")
    tap.is_(next_grant(conn, "ck.early"), early,
            "a resource in the last checkpoint comes back exactly (not restart + 1 hour)")
    tap.ok("resources from its checkpoint" in server_log(), "the log says what the checkpoint restored")
    wait_s = one(conn, "SELECT extract(epoch FROM expires_at - clock_timestamp()) FROM throttle.locks "
                       "WHERE name = 'cr.lease' AND holder LIKE '[unknown%%'")
    tap.ok(wait_s is not None and 0 < float(wait_s[0]) <= 10,
           "held for an unknown holder until the restart plus pg_throttle.max_lease", repr(wait_s))
    time.sleep(float(wait_s[0]) + 0.2 if wait_s else 0)
    token = one(conn, "SELECT throttle.lock('cr.lease', '10 seconds')")[0]
    tap.ok(token is not None and token > max(tokens_before + [crash_lease]),
           "after max_lease it is granted, with a token above every earlier one",
           repr((token, crash_lease)))
    tap.ok(one(conn, "SELECT throttle.lock('cr.other', '10 seconds', wait => '5 seconds')")[0] is not None,
           "a waiter gets a lock once the window after the crash has passed")

    # The postmaster itself killed with SIGKILL: its backends notice and
    # exit; a new postmaster finds the marker. First a clean restart again.
    conn.close()
    pg_ctlcluster("restart", "-m", "fast")
    conn = real = connect()
    # A reset must not be undone by a checkpoint taken before it.
    one(conn, "SELECT throttle.acquire('ck.reset', '1 hour')")
    one(conn, "SELECT throttle.checkpoint()")
    one(conn, "SELECT throttle.reset('ck.reset')")
    tap.ok(not os.path.exists(checkpoint), "throttle.reset deletes the checkpoint")
    time.sleep(0.01)
    tap.ok(one(conn, "SELECT throttle.acquire('ck.reset', '1 hour')")[0], "after the reset it is granted again")
    regranted = next_grant(conn, "ck.reset")
    pm_lease = grant_before(tap, conn, "pm")
    with open(os.path.join(data_dir, "postmaster.pid")) as f:
        postmaster = int(f.readline())
    os.kill(postmaster, signal.SIGKILL)
    conn.close()
    children = subprocess.run(["pgrep", "-P", str(postmaster)], capture_output=True, text=True).stdout.split()
    for _ in range(100):  # backends exit once they notice; then shared memory is free
        if all(gone(int(pid)) for pid in children + [str(postmaster)]):
            break
        time.sleep(0.1)
    # Where nobody reaps orphans (PID 1 of a container), the dead postmaster
    # stays a zombie and its socket lock file names a "live" PID.
    for lock in glob.glob("/var/run/postgresql/.s.PGSQL.*.lock"):
        with open(lock) as f:
            if f.readline().strip() == str(postmaster):
                os.unlink(lock)
    pg_ctlcluster("start")
    conn = reconnect()
    tap.ok(conn is not None, "the server starts after its postmaster was killed")
    check_nothing_granted_twice(tap, conn, "pm", "a postmaster kill")
    tap.ok(not one(conn, "SELECT throttle.acquire('ck.reset', '1 hour')")[0],
           "a resource reset and granted again stays taken")
    after_reset = next_grant(conn, "ck.reset")
    tap.ok(after_reset is None or after_reset >= regranted,
           "and not from the checkpoint taken before the reset", repr((after_reset, regranted)))
    wait_s = one(conn, "SELECT extract(epoch FROM expires_at - clock_timestamp()) FROM throttle.locks "
                       "WHERE name = 'pm.lease'")
    time.sleep(float(wait_s[0]) + 0.2 if wait_s else 0)
    pm_token = one(conn, "SELECT throttle.lock('pm.lease', '10 seconds')")[0]
    tap.ok(pm_token is not None and pm_token > pm_lease,
           "after max_lease it is granted with a greater token", repr((pm_token, pm_lease)))
    conn.close()

    # A damaged fence file: a WARNING, and tokens continue above the old ones.
    pg_ctlcluster("stop", "-m", "fast")
    with open(os.path.join(data_dir, "pg_throttle.fence"), "r+b") as f:
        f.seek(8)
        f.write(b"\x00\x00\x00\x00")
    pg_ctlcluster("start")
    conn = reconnect()
    tap.ok("ignoring damaged pg_throttle fence file" in server_log(), "a damaged fence file: a WARNING")
    fresh = one(conn, "SELECT throttle.lock('fe.fresh', '1 second')")[0]
    tap.ok(fresh is not None and fresh > pm_token, "and tokens still grow", repr((fresh, pm_token)))

    # A damaged checkpoint: a WARNING, and the crash rules alone still hold.
    tap.ok(one(conn, "SELECT throttle.acquire('dc.job', '1 hour')")[0], "resource granted before")
    tap.is_(one(conn, "SELECT throttle.checkpoint() >= 1")[0], True, "and checkpointed")
    with open(checkpoint, "r+b") as f:
        f.seek(48)
        f.write(b"\xff\xff\xff\xff")
    os.kill(one(conn, "SELECT pg_backend_pid()")[0], signal.SIGKILL)
    conn.close()
    conn = reconnect()
    tap.ok("ignoring pg_throttle checkpoint" in server_log(), "a damaged checkpoint: a WARNING")
    tap.ok(not one(conn, "SELECT throttle.acquire('dc.job', '1 hour')")[0],
           "and the resource is still not granted again (the crash rule)")
    conn.close()
    tap.done()


if __name__ == "__main__":
    main()
