#!/usr/bin/python3
"""Rate-limited claims with many real workers on the real clock.

A queue named in throttle.queue_bucket hands out at most as many events as
its bucket allows. Eight workers claim (one, three at a time, or a group)
and complete as fast as they can for a few seconds; the claimed_at of every
event they got is the log: in every span of it, [t_i, t_j], the claims
never exceed burst + (t_j - t_i) / T, T = per / rate (the GCRA bound), and
no event is claimed twice.
"""
import os
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(__file__))
from pgconn import connect, one  # noqa: E402
from tap import Tap  # noqa: E402

QUEUE = "qr.limited"
RATE, PER_MS, BURST = 40, 1000, 6
EMISSION_US = PER_MS * 1000 // RATE
WORKERS = 8
SECONDS = 4.0


def drain(queue, name, seconds, grouped, max_events, errors, claimed):
    """Claims (claim_group, or claim of up to max_events) and completes
    events of `queue` for `seconds`; the ids it got go to `claimed`."""
    conn = connect()
    deadline = time.monotonic() + seconds
    try:
        with conn.cursor() as cur:
            while time.monotonic() < deadline:
                if grouped:
                    cur.execute("SELECT id, claim_token FROM throttle.claim_group(%s, %s, '1 minute')",
                                (queue, name))
                else:
                    cur.execute("SELECT id, claim_token FROM throttle.claim(%s, %s, '1 minute', %s)",
                                (queue, name, max_events))
                rows = cur.fetchall()
                if rows:
                    claimed.extend(r[0] for r in rows)
                    cur.execute("SELECT throttle.complete(%s::bigint[], %s)", ([r[0] for r in rows], rows[0][1]))
    except Exception as e:  # noqa: BLE001 - reported by the checks
        errors.append(str(e))
    finally:
        conn.close()


