#!/usr/bin/python3
"""A claim starts its walk of the due events at the queue's scan floor, and
misses no event however it came to be pending behind it.

throttle.claim keeps, in shared memory, where the first pending event of a
queue's highest priority is (src/pg/queue/scan_floors.hpp), so that it does
not walk again, at every claim, the index entries that finished claims left
behind, which vacuum cannot remove while an old snapshot is open. Here:

- with a REPEATABLE READ snapshot held open, 3 000 jobs scheduled, claimed
  and completed; a claim then reads a few index entries, not thousands
  (pg_stat_get_xact_tuples_returned), also when their leases have ended
  (the look-up of expired claims starts at a floor of its own);
- every way an event becomes pending behind the floor, each followed by a
  claim that must return it first: a schedule with a past run_at, a claim
  rolled back, two claims of one transaction rolled back, a schedule and a
  claim in one transaction, a schedule committed by a transaction held open across
  another session's claims, a successor whose claimed run completes, fail
  with retry_in => '0', retry of a dead event, reschedule to an earlier
  time, a superuser's UPDATE, a higher priority and back, a REPEATABLE
  READ claim whose snapshot is older than a schedule, a transaction that
  writes to more queues than a commit notes one by one;
- the two priorities a queue's floors track, events between, above and
  below them, claims with a concurrency key pending (the other path), and
  the claims' leases: a claim whose lease ends before the earlier claims'
  (a shorter lease, or extend to a shorter one) is taken over as it ends;
- a race of 8 clients that schedule events due in the past, claim, and
  complete, fail or roll back at random: every event completed exactly
  once, and a claim that finds nothing means that nothing is due.
"""
import os
import random
import sys
import threading

sys.path.insert(0, os.path.dirname(__file__))
from pgconn import connect, event_rows_read, fresh_database, one  # noqa: E402
from tap import Tap  # noqa: E402

DB = "queue_scan_floor"
JOBS = 3000
BOUND = 200  # index entries and rows a claim may read after JOBS jobs


def claim(conn, queue, max_=1):
    with conn.cursor() as cur:
        cur.execute("SELECT id, item_key, claim_token FROM throttle.claim(%s, 'w', '1 minute', %s)",
                    (queue, max_))
        return cur.fetchall()


def claimed_keys(conn, queue, max_=1):
    return [row[1] for row in claim(conn, queue, max_)]


def complete(conn, rows):
    with conn.cursor() as cur:
        for (id_, _key, token) in rows:
            cur.execute("SELECT throttle.complete(ARRAY[%s]::bigint[], %s)", (id_, token))


def schedule(conn, queue, key, ago, **extra):
    names = "".join(f", {name} => %s" for name in extra)
    return one(conn, f"SELECT throttle.schedule(%s, %s, now() - %s::interval{names})",
               (queue, key, ago, *extra.values()))[0]


def old_snapshot(tap, db, floors):
    """Claims stay cheap while a snapshot older than their work is open."""
    holder = connect(dbname=DB, autocommit=False)
    with holder.cursor() as cur:
        cur.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        cur.execute("SELECT count(*) FROM throttle.event")
    with db.cursor() as cur:
        for i in range(JOBS):
            cur.execute("SELECT throttle.schedule('snap', %s, now())", (f"j{i}",))
            cur.execute("SELECT id, claim_token FROM throttle.claim('snap', 'w', '1 minute', 1)")
            id_, token = cur.fetchone()
            cur.execute("SELECT throttle.complete(ARRAY[%s]::bigint[], %s)", (id_, token))
        cur.execute("SELECT throttle.schedule('snap', 'last', now())")
    work = connect(dbname=DB, autocommit=False)
    with work.cursor() as cur:
        # Two minutes on: the leases of the finished claims have all ended,
        # so the look-up of expired claims meets their entries too.
        cur.execute("SELECT set_config('pg_throttle.test_clock',"
                    " (now() + interval '2 minutes')::text, false)")
        work.commit()
        before = event_rows_read(cur)
        cur.execute("SELECT item_key FROM throttle.claim('snap', 'w', '1 minute', 1)")
        got = cur.fetchall()
        read = event_rows_read(cur) - before
        cur.execute("SELECT item_key FROM throttle.claim('snap', 'w', '1 minute', 1)")
        again = cur.fetchall()
        read_empty = event_rows_read(cur) - before - read
        work.commit()
    tap.is_(got, [("last",)], "after 3 000 jobs under an old snapshot, the claim gets the due event")
    skip = "" if floors else " # SKIP scan floors are off"
    tap.ok(read <= BOUND or not floors,
           f"and reads {read} rows and index entries of throttle.event (at most {BOUND}){skip}")
    tap.is_(again, [], "then the queue is drained")
    tap.ok(read_empty <= BOUND or not floors,
           f"and a claim of the drained queue reads {read_empty} (at most {BOUND}){skip}")
    holder.rollback()
    holder.close()
    work.close()


