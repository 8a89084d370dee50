#!/usr/bin/python3
"""The event queue's defects found in review, each forced with real sessions
and held transactions (never with luck):

- a claim_group running while another transaction cancels, reschedules or
  completes one of the group's events: the claim never waits for it, and
  never claims an event that transaction ends;
- a claim_group rolled back (whole, or to a savepoint) leaves its group free;
- schedule of an item_key whose event is claimed schedules a new run after
  it, which is neither lost nor run beside the claimed one; a claim of one
  claimer (claim, claim_group) holds back a newer run that the other one
  takes only while its lease holds;
- a group_key of any length (groups whose keys share their first 200 bytes
  are still two groups);
- enqueued_by names the role that called schedule, not the extension's owner;
- claims are owned by their claimer: complete, fail and extend act through
  the claim's token, with the claim's role; two processes with one worker
  name are two claims, and another role neither sees a claim's token nor
  completes the claim with it;
- a claim_group in a transaction left open holds row locks on the events it
  claims and on no others: not on a group it passed over (another worker
  gets that group, a schedule onto it does not wait), nor on the events of
  its group beyond max;
- a transaction that claims or extends commits durably even when the call
  was made in a function whose SET clause turns synchronous_commit off.
"""
import datetime
import os
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(__file__))
from cluster import execute  # noqa: E402
from pgconn import connect, one, set_wakeups, sql_error  # noqa: E402
from tap import Tap  # noqa: E402

PROMPT = 3.0  # seconds: a call that takes longer waited for a row lock


def timed(conn, sql, params=None, wait=10):
    """Runs sql on conn in a thread and waits up to `wait` seconds for it;
    returns (result, seconds, thread): result["rows"] holds the rows once it
    ends, result["error"] the error it raised."""
    out = {}

    def run():
        try:
            with conn.cursor() as cur:
                cur.execute(sql, params)
                out["rows"] = cur.fetchall()
        except Exception as e:  # noqa: BLE001 - reported by the caller's checks
            out["error"] = str(e)

    t0 = time.monotonic()
    t = threading.Thread(target=run)
    t.start()
    t.join(timeout=wait)
    return out, time.monotonic() - t0, t


def while_held(holder, caller, sql, params=None, linger=0.0):
    """Runs sql on caller while holder's transaction stays open; once sql
    waits for a lock (pg_stat_activity says so, within 10 s), and `linger`
    seconds after that, commits holder's transaction and returns what sql
    did (as timed() does), with result["waited"]: whether sql was seen
    waiting for the lock."""
    pid = one(caller, "SELECT pg_backend_pid()")[0]
    watcher = connect()
    result, _, thread = timed(caller, sql, params, wait=0)
    deadline = time.monotonic() + 10
    waited = False
    while thread.is_alive() and time.monotonic() < deadline:
        if one(watcher, "SELECT wait_event_type = 'Lock' FROM pg_stat_activity WHERE pid = %s", (pid,))[0]:
            waited = True
            break
        time.sleep(0.02)
    result["waited"] = waited
    time.sleep(linger)
    holder.commit()
    thread.join(timeout=30)
    watcher.close()
    return result


def behind_open_extend(claim, sql, linger):
    """Runs sql (its parameters: the claim's id and token) in a session of
    its own while an extend of `claim` (id, token) stays open in another,
    which commits `linger` seconds after sql is seen waiting; returns what
    while_held does."""
    extender = connect(autocommit=False)
    worker = connect()
    try:
        execute(extender, "SELECT throttle.extend(ARRAY[%s]::bigint[], %s, '5 minutes')", claim)
        return while_held(extender, worker, sql, claim, linger=linger)
    finally:
        worker.close()
        extender.close()


def heard(listener, wait=5):
    """The payloads (ints) of the first notifications listener gets within
    `wait` seconds."""
    payloads = []
    deadline = time.monotonic() + wait
    while time.monotonic() < deadline and not payloads:
        time.sleep(0.05)
        listener.poll()
        payloads = [int(n.payload) for n in listener.notifies]
    return payloads


def commit_waits_for_standby(session, watcher):
    """Commits session's transaction in a thread; whether the commit is seen
    waiting for a synchronous standby (wait_event SyncRep) within 10 s. The
    wait is then cancelled: PostgreSQL keeps the commit, with a WARNING."""
    pid = session.get_backend_pid()
    out = {}

    def run():
        try:
            session.commit()
        except Exception as e:  # noqa: BLE001 - reported by the caller's checks
            out["error"] = str(e)

    thread = threading.Thread(target=run)
    thread.start()
    waited = False
    deadline = time.monotonic() + 10
    while thread.is_alive() and time.monotonic() < deadline:
        if one(watcher, "SELECT count(*) FROM pg_stat_activity WHERE pid = %s AND wait_event = 'SyncRep'",
               (pid,))[0]:
            waited = True
            break
        time.sleep(0.02)
    if thread.is_alive():
        one(watcher, "SELECT pg_cancel_backend(%s)", (pid,))
    thread.join(timeout=30)
    return waited and "error" not in out


def durable_in_function(tap, admin):
    """A claim (claim, claim_group) or an extend made inside a function
    whose SET clause says synchronous_commit = off, in a session whose own
    setting is off too: the function's SET restores the session's off when
    it returns, before the commit, so a setting the claim made during the
    call is gone by then. The commit must still be durable.

    Deterministic: a synchronous standby that never comes
    (synchronous_standby_names names none that exists) makes every commit
    with synchronous_commit above local wait for it (wait_event SyncRep),
    and an asynchronous commit returns at once. A claim made directly is
    the control: it waits (and shows the setting is in force). Then each
    wrapped call must wait as well; with the raise made during the call
    only, their commits were asynchronous and returned at once. A
    transaction that claims nothing keeps the session's setting."""
    cur = admin.cursor()
    fresh(cur, "d.durable")
    cur.execute("SELECT throttle.schedule('d.durable', 'k' || g, now()) FROM generate_series(1, 8) g")
    cur.execute("SELECT throttle.schedule('d.durable', 'g' || g, now(), group_key => 'g') "
                "FROM generate_series(1, 2) g")
    held = one(admin, "SELECT array_agg(id), min(claim_token) FROM throttle.claim('d.durable', 'wx', '1 hour')")
    for name, call in (("claim", "SELECT count(*) FROM throttle.claim('d.durable', 'w', '1 hour')"),
                       ("claim_group", "SELECT count(*) FROM throttle.claim_group('d.durable', 'w', '1 hour')"),
                       ("extend", "SELECT throttle.extend(ids, token, '2 hours')")):
        cur.execute(f"CREATE OR REPLACE FUNCTION public.queue_defects_{name}(ids bigint[], token bigint) "
                    "RETURNS bigint LANGUAGE plpgsql SET synchronous_commit = off AS $$"
                    f" DECLARE n bigint; BEGIN {call} INTO n; RETURN n; END $$")
    session = connect(autocommit=False)
    execute(session, "SET synchronous_commit = off")
    session.commit()
    watcher = connect()
    execute(admin, "SET synchronous_commit = local")  # the suite's own commits do not wait
    cur.execute("ALTER SYSTEM SET synchronous_standby_names = 'pg_throttle_no_such_standby'")
    one(admin, "SELECT pg_reload_conf()")
    try:
        time.sleep(0.5)  # the checkpointer applies it
        control = []
        for _ in range(5):  # until the setting is seen in force
            control.append(one(session, "SELECT count(*) FROM throttle.claim('d.durable', 'w', '1 hour')")[0])
            if commit_waits_for_standby(session, watcher):
                break
            control.append("no wait")
        tap.ok(control[-1] == 1, "control: a claim made directly, with synchronous_commit off, commits "
                                 "durably (waits for the synchronous standby)", repr(control))
        for name in ("claim", "claim_group", "extend"):
            got = one(session, f"SELECT public.queue_defects_{name}(%s, %s)", held)[0]
            waited = commit_waits_for_standby(session, watcher)
            tap.ok(got >= 1 and waited,
                   f"{name} called in a function with SET synchronous_commit = off commits durably",
                   f"it returned {got}; its commit waited for the standby: {waited}")
        one(session, "SELECT throttle.schedule('d.durable', 'later', now() + interval '1 hour')")
        tap.ok(not commit_waits_for_standby(session, watcher),
               "a transaction that claims nothing keeps the session's synchronous_commit = off")
    finally:
        cur.execute("ALTER SYSTEM RESET synchronous_standby_names")
        one(admin, "SELECT pg_reload_conf()")
        execute(admin, "RESET synchronous_commit")
        session.close()
        watcher.close()
        for name in ("claim", "claim_group", "extend"):
            cur.execute(f"DROP FUNCTION public.queue_defects_{name}(bigint[], bigint)")


