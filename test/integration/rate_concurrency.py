#!/usr/bin/python3
"""16 real clients on one token bucket for several seconds, on the real clock.

Every allowed call is recorded in a table of the test's own. GCRA promises
allowed <= burst + rate * elapsed; with callers far outpacing the rate it
should also hand out nearly all of it (>= 95 %).
"""
import os
import sys

sys.path.insert(0, os.path.dirname(__file__))
from pgconn import connect, pgbench  # noqa: E402
from tap import Tap  # noqa: E402

CLIENTS = 16
SECONDS = 5
RATE = 1000   # per second
BURST = 50


def main():
    tap = Tap(4)
    conn = connect()
    cur = conn.cursor()
    cur.execute("DROP TABLE IF EXISTS rate_grants")
    cur.execute("CREATE UNLOGGED TABLE rate_grants (at timestamptz DEFAULT clock_timestamp())")
    script = f"""
SELECT throttle.allow('rc.hot', {RATE}, '1 second', {BURST}) AS ok \\gset
\\if :ok
INSERT INTO rate_grants DEFAULT VALUES;
\\endif
"""
    cur.execute("SELECT clock_timestamp()")
    started = cur.fetchone()[0]
    calls, _ = pgbench(script, SECONDS, CLIENTS)
    cur.execute("SELECT count(*), extract(epoch FROM clock_timestamp() - %s), "
                "extract(epoch FROM max(at) - min(at)) FROM rate_grants", (started,))
    allowed, outer, inner = cur.fetchone()
    outer, inner = float(outer), float(inner)

    tap.ok(calls > 3 * allowed, f"{CLIENTS} clients called far faster than the rate",
           f"calls: {calls}, allowed: {allowed}")
    upper = BURST + RATE * outer
    tap.ok(allowed <= upper, f"allowed <= burst + rate * elapsed ({allowed} <= {upper:.0f})")
    # The first and last recorded grants lie inside the run: the bucket must
    # have handed out at least 95 % of what that span allows.
    lower = 0.95 * (BURST + RATE * inner)
    tap.ok(allowed >= lower, f"allowed >= 95 % of burst + rate * elapsed ({allowed} >= {lower:.0f})")
    cur.execute("SELECT count(*) FROM (SELECT at, lag(at) OVER (ORDER BY at) AS prev FROM rate_grants) g "
                "WHERE at - prev > interval '1 second'")
    tap.is_(cur.fetchone()[0], 0, "no client starved the bucket for a second")
    cur.execute("DROP TABLE rate_grants")
    conn.close()
    tap.done()


if __name__ == "__main__":
    main()