def worst_span(stamps, burst, emission_us):
    """The span of sorted claim times (us) with the most claims beyond
    burst + span / emission_us: (how many too many, i, j), or None."""
    worst = None
    for i in range(len(stamps)):
        for j in range(i, len(stamps)):
            over = j - i + 1 - (burst + (stamps[j] - stamps[i]) // emission_us)
            if over > 0 and (worst is None or over > worst[0]):
                worst = (over, i, j)
    return worst


def limit(cur, table, queue, bucket, rate, per, burst):
    """Empties `queue` (both event tables) and names it in `table`
    (queue_bucket or group_bucket) with a new bucket of that shape."""
    cur.execute("DELETE FROM throttle.event WHERE queue = %s", (queue,))
    cur.execute("DELETE FROM throttle.event_history WHERE queue = %s", (queue,))
    cur.execute("DELETE FROM throttle.bucket WHERE name = %s", (bucket,))
    cur.execute("INSERT INTO throttle.bucket (name, rate, per, burst) VALUES (%s, %s, %s, %s)",
                (bucket, rate, per, burst))
    cur.execute(f"INSERT INTO throttle.{table} (queue, bucket) VALUES (%s, %s)", (queue, bucket))


def held_claim_locks_no_more(tap, admin):
    """A claim whose transaction stays open locks no more events than the
    bucket let it claim: another worker gets the next unit's event at once."""
    cur = admin.cursor()
    limit(cur, "queue_bucket", "qr.held", "qr.one", 1, "1 second", 1)
    cur.execute("SELECT count(throttle.schedule('qr.held', 'h' || g, now() - interval '1 minute')) "
                "FROM generate_series(1, 5) g")
    first = connect(autocommit=False)
    got_first = one(first, "SELECT count(*) FROM throttle.claim('qr.held', 'w1', '1 minute', 5)")[0]
    time.sleep(1.2)
    second = connect()
    got_second = one(second, "SELECT count(*) FROM throttle.claim('qr.held', 'w2', '1 minute', 5)")[0]
    first.commit()
    tap.ok(got_first == 1 and got_second == 1,
           "a claim held open in its transaction locks only the events its units cover: "
           "the next worker gets the next unit's event",
           f"first {got_first}, second {got_second}")
    first.close()
    second.close()
    cur.execute("DELETE FROM throttle.queue_bucket WHERE queue = 'qr.held'")
    cur.execute("DELETE FROM throttle.event WHERE queue = 'qr.held'")


def group_buckets_on_the_test_clock(tap, admin):
    """Each group of a queue in throttle.group_bucket has a bucket of its own:
    claim_group hands a group no more than its units, passes over a group
    whose bucket is empty, and the queue's own bucket still bounds them all."""
    cur = admin.cursor()
    cur.execute("SET pg_throttle.test_clock = '2031-03-01 12:00:00+00'")
    for queue in ("qr.groups", "qr.both"):
        cur.execute("DELETE FROM throttle.event WHERE queue = %s", (queue,))
        cur.execute("DELETE FROM throttle.event_history WHERE queue = %s", (queue,))
    cur.execute("DELETE FROM throttle.bucket WHERE name IN ('qr.two', 'qr.three')")
    cur.execute("INSERT INTO throttle.bucket (name, rate, per, burst) VALUES ('qr.two', 2, '1 minute', 2),"
                " ('qr.three', 3, '1 minute', 3)")
    cur.execute("INSERT INTO throttle.group_bucket (queue, bucket) VALUES ('qr.groups', 'qr.two'), "
                "('qr.both', 'qr.two')")
    cur.execute("INSERT INTO throttle.queue_bucket (queue, bucket) VALUES ('qr.both', 'qr.three')")
    for queue in ("qr.groups", "qr.both"):
        cur.execute("SELECT count(throttle.schedule(%s, g || '.' || n, '2031-03-01 11:00:00+00', "
                    "group_key => g)) FROM unnest(ARRAY['G1', 'G2']) g, generate_series(1, 5) n", (queue,))

    def claim(queue):
        cur.execute("SELECT group_key, count(*), min(claim_token), array_agg(id) "
                    "FROM throttle.claim_group(%s, 'w', '1 minute') GROUP BY group_key", (queue,))
        row = cur.fetchone()
        if row is None:
            return None
        cur.execute("SELECT throttle.complete(%s, %s)", (row[3], row[2]))
        return row[0], row[1]
    got = [claim("qr.groups") for _ in range(3)]
    cur.execute("SET pg_throttle.test_clock = '2031-03-01 12:00:30+00'")
    got.append(claim("qr.groups"))
    tap.is_(got, [("G1", 2), ("G2", 2), None, ("G1", 1)],
            "claim_group hands each group what its own bucket allows (2 of 5), passes over the groups "
            "whose bucket is empty, and a group's bucket refills at its rate (1 after 30 s)")
    cur.execute("SELECT count(*) FROM throttle.status WHERE kind = 'group_bucket'")
    tap.is_(cur.fetchone()[0], 2, "each group's units are an entry of its own, kind group_bucket")
    cur.execute("SET pg_throttle.test_clock = '2031-03-01 12:00:00+00'")
    got = [claim("qr.both") for _ in range(3)]
    tap.is_(got, [("G1", 2), ("G2", 1), None],
            "beside the queue's bucket (3 units) the groups' buckets (2 each) bound a claim too: "
            "the lower of the two wins")
    cur.execute("RESET pg_throttle.test_clock")
    cur.execute("DELETE FROM throttle.group_bucket WHERE queue IN ('qr.groups', 'qr.both')")
    cur.execute("DELETE FROM throttle.queue_bucket WHERE queue = 'qr.both'")


GROUPED = "qr.pergroup"
G_RATE, G_PER_MS, G_BURST = 10, 1000, 2
G_EMISSION_US = G_PER_MS * 1000 // G_RATE


def group_buckets_with_workers(tap, admin):
    """Six workers claim groups of a queue whose groups take 10 a second,
    burst 2, on the real clock: in every span of each group's claims the
    group never gets more than burst + span / T."""
    cur = admin.cursor()
    limit(cur, "group_bucket", GROUPED, "qr.group", G_RATE, f"{G_PER_MS} milliseconds", G_BURST)
    cur.execute("SELECT count(throttle.schedule(%s, g || '.' || n, now() - interval '1 minute', "
                "group_key => g)) FROM (SELECT 'G' || k AS g FROM generate_series(1, 6) k) s, "
                "generate_series(1, 100) n", (GROUPED,))
    errors = []
    threads = [threading.Thread(target=drain, args=(GROUPED, f"gw{n}", 3.0, True, None, errors, []))
               for n in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    cur.execute("SELECT group_key, array_agg((extract(epoch FROM claimed_at) * 1e6)::bigint ORDER BY claimed_at)"
                " FROM throttle.all_events WHERE queue = %s AND claimed_at IS NOT NULL GROUP BY group_key",
                (GROUPED,))
    per_group = dict(cur.fetchall())
    worst = None
    for group, stamps in per_group.items():
        span = worst_span(stamps, G_BURST, G_EMISSION_US)
        if span is not None and (worst is None or span[0] > worst[0]):
            worst = (span[0], group)
    counts = sorted(len(s) for s in per_group.values())
    tap.ok(not errors and worst is None and len(per_group) == 6 and counts[0] >= G_RATE,
           f"6 workers, 6 groups of 100 that take {G_RATE} a second: no group ever got more than "
           f"burst {G_BURST} + span / {G_EMISSION_US} us, each got its share ({counts})",
           "; ".join(errors[:1]) + (f" {worst[0]} too many in group {worst[1]}" if worst else ""))
    cur.execute("DELETE FROM throttle.group_bucket WHERE queue = %s", (GROUPED,))


def main():
    tap = Tap(10)
    admin = connect()
    cur = admin.cursor()
    limit(cur, "queue_bucket", QUEUE, "qr.bucket", RATE, f"{PER_MS} milliseconds", BURST)
    cur.execute("SELECT count(throttle.schedule(%s, 'e' || g, now() - interval '1 minute')) "
                "FROM generate_series(1, 600) g", (QUEUE,))
    cur.execute("SELECT count(throttle.schedule(%s, 'g' || g, now() - interval '1 minute', "
                "group_key => 'grp' || (g %% 40))) FROM generate_series(1, 400) g", (QUEUE,))
    errors, claimed = [], []
    threads = [threading.Thread(target=drain, args=(QUEUE, f"w{n}", SECONDS, n % 3 == 0, 1 + 2 * (n % 2),
                                                    errors, claimed))
               for n in range(WORKERS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    tap.ok(not errors, f"{WORKERS} workers claiming from a rate-limited queue: no error",
           errors[0] if errors else "")
    stamps = [r[0] for r in one(admin, "SELECT array_agg(ARRAY[(extract(epoch FROM claimed_at) * 1e6)::bigint]"
                                       " ORDER BY claimed_at) FROM throttle.all_events WHERE queue = %s "
                                       "AND claimed_at IS NOT NULL", (QUEUE,))[0] or []]
    worst = worst_span(stamps, BURST, EMISSION_US)
    tap.ok(worst is None, f"in every span of the log, claims never exceed burst {BURST} + span / {EMISSION_US} us",
           f"{worst[0]} too many between claims {worst[1]} and {worst[2]}" if worst else "")
    most = BURST + int(SECONDS * 1e6 + 2e6) // EMISSION_US
    tap.ok(RATE <= len(stamps) <= most,
           f"the workers got about what the bucket refilled: {len(stamps)} events in {SECONDS} s",
           f"at least {RATE}, at most {most}")
    tap.is_(len(claimed), len(set(claimed)), "no event was claimed twice")
    left = one(admin, "SELECT count(*) FILTER (WHERE state = 'pending'), count(*) FILTER (WHERE attempts > 1) "
                      "FROM throttle.all_events WHERE queue = %s", (QUEUE,))
    tap.ok(left[0] > 0 and left[1] == 0, "the events the bucket held back are still pending, none retried",
           f"pending {left[0]}, retried {left[1]}")
    cur.execute("DELETE FROM throttle.queue_bucket WHERE queue = %s", (QUEUE,))
    cur.execute("DELETE FROM throttle.event WHERE queue = %s", (QUEUE,))
    held_claim_locks_no_more(tap, admin)
    group_buckets_on_the_test_clock(tap, admin)
    group_buckets_with_workers(tap, admin)
    admin.close()
    tap.done()


if __name__ == "__main__":
    main()
