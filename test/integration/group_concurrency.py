#!/usr/bin/python3
"""Per-group concurrency: throttle.group_concurrency lets N claims hold a group.

First the rules, one at a time, on the extension's clock (test_clock):
the N + 1st claim gets nothing, ending a claim frees its slot, a claim that
shared memory forgot (as after a restart) still counts while the table says
its lease holds, expired claims are taken over and their worker fenced,
extend renews a slot above 0, release_group ends every slot, a rollback
frees its slot, and lowering N holds the group to the new N.

Then a race on the real clock: 10 workers drain 60 groups of a queue whose
groups take 3 workers, claiming 3 events at a time; a group's events are
the oldest due ones together, so workers crowd onto one group after another. Each worker logs when
its claim returned and when it called complete; those spans lie inside the
time the claim held its group, so no instant may fall in 4 spans of one
group. Every event is completed exactly once.
"""
import collections
import os
import random
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(__file__))
from pgconn import connect, sql_error  # noqa: E402
from tap import Tap  # noqa: E402

QUEUE = "it.groupconc"
RACE_QUEUE = "it.groupconc.race"
WORKERS = 10
GROUPS = 60
PER_GROUP = 15
LIMIT = 3


def rows(cur, sql, params=None):
    cur.execute(sql, params)
    return cur.fetchall()


def claim(cur, worker, lease="1 minute", max_=1, queue=QUEUE):
    got = rows(cur, "SELECT id, claim_token FROM throttle.claim_group(%s, %s, %s, %s)",
               (queue, worker, lease, max_))
    return [r[0] for r in got], (got[0][1] if got else None)


def complete(cur, ids, token):
    return rows(cur, "SELECT throttle.complete(%s::bigint[], %s)", (ids, token))[0][0]


def rules(tap):
    conn = connect()
    cur = conn.cursor()
    cur.execute("SET pg_throttle.test_clock = '2030-01-01 12:00:00+00'")
    cur.execute("DELETE FROM throttle.event WHERE queue = %s", (QUEUE,))
    cur.execute("INSERT INTO throttle.group_concurrency (queue, workers) VALUES (%s, 2)", (QUEUE,))
    cur.execute("SELECT throttle.schedule(%s, 'k' || g, throttle.now(), group_key => 'g')"
                " FROM generate_series(1, 8) g", (QUEUE,))

    a, ta = claim(cur, "a")
    b, tb = claim(cur, "b")
    c, _ = claim(cur, "c")
    tap.ok(len(a) == 1 and len(b) == 1 and a != b and c == [],
           "two claims hold the group with one event each; a third gets nothing",
           f"a={a} b={b} c={c}")
    tap.is_(complete(cur, a, ta), 1, "complete ends the first claim")
    c, tc = claim(cur, "c")
    tap.ok(len(c) == 1 and c != b, "its slot goes to the next claim", f"c={c}")

    # extend renews the lease of slot 1 in shared memory, not only the rows.
    cur.execute("SET pg_throttle.test_clock = '2030-01-01 12:00:30+00'")
    tap.is_(rows(cur, "SELECT throttle.extend(%s::bigint[], %s, '5 minutes')", (b, tb))[0][0], 1,
            "extend renews the claim held in slot 1")
    tap.is_(rows(cur, "SELECT next_grant_at = '2030-01-01 12:05:30+00' FROM throttle.status"
                      " WHERE kind = 'group' AND token = %s", (tb,)), [(True,)],
            "and its lease in shared memory")

    # Past c's lease its expired claim is taken over, first, and c fenced.
    cur.execute("SET pg_throttle.test_clock = '2030-01-01 12:02:00+00'")
    e, te = claim(cur, "e")
    tap.is_(e, c, "past its lease an expired claim is taken over, its events first")
    tap.is_(complete(cur, c, tc), 0, "its old worker is fenced: complete changes nothing")
    f_, _ = claim(cur, "f")
    tap.is_(f_, [], "the extended claim and the new one hold both slots")

    # Shared memory forgets both leases (as a crash would): the table, whose
    # claimed rows still hold, keeps the group from a third claim.
    cur.execute("SELECT throttle._group_reset(%s, 'g')", (QUEUE,))
    g_, _ = claim(cur, "g")
    tap.is_(g_, [], "claims that shared memory forgot still count while their lease holds")
    tap.is_(complete(cur, b, tb), 1, "one of them completes")
    g_, tg = claim(cur, "g")
    tap.ok(len(g_) == 1, "then one more claim gets the group", f"g={g_}")
    h, _ = claim(cur, "h")
    tap.is_(h, [], "and no third: one holder known to the table only, one to both")

    # release_group ends every slot: both holders fenced, two new claims fit.
    cur.execute("SELECT throttle.release_group(%s, 'g')", (QUEUE,))
    tap.is_((complete(cur, e, te), complete(cur, g_, tg)), (0, 0),
            "release_group fences the holders of every slot")
    conn2 = connect(autocommit=False)
    cur2 = conn2.cursor()
    cur2.execute("SET pg_throttle.test_clock = '2030-01-01 12:02:00+00'")
    r, _ = claim(cur2, "r")
    conn2.rollback()
    h, th = claim(cur, "h")
    i, ti = claim(cur, "i")
    tap.ok(len(r) == 1 and len(h) == 1 and len(i) == 1,
           "a claim rolled back frees its slot at once", f"r={r} h={h} i={i}")

    # Lowered to 1 while two claims hold: none until both have ended.
    cur.execute("UPDATE throttle.group_concurrency SET workers = 1 WHERE queue = %s", (QUEUE,))
    complete(cur, h, th)
    j, tj = claim(cur, "j")
    tap.is_(j, [], "lowered to 1: a claim still holding keeps the group whole")
    complete(cur, i, ti)
    j, tj = claim(cur, "j", max_=None)
    tap.ok(len(j) >= 2, "once it ends, one claim takes every due event", f"j={j}")

    tap.is_(sql_error(conn, "SELECT * FROM throttle.claim_group(%s, 'x', '1 minute', 0)",
                      (QUEUE,))[0], "22023", "max 0 is refused (22023)")
    tap.is_(sql_error(conn, "INSERT INTO throttle.group_concurrency VALUES ('it.x', 65)")[0],
            "23514", "more than 64 workers per group is refused (23514)")
    cur.execute("DELETE FROM throttle.group_concurrency WHERE queue = %s", (QUEUE,))
    conn2.close()
    conn.close()


