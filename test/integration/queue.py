#!/usr/bin/python3
"""The event queue with real workers: 6 workers drain thousands of grouped
events with claim_group; every event is completed exactly once and no group
is held by two workers at overlapping times. LISTEN gets due events.
"""
import collections
import datetime
import os
import random
import select
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(__file__))
from pgconn import connect, fresh_database  # noqa: E402
from tap import Tap  # noqa: E402

WORKERS = 6
GROUPS = 300
EVENTS = 3000
QUEUE = "it.orders"


def worker(name, claims, errors, stop_at):
    conn = connect()
    cur = conn.cursor()
    rng = random.Random(name)
    idle_since = None
    try:
        while time.monotonic() < stop_at:
            cur.execute("SELECT id, group_key, clock_timestamp(), claim_token "
                        "FROM throttle.claim_group(%s, %s, '1 minute')",
                        (QUEUE, name))
            rows = cur.fetchall()
            if not rows:
                cur.execute("SELECT count(*) FROM throttle.all_events WHERE queue = %s AND state IN ('pending', 'claimed')",
                            (QUEUE,))
                if cur.fetchone()[0] == 0:
                    return
                idle_since = idle_since or time.monotonic()
                time.sleep(0.01)
                continue
            idle_since = None
            ids = [r[0] for r in rows]
            groups = {r[1] for r in rows}
            time.sleep(rng.uniform(0, 0.003))  # the work
            cur.execute("SELECT clock_timestamp(), throttle.complete(%s::bigint[], %s)", (ids, rows[0][3]))
            ended, completed = cur.fetchone()
            claims.append((name, groups, ids, rows[0][2], ended, completed))
    except Exception as e:  # noqa: BLE001 - reported as a test failure
        errors.append(f"{name}: {e}")
    finally:
        conn.close()


def main():
    tap = Tap(19)
    conn = connect()
    cur = conn.cursor()
    cur.execute("DELETE FROM throttle.event WHERE queue = %s", (QUEUE,))
    # Most events due now; some become due during the run.
    cur.execute("""
        SELECT count(throttle.schedule(%s, 'e' || g, now() + CASE WHEN g %% 10 = 0
                                       THEN random() * interval '2 seconds' ELSE interval '0' END,
                                       jsonb_build_object('n', g), 'g' || (g %% %s)))
        FROM generate_series(1, %s) AS g""", (QUEUE, GROUPS, EVENTS))
    tap.is_(cur.fetchone()[0], EVENTS, f"{EVENTS} events scheduled over {GROUPS} groups")

    claims, errors = [], []
    stop_at = time.monotonic() + 60
    threads = [threading.Thread(target=worker, args=(f"w{i}", claims, errors, stop_at)) for i in range(WORKERS)]
    t0 = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    took = time.monotonic() - t0
    tap.is_(errors, [], "no worker failed")
    cur.execute("SELECT count(*) FILTER (WHERE state = 'done'), count(*) FROM throttle.all_events WHERE queue = %s",
                (QUEUE,))
    done, total = cur.fetchone()
    tap.ok(done == total == EVENTS, f"all {EVENTS} events done in {took:.1f} s", f"done {done} of {total}")
    completed_ids = collections.Counter(i for c in claims for i in c[2])
    tap.ok(len(completed_ids) == EVENTS and max(completed_ids.values()) == 1,
           "every event was claimed and completed exactly once",
           f"distinct {len(completed_ids)}, most claims of one event {max(completed_ids.values(), default=0)}")
    tap.is_(sum(c[5] for c in claims), EVENTS, "complete counted every event once")
    tap.ok(all(len(c[1]) == 1 for c in claims), "each claim_group call returned one group")
    by_group = collections.defaultdict(list)
    for name, groups, _, started, ended, _ in claims:
        by_group[next(iter(groups))].append((started, ended, name))
    overlaps = 0
    for spans in by_group.values():
        spans.sort()
        for (s1, e1, w1), (s2, e2, w2) in zip(spans, spans[1:]):
            if s2 < e1:
                overlaps += 1
    tap.is_(overlaps, 0, "no group was held by two workers at overlapping times")

    # LISTEN: a due event notifies the queue's channel with its id.
    listener = connect()
    lcur = listener.cursor()
    lcur.execute('LISTEN "it.mail"')
    cur.execute("SELECT throttle.schedule('it.mail', 'later', now() + interval '1 hour')")
    cur.execute("SELECT throttle.schedule('it.mail', 'now', now())")
    due_id = cur.fetchone()[0]
    received = []
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and not received:
        if select.select([listener], [], [], 0.5)[0]:
            listener.poll()
            received += [(n.channel, n.payload) for n in listener.notifies]
    time.sleep(0.2)
    listener.poll()
    received += [(n.channel, n.payload) for n in listener.notifies if (n.channel, n.payload) not in received]
    tap.is_(received, [("it.mail", str(due_id))], "LISTEN gets the due event's id, and only that one")
    listener.close()

    # A group is one group on every clock: a worker on the test clock claims
    # it in an open transaction; a worker on the real clock, blocked on the
    # row until that commits, must then get nothing.
    cur.execute("SELECT throttle.schedule('it.clocks', 'one', now(), group_key => 'cust')")
    test_worker = connect(autocommit=False)
    tcur = test_worker.cursor()
    tcur.execute("SET pg_throttle.test_clock = %s", (str(datetime.datetime.now(datetime.timezone.utc)),))
    tcur.execute("SELECT id FROM throttle.claim_group('it.clocks', 'worker-test', '5 minutes')")
    first = tcur.fetchall()
    second = []

    def real_worker():
        real = connect()
        rcur = real.cursor()
        rcur.execute("SELECT id FROM throttle.claim_group('it.clocks', 'worker-real', '5 minutes')")
        second.extend(rcur.fetchall())
        real.close()

    t = threading.Thread(target=real_worker)
    t.start()
    time.sleep(0.5)
    test_worker.commit()
    t.join(timeout=10)
    tap.ok(len(first) == 1 and second == [] and not t.is_alive(),
           "a group claimed on the test clock is not claimed again on the real clock",
           f"test clock got {first}, real clock got {second}")
    test_worker.close()
    conn.close()
    answers(tap)
    tap.done()