def behind_the_floor(tap, db):
    """Each way an event becomes pending behind the floor."""
    q = "behind"
    for i in range(5):
        schedule(db, q, f"k{i}", f"{60 - i} minutes")
    tap.is_(claimed_keys(db, q, 2), ["k0", "k1"], "claims take the oldest first")

    schedule(db, q, "past", "2 hours")
    tap.is_(claimed_keys(db, q), ["past"], "an event scheduled in the past comes first")

    db.autocommit = False
    tap.is_(claimed_keys(db, q), ["k2"], "a claim in a transaction takes k2")
    db.rollback()
    db.autocommit = True
    tap.is_(claimed_keys(db, q), ["k2"], "rolled back, k2 is claimed again, first")

    writer = connect(dbname=DB, autocommit=False)
    schedule(writer, q, "held", "3 hours")  # not committed yet
    tap.is_(claimed_keys(db, q), ["k3"], "a claim while the writer's transaction is open")
    tap.is_(claimed_keys(db, q), ["k4"], "and another, which counts the floor past k4")
    writer.commit()
    writer.close()
    tap.is_(claimed_keys(db, q), ["held"], "the event committed behind the floor comes next")
    tap.is_(claimed_keys(db, q), [], "then nothing is due")

    first = claim(db, q) or None
    tap.is_(first, None, "(still nothing)")
    schedule(db, q, "t1", "50 minutes")
    schedule(db, q, "t2", "49 minutes")
    db.autocommit = False
    tap.is_(claimed_keys(db, q) + claimed_keys(db, q), ["t1", "t2"],
            "two claims in one transaction take t1, then t2")
    db.rollback()
    db.autocommit = True
    tap.is_(claimed_keys(db, q, 2), ["t1", "t2"], "rolled back, both are claimed again")

    db.autocommit = False
    with db.cursor() as cur:
        cur.execute("SELECT throttle.schedule(%s, 'own', now() - interval '4 hours')", (q,))
    tap.is_(claimed_keys(db, q), ["own"],
            "a claim takes what its own transaction scheduled, behind the floor")
    db.rollback()
    db.autocommit = True
    tap.is_(claimed_keys(db, q), [], "(rolled back, it is gone)")

    schedule(db, q, "key", "10 minutes")
    run = claim(db, q)
    schedule(db, q, "key", "20 minutes")  # a successor, behind, waiting for the claimed run
    schedule(db, q, "after", "1 minute")
    tap.is_(claimed_keys(db, q), ["after"], "a successor waits while its key's run is claimed")
    complete(db, run)
    tap.is_(claimed_keys(db, q), ["key"], "completed, the successor behind the floor is claimed")

    schedule(db, q, "failing", "30 minutes")
    failing = claim(db, q)
    schedule(db, q, "later", "5 seconds")
    tap.is_(claimed_keys(db, q), ["later"], "(a newer event is claimed)")
    with db.cursor() as cur:
        cur.execute("SELECT throttle.fail(ARRAY[%s]::bigint[], %s, 'boom', retry_in => '0')",
                    (failing[0][0], failing[0][2]))
    tap.is_(claimed_keys(db, q), ["failing"], "failed with retry_in => 0, it is claimed again")

    dead = schedule(db, q, "dead", "40 minutes", max_attempts=1)
    dead_run = claim(db, q)
    with db.cursor() as cur:
        cur.execute("SELECT throttle.fail(ARRAY[%s]::bigint[], %s, 'fatal')",
                    (dead_run[0][0], dead_run[0][2]))
    schedule(db, q, "newer", "1 second")
    tap.is_(claimed_keys(db, q), ["newer"], "a dead event is not claimed")
    one(db, "SELECT throttle.retry(%s)", (dead,))
    tap.is_(claimed_keys(db, q), ["dead"], "retried, it is claimed")

    schedule(db, q, "moved", "1 second")
    schedule(db, q, "stays", "2 seconds")
    tap.is_(claimed_keys(db, q), ["stays"], "the older of two comes first")
    one(db, "SELECT throttle.reschedule(%s, 'moved', now() - interval '1 day')", (q,))
    tap.is_(claimed_keys(db, q), ["moved"], "rescheduled to an earlier time, it is claimed")

    schedule(db, q, "touched", "1 second")
    schedule(db, q, "other", "2 seconds")
    tap.is_(claimed_keys(db, q), ["other"], "(the older comes first)")
    one(db, "UPDATE throttle.event SET run_at = now() - interval '1 year'"
            " WHERE queue = %s AND item_key = 'touched' RETURNING id", (q,))
    tap.is_(claimed_keys(db, q), ["touched"], "moved behind by a superuser's UPDATE, it is claimed")

    schedule(db, q, "low", "1 hour")
    schedule(db, q, "high", "1 second", priority=5)
    tap.is_(claimed_keys(db, q), ["high"], "a higher priority comes first")
    schedule(db, q, "low2", "2 hours")
    tap.is_(claimed_keys(db, q, 2), ["low2", "low"], "then the lower one, oldest first")

    schedule(db, q, "rr1", "1 minute")
    tap.is_(claimed_keys(db, q), ["rr1"], "(a claim counts the floor)")
    schedule(db, q, "rr2", "30 seconds")
    repeatable = connect(dbname=DB, autocommit=False)
    with repeatable.cursor() as cur:
        cur.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        cur.execute("SELECT 1")  # its snapshot, before the next schedule
    schedule(db, q, "rr-old", "5 hours")
    tap.is_(claimed_keys(repeatable, q), ["rr2"],
            "a REPEATABLE READ claim, its snapshot older than a schedule, takes what it sees")
    repeatable.commit()
    repeatable.close()
    tap.is_(claimed_keys(db, q), ["rr-old"], "the event its snapshot did not show is claimed next")

    with db.cursor() as cur:
        cur.execute("SELECT throttle.schedule('side', 'a', now())")
        tap.is_(claimed_keys(db, "side"), ["a"], "a queue of its own")
        cur.execute("BEGIN")
        for n in range(12):
            cur.execute("SELECT throttle.schedule(%s, 'many', now() - interval '1 day')",
                        (f"many{n}",))
        cur.execute("SELECT throttle.schedule('side', 'b', now() - interval '1 day')")
        cur.execute("COMMIT")
    tap.is_(claimed_keys(db, "side"), ["b"],
            "written by a transaction that wrote to 13 queues, it is claimed")
    tap.is_(claimed_keys(db, q), [], "nothing else is due")
    tap.is_(one(db, "SELECT count(*) FROM throttle.event WHERE queue = %s AND state = 'pending'"
                    " AND run_at <= now()", (q,))[0], 0, "and nothing is pending and due")