def open_claim_group_locks(tap, admin):
    """A worker claims a group in a transaction it leaves open (it works on
    the events before COMMIT). It passes over group g1, whose event a1 a
    producer is scheduling again in a transaction of its own, and takes g2.
    Once the producer has committed, the passed-over group must be free: a
    schedule onto its other event a2 does not wait for the worker, and
    another worker's claim_group gets g1. (claim_group locked a2 before it
    found a1 busy, and a row lock lasts until the transaction ends.) The
    same for the events of a claimed group beyond max: only the claimed one
    is locked."""
    cur = admin.cursor()
    fresh(cur, "d.openskip")
    for key, group in (("a1", "g1"), ("a2", "g1"), ("b1", "g2")):
        cur.execute("SELECT throttle.schedule('d.openskip', %s, now(), group_key => %s)", (key, group))
    producer = connect(autocommit=False)
    execute(producer, "SELECT throttle.schedule('d.openskip', 'a1', now(), '{\"v\": 2}', group_key => 'g1')")
    worker = connect(autocommit=False)
    first = one(worker, "SELECT array_agg(item_key) FROM throttle.claim_group('d.openskip', 'w1', '5 minutes')")[0]
    producer.commit()
    impatient = connect(options="-c lock_timeout=2s")
    tap.is_((first, sql_error(impatient, "SELECT throttle.schedule('d.openskip', 'a2', now(), '{\"v\": 2}', "
                                         "group_key => 'g1')")),
            (["b1"], None),
            "a claim_group left open passes over a group with an event being changed and holds no lock "
            "on its other events: a schedule onto one does not wait")
    second = one(impatient, "SELECT array_agg(item_key ORDER BY item_key) "
                            "FROM throttle.claim_group('d.openskip', 'w2', '5 minutes')")[0]
    tap.is_(second, ["a1", "a2"], "and another worker's claim_group gets the group it passed over")
    worker.commit()

    fresh(cur, "d.openmax")
    cur.execute("SELECT throttle.schedule('d.openmax', 'e' || g, now(), group_key => 'g') "
                "FROM generate_series(1, 3) g")
    first = one(worker, "SELECT array_agg(item_key) FROM throttle.claim_group('d.openmax', 'w1', '5 minutes', 1)")[0]
    locked = sql_error(impatient, "SELECT count(*) FROM (SELECT 1 FROM throttle.event "
                                  "WHERE queue = 'd.openmax' AND item_key IN ('e2', 'e3') "
                                  "FOR UPDATE NOWAIT) AS x")
    rescheduled = sql_error(impatient, "SELECT throttle.schedule('d.openmax', 'e3', now(), '{\"v\": 2}', "
                                       "group_key => 'g')")
    tap.is_((first, locked, rescheduled), (["e1"], None, None),
            "a claim_group with max left open locks only the event it claims, not the group's others")
    worker.commit()

    # The claim writes its events in the subtransaction that locked them: an
    # UPDATE of rows another subtransaction of ours locked makes a MultiXact
    # per row (and a claim_group with eight workers ran 20 % slower).
    fresh(cur, "d.openmulti")
    cur.execute("SELECT throttle.schedule('d.openmulti', 'e' || g, now(), group_key => 'g') "
                "FROM generate_series(1, 3) g")
    cur.execute("CHECKPOINT")
    before = one(admin, "SELECT next_multixact_id FROM pg_control_checkpoint()")[0]
    claimed = one(worker, "SELECT count(*) FROM throttle.claim_group('d.openmulti', 'w1', '5 minutes')")[0]
    worker.commit()
    cur.execute("CHECKPOINT")
    after = one(admin, "SELECT next_multixact_id FROM pg_control_checkpoint()")[0]
    tap.is_((claimed, int(after) - int(before)), (3, 0), "a claim_group of three events makes no MultiXact")
    producer.close()
    worker.close()

    # The lock runs in a subtransaction of claim_group's own: an error in it
    # (40001: under repeatable read, an event of the group changed after the
    # snapshot) inside the caller's exception block rolls it back before the
    # error reaches the block, which catches it; the transaction goes on and
    # commits, and the group is free.
    fresh(cur, "d.openrr")
    cur.execute("SELECT throttle.schedule('d.openrr', 'a1', now(), group_key => 'g')")
    rr = connect(autocommit=False)
    execute(rr, "BEGIN ISOLATION LEVEL REPEATABLE READ")
    execute(rr, "CREATE FUNCTION pg_temp.claim_or_retry() RETURNS text LANGUAGE plpgsql AS $$"
                " BEGIN PERFORM count(*) FROM throttle.claim_group('d.openrr', 'w1', '5 minutes');"
                "       RETURN 'claimed';"
                " EXCEPTION WHEN serialization_failure THEN RETURN 'serialization failure'; END $$")
    cur.execute("SELECT throttle.reschedule('d.openrr', 'a1', now() - interval '1 second')")
    outcome = one(rr, "SELECT pg_temp.claim_or_retry()")[0]
    after = one(rr, "SELECT count(*) FROM throttle.event WHERE queue = 'd.openrr'")[0]
    rr.commit()
    taken = one(impatient, "SELECT array_agg(item_key) FROM throttle.claim_group('d.openrr', 'w2', '5 minutes')")[0]
    tap.is_((outcome, after, taken), ("serialization failure", 1, ["a1"]),
            "a claim_group's 40001 from its lock, caught by the caller's exception block: the transaction goes "
            "on and commits, and the group is free")
    rr.close()
    impatient.close()


def strict_blocking_claims(tap):
    """In a group kept in strict order a claim of e1, e2, e3 expires; the
    worker extended e3's lease. A run without a group of e2's item_key is
    scheduled and throttle.claim comes by: it ends e2 (it holds back that
    run) and the claim's later events whose lease ended too, not e3, which
    its worker still completes. e2 waited behind e1, still claimed: it never
    ran, and is not charged."""
    conn = connect()
    cur = conn.cursor()
    queue = "d.strict.blocking"
    fresh(cur, queue)
    cur.execute("INSERT INTO throttle.group_policy (queue, strict_order) VALUES (%s, true)"
                " ON CONFLICT (queue) DO UPDATE SET strict_order = true, workers = 1", (queue,))
    cur.execute("SET pg_throttle.test_clock = '2031-06-01 12:00:00+00'")
    e1, e2, e3 = [one(conn, "SELECT throttle.schedule(%s, %s, throttle.now(), group_key => 'G')",
                      (queue, k))[0] for k in ("k1", "k2", "k3")]
    token = one(conn, "SELECT min(claim_token) FROM throttle.claim_group(%s, 'w1', '10 seconds')",
                (queue,))[0]
    cur.execute("SET pg_throttle.test_clock = '2031-06-01 12:00:05+00'")
    one(conn, "SELECT throttle.extend(%s, %s, '1 hour')", ([e3], token))
    cur.execute("SET pg_throttle.test_clock = '2031-06-01 12:00:20+00'")
    run = one(conn, "SELECT throttle.schedule(%s, 'k2', throttle.now())", (queue,))[0]
    got = one(conn, "SELECT array_agg(id) FROM throttle.claim(%s, 'w2', '1 minute', 10)", (queue,))[0]
    states = one(conn, "SELECT array_agg(state || ':' || attempts ORDER BY id) FROM throttle.all_events"
                       " WHERE id = ANY (%s)", ([e1, e2, e3],))[0]
    tap.is_((got, states), ([run], ["claimed:1", "cancelled:0", "claimed:1"]),
            "claim ends the strict group's expired claim that holds back its run, uncharged (an earlier "
            "event of its claim is still claimed), and leaves the event whose lease was extended")
    tap.is_(one(conn, "SELECT array_agg(outcome) FROM throttle.event_attempt WHERE event_id = ANY (%s)",
                ([e1, e3],))[0], None, "no attempt of e1 or e3 is ended")
    tap.is_(one(conn, "SELECT throttle.complete(%s, %s)", ([e3], token))[0], 1,
            "the worker completes the event whose lease it extended")
    cur.execute("DELETE FROM throttle.group_policy WHERE queue = %s", (queue,))
    conn.close()


