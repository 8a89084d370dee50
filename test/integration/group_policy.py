#!/usr/bin/python3
"""throttle.group_policy: per-group concurrency, and groups in strict order.

Per-group concurrency lets N claims hold a group.

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

Strict order: the rules on the test clock (id order whatever run_at says, a
failed event holding back the claim's later ones without using their
attempts, a head not yet due or backing off holding back the group, a dead
or cancelled head letting it go on, an expired claim taken over by a claim
cut short by max or by the queue's bucket, or released, charging its first
event only), then a race: 8 workers drain groups
kept in strict order, failing a fifth of their events at random; each
group's completions, in the order the server recorded them, must be in id
order.
"""
import collections
import os
import random
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(__file__))
from pgconn import connect, most_at_once, rows, sql_error  # noqa: E402
from tap import Tap  # noqa: E402

QUEUE = "it.groupconc"
RACE_QUEUE = "it.groupconc.race"
WORKERS = 10
GROUPS = 60
PER_GROUP = 15
LIMIT = 3


def claim(cur, worker, lease="1 minute", max_=1, queue=QUEUE):
    got = rows(cur, "SELECT id, claim_token FROM throttle.claim_group(%s, %s, %s, %s)",
               (queue, worker, lease, max_))
    return [r[0] for r in got], (got[0][1] if got else None)


def drained(cur, queue):
    """Whether every event of the queue is finished."""
    return rows(cur, "SELECT count(*) FROM throttle.all_events WHERE queue = %s"
                     " AND state IN ('pending', 'claimed')", (queue,))[0][0] == 0


def complete(cur, ids, token):
    return rows(cur, "SELECT throttle.complete(%s::bigint[], %s)", (ids, token))[0][0]


def rules(tap):
    conn = connect()
    cur = conn.cursor()
    cur.execute("SET pg_throttle.test_clock = '2030-01-01 12:00:00+00'")
    cur.execute("DELETE FROM throttle.event WHERE queue = %s", (QUEUE,))
    cur.execute("INSERT INTO throttle.group_policy (queue, workers) VALUES (%s, 2)", (QUEUE,))
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
    cur.execute("UPDATE throttle.group_policy SET workers = 1 WHERE queue = %s", (QUEUE,))
    complete(cur, h, th)
    j, tj = claim(cur, "j")
    tap.is_(j, [], "lowered to 1: a claim still holding keeps the group whole")
    complete(cur, i, ti)
    j, tj = claim(cur, "j", max_=None)
    tap.ok(len(j) >= 2, "once it ends, one claim takes every due event", f"j={j}")

    tap.is_(sql_error(conn, "SELECT * FROM throttle.claim_group(%s, 'x', '1 minute', 0)",
                      (QUEUE,))[0], "22023", "max 0 is refused (22023)")
    tap.is_(sql_error(conn, "INSERT INTO throttle.group_policy VALUES ('it.x', 65)")[0],
            "23514", "more than 64 workers per group is refused (23514)")
    cur.execute("DELETE FROM throttle.group_policy WHERE queue = %s", (QUEUE,))
    conn2.close()
    conn.close()


STRICT = "it.strict"
STRICT_RACE = "it.strict.race"


