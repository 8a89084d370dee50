#!/usr/bin/python3
"""Per-key concurrency: events without a group that share a concurrency_key
are claimed at most throttle.concurrency_policy.max_claimed at once (1 when
the queue is not named there), whoever claims them.

First the rules, one at a time, on the extension's clock (test_clock): the
first claim takes one event per key and the events without a key, the next
gets nothing, a completion frees one place, a raised limit lets more in at
once, a lowered one holds new claims back until the key is under it, claims
whose lease ended no longer count and are taken over within the limit, and
bad keys are refused (22023).

Then what one session's open transaction does to another: a key whose
events an uncommitted claim is taking is left (not waited for) by the
others, a claim under repeatable read applies a limit lowered after its
snapshot, a change of the policy waits for a claim in progress, a claim
that finds every key full takes no transaction id and holds no key lock, an
extend committed after its old lease does not let a claim of its key in
meanwhile, and a claim while a change of the policy waits leaves the keyed
events without waiting. complete and fail NOTIFY the key's next due event.

Then a race on the real clock: 10 workers drain a queue of 6 keys whose
keys take 2 claims, claiming 1 to 4 events at a time. Each worker logs, for
each event, when its claim returned and when it called complete; those
spans lie inside the time the event was claimed, so no instant may fall in
3 spans of one key. Every event is completed exactly once.
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

QUEUE = "it.conckey"
ISOLATION = "it.conckey.iso"
RACE_QUEUE = "it.conckey.race"
WORKERS = 10
KEYS = 6
PER_KEY = 60
UNKEYED = 60
LIMIT = 2


def claim(cur, worker, max_=10, queue=QUEUE, lease="1 minute"):
    """The claimed events as {item_key: id}, and the claim's token."""
    got = rows(cur, "SELECT item_key, id, claim_token FROM throttle.claim(%s, %s, %s, %s)",
               (queue, worker, lease, max_))
    return {r[0]: r[1] for r in got}, (got[0][2] if got else None)


def complete(cur, ids, token):
    return rows(cur, "SELECT throttle.complete(%s::bigint[], %s)", (list(ids), token))[0][0]


def schedule(cur, keys, queue=QUEUE, age="1 minute"):
    """Schedules item_key -> concurrency_key (None: no key), due `age` ago,
    in the order given (older first)."""
    for n, (item, key) in enumerate(keys):
        cur.execute("SELECT throttle.schedule(%s, %s, throttle.now() - %s::interval"
                    " + %s * interval '1 second', concurrency_key => %s)",
                    (queue, item, age, n, key))


