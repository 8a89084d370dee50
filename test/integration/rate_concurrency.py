#!/usr/bin/python3
"""16 real clients on one token bucket for several seconds, on the real clock.

Every call is recorded in a table of the test's own, with the real time
before and after the decision. GCRA promises allowed <= burst + rate *
elapsed, and that a call is refused only while the bucket is empty: with
burst 50 at 1 000/s, a call made 100 ms after the last grant must pass. Both
are checked exactly. The throughput floor (>= 95 % of what the span allows)
leaves out the spans in which no client was calling at all: a machine that
stops every process for a moment is not a bucket that refuses.
"""
import bisect
import os
import sys

sys.path.insert(0, os.path.dirname(__file__))
from pgconn import connect, pgbench  # noqa: E402
from tap import Tap  # noqa: E402

CLIENTS = 16
SECONDS = 5
RATE = 1000   # per second
BURST = 50
FULL_AFTER = 0.1   # s after the last grant: the bucket is full again (it needs 50 ms)
IDLE_GAP = 0.05    # s with no call from any of the 16 clients: the machine stood still


def main():
    tap = Tap(5)
    conn = connect()
    cur = conn.cursor()
    cur.execute("DROP TABLE IF EXISTS rate_calls")
    cur.execute("CREATE UNLOGGED TABLE rate_calls (before float8, allowed bool, after float8)")
    # The target list is evaluated in order: before, the decision, after.
    script = f"""
INSERT INTO rate_calls
SELECT extract(epoch FROM clock_timestamp()),
       throttle.allow('rc.hot', {RATE}, '1 second', {BURST}),
       extract(epoch FROM clock_timestamp());
"""
    cur.execute("SELECT extract(epoch FROM clock_timestamp())")
    started = float(cur.fetchone()[0])
    calls, _ = pgbench(script, SECONDS, CLIENTS)
    cur.execute("SELECT extract(epoch FROM clock_timestamp())")
    outer = float(cur.fetchone()[0]) - started
    cur.execute("SELECT before, allowed, after FROM rate_calls ORDER BY before")
    rows = cur.fetchall()
    grants = [(before, after) for before, ok, after in rows if ok]
    refusals = [(before, after) for before, ok, after in rows if not ok]
    starts = [row[0] for row in rows]
    allowed = len(grants)

    tap.ok(calls > 3 * allowed, f"{CLIENTS} clients called far faster than the rate",
           f"calls: {calls}, allowed: {allowed}")
    upper = BURST + RATE * outer
    tap.ok(allowed <= upper, f"allowed <= burst + rate * elapsed ({allowed} <= {upper:.0f})")

    # A refusal is wrong when every grant decided before it was decided more
    # than FULL_AFTER earlier. Grant g was decided in [g.before, g.after];
    # refusal r in [r.before, r.after]. Only grants with g.before <= r.after
    # can precede r; if the latest `after` among them is older than
    # r.before - FULL_AFTER, the bucket was full when r was refused.
    befores = [g[0] for g in grants]
    reach, latest = [], float("-inf")
    for _, after in grants:
        latest = max(latest, after)
        reach.append(latest)
    wrong = []
    for before, after in refusals:
        i = bisect.bisect_right(befores, after) - 1
        if i < 0 or reach[i] < before - FULL_AFTER:
            wrong.append(before - started)
    tap.ok(not wrong, f"no call refused {FULL_AFTER * 1000:.0f} ms after the last grant "
           f"(of {len(refusals)} refusals)", f"refused at {[round(w, 3) for w in wrong[:10]]} s")

    # The floor, over the span from the first grant to the last, less the
    # gaps in which no client made any call (each beyond IDLE_GAP).
    first, last = grants[0][0], grants[-1][0]
    idle = sum(max(0.0, b - a - IDLE_GAP) for a, b in zip(starts, starts[1:])
               if first <= a and b <= last)
    span = last - first - idle
    lower = 0.95 * (BURST + RATE * span)
    tap.ok(allowed >= lower, f"allowed >= 95 % of burst + rate * active span "
           f"({allowed} >= {lower:.0f}; {idle * 1000:.0f} ms with no caller)")
    # A second without a grant while clients were being refused.
    gaps = [(a, b) for a, b in zip(befores, befores[1:]) if b - a > 1.0]
    starved = [round(b - a, 3) for a, b in gaps
               if any(a < before < b for before, _ in refusals)]
    tap.ok(not starved, "no client starved the bucket for a second",
           f"gaps between grants: {[round(b - a, 3) for a, b in gaps]}")
    cur.execute("DROP TABLE rate_calls")
    conn.close()
    tap.done()


if __name__ == "__main__":
    main()