def priorities_and_leases(tap, db):
    """The two tracked priorities, the ranges around them, the path of
    claims with concurrency keys, and the floor of the claims' leases."""
    q = "levels"
    schedule(db, q, "p0a", "10 minutes")
    schedule(db, q, "p5a", "1 minute", priority=5)
    tap.is_(claimed_keys(db, q), ["p5a"], "priority 5 first")
    tap.is_(claimed_keys(db, q), ["p0a"], "then 0: the queue's slot tracks 5 and 0")
    schedule(db, q, "p0b", "20 minutes")
    schedule(db, q, "p3", "1 second", priority=3)
    tap.is_(claimed_keys(db, q), ["p3"], "a priority between the two tracked comes before 0")
    schedule(db, q, "p7", "1 second", priority=7)
    tap.is_(claimed_keys(db, q), ["p7"], "one above both comes first")
    tap.is_(claimed_keys(db, q), ["p0b"], "then 0 again")
    one(db, "SELECT throttle.schedule(%s, 'p0-later', now() + interval '1 hour')", (q,))
    schedule(db, q, "pm1", "1 second", priority=-1)
    tap.is_(claimed_keys(db, q), ["pm1"],
            "with only a future event at 0, the priority below it is claimed")

    schedule(db, q, "x1", "10 minutes")
    tap.is_(claimed_keys(db, q), ["x1"], "(the floor of 0 moves past x1)")
    schedule(db, q, "kx", "5 minutes", concurrency_key="k")
    schedule(db, q, "x2", "20 minutes")
    tap.is_(claimed_keys(db, q, 2), ["x2", "kx"],
            "with a concurrency key pending, the scans from the floor find x2 behind it")

    q = "leases"
    for key in ("a", "b", "c"):
        schedule(db, q, key, "1 minute")
    with db.cursor() as cur:
        cur.execute("SELECT item_key FROM throttle.claim(%s, 'w', '1 hour')", (q,))
        cur.execute("SELECT item_key FROM throttle.claim(%s, 'w', '1 hour')", (q,))
        cur.execute("SELECT item_key FROM throttle.claim(%s, 'w', '1 second')", (q,))
        short = cur.fetchall()
    tap.is_(short, [("c",)], "(c is claimed for a second, after two claims of an hour)")
    with db.cursor() as cur:
        cur.execute("SELECT set_config('pg_throttle.test_clock',"
                    " (now() + interval '10 seconds')::text, false)")
        cur.execute("SELECT item_key, attempts FROM throttle.claim(%s, 'w', '1 hour')", (q,))
        tap.is_(cur.fetchall(), [("c", 2)],
                "its lease ended before the others': the next claim takes it over")
        cur.execute("RESET pg_throttle.test_clock")
    schedule(db, q, "d", "1 minute")
    d = claim(db, q)
    with db.cursor() as cur:
        cur.execute("SELECT throttle.extend(ARRAY[%s]::bigint[], %s, '1 second')",
                    (d[0][0], d[0][2]))
        cur.execute("SELECT set_config('pg_throttle.test_clock',"
                    " (now() + interval '10 seconds')::text, false)")
        cur.execute("SELECT item_key FROM throttle.claim(%s, 'w', '1 hour')", (q,))
        tap.is_(cur.fetchall(), [("d",)], "a lease extended to end sooner is taken over as it ends")
        cur.execute("RESET pg_throttle.test_clock")