def rules(tap):
    conn = connect()
    cur = conn.cursor()
    cur.execute("SET pg_throttle.test_clock = '2030-01-01 12:00:00+00'")
    cur.execute("DELETE FROM throttle.event WHERE queue = %s", (QUEUE,))
    cur.execute("DELETE FROM throttle.concurrency_policy WHERE queue = %s", (QUEUE,))
    schedule(cur, [("a1", "a"), ("a2", "a"), ("a3", "a"), ("a4", "a"), ("b1", "b"), ("b2", "b"),
                   ("n1", None)])

    c1, t1 = claim(cur, "w1")
    tap.is_(sorted(c1), ["a1", "b1", "n1"],
            "no policy: one event per key, and the events without a key")
    tap.is_(claim(cur, "w2")[0], {}, "the next claim gets nothing: both keys are full")
    tap.is_(complete(cur, [c1["a1"]], t1), 1, "a1 completes")
    c3, _ = claim(cur, "w3")
    tap.is_(sorted(c3), ["a2"], "its key takes one more, the oldest")

    cur.execute("INSERT INTO throttle.concurrency_policy VALUES (%s, 3)", (QUEUE,))
    c4, _ = claim(cur, "w4")
    tap.is_(sorted(c4), ["a3", "a4", "b2"], "max_claimed 3: two more of a (a2 holds), one more of b")
    schedule(cur, [("a5", "a"), ("b3", "b")])
    c5, _ = claim(cur, "w5")
    tap.is_(sorted(c5), ["b3"], "a has 3 claimed and takes none; b takes its third")
    c5b, _ = claim(cur, "w5", max_=1)
    tap.is_(c5b, {}, "two calls: still none")

    cur.execute("UPDATE throttle.concurrency_policy SET max_claimed = 1 WHERE queue = %s", (QUEUE,))
    tap.is_(complete(cur, [c1["b1"], c1["n1"]], t1), 2, "b1 completes: b has 2 claimed")
    schedule(cur, [("b4", "b")])
    tap.is_(claim(cur, "w6")[0], {}, "lowered to 1 with 2 of b claimed: no new claim of b")

    # Every lease ended: expired claims count no more and are taken over
    # first, within the limit: one per key.
    cur.execute("SET pg_throttle.test_clock = '2030-01-01 12:02:00+00'")
    c7, _ = claim(cur, "w7")
    tap.is_(sorted(c7), ["a2", "b2"],
            "past the leases: the oldest expired claim of each key is taken over, one per key")
    tap.is_(rows(cur, "SELECT attempts FROM throttle.all_events WHERE queue = %s AND item_key IN ('a2', 'b2')"
                      " AND state = 'claimed' ORDER BY item_key", (QUEUE,)), [(2,), (2,)],
            "as second attempts")
    tap.is_(claim(cur, "w8")[0], {}, "and nothing more of either key")

    # An expired claim of a full key takes no place of another's takeover,
    # and a claim asks for no room it does not need (max up to 2^31 - 1).
    schedule(cur, [("u1", None)])
    u1, _ = claim(cur, "w9", max_=2147483647)
    tap.is_(sorted(u1), ["u1"], "max 2147483647: the one event that is free")
    cur.execute("SET pg_throttle.test_clock = '2030-01-01 12:10:00+00'")
    cur.execute("UPDATE throttle.event SET lease_until = throttle.now() + interval '1 hour'"
                " WHERE queue = %s AND item_key IN ('a2', 'b2')", (QUEUE,))  # a and b full again
    u1b, _ = claim(cur, "w10", max_=1)
    tap.is_(sorted(u1b), ["u1"],
            "an expired claim of a full key is passed over: the expired u1 is taken over")
    poll = connect(autocommit=False)
    pc = poll.cursor()
    pc.execute("SET pg_throttle.test_clock = '2030-01-01 12:10:00+00'")
    pc.execute("SELECT count(*) FROM throttle.claim(%s, 'w11', '1 minute', 5)", (QUEUE,))
    pc.execute("SELECT pg_current_xact_id_if_assigned() IS NULL")
    tap.is_(pc.fetchone()[0], True,
            "a poll that finds only expired claims and events of full keys locks none of them")
    poll.rollback()
    poll.close()

    # Bad keys.
    cur.execute("RESET pg_throttle.test_clock")
    errors = [
        sql_error(conn, "SELECT throttle.schedule(%s, 'x', now(), group_key => 'g',"
                        " concurrency_key => 'k')", (QUEUE,)),
        sql_error(conn, "SELECT throttle.schedule(%s, 'x', now(), concurrency_key => '')", (QUEUE,)),
        sql_error(conn, "SELECT throttle.schedule(%s, 'x', now(), concurrency_key => repeat('k', 1025))",
                  (QUEUE,)),
        sql_error(conn, "SELECT throttle.schedule_many(%s, ARRAY['x', 'y'], ARRAY[now(), now()],"
                        " group_keys => ARRAY[NULL, 'g'], concurrency_keys => ARRAY['k', 'k'])", (QUEUE,)),
        sql_error(conn, "SELECT throttle.schedule_many(%s, ARRAY['x'], ARRAY[now()],"
                        " concurrency_keys => ARRAY['k', 'k'])", (QUEUE,)),
        sql_error(conn, "INSERT INTO throttle.event (queue, item_key, run_at, enqueued_at, enqueued_by,"
                        " group_key, concurrency_key) VALUES ('q', 'x', now(), now(), 'me', 'g', 'k')"),
    ]
    codes = [e[0] if e else None for e in errors]
    tap.is_(codes, ["22023", "22023", "22023", "22023", "22023", "23514"],
            "a key with a group, an empty key, a key over 1024 bytes, the same in a batch,"
            " and a batch of the wrong length are refused; the table's CHECK holds too")
    tap.ok(errors[3] and "item_keys[2]" in errors[3][1], "a batch names the element at fault",
           str(errors[3]))
    cur.execute("DELETE FROM throttle.concurrency_policy WHERE queue = %s", (QUEUE,))
    conn.close()