def fresh(cur, queue):
    cur.execute("DELETE FROM throttle.event WHERE queue = %s", (queue,))


def claim_group_during(tap, admin, queue, change, what):
    """A transaction runs `change` on event a1 of group g and stays open; a
    worker calls claim_group meanwhile, then the transaction commits."""
    cur = admin.cursor()
    fresh(cur, queue)
    cur.execute("SELECT throttle.schedule(%s, 'a1', now(), group_key => 'g')", (queue,))
    cur.execute("SELECT throttle.schedule(%s, 'a2', now(), group_key => 'g')", (queue,))
    other = connect(autocommit=False)
    ocur = other.cursor()
    ocur.execute(change, (queue,))
    worker = connect(options="-c statement_timeout=20s")
    result, took, thread = timed(worker, "SELECT id, item_key FROM throttle.claim_group(%s, 'w1', '5 minutes')",
                                 (queue,))
    other.commit()
    thread.join(timeout=30)
    rows = result.get("rows")
    tap.ok(took < PROMPT and rows == [],
           f"claim_group skips a group while another transaction {what} one of its events, without waiting",
           f"it took {took:.1f} s and returned {rows}, error {result.get('error')}")
    state = one(admin, "SELECT state, claimed_at IS NULL FROM throttle.all_events WHERE queue = %s AND item_key = 'a1' "
                "ORDER BY id DESC LIMIT 1", (queue,))
    after = one(admin, "SELECT array_agg(item_key ORDER BY item_key) FROM throttle.claim_group(%s, 'w2', '5 minutes')",
                (queue,))[0]
    tap.ok(after == ["a2"] and state[1],
           f"after the commit, the group is claimed without the event the other transaction {what}",
           f"claimed {after}, a1 is {state}")
    other.close()
    worker.close()
    return state


def complete_lock_order(tap, admin):
    """complete, fail and extend lock a claim's events in id order, so that
    two of them on one claim never deadlock: complete's one statement for
    ungrouped events too, also when its plan reads the primary key through a
    bitmap scan (which returns rows in the table's order). Row 1's live
    version is moved after row 2's (its payload grown until it is); a heartbeat holds row 1 in an
    open transaction while complete (bitmap plans) waits, then extends row 2:
    complete must wait on row 1 holding nothing."""
    cur = admin.cursor()
    fresh(cur, "d.lockorder")
    cur.execute("SELECT throttle.schedule('d.lockorder', k, now() - interval '1 minute')"
                " FROM unnest(ARRAY['a', 'b']) k")
    worker = connect()
    with worker.cursor() as wcur:
        wcur.execute("SELECT id, claim_token FROM throttle.claim('d.lockorder', 'w', '10 minutes', 2) ORDER BY id")
        (id1, token), (id2, _) = wcur.fetchall()
    moved = False
    for i in range(40):  # until row 1's live version lies after row 2's
        moved = one(admin, "SELECT (SELECT ctid FROM throttle.event WHERE id = %s)"
                           " > (SELECT ctid FROM throttle.event WHERE id = %s)", (id1, id2))[0]
        if moved:
            break
        execute(admin, "UPDATE throttle.event SET payload = payload || jsonb_build_object(%s, repeat('x', 500))"
                       " WHERE id = %s", (f"pad{i}", id1))
    heartbeat = connect(autocommit=False)
    completer = connect()
    execute(heartbeat, "SELECT throttle.extend(ARRAY[%s]::bigint[], %s, '10 minutes')", (id1, token))
    # This backend's kept plans are made now, with bitmap scans only.
    execute(completer, "SET enable_indexscan = off")
    done, _, thread = timed(completer, "SELECT throttle.complete(ARRAY[%s, %s]::bigint[], %s)",
                            (id1, id2, token), wait=1)
    extended, _, _ = timed(heartbeat, "SELECT throttle.extend(ARRAY[%s]::bigint[], %s, '10 minutes')",
                           (id2, token), wait=5)
    heartbeat.commit()
    thread.join(timeout=10)
    tap.ok(moved and "error" not in extended and extended.get("rows") == [(1,)],
           "while complete waits for a claim's first event, an extend of its second goes through"
           " (complete holds nothing yet: it locks in id order, whatever its plan)",
           (moved, extended))
    tap.is_(done.get("rows", done.get("error")), [(2,)], "and complete then ends both")
    for conn in (heartbeat, completer, worker):
        conn.close()


