#!/usr/bin/python3
"""Fair claims between tenants, measured: one big tenant with BENCH_FAIR_BIG (100 000) due events
and BENCH_FAIR_TENANTS (99) small tenants with BENCH_FAIR_SMALL (10) each, all due before the
workers start, the big tenant's oldest. BENCH_FAIR_WORKERS (4) workers, each a thread with its
own connection, loop on a claim of max BENCH_FAIR_MAX (10) + complete (an empty claim sleeps
10 ms), until every small tenant's events are done.

A tenant is a group (group_key; the workers call claim_group), then a concurrency key
(concurrency_key; the workers call claim; throttle.concurrency_policy.max_claimed
BENCH_FAIR_KEY_ROOM (10): at most that many events of one tenant at once). Each twice on the
cluster of the libpq environment, in one run: fairness 'oldest_first' (the default) and
'round_robin' (throttle.group_policy, throttle.concurrency_policy). Lateness = claimed_at
(throttle.event_history, the server's clock) minus the instant the workers started (every event
was due by then).
Prints per policy: the small tenants' p50 / p99 / max lateness, the big tenant's events claimed
meanwhile, the claim_group calls that got events per second, and the mean time of such a call
(the cost per claim), of an empty one, as the workers saw them.
"""
import os
import threading
import time

import psycopg2

BIG = int(os.environ.get("BENCH_FAIR_BIG", "100000"))
TENANTS = int(os.environ.get("BENCH_FAIR_TENANTS", "99"))
SMALL = int(os.environ.get("BENCH_FAIR_SMALL", "10"))
WORKERS = int(os.environ.get("BENCH_FAIR_WORKERS", "4"))
MAX = int(os.environ.get("BENCH_FAIR_MAX", "10"))
TIMEOUT = float(os.environ.get("BENCH_FAIR_TIMEOUT", "300"))
KEY_ROOM = int(os.environ.get("BENCH_FAIR_KEY_ROOM", "10"))

# Per kind of tenant: the claim, the policy table, the column and the argument of schedule_many.
KINDS = {
    "groups": ("claim_group", "group_policy", "group_key", "group_keys"),
    "keys": ("claim", "concurrency_policy", "concurrency_key", "concurrency_keys"),
}


def connect():
    conn = psycopg2.connect("")
    conn.autocommit = True
    return conn


class Worker(threading.Thread):
    def __init__(self, queue, name, stop, claim):
        super().__init__(daemon=True)
        self.queue, self.name_, self.stop, self.claim = queue, name, stop, claim
        self.conn = connect()
        self.full = []   # seconds per claim_group call that got events
        self.empty = []  # seconds per call that got none

    def run(self):
        cur = self.conn.cursor()
        while not self.stop.is_set():
            began = time.perf_counter()
            cur.execute(f"SELECT array_agg(id), min(claim_token) FROM "
                        f"throttle.{self.claim}(%s, %s, '1 minute', %s)", (self.queue, self.name_, MAX))
            ids, token = cur.fetchone()
            took = time.perf_counter() - began
            if ids:
                self.full.append(took)
                cur.execute("SELECT throttle.complete(%s::bigint[], %s)", (ids, token))
            else:
                self.empty.append(took)
                time.sleep(0.01)
        self.conn.close()


def percentile(values, p):
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(p / 100 * (len(ordered) - 1))))]


def one(cur, sql, args=None):
    cur.execute(sql, args)
    return cur.fetchone()


