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


def worker(n, errors, claimed):
    conn = connect()
    deadline = time.monotonic() + SECONDS
    try:
        with conn.cursor() as cur:
            while time.monotonic() < deadline:
                if n % 3 == 0:
                    cur.execute("SELECT id, claim_token FROM throttle.claim_group(%s, %s, '1 minute')",
                                (QUEUE, f"w{n}"))
                else:
                    cur.execute("SELECT id, claim_token FROM throttle.claim(%s, %s, '1 minute', %s)",
                                (QUEUE, f"w{n}", 1 + 2 * (n % 2)))
                rows = cur.fetchall()
                if rows:
                    claimed.extend(r[0] for r in rows)
                    cur.execute("SELECT throttle.complete(%s::bigint[], %s)", ([r[0] for r in rows], rows[0][1]))
    except Exception as e:  # noqa: BLE001 - reported by the checks
        errors.append(str(e))
    finally:
        conn.close()


def held_claim_locks_no_more(tap, admin):
    """A claim whose transaction stays open locks no more events than the
    bucket let it claim: another worker gets the next unit's event at once."""
    cur = admin.cursor()
    cur.execute("DELETE FROM throttle.event WHERE queue = 'qr.held'")
    cur.execute("DELETE FROM throttle.bucket WHERE name = 'qr.one'")
    cur.execute("INSERT INTO throttle.bucket (name, rate, per, burst) VALUES ('qr.one', 1, '1 second', 1)")
    cur.execute("INSERT INTO throttle.queue_bucket (queue, bucket) VALUES ('qr.held', 'qr.one')")
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


def main():
    tap = Tap(6)
    admin = connect()
    cur = admin.cursor()
    cur.execute("DELETE FROM throttle.event WHERE queue = %s", (QUEUE,))
    cur.execute("DELETE FROM throttle.bucket WHERE name = 'qr.bucket'")
    cur.execute("INSERT INTO throttle.bucket (name, rate, per, burst) VALUES ('qr.bucket', %s, %s, %s)",
                (RATE, f"{PER_MS} milliseconds", BURST))
    cur.execute("INSERT INTO throttle.queue_bucket (queue, bucket) VALUES (%s, 'qr.bucket')", (QUEUE,))
    cur.execute("SELECT count(throttle.schedule(%s, 'e' || g, now() - interval '1 minute')) "
                "FROM generate_series(1, 600) g", (QUEUE,))
    cur.execute("SELECT count(throttle.schedule(%s, 'g' || g, now() - interval '1 minute', "
                "group_key => 'grp' || (g %% 40))) FROM generate_series(1, 400) g", (QUEUE,))
    errors, claimed = [], []
    threads = [threading.Thread(target=worker, args=(n, errors, claimed)) for n in range(WORKERS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    tap.ok(not errors, f"{WORKERS} workers claiming from a rate-limited queue: no error",
           errors[0] if errors else "")
    stamps = [r[0] for r in one(admin, "SELECT array_agg(ARRAY[(extract(epoch FROM claimed_at) * 1e6)::bigint]"
                                       " ORDER BY claimed_at) FROM throttle.all_events WHERE queue = %s "
                                       "AND claimed_at IS NOT NULL", (QUEUE,))[0] or []]
    worst = None
    for i in range(len(stamps)):
        for j in range(i, len(stamps)):
            allowed = BURST + (stamps[j] - stamps[i]) // EMISSION_US
            if j - i + 1 > allowed and (worst is None or j - i + 1 - allowed > worst[0]):
                worst = (j - i + 1 - allowed, i, j)
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
    admin.close()
    tap.done()


if __name__ == "__main__":
    main()