def main():
    tap = Tap(76)
    admin = connect()
    cur = admin.cursor()

    # 1-2: a cancel in flight.
    state = claim_group_during(tap, admin, "d.cancel",
                               "SELECT throttle.cancel(%s, 'a1')", "cancels")
    # 3-4: a reschedule in flight.
    claim_group_during(tap, admin, "d.resched",
                       "SELECT throttle.reschedule(%s, 'a1', now() + interval '1 hour')", "reschedules")
    tap.is_(state[0], "cancelled", "the cancelled event stays cancelled")

    # 6-8: a worker with autocommit off claims a group and completes it in a
    # transaction it has not committed yet (psycopg2's default).
    fresh(cur, "d.open")
    cur.execute("SELECT throttle.schedule('d.open', 'e' || g, now(), group_key => 'g') FROM generate_series(1, 3) g")
    a = connect(autocommit=False)
    acur = a.cursor()
    acur.execute("SELECT id, claim_token FROM throttle.claim_group('d.open', 'wa', '5 minutes')")
    a_rows = acur.fetchall()
    acur.execute("SELECT throttle.complete(%s::bigint[], %s)", ([r[0] for r in a_rows], a_rows[0][1]))
    held_before_commit = one(admin, "SELECT count(*) FROM throttle.status WHERE kind = 'group' "
                                    "AND name = '6:d.open:g'")[0]
    b = connect(options="-c statement_timeout=20s")
    result, took, thread = timed(b, "SELECT id FROM throttle.claim_group('d.open', 'wb', '5 minutes')")
    a.commit()
    thread.join(timeout=30)
    rows = result.get("rows", [])
    tap.ok(took < PROMPT and rows == [] and held_before_commit == 1,
           "a group completed in a transaction not yet committed stays held: others skip it, without waiting",
           f"it took {took:.1f} s, returned {rows}, error {result.get('error')}; leases held {held_before_commit}")
    again = one(b, "SELECT array_agg(id) FROM throttle.claim_group('d.open', 'wb', '5 minutes')")[0]
    claimed = sorted([r[0] for r in rows] + (again or []))
    tap.is_(claimed, [], "no event completed by the other worker is claimed again, before or after its commit")
    tap.is_(one(admin, "SELECT count(*) FILTER (WHERE state = 'done' AND completed_by = 'wa') FROM throttle.all_events "
                     "WHERE queue = 'd.open'")[0], 3, "the three events are done, by the worker that claimed them")
    a.close()

    # 9-11: a claim_group that is rolled back leaves the group free at once.
    fresh(cur, "d.rollback")
    cur.execute("SELECT throttle.schedule('d.rollback', 'e1', now(), group_key => 'g')")
    a = connect(autocommit=False)
    acur = a.cursor()
    acur.execute("SELECT id FROM throttle.claim_group('d.rollback', 'wa', '5 minutes')")
    got_a = acur.fetchall()
    a.rollback()
    got_b, token_b = one(b, "SELECT array_agg(id), min(claim_token) "
                            "FROM throttle.claim_group('d.rollback', 'wb', '5 minutes')")
    tap.ok(len(got_a) == 1 and got_b == [got_a[0][0]],
           "a claim_group rolled back leaves its group to the next worker", f"a {got_a}, then b {got_b}")
    cur.execute("SELECT throttle.complete(%s::bigint[], %s)", (got_b or [], token_b or 0))
    cur.execute("SELECT throttle.schedule('d.rollback', 'e2', now(), group_key => 'g')")
    acur.execute("SAVEPOINT s")
    acur.execute("SELECT id FROM throttle.claim_group('d.rollback', 'wa', '5 minutes')")
    got_a = acur.fetchall()
    acur.execute("ROLLBACK TO SAVEPOINT s")
    got_b, token_b = one(b, "SELECT array_agg(id), min(claim_token) "
                            "FROM throttle.claim_group('d.rollback', 'wb', '5 minutes')")
    tap.ok(len(got_a) == 1 and got_b == [got_a[0][0]],
           "so does one rolled back to a savepoint", f"a {got_a}, then b {got_b}")
    a.commit()
    cur.execute("SELECT throttle.complete(%s::bigint[], %s)", (got_b or [], token_b or 0))
    cur.execute("SELECT throttle.schedule('d.rollback', 'e3', now(), group_key => 'g')")
    acur.execute("SAVEPOINT s")
    acur.execute("SELECT id FROM throttle.claim_group('d.rollback', 'wa', '5 minutes')")
    got_a = acur.fetchall()
    acur.execute("RELEASE SAVEPOINT s")
    a.commit()
    got_b, token_b = one(b, "SELECT array_agg(id), min(claim_token) "
                            "FROM throttle.claim_group('d.rollback', 'wb', '5 minutes')")
    tap.ok(len(got_a) == 1 and got_b is None,
           "a claim in a savepoint that is released, then committed, holds its group", f"a {got_a}, then b {got_b}")
    a.close()

    # 12-16: schedule of an item_key whose event is claimed.
    fresh(cur, "d.again")
    cur.execute("SELECT throttle.schedule('d.again', 'k', now(), '{\"v\": 1}')")
    first = one(admin, "SELECT id, payload, claim_token FROM throttle.claim('d.again', 'w1')")
    second_id = one(admin, "SELECT throttle.schedule('d.again', 'k', now(), '{\"v\": 2}')")[0]
    tap.ok(second_id != first[0], "schedule of a claimed item_key makes a new event",
           f"claimed {first[0]}, schedule returned {second_id}")
    tap.is_(one(admin, "SELECT state, payload->>'v' FROM throttle.all_events WHERE id = %s", (first[0],)),
            ("claimed", "1"), "and leaves the claimed event as it was")
    tap.is_(one(b, "SELECT count(*) FROM throttle.claim('d.again', 'w2')")[0], 0,
            "the new run is not handed to another worker while the claimed one runs")
    tap.is_(one(admin, "SELECT throttle.complete(ARRAY[%s]::bigint[], %s)", (first[0], first[2]))[0], 1,
            "the claimed event completes")
    tap.is_(one(b, "SELECT item_key, payload->>'v' FROM throttle.claim('d.again', 'w2')"), ("k", "2"),
            "then the new run is claimed, with its payload")

    # 17-19: group keys of any length.
    fresh(cur, "d.long")
    base = "x" * 250
    cur.execute("SELECT throttle.schedule('d.long', 'one', now(), group_key => %s)", (base + "1",))
    cur.execute("SELECT throttle.schedule('d.long', 'two', now(), group_key => %s)", (base + "2",))
    cur.execute("SELECT throttle.schedule('d.long', 'short', now(), group_key => 'short')")
    claims = []
    for worker in ("w1", "w2", "w3"):
        with admin.cursor() as c:
            c.execute("SELECT item_key FROM throttle.claim_group('d.long', %s, '5 minutes')", (worker,))
            claims.append(sorted(r[0] for r in c.fetchall()))
    tap.is_(sorted(k for c in claims for k in c), ["one", "short", "two"],
            "three workers claim three groups, two of them with 251-byte group_keys")
    tap.ok(all(len(c) == 1 for c in claims), "one group each: keys sharing 250 bytes are two groups", claims)
    with admin.cursor() as c:
        c.execute("SELECT count(*) FROM throttle.claim_group('d.long', 'w4', '5 minutes')")
        tap.is_(c.fetchone()[0], 0, "and while they are held no fourth worker gets any of them")

    # 20-21: enqueued_by is the caller.
    cur.execute("SELECT count(*) FROM pg_roles WHERE rolname = 'queue_defects_role'")
    if cur.fetchone()[0] == 0:
        cur.execute("CREATE ROLE queue_defects_role")
    fresh(cur, "d.who")
    cur.execute("SET ROLE queue_defects_role")
    cur.execute("SET application_name = 'billing'")
    cur.execute("SELECT throttle.schedule('d.who', 'k', now())")
    cur.execute("RESET ROLE")
    tap.is_(one(admin, "SELECT enqueued_by FROM throttle.all_events WHERE queue = 'd.who'")[0],
            "queue_defects_role (billing)", "enqueued_by names the role that called schedule")
    tap.ok(one(admin, "SELECT enqueued_by FROM throttle.all_events WHERE queue = 'd.again' LIMIT 1")[0]
           .startswith(one(admin, "SELECT current_user")[0]), "and the superuser when it calls")

    # 22-23: two processes that both call themselves worker-7. The first
    # one's lease expires (a session whose test clock is 10 minutes ahead
    # sees that now) and the second claims the event again.
    fresh(cur, "d.same")
    cur.execute("SELECT throttle.schedule('d.same', 'k', now())")
    first = one(admin, "SELECT id, claim_token FROM throttle.claim('d.same', 'worker-7', '5 minutes')")
    later = connect()
    ahead = datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(minutes=10)
    execute(later, "SET pg_throttle.test_clock = %s", (str(ahead),))
    second = one(later, "SELECT id, claim_token FROM throttle.claim('d.same', 'worker-7', '5 minutes')")
    tap.is_(one(admin, "SELECT throttle.complete(ARRAY[%s]::bigint[], %s), "
                       "throttle.fail(ARRAY[%s]::bigint[], %s, 'late'), "
                       "throttle.extend(ARRAY[%s]::bigint[], %s, '1 minute')",
                (first[0], first[1]) * 3), (0, 0, 0),
            "a worker whose claim was taken over by another process with its name changes nothing")
    tap.is_(one(later, "SELECT throttle.complete(ARRAY[%s]::bigint[], %s)", second)[0], 1,
            "the process holding the claim completes it with its own token")
    later.close()

    # 24-27: another role.
    for role in ("queue_defects_a", "queue_defects_b"):
        cur.execute("SELECT count(*) FROM pg_roles WHERE rolname = %s", (role,))
        if cur.fetchone()[0] == 0:
            cur.execute(f"CREATE ROLE {role}")
    fresh(cur, "d.roles")
    cur.execute("SELECT throttle.schedule('d.roles', 'k' || g, now()) FROM generate_series(1, 2) g")
    cur.execute("SET ROLE queue_defects_a")
    claims = [one(admin, "SELECT id, claim_token FROM throttle.claim('d.roles', 'w')") for _ in range(2)]
    cur.execute("SET ROLE queue_defects_b")
    tap.is_(one(admin, "SELECT throttle.complete(ARRAY[%s]::bigint[], %s), "
                       "throttle.fail(ARRAY[%s]::bigint[], %s, 'x'), "
                       "throttle.extend(ARRAY[%s]::bigint[], %s, '1 minute')", claims[0] * 3), (0, 0, 0),
            "another role cannot complete, fail or extend a claim, even with its token")
    tap.is_((sql_error(admin, "SELECT claim_token FROM throttle.event WHERE queue = 'd.roles'") or ("",))[0],
            "42501", "and cannot read claim tokens (42501); the other columns it can")
    one(admin, "SELECT id, claimed_by, claimed_role FROM throttle.all_events WHERE queue = 'd.roles' LIMIT 1")
    cur.execute("SET ROLE queue_defects_a")
    tap.is_(one(admin, "SELECT throttle.complete(ARRAY[%s, %s]::bigint[], %s)",
                (claims[0][0], claims[1][0], claims[0][1]))[0], 1,
            "the claim's role completes with the claim's token: only the events that token holds")
    cur.execute("RESET ROLE")
    tap.ok(claims[0][1] is not None and claims[1][1] is not None and claims[1][1] > claims[0][1],
           "every claim of ungrouped events has a token of its own, greater than the one before", claims)

    # 28: fail of a claimed event whose item_key was scheduled again.
    fresh(cur, "d.superseded")
    cur.execute("SELECT throttle.schedule('d.superseded', 'k', now(), '{\"v\": 1}')")
    old = one(admin, "SELECT id, claim_token FROM throttle.claim('d.superseded', 'w1')")
    cur.execute("SELECT throttle.schedule('d.superseded', 'k', now(), '{\"v\": 2}')")
    failed = sql_error(admin, "SELECT throttle.fail(ARRAY[%s]::bigint[], %s, 'boom')", old)
    tap.is_((failed, one(admin, "SELECT array_agg(state || ':' || (payload->>'v') ORDER BY id) FROM throttle.all_events "
                                "WHERE queue = 'd.superseded'")[0]),
            (None, ["cancelled:1", "pending:2"]),
            "fail of a claimed event scheduled again meanwhile: it is superseded by the newer run, no error")

    # 29-30: the newer run of a claimed event is not claimed by claim_group,
    # whether the claimed one is ungrouped or in the same group.
    fresh(cur, "d.succ")
    cur.execute("SELECT throttle.schedule('d.succ', 'k', now())")
    running = one(admin, "SELECT id, claim_token FROM throttle.claim('d.succ', 'w1')")
    cur.execute("SELECT throttle.schedule('d.succ', 'k', now(), group_key => 'g')")
    tap.is_(one(b, "SELECT count(*) FROM throttle.claim_group('d.succ', 'w2', '5 minutes')")[0], 0,
            "claim_group leaves a newer run alone while the claimed one runs")
    cur.execute("SELECT throttle.complete(ARRAY[%s]::bigint[], %s)", running)
    tap.is_(one(b, "SELECT count(*) FROM throttle.claim_group('d.succ', 'w2', '5 minutes')")[0], 1,
            "and claims it once that one is done")

    # 31-32: extend does not revive a claim whose lease has ended; a group
    # taken over meanwhile stays with its new holder.
    fresh(cur, "d.extend")
    cur.execute("SELECT throttle.schedule('d.extend', 'e' || g, now(), group_key => 'g') FROM generate_series(1, 2) g")
    first = one(admin, "SELECT array_agg(id), min(claim_token) FROM throttle.claim_group('d.extend', 'wa', '5 minutes')")
    later = connect()
    execute(later, "SET pg_throttle.test_clock = %s",
            (str(datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(minutes=10)),))
    tap.is_(one(later, "SELECT throttle.extend(%s, %s, '5 minutes')", first)[0], 0,
            "extend of a claim whose lease has ended changes nothing")
    taken = one(later, "SELECT count(*) FROM throttle.claim_group('d.extend', 'wb', '5 minutes')")[0]
    tap.is_((taken, one(later, "SELECT count(DISTINCT claim_token) FROM throttle.event WHERE queue = 'd.extend'")[0]),
            (2, 1), "the group goes to the next worker whole")
    later.close()

    # 33-34: keys are indexed: at most 1024 bytes.
    tap.is_((sql_error(admin, "SELECT throttle.schedule('d.keys', 'k', now(), group_key => repeat('g', 1025))")
             or ("",))[:2], ("22023", "group_key must have at most 1024 bytes"), "a longer group_key: 22023")
    tap.is_((sql_error(admin, "SELECT throttle.schedule('d.keys', repeat('k', 1025), now())") or ("",))[:2],
            ("22023", "item_key must have at most 1024 bytes"), "a longer item_key: 22023")

    # 35: a newer run that commits while fail runs: no unique violation.
    fresh(cur, "d.race")
    cur.execute("SELECT throttle.schedule('d.race', 'k', now())")
    old = one(admin, "SELECT id, claim_token FROM throttle.claim('d.race', 'w1')")
    producer = connect(autocommit=False)
    execute(producer, "SELECT throttle.schedule('d.race', 'k', now(), '{\"v\": 2}')")
    worker = connect()
    result = while_held(producer, worker, "SELECT throttle.fail(ARRAY[%s]::bigint[], %s, 'boom')", old)
    tap.is_((result.get("rows"), result.get("error"),
             one(admin, "SELECT array_agg(state ORDER BY id) FROM throttle.all_events WHERE queue = 'd.race'")[0]),
            ([(1,)], None, ["cancelled", "pending"]),
            "a newer run committed while fail waits for it: the failed run is superseded, no error")
    producer.close()

    # 36: retry refuses a dead run whose item_key has a newer run claimed.
    fresh(cur, "d.retry")
    cur.execute("SELECT throttle.schedule('d.retry', 'k', now(), max_attempts => 1)")
    dead = one(admin, "SELECT id, claim_token FROM throttle.claim('d.retry', 'w1')")
    cur.execute("SELECT throttle.fail(ARRAY[%s]::bigint[], %s, 'boom')", dead)
    cur.execute("SELECT throttle.schedule('d.retry', 'k', now())")
    one(admin, "SELECT id FROM throttle.claim('d.retry', 'w2')")
    tap.is_(one(admin, "SELECT retried, reason FROM throttle.retry(ARRAY[%s]::bigint[])", (dead[0],)),
            (False, "its item_key has a newer run, pending or claimed"),
            "retry refuses a dead run while a newer run of its item_key is claimed")

    # 37: two transactions each complete part of one group claim; the group
    # is free once both have committed.
    fresh(cur, "d.halves")
    cur.execute("SELECT throttle.schedule('d.halves', 'e' || g, now(), group_key => 'g') FROM generate_series(1, 2) g")
    halves = one(admin, "SELECT array_agg(id ORDER BY id), min(claim_token) "
                        "FROM throttle.claim_group('d.halves', 'w1', '1 hour')")
    t1 = connect(autocommit=False)
    execute(t1, "SELECT throttle.complete(ARRAY[%s]::bigint[], %s)", (halves[0][0], halves[1]))
    t2 = connect()
    result = while_held(t1, t2, "SELECT throttle.complete(ARRAY[%s]::bigint[], %s)", (halves[0][1], halves[1]))
    cur.execute("SELECT throttle.schedule('d.halves', 'e3', now(), group_key => 'g')")
    tap.is_((result.get("rows"), one(b, "SELECT count(*) FROM throttle.claim_group('d.halves', 'w2', '1 minute')")[0]),
            ([(1,)], 1), "two transactions completing halves of one group claim leave the group free")
    t1.close()
    t2.close()

    # 37b: a complete of the whole group claim and a complete of part of it,
    # in either order, or of two parts given with NULL elements, one
    # transaction held open: the second waits for the first, no event is
    # completed twice, and the group is free after both.
    for queue, first, second, name in (
            ("d.whole1", lambda i: i, lambda i: i[1:2], "whole, then part"),
            ("d.whole2", lambda i: i[1:2], lambda i: i, "part, then whole"),
            ("d.whole3", lambda i: [i[0], None], lambda i: [None, i[1], i[2]], "two parts with NULLs")):
        cur.execute("SELECT throttle.schedule(%s, 'e' || g, now(), group_key => 'g') "
                    "FROM generate_series(1, 3) g", (queue,))
        claimed = one(admin, "SELECT array_agg(id ORDER BY id), min(claim_token) "
                             "FROM throttle.claim_group(%s, 'w1', '1 hour')", (queue,))
        t1 = connect(autocommit=False)
        done_first = one(t1, "SELECT throttle.complete(%s::bigint[], %s)",
                         (first(claimed[0]), claimed[1]))[0]
        t2 = connect()
        result = while_held(t1, t2, "SELECT throttle.complete(%s::bigint[], %s)",
                            (second(claimed[0]), claimed[1]))
        cur.execute("SELECT throttle.schedule(%s, 'e4', now(), group_key => 'g')", (queue,))
        tap.is_((done_first + result.get("rows", [(None,)])[0][0], result.get("waited"),
                 one(b, "SELECT count(*) FROM throttle.claim_group(%s, 'w2', '1 minute')", (queue,))[0],
                 one(admin, "SELECT count(*) FROM throttle.event_history WHERE queue = %s", (queue,))[0]),
                (3, True, 1, 3),
                f"complete of a group claim, {name}: each event completed once, the group free after")
        t1.close()
        t2.close()

    # 37d: finishing part of a large group claim reaches its events by
    # primary key whatever the plans and statistics say: a session whose
    # plans were made while the table was small, and an ANALYZE that saw no
    # claim at all, then extend and complete of half of a 10 000-event
    # claim (a plan that tested every row against every id took 6 to 10 s).
    fresh(cur, "d.large")
    fresh(cur, "d.small")
    big = connect()
    for round_ in range(7):
        cur.execute("SELECT throttle.schedule('d.small', 'r%s.' || g, now(), group_key => 'g%s') "
                    "FROM generate_series(1, 2) g", (round_, round_))
        small = one(big, "SELECT array_agg(id ORDER BY id), min(claim_token) "
                         "FROM throttle.claim_group('d.small', 'w1', '1 hour')")
        one(big, "SELECT throttle.extend(%s::bigint[], %s, '2 hours')", (small[0][:1], small[1]))
        one(big, "SELECT throttle.complete(%s::bigint[], %s)", (small[0][:1], small[1]))
        one(big, "SELECT throttle.complete(%s::bigint[], %s)", (small[0][1:], small[1]))
        cur.execute("SELECT throttle.schedule('d.small', 'f%s.' || g, now(), group_key => 'f%s') "
                    "FROM generate_series(1, 2) g", (round_, round_))
        small = one(big, "SELECT array_agg(id ORDER BY id), min(claim_token) "
                         "FROM throttle.claim_group('d.small', 'w1', '1 hour')")
        one(big, "SELECT throttle.fail(%s::bigint[], %s, 'x', '1 hour')", (small[0][:1], small[1]))
        one(big, "SELECT throttle.fail(%s::bigint[], %s, 'x', '1 hour')", (small[0][1:], small[1]))
    cur.execute("SELECT throttle.schedule_many('d.large', array_agg('e' || g), array_agg(now()), "
                "group_keys => array_agg(CASE WHEN g <= 10000 THEN 'g' ELSE 'h' || g END)) "
                "FROM generate_series(1, 30000) g")
    cur.execute("ANALYZE throttle.event")
    large = one(admin, "SELECT array_agg(id ORDER BY id), min(claim_token) "
                       "FROM throttle.claim_group('d.large', 'w1', '1 hour', 10000)")
    t0 = time.monotonic()
    extended = one(big, "SELECT throttle.extend(%s::bigint[], %s, '2 hours')",
                   (large[0][:5000], large[1]))[0]
    t1 = time.monotonic()
    completed = one(big, "SELECT throttle.complete(%s::bigint[], %s)", (large[0][:5000], large[1]))[0]
    t2 = time.monotonic()
    tap.is_((len(large[0]), extended, completed, t1 - t0 < 3, t2 - t1 < 3), (10000, 5000, 5000, True, True),
            f"extend and complete of half of a 10 000-event group claim: {t1 - t0:.2f} s and "
            f"{t2 - t1:.2f} s (bound 3 s each)")
    # 42: fail of a whole 10 000-event group claim, the same way (a plan
    # that joined the events to a list of them, expecting ten, took 4 s).
    fresh(cur, "d.large2")
    cur.execute("SELECT throttle.schedule_many('d.large2', array_agg('e' || g), array_agg(now()), "
                "group_keys => array_fill('g'::text, ARRAY[10000])) FROM generate_series(1, 10000) g")
    whole = one(admin, "SELECT array_agg(id ORDER BY id), min(claim_token) "
                       "FROM throttle.claim_group('d.large2', 'w1', '1 hour', 10000)")
    t3 = time.monotonic()
    failed = one(big, "SELECT throttle.fail(%s::bigint[], %s, 'boom', '1 hour')", whole)[0]
    t4 = time.monotonic()
    tap.is_((failed, t4 - t3 < 2), (10000, True),
            f"fail of a whole 10 000-event group claim: {t4 - t3:.2f} s (bound 2 s)")
    # 43: in a group kept in strict order, fail of the first event of a
    # 10 000-event claim hands the other 9 999 back (throttle._fence_claims),
    # in a session that has done so often enough for PL/pgSQL to keep a
    # generic plan (which, joining the events to a list of them, took 4.7 s
    # for 5 000).
    fresh(cur, "d.large3")
    cur.execute("INSERT INTO throttle.group_policy (queue, strict_order) VALUES ('d.large3', true) "
                "ON CONFLICT (queue) DO UPDATE SET strict_order = true")
    # (PL/pgSQL plans each call for its values five times, then keeps the
    # generic plan once the custom ones cost more on average: here after
    # small claims and one of 2 500.)
    for round_, size in enumerate([3] * 8 + [2500]):
        cur.execute("SELECT throttle.schedule_many('d.large3', array_agg('s%s.' || g), array_agg(now()), "
                    "group_keys => array_fill(%s::text, ARRAY[%s])) FROM generate_series(1, %s) g",
                    (round_, f"s{round_}", size, size))
        small = one(big, "SELECT array_agg(id ORDER BY id), min(claim_token) "
                         "FROM throttle.claim_group('d.large3', 'w1', '1 hour', 10000)")
        one(big, "SELECT throttle.fail(%s::bigint[], %s, 'x', '1 hour')", (small[0][:1], small[1]))
    cur.execute("SELECT throttle.schedule_many('d.large3', array_agg('e' || g), array_agg(now()), "
                "group_keys => array_fill('big'::text, ARRAY[10000])) FROM generate_series(1, 10000) g")
    whole = one(admin, "SELECT array_agg(id ORDER BY id), min(claim_token) "
                       "FROM throttle.claim_group('d.large3', 'w1', '1 hour', 10000)")
    t5 = time.monotonic()
    failed = one(big, "SELECT throttle.fail(%s::bigint[], %s, 'boom', '1 hour')", ([whole[0][0]], whole[1]))[0]
    t6 = time.monotonic()
    handed_back = one(admin, "SELECT count(*) FILTER (WHERE state = 'pending' AND claim_token IS NULL) "
                             "FROM throttle.event WHERE queue = 'd.large3' AND group_key = 'big'")[0]
    tap.is_((failed, handed_back, t6 - t5 < 3), (1, 9999, True),
            f"fail of the first event of a 10 000-event claim in strict order hands the rest back: "
            f"{t6 - t5:.2f} s (bound 3 s)")
    big.close()

    # 37c: a complete that ends a group claim NOTIFYs the group's events that
    # came due while it was held.
    fresh(cur, "d.wake")
    cur.execute("SELECT throttle.schedule('d.wake', 'e1', now(), group_key => 'g')")
    held = one(admin, "SELECT array_agg(id), min(claim_token) FROM throttle.claim_group('d.wake', 'w1', '1 hour')")
    listener = connect()
    listener.cursor().execute('LISTEN "d.wake"')
    arrived = one(admin, "SELECT throttle.schedule('d.wake', 'e2', now(), group_key => 'g')")[0]
    deadline = time.monotonic() + 10  # schedule's own notify first, however late it comes
    while time.monotonic() < deadline and not listener.notifies:
        time.sleep(0.05)
        listener.poll()
    time.sleep(0.3)
    listener.poll()
    listener.notifies.clear()
    one(admin, "SELECT throttle.complete(%s::bigint[], %s)", (held[0], held[1]))
    tap.is_(heard(listener), [arrived],
            "complete that frees a group notifies the event that came due while it was held")
    listener.close()

    # 54: fail decides what is due, to NOTIFY, when its waits are over: a
    # retry that came due while fail waited for the claim's row (an extend
    # in a transaction left open) is heard.
    set_wakeups(admin, False)  # fail's own NOTIFY, not the waker's
    fresh(cur, "d.latewake")
    cur.execute("SELECT throttle.schedule('d.latewake', 'k', now())")
    claim = one(admin, "SELECT id, claim_token FROM throttle.claim('d.latewake', 'w1')")
    listener = connect()
    listener.cursor().execute('LISTEN "d.latewake"')
    # The extend commits 0.6 s after fail began to wait: its retry, due
    # 300 ms after fail began, is due by then.
    result = behind_open_extend(claim, "SELECT throttle.fail(ARRAY[%s]::bigint[], %s, 'boom', '300 ms')", 0.6)
    tap.is_((result.get("rows"), result["waited"], heard(listener)), ([(1,)], True, [claim[0]]),
            "fail that waited past its retry's run_at NOTIFYs the retry")
    listener.close()

    # 56-57: complete NOTIFYs the run of its event's item_key that was
    # scheduled while the event ran (it waited for the claim to end), and
    # decides what is due when its waits are over.
    fresh(cur, "d.succ")
    cur.execute("SELECT throttle.schedule('d.succ', 'k', now())")
    claim = one(admin, "SELECT id, claim_token FROM throttle.claim('d.succ', 'w1')")
    listener = connect()
    listener.cursor().execute('LISTEN "d.succ"')
    successor = one(admin, "SELECT throttle.schedule('d.succ', 'k', now())")[0]
    heard(listener)  # schedule's own notify, heard while the claim holds
    listener.notifies.clear()
    one(admin, "SELECT throttle.complete(ARRAY[%s]::bigint[], %s)", claim)
    tap.is_(heard(listener), [successor],
            "complete NOTIFYs the run of its item_key scheduled while the event ran")
    fresh(cur, "d.succ")
    cur.execute("SELECT throttle.schedule('d.succ', 'k', now())")
    heard(listener)  # its own notify
    listener.notifies.clear()
    claim = one(admin, "SELECT id, claim_token FROM throttle.claim('d.succ', 'w1')")
    # Due 300 ms from now; complete waits 0.6 s for an extend left open.
    successor = one(admin, "SELECT throttle.schedule('d.succ', 'k', now() + interval '300 ms')")[0]
    result = behind_open_extend(claim, "SELECT throttle.complete(ARRAY[%s]::bigint[], %s)", 0.6)
    tap.is_((result.get("rows"), result["waited"], heard(listener)), ([(1,)], True, [successor]),
            "complete that waited past the next run's run_at NOTIFYs it")
    listener.close()
    set_wakeups(admin, True)

    # 38: a claim that expired while a newer run of its item_key waits is
    # not run again with its old payload: the newer run replaces it.
    fresh(cur, "d.stale")
    cur.execute("SELECT throttle.schedule('d.stale', 'k', now(), '{\"v\": 1}')")
    one(admin, "SELECT id FROM throttle.claim('d.stale', 'w1', '5 minutes')")
    cur.execute("SELECT throttle.schedule('d.stale', 'k', now(), '{\"v\": 2}')")
    later = connect()
    execute(later, "SET pg_throttle.test_clock = %s",
            (str(datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(minutes=10)),))
    got = [one(later, "SELECT array_agg(payload->>'v') FROM throttle.claim('d.stale', 'w2')")[0] for _ in range(2)]
    tap.is_((got, one(admin, "SELECT array_agg(state ORDER BY id) FROM throttle.all_events WHERE queue = 'd.stale'")[0]),
            ([None, ["2"]], ["cancelled", "claimed"]),
            "an expired claim superseded by a newer run is cancelled, and only the newer run runs")
    later.close()

    # 39: the default backoff of a late attempt does not overflow.
    fresh(cur, "d.backoff")
    cur.execute("SELECT throttle.schedule('d.backoff', 'k', now(), max_attempts => 100)")
    cur.execute("UPDATE throttle.event SET attempts = 60 WHERE queue = 'd.backoff'")
    late = one(admin, "SELECT id, claim_token FROM throttle.claim('d.backoff', 'w1')")
    tap.is_((sql_error(admin, "SELECT throttle.fail(ARRAY[%s]::bigint[], %s, 'again')", late),
             one(admin, "SELECT run_at - now() <= interval '1 hour 1 minute' FROM throttle.all_events WHERE id = %s",
                 (late[0],))[0]),
            (None, True), "fail of the 61st attempt backs off one hour, without an interval overflow")

    # 40: a claim's role is its oid: renaming the role keeps its claims.
    fresh(cur, "d.rename")
    cur.execute("SELECT throttle.schedule('d.rename', 'k', now())")
    cur.execute("SET ROLE queue_defects_a")
    mine = one(admin, "SELECT id, claim_token FROM throttle.claim('d.rename', 'w')")
    cur.execute("RESET ROLE")
    cur.execute("ALTER ROLE queue_defects_a RENAME TO queue_defects_a2")
    cur.execute("SET ROLE queue_defects_a2")
    tap.is_(one(admin, "SELECT throttle.complete(ARRAY[%s]::bigint[], %s)", mine)[0], 1,
            "a role renamed while it holds a claim still completes it")
    cur.execute("RESET ROLE")
    cur.execute("ALTER ROLE queue_defects_a2 RENAME TO queue_defects_a")

    # 41: the same in one transaction snapshot: a serialization failure the
    # client retries, never a unique violation.
    fresh(cur, "d.rr")
    cur.execute("SELECT throttle.schedule('d.rr', 'k', now())")
    old = one(admin, "SELECT id, claim_token FROM throttle.claim('d.rr', 'w1')")
    rr = connect(autocommit=False)
    execute(rr, "BEGIN ISOLATION LEVEL REPEATABLE READ")
    one(rr, "SELECT 1")
    cur.execute("SELECT throttle.schedule('d.rr', 'k', now(), '{\"v\": 2}')")
    tap.is_((sql_error(rr, "SELECT throttle.fail(ARRAY[%s]::bigint[], %s, 'boom')", old) or ("",))[0], "40001",
            "fail in a repeatable-read snapshot that misses a newer run: 40001, to retry")
    rr.rollback()
    tap.is_(one(admin, "SELECT throttle.fail(ARRAY[%s]::bigint[], %s, 'boom')", old)[0], 1,
            "and the retry supersedes the failed run")
    rr.close()

    # 43: two retries crossing two keys: each brings its dead runs back in
    # key order, so they cannot wait for each other in a circle. A holds
    # k's pending entry; B (m's run first in its array) waits for k before
    # it touches m; A then brings m back and commits. The old order put
    # m into the index first in B and deadlocked here.
    fresh(cur, "d.cross")
    dead = {}
    for key in ("k", "k", "m", "m"):
        cur.execute("SELECT throttle.schedule('d.cross', %s, now(), max_attempts => 1)", (key,))
        run = one(admin, "SELECT id, claim_token FROM throttle.claim('d.cross', 'w')")
        cur.execute("SELECT throttle.fail(ARRAY[%s]::bigint[], %s, 'boom')", run)
        dead.setdefault(key, []).append(run[0])
    a_conn = connect(autocommit=False)
    execute(a_conn, "SELECT * FROM throttle.retry(ARRAY[%s]::bigint[])", (dead["k"][0],))
    b_conn = connect(options="-c deadlock_timeout=100ms")
    result, _, thread = timed(b_conn, "SELECT retried FROM throttle.retry(ARRAY[%s, %s]::bigint[])",
                              (dead["m"][1], dead["k"][1]))
    time.sleep(0.5)
    a_error = sql_error(a_conn, "SELECT * FROM throttle.retry(ARRAY[%s]::bigint[])", (dead["m"][0],))
    a_conn.commit()
    thread.join(timeout=30)
    tap.is_((a_error, result.get("error"), result.get("rows")), (None, None, [(False,), (False,)]),
            "two retries crossing two keys: no deadlock; the second finds both keys retried")
    a_conn.close()
    b_conn.close()

    # 44: release_group while a newer run of one of the group's item_keys
    # commits: that event is superseded, the other handed back, each once.
    fresh(cur, "d.release")
    cur.execute("SELECT throttle.schedule('d.release', 'k1', now(), group_key => 'g')")
    cur.execute("SELECT throttle.schedule('d.release', 'k2', now(), group_key => 'g')")
    one(admin, "SELECT count(*) FROM throttle.claim_group('d.release', 'w1', '5 minutes')")
    producer = connect(autocommit=False)
    execute(producer, "SELECT throttle.schedule('d.release', 'k2', now())")
    operator = connect()
    result = while_held(producer, operator, "SELECT throttle.release_group('d.release', 'g')")
    tap.is_((result.get("rows"), result.get("error"),
             one(admin, "SELECT array_agg(item_key || ':' || state ORDER BY id) FROM throttle.all_events "
                        "WHERE queue = 'd.release'")[0]),
            ([(2,)], None, ["k1:pending", "k2:cancelled", "k2:pending"]),
            "a newer run committed while release_group waits for it: two events handed back, "
            "counted once each")
    producer.close()
    operator.close()

    # 45: purge while a dead event comes back and dies again in a transaction
    # not yet committed: purge deletes the event in its newest version, and
    # with it the attempt that transaction wrote, which purge's first
    # snapshot could not see.
    fresh(cur, "d.purge")
    cur.execute("SELECT throttle.schedule('d.purge', 'p1', now(), max_attempts => 1)")
    pid, ptoken = one(admin, "SELECT id, claim_token FROM throttle.claim('d.purge', 'w1')")
    cur.execute("SELECT throttle.fail(%s, %s, 'first life')", ([pid], ptoken))
    second = connect(autocommit=False)
    execute(second, "SELECT throttle.retry(%s)", (pid,))
    token2 = one(second, "SELECT claim_token FROM throttle.claim('d.purge', 'w2')")[0]
    execute(second, "SELECT throttle.fail(%s, %s, 'second life')", ([pid], token2))
    purger = connect()
    result = while_held(second, purger, "SELECT throttle.purge('0 seconds', 'd.purge', '{dead}')")
    tap.is_((result.get("rows"), result.get("error"),
             one(admin, "SELECT count(*) FROM throttle.all_events WHERE id = %s", (pid,))[0],
             one(admin, "SELECT array_agg(error) FROM throttle.event_attempt WHERE event_id = %s", (pid,))[0]),
            ([(1,)], None, 0, None),
            "purge of an event that died again while purge waited takes its newest attempts with it")
    second.close()
    purger.close()

    # 51-52: fail runs its statement in a subtransaction of its own (to try
    # again past a newer run that commits meanwhile). Cancelled while it
    # waits for such a run, inside the caller's own exception block, it
    # rolls its subtransaction back before the error reaches the caller:
    # the caller's block catches it, its transaction goes on and commits,
    # and the claim is as it was; a fail after the newer run committed
    # supersedes the failed run.
    fresh(cur, "d.failcancel")
    cur.execute("SELECT throttle.schedule('d.failcancel', 'k', now())")
    claim = one(admin, "SELECT id, claim_token FROM throttle.claim('d.failcancel', 'w1')")
    producer = connect(autocommit=False)
    execute(producer, "SELECT throttle.schedule('d.failcancel', 'k', now(), '{\"v\": 2}')")
    worker = connect(autocommit=False)
    execute(worker, "CREATE TEMP TABLE block_effects (n integer)")
    execute(worker, "CREATE FUNCTION pg_temp.fail_or_cancelled(ids bigint[], token bigint) RETURNS text"
                    " LANGUAGE plpgsql AS $$"
                    " BEGIN INSERT INTO block_effects VALUES (1);"
                    "       PERFORM throttle.fail(ids, token, 'boom'); RETURN 'failed';"
                    " EXCEPTION WHEN query_canceled THEN RETURN 'cancelled'; END $$")
    execute(worker, "SET statement_timeout = '500ms'")
    outcome = one(worker, "SELECT pg_temp.fail_or_cancelled(ARRAY[%s]::bigint[], %s)", claim)[0]
    after = one(worker, "SELECT state, attempts, (SELECT count(*) FROM throttle.event_attempt a"
                        "                         WHERE a.event_id = e.id),"
                        "       (SELECT count(*) FROM block_effects)"
                        " FROM throttle.event e WHERE e.id = %s", (claim[0],))
    worker.commit()
    tap.is_((outcome, after), ("cancelled", ("claimed", 1, 0, 0)),
            "fail cancelled while it waits for a newer run, in the caller's exception block: caught there "
            "(the block's own changes undone), the transaction goes on and commits, the claim as it was")
    producer.commit()
    execute(worker, "RESET statement_timeout")
    failed = one(worker, "SELECT throttle.fail(ARRAY[%s]::bigint[], %s, 'boom')", claim)[0]
    worker.commit()
    tap.is_((failed, one(admin, "SELECT array_agg(state ORDER BY id) FROM throttle.all_events "
                                "WHERE queue = 'd.failcancel'")[0]),
            (1, ["cancelled", "pending"]), "fail after the newer run committed: the failed run is superseded")
    worker.close()
    producer.close()
    # 58-61: an expired claim of an item_key holds back its newer run only
    # until the next claimer of that run's kind comes by: claim_group ends
    # an expired claim of throttle.claim, claim one of claim_group, as each
    # ends its own kind's (cancelled, superseded by the newer run, its
    # attempt expired in the history). While the lease holds, the newer run
    # waits.
    clock = connect()
    ccur = clock.cursor()
    ccur.execute("SET pg_throttle.test_clock = '2030-03-01 12:00:00+00'")
    for first, then, queue in (("claim", "claim_group", "d.cross.kind1"),
                               ("claim_group", "claim", "d.cross.kind2")):
        fresh(ccur, queue)
        ccur.execute("SET pg_throttle.test_clock = '2030-03-01 12:00:00+00'")
        one(clock, "SELECT throttle.schedule(%s, 'k', throttle.now(), group_key => %s)",
            (queue, "g" if first == "claim_group" else None))
        old = one(clock, f"SELECT id FROM throttle.{first}(%s, 'w1', '1 minute')", (queue,))[0]
        new = one(clock, "SELECT throttle.schedule(%s, 'k', throttle.now(), group_key => %s)",
                  (queue, "g" if then == "claim_group" else None))[0]
        held = one(clock, f"SELECT count(*) FROM throttle.{then}(%s, 'w2', '1 minute')", (queue,))[0]
        ccur.execute("SET pg_throttle.test_clock = '2030-03-01 12:05:00+00'")
        got = one(clock, f"SELECT array_agg(id) FROM throttle.{then}(%s, 'w2', '1 minute')", (queue,))[0]
        tap.is_((held, got), (0, [new]),
                f"a newer run waits while the claim of {first} holds, and {then} takes it once that "
                f"claim expired, with no {first} call")
        ccur.execute("SELECT attempt, outcome, ended_at FROM throttle.event_attempt WHERE event_id = %s",
                     (old,))
        tap.is_((one(clock, "SELECT state, cancelled_by, failed_at FROM throttle.all_events WHERE id = %s",
                     (old,)), ccur.fetchall()),
                (("cancelled", None, datetime.datetime(2030, 3, 1, 12, 1, tzinfo=datetime.timezone.utc)),
                 [(1, "expired", datetime.datetime(2030, 3, 1, 12, 1, tzinfo=datetime.timezone.utc))]),
                f"the expired claim of {first} ends superseded, its attempt expired at the end of its lease")
    clock.close()

    # 62-66: a claim_group left open holds no lock beyond its claim.
    open_claim_group_locks(tap, admin)
    # 67-71: durable commits through a function's SET synchronous_commit = off.
    durable_in_function(tap, admin)
    # 72-74: a claim that ends a strict group's expired claim for a newer run
    # leaves the group's events whose lease the worker extended, and gives
    # their attempt back to those that never ran.
    strict_blocking_claims(tap)
    # 75-76: complete locks a claim's events in id order, whatever its plan.
    complete_lock_order(tap, admin)
    b.close()
    admin.close()
    tap.done()


if __name__ == "__main__":
    main()