def race_worker(index, log, errors, stop_at):
    conn = connect()
    cur = conn.cursor()
    rng = random.Random(index)
    try:
        while time.monotonic() < stop_at:
            got = rows(cur, "SELECT id, claim_token, group_key FROM throttle.claim_group("
                            "%s, %s, '1 minute', 3)", (RACE_QUEUE, f"w{index}"))
            returned = time.monotonic()
            if not got:
                left = rows(cur, "SELECT count(*) FROM throttle.event WHERE queue = %s"
                                 " AND state IN ('pending', 'claimed')", (RACE_QUEUE,))[0][0]
                if left == 0:
                    return
                time.sleep(0.005)
                continue
            time.sleep(rng.uniform(0.0, 0.02))
            ids, token, group = [r[0] for r in got], got[0][1], got[0][2]
            completing = time.monotonic()
            done = complete(cur, ids, token)
            log.append((group, returned, completing, ids, done))
    except Exception as e:  # noqa: BLE001 - reported as a test failure
        errors.append(f"w{index}: {e}")
    finally:
        conn.close()


def most_at_once(spans):
    """The most spans (start, end) that share an instant."""
    edges = sorted([(s, 1) for s, _ in spans] + [(e, -1) for _, e in spans],
                   key=lambda edge: (edge[0], edge[1]))
    now = best = 0
    for _, step in edges:
        now += step
        best = max(best, now)
    return best


def race(tap):
    conn = connect()
    cur = conn.cursor()
    cur.execute("DELETE FROM throttle.event WHERE queue = %s", (RACE_QUEUE,))
    cur.execute("INSERT INTO throttle.group_concurrency (queue, workers) VALUES (%s, %s)",
                (RACE_QUEUE, LIMIT))
    cur.execute("SELECT throttle.schedule_many(%s, array_agg('e' || n ORDER BY n),"
                " array_agg(now() - interval '1 minute' ORDER BY n), NULL,"
                " array_agg('g' || (n - 1) / %s ORDER BY n))"
                " FROM generate_series(1, %s) n", (RACE_QUEUE, PER_GROUP, GROUPS * PER_GROUP))
    log, errors = [], []
    stop_at = time.monotonic() + 120
    threads = [threading.Thread(target=race_worker, args=(i, log, errors, stop_at))
               for i in range(WORKERS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    tap.is_(errors, [], "no worker failed")

    spans = collections.defaultdict(list)
    for group, returned, completing, _, _ in log:
        spans[group].append((returned, completing))
    worst = max((most_at_once(s) for s in spans.values()), default=0)
    tap.ok(worst <= LIMIT, f"no group was held by more than {LIMIT} claims at once",
           f"most at once: {worst}")
    tap.ok(worst >= 2, "groups were held by several claims at once (the limit was reached for)",
           f"most at once: {worst}")
    completed = collections.Counter(i for *_, ids, done in log if done == len(ids) for i in ids)
    fenced = [entry for entry in log if entry[4] != len(entry[3])]
    tap.is_(fenced, [], "every claim completed all of its events")
    tap.ok(len(completed) == GROUPS * PER_GROUP and max(completed.values()) == 1,
           "every event was completed exactly once",
           f"{len(completed)} events, most completions of one: {max(completed.values(), default=0)}")
    left = rows(cur, "SELECT count(*) FROM throttle.event WHERE queue = %s AND state <> 'done'",
                (RACE_QUEUE,))[0][0]
    tap.is_(left, 0, "the table agrees: every event is done")
    cur.execute("DELETE FROM throttle.group_concurrency WHERE queue = %s", (RACE_QUEUE,))
    print(f"# {len(log)} claims, most holders of one group at once: {worst}")
    conn.close()


def main():
    tap = Tap(24)
    rules(tap)
    race(tap)
    return tap.done()


if __name__ == "__main__":
    sys.exit(main())