def race(tap):
    """8 clients schedule, claim and end events at random."""
    q = "race"
    errors = []
    scheduled = []
    lock = threading.Lock()

    def client(seed):
        rnd = random.Random(seed)
        conn = connect(dbname=DB)
        try:
            for i in range(250):
                key = f"c{seed}-{i}"
                schedule(conn, q, key, f"{rnd.randint(0, 3600)} seconds")
                with lock:
                    scheduled.append(key)
                conn.autocommit = False
                got = claim(conn, q, rnd.randint(1, 3))
                roll = rnd.random()
                if roll < 0.2:
                    conn.rollback()
                else:
                    with conn.cursor() as cur:
                        for (id_, _key, token) in got:
                            if roll < 0.35:
                                cur.execute("SELECT throttle.fail(ARRAY[%s]::bigint[], %s, 'x',"
                                            " retry_in => '0')", (id_, token))
                            else:
                                cur.execute("SELECT throttle.complete(ARRAY[%s]::bigint[], %s)",
                                            (id_, token))
                    conn.commit()
                conn.autocommit = True
        except Exception as e:  # reported below
            errors.append(repr(e))
        finally:
            conn.close()

    threads = [threading.Thread(target=client, args=(seed,)) for seed in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    tap.is_(errors, [], "the clients ran without errors")
    db = connect(dbname=DB)
    with db.cursor() as cur:
        cur.execute("SELECT count(*) FROM throttle.event WHERE queue = %s AND state = 'pending'"
                    " AND run_at <= now() AND attempts < max_attempts", (q,))
        due = cur.fetchone()[0]
    drained = 0
    while True:
        got = claim(db, q, 50)
        if not got:
            break
        complete(db, got)
        drained += len(got)
    tap.is_(drained, due, f"the drain claims every event still due ({due})")
    with db.cursor() as cur:
        cur.execute("SELECT count(*) FROM throttle.event WHERE queue = %s AND state = 'pending'",
                    (q,))
        tap.is_(cur.fetchone()[0], 0, "a claim that found nothing left nothing pending")
        cur.execute("SELECT count(*), count(DISTINCT item_key) FROM throttle.event_history"
                    " WHERE queue = %s AND state = 'done'", (q,))
        done, distinct = cur.fetchone()
        cur.execute("SELECT count(*) FROM throttle.event WHERE queue = %s", (q,))
        left = cur.fetchone()[0]
    tap.ok(done == distinct == len(scheduled) - left,
           f"every event completed exactly once ({done} done, {distinct} keys,"
           f" {len(scheduled)} scheduled, {left} dead)")
    db.close()


def main():
    tap = Tap(51)
    admin, db = fresh_database(DB)
    with db.cursor() as cur:
        cur.execute("SHOW max_prepared_transactions")
        prepared = int(cur.fetchone()[0])
    if prepared > 0:  # floors are off: nothing to show for them, the rules hold the same
        print(f"# max_prepared_transactions = {prepared}: scan floors are off", flush=True)
    old_snapshot(tap, db, floors=prepared == 0)
    behind_the_floor(tap, db)
    priorities_and_leases(tap, db)
    race(tap)
    db.close()
    with admin.cursor() as cur:
        cur.execute(f"DROP DATABASE {DB}")
    tap.done()


if __name__ == "__main__":
    main()
