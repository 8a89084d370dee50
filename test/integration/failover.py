#!/usr/bin/python3
"""A promoted standby keeps the registry's promises: it never had the
primary's shared memory, so at its promotion everything counts as granted
then; fence tokens continue above every token the primary handed out (the
primary's durable high-water mark reaches the standby through WAL).

Builds a streaming standby of the cluster this suite runs against
(pg_basebackup), then stops the primary the hard way and promotes the
standby. Runs on a cluster of its own.
"""
import os
import shutil
import subprocess
import sys
import tempfile
import time

import psycopg2

sys.path.insert(0, os.path.dirname(__file__))
from crash_rules import check_nothing_granted_twice, grant_before  # noqa: E402
from pgconn import connect, one  # noqa: E402
from tap import Tap  # noqa: E402

BIN = "/usr/lib/postgresql/15/bin"
MAX_LEASE_S = 10


def error_code(conn, sql):
    try:
        one(conn, sql)
        return None
    except psycopg2.Error as e:
        return e.pgcode


def as_postgres(*command):
    return subprocess.run(["runuser", "-u", "postgres", "--", *command], check=True,
                          capture_output=True, text=True)


def make_standby(primary, directory, port):
    """A hot standby of `primary` in `directory`, listening on `port`."""
    data = os.path.join(directory, "data")
    subprocess.run([f"{BIN}/pg_basebackup", "-D", data, "-R", "-X", "stream", "-c", "fast"],
                   check=True, capture_output=True, text=True)
    hba = one(primary, "SHOW hba_file")[0]
    shutil.copy(hba, os.path.join(data, "pg_hba.conf"))
    with open(os.path.join(data, "postgresql.conf"), "w") as f:
        f.write(f"""listen_addresses = '127.0.0.1'
port = {port}
unix_socket_directories = '{directory}'
shared_preload_libraries = 'pg_throttle'
pg_throttle.max_lease = {MAX_LEASE_S}
hot_standby = on
""")
    subprocess.run(["chown", "-R", "postgres:postgres", directory], check=True)
    os.chmod(data, 0o700)
    as_postgres(f"{BIN}/pg_ctl", "-D", data, "-l", os.path.join(directory, "log"), "-w", "start")
    return data


def wait_for_replay(primary, standby):
    target = one(primary, "SELECT pg_current_wal_flush_lsn()")[0]
    for _ in range(300):
        if one(standby, "SELECT pg_last_wal_replay_lsn() >= %s::pg_lsn", (target,))[0]:
            return True
        time.sleep(0.1)
    return False


def main():
    tap = Tap(15)
    primary = connect()
    one(primary, "CREATE EXTENSION IF NOT EXISTS pg_throttle; SELECT 1")
    directory = tempfile.mkdtemp(prefix="pg_throttle_standby.")
    port = int(os.environ.get("PGPORT", "5432")) + 50
    # The backup is taken before the primary hands out any token, so the
    # standby's copy of the fence file knows none of them: only WAL tells it.
    data = make_standby(primary, directory, port)
    standby = None
    for _ in range(100):
        try:
            standby = connect(host="127.0.0.1", port=port)
            break
        except psycopg2.OperationalError:
            time.sleep(0.1)
    tap.ok(standby is not None, "the standby runs with pg_throttle preloaded")

    tokens = [one(primary, "SELECT throttle.lock('fo.t%s', '10 seconds')" % i)[0] for i in range(20)]
    lease = grant_before(tap, primary, "fo")
    tap.ok(wait_for_replay(primary, standby), "the standby has replayed the primary's WAL")
    tap.is_(error_code(standby, "SELECT throttle.lock('fo.standby')"), "25006",
            "a standby refuses to hand out fence tokens (25006)")
    # The standby started from a backup: its start counts as a crash, so an
    # interval shorter than its uptime is granted.
    tap.ok(one(standby, "SELECT throttle.acquire('fo.standby-only', '10 milliseconds')")[0],
           "a standby's own registry works for acquire")

    # The primary fails; the standby is promoted.
    subprocess.run(["pg_ctlcluster", "15", "regress", "stop", "-m", "immediate"], check=True,
                   capture_output=True)
    primary.close()
    tap.ok(one(standby, "SELECT pg_promote(true, 30)")[0], "the standby is promoted")
    promoted_at = time.time()
    check_nothing_granted_twice(tap, standby, "fo", "the promotion")
    tap.ok(not one(standby, "SELECT throttle.acquire('fo.standby-only', '1 second')")[0],
           "what the standby granted before is forgotten: everything counts as granted at the promotion")
    holder = one(standby, "SELECT holder FROM throttle.locks WHERE name = 'fo.lease'")
    tap.ok(holder is not None and holder[0].startswith("[unknown"), "it is held for an unknown holder",
           repr(holder))
    time.sleep(max(0.0, promoted_at + MAX_LEASE_S + 0.3 - time.time()))
    token = one(standby, "SELECT throttle.lock('fo.lease', '10 seconds')")[0]
    tap.ok(token is not None, "after max_lease the promoted server grants the lease")
    tap.ok(token is not None and token > max(tokens + [lease]),
           "with a fence token above every token the primary handed out", repr((token, lease)))
    log = open(os.path.join(directory, "log")).read()
    tap.ok("pg_throttle noticed the promotion" in log, "the log says the promotion was noticed")
    standby.close()
    as_postgres(f"{BIN}/pg_ctl", "-D", data, "-m", "immediate", "stop")
    shutil.rmtree(directory, ignore_errors=True)
    tap.done()


if __name__ == "__main__":
    main()