def isolation(tap):
    conn = connect()
    cur = conn.cursor()
    cur.execute("DELETE FROM throttle.event WHERE queue = %s", (ISOLATION,))
    cur.execute("INSERT INTO throttle.concurrency_policy VALUES (%s, 2)", (ISOLATION,))
    schedule(cur, [("c1", "c"), ("c2", "c"), ("d1", "d")], queue=ISOLATION)
    cur.execute("SET statement_timeout = '3s'")

    # A claim of key c in progress: the others leave c, and wait for nothing.
    open_claim = connect(autocommit=False)
    oc = open_claim.cursor()
    got, _ = claim(oc, "o", max_=1, queue=ISOLATION)
    tap.is_(sorted(got), ["c1"], "an uncommitted claim takes c1")
    tap.is_(sorted(claim(cur, "p", queue=ISOLATION)[0]), ["d1"],
            "another claim meanwhile leaves key c (it does not wait) and takes d1")
    cur.execute("SET lock_timeout = '300ms'")
    tap.is_((sql_error(conn, "UPDATE throttle.concurrency_policy SET max_claimed = 3") or [None])[0],
            "55P03", "a change of the policy waits for a claim of a key in progress")
    cur.execute("RESET lock_timeout")
    open_claim.commit()
    tap.is_(sorted(claim(cur, "q", queue=ISOLATION)[0]), ["c2"],
            "once it commits, c has room for one more: c2")

    # Lowered while a repeatable-read transaction holds a snapshot from before.
    # (Its snapshot's limit, 3, would let c3 in beside c1 and c2.)
    schedule(cur, [("c3", "c")], queue=ISOLATION)
    cur.execute("UPDATE throttle.concurrency_policy SET max_claimed = 3 WHERE queue = %s", (ISOLATION,))
    old = connect(autocommit=False)
    old_cur = old.cursor()
    old_cur.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
    old_cur.execute("SELECT 1")
    cur.execute("UPDATE throttle.concurrency_policy SET max_claimed = 1 WHERE queue = %s", (ISOLATION,))
    tap.is_(claim(old_cur, "x", queue=ISOLATION)[0], {},
            "a repeatable-read claim applies the limit lowered after its snapshot")
    old.rollback()

    # A poll that finds every key full writes nothing.
    old_cur.execute("SELECT count(*) FROM throttle.claim(%s, 'z', '1 minute', 5)", (ISOLATION,))
    old_cur.execute("SELECT pg_current_xact_id_if_assigned() IS NULL")
    tap.is_(old_cur.fetchone()[0], True, "a claim that finds every key full takes no transaction id")
    old.rollback()
    # A key whose room its count finds used up is let go at once: an open
    # repeatable-read claim that took nothing of it holds back no one.
    cur.execute("DELETE FROM throttle.event WHERE queue = %s", (ISOLATION,))
    cur.execute("DELETE FROM throttle.concurrency_policy WHERE queue = %s", (ISOLATION,))
    # (Its snapshot shows f2 only; f1, older, comes after it and is claimed.)
    schedule(cur, [("f2", "f")], queue=ISOLATION)
    old_cur.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
    old_cur.execute("SELECT 1")
    schedule(cur, [("f1", "f")], queue=ISOLATION, age="5 minutes")
    f1, tf1 = claim(cur, "p", max_=1, queue=ISOLATION)
    tap.is_((sorted(f1), claim(old_cur, "x", queue=ISOLATION)[0]), (["f1"], {}),
            "a repeatable-read claim finds key f full in the latest state")
    complete(cur, f1.values(), tf1)
    schedule(cur, [("f3", "f")], queue=ISOLATION, age="1 second")
    tap.is_(sorted(claim(cur, "q", queue=ISOLATION)[0]), ["f3"],
            "and holds its lock no longer: f3 goes to the next claim while it stays open")
    old.rollback()
    cur.execute("RESET statement_timeout")
    cur.execute("DELETE FROM throttle.concurrency_policy WHERE queue = %s", (ISOLATION,))
    open_claim.close()
    old.close()
    conn.close()