def run_policy(admin, kind, fairness):
    claim, policy, column, argument = KINDS[kind]
    queue = f"bench.fair.{kind}.{fairness}"
    cur = admin.cursor()
    for table in ("event", "event_history"):
        cur.execute(f"DELETE FROM throttle.{table} WHERE queue = %s", (queue,))
    cur.execute(f"DELETE FROM throttle.{policy} WHERE queue = %s", (queue,))
    if kind == "keys":
        cur.execute("INSERT INTO throttle.concurrency_policy (queue, max_claimed, fairness)"
                    " VALUES (%s, %s, %s)", (queue, KEY_ROOM, fairness))
    else:
        cur.execute("INSERT INTO throttle.group_policy (queue, fairness) VALUES (%s, %s)",
                    (queue, fairness))
    # The big tenant's events are the oldest (an hour ago on), the small ones' a minute ago.
    for start in range(0, BIG, 10000):
        cur.execute("SELECT cardinality(throttle.schedule_many(%s, array_agg('big' || i),"
                    " array_agg(now() - interval '1 hour' + i * interval '1 ms'),"
                    f" {argument} => array_agg('big'::text))) FROM generate_series(%s, %s) i",
                    (queue, start + 1, min(BIG, start + 10000)))
    cur.execute("SELECT cardinality(throttle.schedule_many(%s, array_agg('t' || t || '.' || i),"
                f" array_agg(now() - interval '1 minute'), {argument} => array_agg('t' || lpad(t::text, 3, '0'))))"
                " FROM generate_series(1, %s) t, generate_series(1, %s) i", (queue, TENANTS, SMALL))
    cur.execute("VACUUM ANALYZE throttle.event")
    stop = threading.Event()
    workers = [Worker(queue, f"w{i}", stop, claim) for i in range(WORKERS)]
    started = one(cur, "SELECT now()")[0]
    began = time.perf_counter()
    for w in workers:
        w.start()
    small_left = TENANTS * SMALL
    while small_left > 0 and time.perf_counter() - began < TIMEOUT:
        time.sleep(0.05)
        small_left = one(cur, "SELECT count(*) FROM throttle.event WHERE queue = %s"
                              f" AND {column} <> 'big'", (queue,))[0]
    elapsed = time.perf_counter() - began
    stop.set()
    for w in workers:
        w.join()
    lateness = [r[0] for r in rows(cur, "SELECT extract(epoch FROM claimed_at - %s) * 1000"
                                        " FROM throttle.event_history WHERE queue = %s"
                                        f" AND {column} <> 'big' AND state = 'done'", (started, queue))]
    big_done = one(cur, "SELECT count(*) FROM throttle.event_history WHERE queue = %s"
                        f" AND {column} = 'big' AND state = 'done'", (queue,))[0]
    full = [t for w in workers for t in w.full]
    empty = [t for w in workers for t in w.empty]
    for table in ("event", "event_history"):
        cur.execute(f"DELETE FROM throttle.{table} WHERE queue = %s", (queue,))
    cur.execute(f"DELETE FROM throttle.{policy} WHERE queue = %s", (queue,))
    return {
        "small": len(lateness), "left": small_left, "elapsed": elapsed, "big": big_done,
        "p50": percentile(lateness, 50) if lateness else float("nan"),
        "p99": percentile(lateness, 99) if lateness else float("nan"),
        "max": max(lateness) if lateness else float("nan"),
        "claims_s": len(full) / elapsed,
        "full_ms": 1000 * sum(full) / max(1, len(full)),
        "empty_ms": 1000 * sum(empty) / max(1, len(empty)),
    }


def rows(cur, sql, args=None):
    cur.execute(sql, args)
    return cur.fetchall()


def main():
    admin = connect()
    admin.cursor().execute("CREATE EXTENSION IF NOT EXISTS pg_throttle")
    print(f"one tenant with {BIG} due events, {TENANTS} with {SMALL} each; {WORKERS} workers, "
          f"a claim of max {MAX} + complete; until the small tenants are done; tenants as groups"
          f" (claim_group), then as concurrency keys (claim, max_claimed {KEY_ROOM})")
    print(f"{'tenants':<7} {'fairness':<14} {'small p50':>10} {'p99':>9} {'max':>9} {'big done':>9} "
          f"{'claims/s':>9} {'ms/claim':>9} {'ms/empty':>9} {'seconds':>8}")
    for kind, fairness in [(k, f) for k in KINDS for f in ("oldest_first", "round_robin")]:
        r = run_policy(admin, kind, fairness)
        print(f"{kind:<7} {fairness:<14} {r['p50']:>10.1f} {r['p99']:>9.1f} {r['max']:>9.1f} {r['big']:>9} "
              f"{r['claims_s']:>9.1f} {r['full_ms']:>9.2f} {r['empty_ms']:>9.2f} {r['elapsed']:>8.1f}"
              + (f"  ({r['left']} small events left at the timeout)" if r["left"] else ""))
    print("lateness in ms after the workers started; claims/s: claim calls that got events")


if __name__ == "__main__":
    main()