def strict_rules(tap):
    conn = connect()
    cur = conn.cursor()
    cur.execute("SET pg_throttle.test_clock = '2030-01-01 12:00:00+00'")
    cur.execute("DELETE FROM throttle.event WHERE queue = %s", (STRICT,))
    cur.execute("INSERT INTO throttle.group_policy (queue, strict_order) VALUES (%s, true)",
                (STRICT,))
    # Scheduled in the order s1 .. s5, due in the opposite order.
    ids = [rows(cur, "SELECT throttle.schedule(%s, %s, throttle.now() - %s * interval '1 second',"
                     " group_key => 'g', max_attempts => 3)", (STRICT, f"s{n}", n))[0][0]
           for n in range(1, 6)]
    a, ta = claim(cur, "a", max_=None, queue=STRICT)
    tap.is_(a, ids, "a strict group's events come in the order they were scheduled, not by run_at")
    tap.is_(complete(cur, a[:1], ta), 1, "the first completes")
    tap.is_(rows(cur, "SELECT throttle.fail(%s::bigint[], %s, 'boom', '10 seconds')",
                 (a[1:2], ta))[0][0], 1, "the second fails")
    tap.is_(rows(cur, "SELECT array_agg(state || ':' || attempts ORDER BY id) FROM throttle.all_events"
                      " WHERE id = ANY (%s)", (a[2:],))[0][0], ["pending:0"] * 3,
            "the claim's later events went back to pending, their attempt not counted")
    tap.is_(complete(cur, a[2:3], ta), 0, "and its worker can no longer complete them")
    tap.is_([claim(cur, "b", max_=None, queue=STRICT)[0] for _ in range(2)], [[], []],
            "while the failed event backs off, the later ones wait behind it (two calls)")
    cur.execute("SET pg_throttle.test_clock = '2030-01-01 12:00:10+00'")
    c, tc = claim(cur, "c", max_=2, queue=STRICT)
    tap.is_(c, a[1:3], "then the failed one runs first, before the ones behind it")
    tap.is_(rows(cur, "SELECT outcome FROM throttle.attempt_history WHERE event_id = %s"
                      " ORDER BY claimed_at", (a[2],)), [("released",), ("claimed",)],
            "the history shows the held-back attempt as released")
    # The head fails for good: dead, and the group goes on.
    rows(cur, "SELECT throttle.complete(%s::bigint[], %s)", (c[1:], tc))
    rows(cur, "SELECT throttle.fail(%s::bigint[], %s, 'again', '0 seconds')", (c[:1], tc))
    d, td = claim(cur, "d", max_=1, queue=STRICT)
    rows(cur, "SELECT throttle.fail(%s::bigint[], %s, 'for good', '0 seconds')", (d, td))
    e, te = claim(cur, "e", max_=None, queue=STRICT)
    tap.ok(d == a[1:2] and e == a[3:],
           "a head that dies lets the rest of its group go on", f"d={d} e={e} ids={ids}")
    complete(cur, e, te)
    # A head not due yet holds back a later event that is due; cancelling it frees them.
    h1 = rows(cur, "SELECT throttle.schedule(%s, 'h1', throttle.now() + interval '1 hour',"
                   " group_key => 'h')", (STRICT,))[0][0]
    h2 = rows(cur, "SELECT throttle.schedule(%s, 'h2', throttle.now() - interval '1 hour',"
                   " group_key => 'h')", (STRICT,))[0][0]
    tap.is_(claim(cur, "f", max_=None, queue=STRICT)[0], [],
            "an earlier event not due yet holds back a later one that is due")
    cur.execute("SELECT throttle.cancel(%s, 'h1')", (STRICT,))
    tap.ok(claim(cur, "f", max_=None, queue=STRICT)[0] == [h2] and h1 < h2,
           "once it is cancelled, the later one runs")
    # Expired claims: only the first event of each ran, so only it is charged.
    cur.execute("DELETE FROM throttle.event WHERE queue = %s", (STRICT,))
    xs = [rows(cur, "SELECT throttle.schedule(%s, %s, throttle.now(), group_key => 'x',"
                    " max_attempts => 2)", (STRICT, f"x{n}"))[0][0] for n in range(1, 4)]
    for minute in ("13:00", "13:02", "13:04"):
        cur.execute(f"SET pg_throttle.test_clock = '2030-01-01 {minute}:00+00'")
        last = rows(cur, "SELECT id, attempts FROM throttle.claim_group(%s, 'x', '1 minute')",
                    (STRICT,))
    tap.ok(last == [(xs[1], 1), (xs[2], 1)]
           and rows(cur, "SELECT state FROM throttle.all_events WHERE id = %s", (xs[0],)) == [("dead",)],
           "a strict claim that expires charges its first event only: it dies, the rest go on uncharged",
           f"last claim: {last}, ids {xs}")
    tap.is_(sql_error(conn, "INSERT INTO throttle.group_policy VALUES ('it.y', 2, true)")[0],
            "23514", "strict order with more than one worker per group is refused (23514)")
    # A batch runs in the order of its arrays, not of its keys.
    cur.execute("DELETE FROM throttle.event WHERE queue = %s", (STRICT,))
    cur.execute("SELECT throttle.schedule_many(%s, ARRAY['z-first', 'a-second', 'm-third'],"
                " array_fill(throttle.now(), ARRAY[3]), NULL, array_fill('b'::text, ARRAY[3]))",
                (STRICT,))
    tap.is_(rows(cur, "SELECT array_agg(item_key) FROM throttle.claim_group(%s, 'b', '1 minute')",
                 (STRICT,))[0][0], ["z-first", "a-second", "m-third"],
            "a schedule_many batch in a strict group runs in the order of its item_keys array")
    cur.execute("DELETE FROM throttle.group_policy WHERE queue = %s", (STRICT,))
    conn.close()


STRICT_BACK = "it.strict.back"