def extend_and_policy_waits(tap):
    """extend against a claim of its key, and a claim while a change of the
    policy waits: on the real clock."""
    conn = connect()
    cur = conn.cursor()
    cur.execute("DELETE FROM throttle.event WHERE queue = %s", (ISOLATION,))
    schedule(cur, [("x1", "x"), ("x2", "x")], queue=ISOLATION)
    x1, tx1 = claim(cur, "w", max_=1, queue=ISOLATION, lease="2 seconds")
    started = time.monotonic()
    # The holder extends in a transaction that commits after its old lease.
    holder = connect(autocommit=False)
    hc = holder.cursor()
    hc.execute("SELECT throttle.extend(%s::bigint[], %s, '1 hour')", (list(x1.values()), tx1))
    time.sleep(max(0.0, started + 2.5 - time.monotonic()))
    other = connect()
    oc = other.cursor()
    oc.execute("SET statement_timeout = '3s'")
    during, _ = claim(oc, "o", queue=ISOLATION)
    holder.commit()
    after, _ = claim(oc, "o", queue=ISOLATION)
    tap.is_((during, after), ({}, {}),
            "a claim past the old lease of a claim being extended takes nothing of its key,"
            " before and after the extend commits")

    # A change of the policy waits for a claim in progress; a claim meanwhile
    # leaves the keyed events and waits for nothing.
    cur.execute("DELETE FROM throttle.event WHERE queue = %s", (ISOLATION,))
    schedule(cur, [("y1", "y"), ("z1", "z"), ("n1", None)], queue=ISOLATION)
    open_claim = connect(autocommit=False)
    got, _ = claim(open_claim.cursor(), "a", max_=1, queue=ISOLATION)
    changer = connect()
    change = threading.Thread(target=lambda: changer.cursor().execute(
        "INSERT INTO throttle.concurrency_policy VALUES (%s, 2)", (ISOLATION,)))
    change.start()
    time.sleep(0.5)
    began = time.monotonic()
    meanwhile, _ = claim(oc, "b", queue=ISOLATION)
    waited = time.monotonic() - began
    open_claim.commit()
    change.join()
    tap.ok(sorted(got) == ["y1"] and sorted(meanwhile) == ["n1"] and waited < 1.0,
           "while a change of the policy waits, a claim takes only events without a key, at once",
           f"got={got} meanwhile={meanwhile} waited={waited:.2f}s")
    tap.is_(sorted(claim(oc, "c", queue=ISOLATION)[0]), ["z1"], "then the keyed ones again")
    # A claim extending C in the transaction that claimed another event of
    # C's key, while C's own worker extends it too: no deadlock.
    cur.execute("DELETE FROM throttle.event WHERE queue = %s", (ISOLATION,))
    schedule(cur, [("v1", "v"), ("v2", "v")], queue=ISOLATION)
    v1, tv1 = claim(cur, "w", max_=1, queue=ISOLATION)
    both = connect(autocommit=False)
    bc = both.cursor()
    bc.execute("SET deadlock_timeout = '100ms'")
    v2, _ = claim(bc, "b", max_=1, queue=ISOLATION)
    results, errors = [], []

    def heartbeat():
        try:
            hb = connect()
            results.append(rows(hb.cursor(), "SELECT throttle.extend(%s::bigint[], %s, '1 hour')",
                                (list(v1.values()), tv1))[0][0])
            hb.close()
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(str(e))
    beat = threading.Thread(target=heartbeat)
    beat.start()
    time.sleep(0.3)
    try:
        in_claim = rows(bc, "SELECT throttle.extend(%s::bigint[], %s, '1 hour')",
                        (list(v1.values()), tv1))[0][0]
        both.commit()
    except Exception as e:  # noqa: BLE001 - reported below
        in_claim = None
        errors.append(str(e))
        both.rollback()
    beat.join()
    tap.ok(errors == [] and in_claim == 1 and results == [1] and sorted(v2) == ["v2"],
           "extend of a claim in a transaction that claimed its key, beside the claim's own"
           " extend: both renew, no deadlock", f"errors={errors} in_claim={in_claim} beat={results}")

    # A claim that holds 16 keys leaves the rest, and locks no row of them
    # past its first pass: another claim meanwhile gets the next keys.
    cur.execute("DELETE FROM throttle.event WHERE queue = %s", (ISOLATION,))
    cur.execute("SELECT throttle.schedule_many(%s, array_agg('m' || n ORDER BY n),"
                " array_agg(now() - interval '1 hour' + n * interval '1 ms' ORDER BY n), NULL, NULL,"
                " concurrency_keys => array_agg('key' || n ORDER BY n))"
                " FROM generate_series(1, 4000) n", (ISOLATION,))
    first = connect(autocommit=False)
    began = time.monotonic()
    got_first, _ = claim(first.cursor(), "f", max_=100, queue=ISOLATION)
    took = time.monotonic() - began
    got_next, _ = claim(oc, "g", max_=100, queue=ISOLATION)
    first.rollback()
    tap.ok(len(got_first) == 16 and len(got_next) == 16 and not set(got_first) & set(got_next)
           and took < 5.0,
           "a claim of 100 over 4 000 keys takes 16 keys' events, in well under 5 s, and an open one"
           " leaves the others to the next claim",
           f"first={len(got_first)} next={len(got_next)} took={took:.2f}s")
    cur.execute("DELETE FROM throttle.concurrency_policy WHERE queue = %s", (ISOLATION,))
    for c in (holder, other, open_claim, changer, both, first, conn):
        c.close()


