#!/usr/bin/python3
"""Many real clients hammering throttle.acquire: never more grants than allowed.

pgbench runs the clients; every grant is recorded in a table, so the number of
grants is counted independently of the extension's own counters.
"""
import os
import sys
import time

sys.path.insert(0, os.path.dirname(__file__))
from pgconn import connect, pgbench as run_pgbench  # noqa: E402
from tap import Tap  # noqa: E402

CLIENTS = 16
SECONDS = 4


def pgbench(script):
    return run_pgbench(script, SECONDS, CLIENTS)


def main():
    tap = Tap(12)
    conn = connect()
    cur = conn.cursor()
    cur.execute("DROP TABLE IF EXISTS conc_grants")
    cur.execute("CREATE TABLE conc_grants (test text, k int, at timestamptz DEFAULT clock_timestamp())")

    # 1. One hot resource, one-hour interval: exactly one grant in total.
    processed, failed = pgbench("""
SELECT throttle.acquire('conc.hot', '1 hour') AS got \\gset
\\if :got
INSERT INTO conc_grants (test) VALUES ('hot');
\\endif
""")
    cur.execute("SELECT count(*) FROM conc_grants WHERE test = 'hot'")
    tap.ok(processed > 1000, f"{CLIENTS} clients made many calls on one resource",
           f"calls: {processed}")
    tap.is_(failed, 0, "no client call failed")
    tap.is_(cur.fetchone()[0], 1, "exactly one grant for one hot resource in one hour")
    cur.execute("SELECT grants, denials FROM throttle.status WHERE name = 'conc.hot'")
    grants, denials = cur.fetchone()
    tap.is_(grants, 1, "status counts that one grant")
    tap.is_(grants + denials, processed, "status counts every call, granted or denied")

    # 2. Many resources hit concurrently: each granted at most once.
    processed, failed = pgbench("""
\\set k random(1, 500)
SELECT throttle.acquire('conc.k.' || :k, '1 hour') AS got \\gset
\\if :got
INSERT INTO conc_grants (test, k) VALUES ('many', :k);
\\endif
""")
    cur.execute("SELECT count(*), count(DISTINCT k) FROM conc_grants WHERE test = 'many'")
    total, distinct = cur.fetchone()
    tap.is_(failed, 0, "no client call failed on many resources")
    tap.is_(total, distinct, "no resource of 500 granted twice")
    tap.ok(distinct == 500, "every resource of 500 granted once", f"granted: {distinct}")

    # 3. A short interval on the real clock: grants never exceed what elapsed time allows.
    every_ms = 20
    cur.execute("SELECT clock_timestamp()")
    started = cur.fetchone()[0]
    processed, failed = pgbench(f"""
SELECT throttle.acquire('conc.short', '{every_ms} milliseconds') AS got \\gset
\\if :got
INSERT INTO conc_grants (test) VALUES ('short');
\\endif
""")
    cur.execute("SELECT count(*), extract(epoch FROM clock_timestamp() - %s) FROM conc_grants "
                "WHERE test = 'short'", (started,))
    grants, elapsed = cur.fetchone()
    allowed = int(float(elapsed) * 1000 // every_ms) + 1
    tap.ok(0 < grants <= allowed,
           f"{every_ms} ms interval: grants within what {float(elapsed):.2f} s allow",
           f"grants: {grants}, allowed: {allowed}")

    # 4. No caller waits for the winner's transaction.
    winner = connect(autocommit=False)
    with winner.cursor() as wcur:
        wcur.execute("SELECT throttle.acquire('conc.open-txn', '1 hour')")
        tap.ok(wcur.fetchone()[0], "the winner is granted inside an open transaction")
        other = connect()
        with other.cursor() as ocur:
            ocur.execute("SET statement_timeout = '5s'")
            t0 = time.monotonic()
            ocur.execute("SELECT throttle.acquire('conc.open-txn', '1 hour')")
            denied = not ocur.fetchone()[0]
            waited = time.monotonic() - t0
        tap.ok(denied and waited < 1.0,
               "a second caller is denied at once while the winner's transaction is open",
               f"denied: {denied}, waited {waited:.3f} s")
        other.close()
    winner.rollback()
    winner.close()
    again = connect()
    with again.cursor() as acur:
        acur.execute("SELECT throttle.acquire('conc.open-txn', '1 hour')")
        tap.ok(not acur.fetchone()[0], "the winner's rollback did not give the grant back")
    again.close()

    cur.execute("DROP TABLE conc_grants")
    conn.close()
    tap.done()


if __name__ == "__main__":
    main()