def strict_handback(tap):
    """An expired strict claim ran its first event only (its worker went in
    order and stopped there): a claim that takes the group over cut short,
    by max or by the queue's bucket, and release_group charge that one
    only. The events handed back untaken go back to pending with the
    attempts they had before the expired claim, and run; every claim stays
    in the history."""
    conn = connect()
    cur = conn.cursor()
    cur.execute("SET pg_throttle.test_clock = '2030-01-02 12:00:00+00'")
    cur.execute("DELETE FROM throttle.event WHERE queue = %s", (STRICT_BACK,))
    cur.execute("INSERT INTO throttle.group_policy (queue, strict_order) VALUES (%s, true)",
                (STRICT_BACK,))

    def three(group):
        return [rows(cur, "SELECT throttle.schedule(%s, %s, throttle.now(), group_key => %s,"
                          " max_attempts => 1)", (STRICT_BACK, f"{group}{n}", group))[0][0]
                for n in range(1, 4)]

    def seen(ids):
        return rows(cur, "SELECT array_agg(state || ':' || attempts ORDER BY id)"
                         " FROM throttle.all_events WHERE id = ANY (%s)", (ids,))[0][0]

    def logged(ids):
        return rows(cur, "SELECT array_agg(outcome || ':' || attempt ORDER BY event_id, id)"
                         " FROM throttle.event_attempt WHERE event_id = ANY (%s)", (ids,))[0][0]

    def at(clock):
        cur.execute(f"SET pg_throttle.test_clock = '2030-01-02 {clock}+00'")

    def finish(ids, token):
        if ids:
            complete(cur, ids, token)

    # Cut short by max.
    m = three("m")
    first, _ = claim(cur, "a", max_=None, queue=STRICT_BACK)
    at("12:05:00")
    cut, _ = claim(cur, "b", max_=1, queue=STRICT_BACK)
    tap.is_((first, seen(m), logged(m)),
            (m, ["dead:1", "pending:0", "pending:0"], ["expired:1"] * 3),
            "a strict claim expired, taken over with max 1: its first event dies on its only attempt, "
            "the two handed back untaken get their attempt back (each claim in the history)")
    c, tc = claim(cur, "c", max_=1, queue=STRICT_BACK)
    finish(c, tc)
    d, td = claim(cur, "d", max_=1, queue=STRICT_BACK)
    finish(d, td)
    tap.is_((cut, c, d, seen(m)), ([], m[1:2], m[2:3], ["dead:1", "done:1", "done:1"]),
            "and they run, in order, one attempt each")

    # Cut short by the queue's bucket: one unit every 10 minutes (a bucket
    # of this run's own: the registry keeps a bucket's units across runs).
    at("13:00:00")
    bucket = f"it.strict.back.{os.getpid()}"
    cur.execute("INSERT INTO throttle.bucket (name, rate, per, burst) VALUES (%s, 1, '10 minutes', 3)",
                (bucket,))
    cur.execute("INSERT INTO throttle.queue_bucket (queue, bucket) VALUES (%s, %s)", (STRICT_BACK, bucket))
    q = three("q")
    first, _ = claim(cur, "a", max_=None, queue=STRICT_BACK)
    at("13:10:00")
    claim(cur, "b", max_=None, queue=STRICT_BACK)
    tap.is_((first, seen(q), logged(q)),
            (q, ["dead:1", "pending:0", "pending:0"], ["expired:1"] * 3),
            "taken over with one unit in the bucket: the same")
    at("13:20:00")
    c, tc = claim(cur, "c", max_=None, queue=STRICT_BACK)
    tap.is_(c, q[1:2], "and the next unit runs the second event")
    finish(c, tc)
    cur.execute("DELETE FROM throttle.queue_bucket WHERE queue = %s", (STRICT_BACK,))
    cur.execute("DELETE FROM throttle.bucket WHERE name = %s", (bucket,))
    finish(*claim(cur, "c", max_=None, queue=STRICT_BACK))  # the third

    # release_group: the same rule.
    r = three("r")
    first, _ = claim(cur, "a", max_=None, queue=STRICT_BACK)
    released = rows(cur, "SELECT throttle.release_group(%s, 'r')", (STRICT_BACK,))[0][0]
    tap.is_((first, released, seen(r), logged(r)),
            (r, 3, ["dead:1", "pending:0", "pending:0"], ["released:1"] * 3),
            "release_group of a strict claim: its first event, on its only attempt, dies; "
            "the later ones never ran and get their attempt back")
    e, te = claim(cur, "e", max_=None, queue=STRICT_BACK)
    tap.is_(e, r[1:], "and they run")
    finish(e, te)

    # claim ends an expired claim whose first event has a newer run without
    # a group: the claim's later events never ran either.
    at("14:00:00")
    x = three("x")
    first, _ = claim(cur, "a", max_=None, queue=STRICT_BACK)
    newer = rows(cur, "SELECT throttle.schedule(%s, 'x1', throttle.now())", (STRICT_BACK,))[0][0]
    at("14:05:00")
    single = rows(cur, "SELECT array_agg(id) FROM throttle.claim(%s, 'f', '1 minute')", (STRICT_BACK,))[0][0]
    tap.is_((first, single, seen(x), logged(x)),
            (x, [newer], ["cancelled:1", "pending:0", "pending:0"], ["expired:1"] * 3),
            "a strict claim whose expired first event a newer run without a group supersedes: "
            "the later events never ran, and get their attempt back")
    g, _ = claim(cur, "g", max_=None, queue=STRICT_BACK)
    tap.is_(g, x[1:], "and they run")
    cur.execute("DELETE FROM throttle.group_policy WHERE queue = %s", (STRICT_BACK,))
    conn.close()