def notifications(tap):
    """complete and fail of a keyed event NOTIFY the key's oldest due event."""
    queue = "it.conckey.notify"
    conn = connect()
    cur = conn.cursor()
    listener = connect()
    listener.cursor().execute(f'LISTEN "{queue}"')
    schedule(cur, [("n1", "nk"), ("n2", "nk"), ("n3", "nk")], queue=queue)
    ids = dict(rows(cur, "SELECT item_key, id FROM throttle.all_events WHERE queue = %s", (queue,)))

    def heard(expected):
        """The notifications that came once `expected` of them have (or
        10 s have passed), and any more within 0.3 s after: a loaded
        machine delivers late, and what arrives late must not be counted
        in the next call's window."""
        deadline = time.monotonic() + 10
        while len(listener.notifies) < expected and time.monotonic() < deadline:
            time.sleep(0.05)
            listener.poll()
        time.sleep(0.3)
        listener.poll()
        got = [int(n.payload) for n in listener.notifies]
        listener.notifies.clear()
        return got
    tap_schedule = heard(3)  # schedule's own, one per due event
    n1, t1 = claim(cur, "w", max_=3, queue=queue)
    complete(cur, n1.values(), t1)
    tap.is_((sorted(tap_schedule), heard(1)), (sorted(ids.values()), [ids["n2"]]),
            "complete of a keyed event notifies the key's oldest due event")
    n2, t2 = claim(cur, "w", max_=3, queue=queue)
    cur.execute("SELECT throttle.fail(%s::bigint[], %s, 'boom', '1 hour')", (list(n2.values()), t2))
    tap.is_(heard(1), [ids["n3"]], "and so does fail (its event waits an hour)")
    cur.execute("DELETE FROM throttle.event WHERE queue = %s", (queue,))
    listener.close()
    conn.close()