def notices(conn, sql, params=None):
    """Runs `sql`; returns its one value and the notices it raised."""
    del conn.notices[:]
    with conn.cursor() as cur:
        cur.execute(sql, params)
        value = cur.fetchone()[0]
    return value, list(conn.notices)


ROLE = "pgt_queue_answers"


def answers(tap):
    """What complete, fail, extend, cancel and reschedule say when they
    change fewer events than asked: a NOTICE, their return values as before."""
    admin, db = fresh_database("pgt_queue_answers")
    cur = db.cursor()
    cur.execute("SET pg_throttle.test_clock = '2031-01-01 12:00:00+00'")
    cur.execute("SET TimeZone = 'UTC'")
    cur.execute("SELECT throttle.schedule('ans', 'a' || g, throttle.now(), group_key => 'cust')"
                " FROM generate_series(1, 2) AS g")
    cur.execute("SELECT array_agg(id ORDER BY id), min(claim_token)"
                " FROM throttle.claim_group('ans', 'w1', '1 minute')")
    ids, token = cur.fetchone()
    # The README's group example, copied with its literal token.
    tap.is_(notices(db, "SELECT throttle.complete(%s::bigint[], 5002)", (ids,)),
            (0, ["NOTICE:  the claim token holds none of the 2 events given: throttle.complete "
                 "left them as they are\nHINT:  The claim's lease may have ended and another "
                 "worker claimed the events since, or the token is not the claim_token that claim "
                 "or claim_group returned. Only the role that made the claim, its members and "
                 "superusers may end it.\n"]),
            "complete with a token that holds none of the events: 0, and a NOTICE says so")
    tap.is_(notices(db, "SELECT throttle.complete(%s::bigint[], %s)", ([ids[0], ids[0]], token)),
            (1, []), "complete of an event the token holds, named twice: 1, no NOTICE")
    tap.is_(notices(db, "SELECT throttle.complete(%s::bigint[], %s)", (ids, token))[1],
            ["NOTICE:  the claim token does not hold 1 of the 2 events given: throttle.complete "
             "left it as it is\nHINT:  The claim's lease may have ended and another worker "
             "claimed the events since, or the token is not the claim_token that claim or "
             "claim_group returned. Only the role that made the claim, its members and superusers "
             "may end it.\n"],
            "complete of two events of which the token holds one: the NOTICE counts the other")

    # A claim lost to the end of its lease: the old worker's fail and extend.
    cur.execute("SELECT throttle.schedule('ans', 'lost', throttle.now())")
    cur.execute("SELECT id, claim_token FROM throttle.claim('ans', 'w1', '1 minute')")
    lost_id, old_token = cur.fetchone()
    cur.execute("SET pg_throttle.test_clock = '2031-01-01 12:01:00+00'")
    tap.is_(notices(db, "SELECT throttle.extend(%s::bigint[], %s, '1 minute')", ([lost_id], old_token)),
            (0, ["NOTICE:  the claim token does not hold the event given: throttle.extend left it "
                 "as it is\nHINT:  A claim whose lease has ended is not extended: another worker "
                 "may have claimed the events since. Or the token is not the claim_token that "
                 "claim or claim_group returned. Only the role that made the claim, its members "
                 "and superusers may extend it.\n"]),
            "extend of a claim whose lease ended: 0, and a NOTICE says so")
    cur.execute("SELECT claim_token FROM throttle.claim('ans', 'w2', '1 minute')")
    new_token = cur.fetchone()[0]
    value, said = notices(db, "SELECT throttle.fail(%s::bigint[], %s, 'boom')", ([lost_id], old_token))
    tap.ok(value == 0 and len(said) == 1 and said[0].startswith(
        "NOTICE:  the claim token does not hold the event given: throttle.fail left it as it is"),
        "fail by the worker whose claim was taken over: 0, and a NOTICE says so", f"{value} {said}")
    tap.is_(notices(db, "SELECT throttle.complete(%s::bigint[], %s)", ([lost_id], new_token)),
            (1, []), "complete by the new holder: 1, no NOTICE")

    # cancel and reschedule: why false.
    cur.execute("SELECT throttle.schedule('ans', 'held', throttle.now())")
    held = cur.fetchone()[0]
    cur.execute("SELECT claim_token FROM throttle.claim('ans', 'w3', '1 hour')")
    tap.is_(notices(db, "SELECT throttle.cancel('ans', 'held')"),
            (False, ["NOTICE:  throttle.cancel found no pending event 'held' in queue 'ans': event "
                     f"{held} is claimed by 'w3' until 2031-01-01 13:01:00+00, and still runs\nHINT:  cancel "
                     'and reschedule change pending events only. A claim ends with throttle.complete '
                     'or throttle.fail, or when its lease ends.\n']),
            "cancel of a claimed event: false, and a NOTICE says who holds it and that it still runs")
    tap.is_(notices(db, "SELECT throttle.reschedule('ans', 'nobody', throttle.now())"),
            (False, ["NOTICE:  throttle.reschedule found no pending event 'nobody' in queue 'ans': "
                     'the queue has no event with that item_key\n']),
            "reschedule of an unknown key: false, and a NOTICE says there is none")
    # Values chosen by callers (the item_key by whoever scheduled it, the worker
    # by whoever claimed it) appear as SQL literals, control characters
    # escaped: they can neither forge the rest of the message nor send a raw
    # newline or terminal escape.
    cur.execute("SELECT throttle.schedule('ans', %s, throttle.now())", ("h'\"\n\x1b[31m",))
    hostile = cur.fetchone()[0]
    cur.execute("SELECT claim_token FROM throttle.claim('ans', %s, '1 hour')",
                ("w' until 2031-01-01, and still runs\x1b[0m",))
    tap.is_(notices(db, "SELECT throttle.cancel('ans', %s)", ("h'\"\n\x1b[31m",)),
            (False, ["NOTICE:  throttle.cancel found no pending event E'h''\"\\n\\u001b[31m' in "
                     f"queue 'ans': event {hostile} is claimed by E'w'' until 2031-01-01, and "
                     "still runs\\u001b[0m' until 2031-01-01 13:01:00+00, and still runs\nHINT:  "
                     "cancel and reschedule change pending events only. A claim ends with "
                     "throttle.complete or throttle.fail, or when its lease ends.\n"]),
            "cancel: an item_key and a worker with a quote, a newline and an escape byte appear "
            "as SQL literals, escaped, and the NOTICE keeps its shape")
    # A role that may cancel but not read throttle.all_events learns no more
    # than the false it gets.
    acur = admin.cursor()
    acur.execute("SELECT count(*) FROM pg_roles WHERE rolname = %s", (ROLE,))
    if acur.fetchone()[0] == 0:
        acur.execute(f"CREATE ROLE {ROLE}")
    cur.execute("REVOKE SELECT ON throttle.all_events FROM PUBLIC")
    cur.execute(f"SET ROLE {ROLE}")
    tap.is_(notices(db, "SELECT throttle.cancel('ans', 'held')"),
            (False, ["NOTICE:  throttle.cancel found no pending event 'held' in queue 'ans'\n"
                     'HINT:  throttle.all_events shows why to a role that may read it.\n']),
            "to a role that may not read throttle.all_events, only that no event is pending")
    cur.execute("RESET ROLE")
    db.close()
    acur.execute("DROP DATABASE pgt_queue_answers")
    acur.execute(f"DROP ROLE {ROLE}")
    admin.close()


if __name__ == "__main__":
    main()