def strict_worker(index, log, errors, stop_at):
    conn = connect()
    cur = conn.cursor()
    rng = random.Random(100 + index)
    try:
        while time.monotonic() < stop_at:
            got = rows(cur, "SELECT id, claim_token, group_key FROM throttle.claim_group("
                            "%s, %s, '1 minute', 3)", (STRICT_RACE, f"s{index}"))
            if not got:
                if drained(cur, STRICT_RACE):
                    return
                time.sleep(0.005)
                continue
            token = got[0][1]
            for event_id, _, group in got:   # in the order returned, one at a time
                if rng.random() < 0.2:
                    rows(cur, "SELECT throttle.fail(%s::bigint[], %s, 'random', '0 seconds')",
                         ([event_id], token))
                    break   # the rest of the claim waits behind it
                if complete(cur, [event_id], token) == 1:
                    log.append((group, event_id))
    except Exception as e:  # noqa: BLE001 - reported as a test failure
        errors.append(f"s{index}: {e}")
    finally:
        conn.close()


def strict_race(tap):
    conn = connect()
    cur = conn.cursor()
    cur.execute("DELETE FROM throttle.event WHERE queue = %s", (STRICT_RACE,))
    cur.execute("INSERT INTO throttle.group_policy (queue, strict_order) VALUES (%s, true)",
                (STRICT_RACE,))
    # Group g<k> gets every 20th event, due in reverse: only id order is right.
    cur.execute("SELECT throttle.schedule_many(%s, array_agg('e' || n ORDER BY n),"
                " array_agg(now() - n * interval '1 millisecond' ORDER BY n), NULL,"
                " array_agg('g' || (n %% 20) ORDER BY n), max_attempts => 1000)"
                " FROM generate_series(1, 600) n", (STRICT_RACE,))
    log, errors = [], []
    stop_at = time.monotonic() + 120
    threads = [threading.Thread(target=strict_worker, args=(i, log, errors, stop_at))
               for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    tap.is_(errors, [], "no strict-order worker failed")
    # The order of completion is the server's: completed_at is read when
    # complete starts, and the next claim of a group starts only after the
    # previous claim's last complete has committed (a worker's own log may
    # append after the next worker's).
    order = dict(rows(cur, "SELECT group_key, array_agg(id ORDER BY completed_at)"
                           " FROM throttle.all_events WHERE queue = %s AND state = 'done'"
                           " GROUP BY group_key", (STRICT_RACE,)))
    out_of_order = {g: ids for g, ids in order.items() if ids != sorted(ids)}
    once = collections.Counter(event_id for _, event_id in log)
    tap.ok(not out_of_order and len(order) == 20 and max(once.values()) == 1,
           "every group's events completed in the order they were scheduled, each once",
           f"{len(out_of_order)} groups out of order: {list(out_of_order.items())[:1]}")
    failed = rows(cur, "SELECT count(*) FROM throttle.event_attempt a JOIN throttle.all_events e"
                       " ON e.id = a.event_id WHERE e.queue = %s AND a.outcome = 'failed'",
                  (STRICT_RACE,))[0][0]
    tap.ok(len(log) == 600 and failed > 0,
           "all 600 completed, with failures among them", f"{len(log)} completed, {failed} failures")
    cur.execute("DELETE FROM throttle.group_policy WHERE queue = %s", (STRICT_RACE,))
    print(f"# strict order: {len(log)} completions, {failed} failures")
    conn.close()


ISOLATION = "it.groupiso"


def isolation(tap):
    """What a claim in an open transaction does to the others."""
    conn = connect()
    cur = conn.cursor()
    cur.execute("DELETE FROM throttle.event WHERE queue = %s", (ISOLATION,))
    cur.execute("INSERT INTO throttle.group_policy (queue, workers) VALUES (%s, 3)", (ISOLATION,))
    cur.execute("SELECT throttle.schedule(%s, 'i' || g, now() - interval '1 minute',"
                " group_key => 'g') FROM generate_series(1, 6) g", (ISOLATION,))
    a, ta = claim(cur, "a", queue=ISOLATION)
    b, _ = claim(cur, "b", queue=ISOLATION)

    # Lowered while a repeatable-read transaction holds a snapshot from before:
    # its claim applies the new limit, not the one its snapshot shows.
    old = connect(autocommit=False)
    old_cur = old.cursor()
    old_cur.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
    old_cur.execute("SELECT 1")
    cur.execute("UPDATE throttle.group_policy SET workers = 2 WHERE queue = %s", (ISOLATION,))
    tap.is_(claim(cur, "y", queue=ISOLATION)[0], [], "lowered to 2 with 2 holding: no third")
    tap.is_(claim(old_cur, "x", queue=ISOLATION)[0], [],
            "nor for a repeatable-read claim whose snapshot predates the change")
    old.rollback()

    # A change waits for the claims in progress, also a new row (nothing to
    # lock a row of); and a poll that claims nothing writes nothing.
    old_cur.execute("SELECT * FROM throttle.claim_group(%s, 'z', '1 minute', 1)", (ISOLATION,))
    old_cur.execute("SELECT pg_current_xact_id_if_assigned() IS NULL")
    tap.is_(old_cur.fetchone()[0], True, "a claim_group that claims nothing takes no transaction id")
    cur.execute("SET lock_timeout = '300ms'")
    tap.is_((sql_error(conn, "INSERT INTO throttle.group_policy VALUES ('it.new', 2)") or [None])[0],
            "55P03", "a change of the policy waits for a claim_group in progress")
    old.rollback()
    cur.execute("RESET lock_timeout")
    cur.execute("UPDATE throttle.group_policy SET workers = 3 WHERE queue = %s", (ISOLATION,))

    # A claim left in an open transaction never locks another claim's events.
    open_claim = connect(autocommit=False)
    oc = open_claim.cursor()
    c, _ = claim(oc, "c", queue=ISOLATION)
    cur.execute("SET statement_timeout = '3s'")
    tap.ok(len(c) == 1 and complete(cur, a, ta) == 1,
           "a holder completes while another claim of its group is not committed", f"c={c}")
    open_claim.rollback()

    # Workers 1: a holder that shared memory forgot (as after a restart), and
    # a claim left open that found the group held: the holder never waits.
    cur.execute("UPDATE throttle.group_policy SET workers = 1 WHERE queue = %s", (ISOLATION,))
    cur.execute("DELETE FROM throttle.event WHERE queue = %s AND state = 'claimed'", (ISOLATION,))
    d, td = claim(cur, "d", queue=ISOLATION)
    cur.execute("SELECT throttle._group_reset(%s, 'g')", (ISOLATION,))
    e, _ = claim(oc, "e", queue=ISOLATION)
    tap.ok(len(d) >= 1 and e == [] and complete(cur, d, td) == len(d),
           "workers 1: a claim that finds the group held locks none of its events", f"d={d} e={e}")
    open_claim.rollback()
    cur.execute("RESET statement_timeout")
    cur.execute("DELETE FROM throttle.group_policy WHERE queue = %s", (ISOLATION,))
    open_claim.close()
    old.close()
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
                if drained(cur, RACE_QUEUE):
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


def race(tap):
    conn = connect()
    cur = conn.cursor()
    cur.execute("DELETE FROM throttle.event WHERE queue = %s", (RACE_QUEUE,))
    cur.execute("INSERT INTO throttle.group_policy (queue, workers) VALUES (%s, %s)",
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
    left = rows(cur, "SELECT count(*) FROM throttle.all_events WHERE queue = %s AND state <> 'done'",
                (RACE_QUEUE,))[0][0]
    tap.is_(left, 0, "the table agrees: every event is done")
    cur.execute("DELETE FROM throttle.group_policy WHERE queue = %s", (RACE_QUEUE,))
    print(f"# {len(log)} claims, most holders of one group at once: {worst}")
    conn.close()


def main():
    tap = Tap(55)
    rules(tap)
    isolation(tap)
    race(tap)
    strict_rules(tap)
    strict_handback(tap)
    strict_race(tap)
    return tap.done()


if __name__ == "__main__":
    sys.exit(main())