def drained(cur):
    return rows(cur, "SELECT count(*) FROM throttle.all_events WHERE queue = %s"
                     " AND state IN ('pending', 'claimed')", (RACE_QUEUE,))[0][0] == 0


def race_worker(index, log, errors, stop_at):
    conn = connect()
    cur = conn.cursor()
    rng = random.Random(index)
    try:
        while time.monotonic() < stop_at:
            got = rows(cur, "SELECT id, claim_token, concurrency_key FROM throttle.claim("
                            "%s, %s, '1 minute', %s)", (RACE_QUEUE, f"w{index}", rng.randint(1, 4)))
            returned = time.monotonic()
            if not got:
                if drained(cur):
                    return
                time.sleep(0.005)
                continue
            time.sleep(rng.uniform(0.0, 0.02))
            ids, token = [r[0] for r in got], got[0][1]
            completing = time.monotonic()
            done = complete(cur, ids, token)
            log.append(([(r[0], r[2]) for r in got], returned, completing, done))
    except Exception as e:  # noqa: BLE001 - reported as a test failure
        errors.append(f"w{index}: {e}")
    finally:
        conn.close()


def race(tap):
    conn = connect()
    cur = conn.cursor()
    cur.execute("DELETE FROM throttle.event WHERE queue = %s", (RACE_QUEUE,))
    cur.execute("INSERT INTO throttle.concurrency_policy VALUES (%s, %s)", (RACE_QUEUE, LIMIT))
    # In run_at order the keys come three by three, so that a claim of 3 or
    # 4 meets more of one key than it may take, and the 6 keys are crowded.
    total = KEYS * PER_KEY + UNKEYED
    cur.execute("SELECT throttle.schedule_many(%s, array_agg('e' || n ORDER BY n),"
                " array_agg(now() - interval '1 hour' + n * interval '1 ms' ORDER BY n), NULL, NULL,"
                " concurrency_keys => array_agg(CASE WHEN n %% 7 = 0 THEN NULL"
                "                                    ELSE 'k' || (n / 3) %% %s END ORDER BY n))"
                " FROM generate_series(1, %s) n", (RACE_QUEUE, KEYS, total))
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
    for events, returned, completing, _ in log:
        for _, key in events:
            if key is not None:
                spans[key].append((returned, completing))
    worst = max((most_at_once(s) for s in spans.values()), default=0)
    tap.ok(worst <= LIMIT, f"no key had more than {LIMIT} events claimed at once",
           f"most at once: {worst}")
    tap.ok(worst == LIMIT, "keys had several events claimed at once (the limit was reached)",
           f"most at once: {worst}")
    fenced = [entry for entry in log if entry[3] != len(entry[0])]
    tap.is_(fenced, [], "every claim completed all of its events")
    completed = collections.Counter(i for events, *_ in log for i, _ in events)
    tap.ok(len(completed) == total and max(completed.values()) == 1,
           "every event was completed exactly once",
           f"{len(completed)} events, most completions of one: {max(completed.values(), default=0)}")
    left = rows(cur, "SELECT count(*) FROM throttle.all_events WHERE queue = %s AND state <> 'done'",
                (RACE_QUEUE,))[0][0]
    tap.is_(left, 0, "the table agrees: every event is done")
    cur.execute("DELETE FROM throttle.concurrency_policy WHERE queue = %s", (RACE_QUEUE,))
    print(f"# {len(log)} claims of {total} events, most claimed of one key at once: {worst}")
    conn.close()


def main():
    tap = Tap(38)
    rules(tap)
    isolation(tap)
    extend_and_policy_waits(tap)
    notifications(tap)
    race(tap)
    return tap.done()


if __name__ == "__main__":
    sys.exit(main())
