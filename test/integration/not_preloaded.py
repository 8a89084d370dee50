#!/usr/bin/python3
"""Without shared_preload_libraries: CREATE EXTENSION works, every call says why it cannot."""
import os
import sys

sys.path.insert(0, os.path.dirname(__file__))
from pgconn import connect, sql_error  # noqa: E402
from tap import Tap  # noqa: E402

CALLS = [
    "SELECT throttle.acquire('np.job', '1 hour')",
    "SELECT throttle.acquire('np.job')",
    "SELECT * FROM throttle.status",
    "SELECT * FROM throttle.take('np.key', 10, '1 second')",
    "SELECT throttle.allow('np.key', 10, '1 second')",
    "SELECT throttle.wait('np.key', 10, '1 second')",
    "SELECT throttle.wait('np.key', timeout => '1 second')",
    "SELECT * FROM throttle.take('np.key', 0)",
    "SELECT * FROM throttle.usage",
    "SELECT * FROM throttle.registry_metrics",
    "SELECT throttle.lock('np.lock')",
    "SELECT throttle.unlock('np.lock', 1)",
    "SELECT throttle.renew('np.lock', 1, '1 second')",
    "SELECT * FROM throttle.locks",
    "SELECT throttle.reset('np.lock')",
    "SELECT throttle.now()",
    "SELECT throttle.schedule('np.queue', 'k', now())",
    "SELECT throttle.schedule(NULL, 'k', now())",
    "SELECT throttle.fail(ARRAY[1]::bigint[], 1, 'boom')",
    "SELECT throttle.fail(NULL, NULL, 'boom')",
    "SELECT * FROM throttle.claim('np.queue', 'w')",
    "SELECT throttle.complete(ARRAY[1]::bigint[], 1)",
]


def main():
    tap = Tap(2 + 3 * len(CALLS))
    conn = connect()
    cur = conn.cursor()
    cur.execute("SHOW shared_preload_libraries")
    tap.ok("pg_throttle" not in cur.fetchone()[0], "this cluster does not preload pg_throttle")
    tap.is_(sql_error(conn, "CREATE EXTENSION pg_throttle"), None, "CREATE EXTENSION still works")
    for call in CALLS:
        err = sql_error(conn, call)
        tap.ok(err is not None and err[0] == "55000", f"{call}: SQLSTATE 55000", repr(err))
        tap.ok(err is not None and "shared_preload_libraries" in err[1],
               f"{call}: the message names shared_preload_libraries", repr(err))
        tap.ok(err is not None and err[2] is not None and "shared_preload_libraries" in err[2],
               f"{call}: the hint says how to fix it", repr(err))
    conn.close()
    tap.done()


if __name__ == "__main__":
    main()
