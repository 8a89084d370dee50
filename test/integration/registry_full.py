#!/usr/bin/python3
"""A small registry (pg_throttle.max_entries = 100): reclaiming and refusing.

Entries whose interval has passed are reclaimed when room is needed; live ones
never are, and when only live ones remain the call fails with 53200. Reclaim
is decided on the real clock: a session whose pg_throttle.test_clock is far in
the future, in another database, does not evict anyone's entries; and a sweep
on the real clock never evicts a test clock's entry that is in force on the
test clock.

Queue groups' leases have room of their own beside max_entries (100 here) and
count against no quota: a role at its quota of take() keys, or a registry full
of other roles' entries, still claims its groups, one worker per group; when
that room is full of leases in force, claim_group fails with 53200.
"""
import os
import sys
import threading
import time

import psycopg2

sys.path.insert(0, os.path.dirname(__file__))
from cluster import pg_ctlcluster, reconnect  # noqa: E402
from pgconn import connect, most_at_once, one, sql_error  # noqa: E402
from tap import Tap  # noqa: E402

CAPACITY = 100


def grants(cur, prefix, first, last, every):
    cur.execute("SELECT count(*) FILTER (WHERE throttle.acquire(%s || g, %s)) "
                "FROM generate_series(%s, %s) AS g", (prefix, every, first, last))
    return cur.fetchone()[0]


def allowed(cur, prefix, per):
    """How many of 50 buckets (1 per `per`) allow a call."""
    cur.execute("SELECT count(*) FILTER (WHERE throttle.allow(%s || g, 1, %s, 1)) "
                "FROM generate_series(1, 50) AS g", (prefix, per))
    return cur.fetchone()[0]


def clear(cur):
    cur.execute("SELECT count(throttle.reset(name)) FROM throttle.status")


def other_database(conn):
    cur = conn.cursor()
    cur.execute("SELECT count(*) FROM pg_database WHERE datname = 'registry_other'")
    if cur.fetchone()[0] == 0:
        cur.execute("CREATE DATABASE registry_other")
    other = connect(dbname="registry_other")
    other.cursor().execute("CREATE EXTENSION IF NOT EXISTS pg_throttle")
    return other


def test_clock_apart(tap, conn, cur):
    """A sweep on the real clock (the registry full) leaves a test clock's
    entry alone: in real time its window (in 2020) is long over, on its clock
    it is not."""
    clear(cur)
    tester = connect()
    tcur = tester.cursor()
    tcur.execute("SET pg_throttle.test_clock = '2020-01-01 00:00:00+00'")
    tcur.execute("SELECT throttle.acquire('tc.window', '1 day')")
    tap.ok(tcur.fetchone()[0], "a session on the test clock is granted a day in 2020")
    allowed(cur, "full.sweep.", "1 second")
    grants(cur, "full.fill.", 1, CAPACITY - 51, "1 hour")
    err = sql_error(conn, "SELECT throttle.acquire('full.extra', '1 hour')")
    tap.ok(err is not None and err[0] == "53200", "the registry is full", repr(err))
    time.sleep(1.2)
    tap.is_(grants(cur, "full.after.", 1, 50, "1 hour"), 50,
            "a sweep on the real clock makes room from the 50 expired buckets")
    err = sql_error(conn, "SELECT throttle.acquire('full.after.51', '1 hour')")
    tap.ok(err is not None and err[0] == "53200",
           "and from them only: the test clock's entry is not reclaimed (53200)", repr(err))
    tcur.execute("SET pg_throttle.test_clock = '2020-01-01 12:00:00+00'")
    answers = []
    for _ in range(2):
        tcur.execute("SELECT throttle.acquire('tc.window', '1 day')")
        answers.append(tcur.fetchone()[0])
    tap.ok(answers == [False, False], "the test clock's entry was not reclaimed: still taken "
           "inside its window on its clock (two calls)", repr(answers))
    tcur.execute("SET pg_throttle.test_clock = '2020-01-02 00:00:00+00'")
    tcur.execute("SELECT throttle.acquire('tc.window', '1 day')")
    tap.ok(tcur.fetchone()[0], "and granted once its window has passed on its clock")
    tcur.execute("SELECT throttle.reset('tc.window')")
    tester.close()


def test_clock_after_restart(tap, conn):
    """A test clock's entries do not hold the registry for good: after a
    restart no test has used the test clock, and a sweep on the real clock
    drops them, whatever their time on the test clock (2100)."""
    clear(conn.cursor())
    tester = connect()
    tcur = tester.cursor()
    tcur.execute("SET pg_throttle.test_clock = '2100-01-01 00:00:00+00'")
    tap.is_(grants(tcur, "tc.fill.", 1, CAPACITY, "1 day"), CAPACITY,
            "a session on the test clock fills the registry")
    tester.close()
    err = sql_error(conn, "SELECT throttle.acquire('tc.real', '1 hour')")
    tap.ok(err is not None and err[0] == "53200",
           "while the test clock was used just now, a real-clock call finds no room", repr(err))
    conn.close()
    pg_ctlcluster("restart", "-m", "fast")
    conn = reconnect()
    answers = [one(conn, "SELECT throttle.acquire('tc.real', '1 hour')")[0] for _ in range(2)]
    tap.ok(answers == [True, False], "after a restart a sweep drops them: granted, once",
           repr(answers))
    return conn


def main():
    tap = Tap(44)
    conn = connect()
    cur = conn.cursor()
    cur.execute("CREATE EXTENSION IF NOT EXISTS pg_throttle")
    cur.execute("SHOW pg_throttle.max_entries")
    tap.is_(int(cur.fetchone()[0]), CAPACITY, "the registry holds 100 entries")

    tap.is_(grants(cur, "full.day.", 1, 100, "1 day"), 100, "100 one-day grants fill the registry")
    err = sql_error(conn, "SELECT throttle.acquire('full.extra', '1 hour')")
    tap.ok(err is not None and err[0] == "53200", "a 101st live entry: SQLSTATE 53200", repr(err))
    tap.ok(err is not None and err[2] is not None and "pg_throttle.max_entries" in err[2],
           "the hint names pg_throttle.max_entries", repr(err))
    tap.is_(grants(cur, "full.day.", 1, 100, "1 day"), 0, "existing live entries still deny")

    # A session in another database with its test clock in 2100: in its time
    # every entry has expired, in real time none has.
    other = other_database(conn)
    ocur = other.cursor()
    ocur.execute("SET pg_throttle.test_clock = '2100-01-01 00:00:00+00'")
    err = sql_error(other, "SELECT throttle.acquire('far.future', '1 hour')")
    tap.ok(err is not None and err[0] == "53200",
           "a test clock in 2100 reclaims nothing that is in force in real time: 53200", repr(err))
    tap.is_(grants(cur, "full.day.", 1, 100, "1 day"), 0,
            "and the other database's entries are all still in force")
    other.close()

    # Half the entries for one second: once it has passed, they make room.
    clear(cur)
    tap.is_(grants(cur, "full.day.", 1, 50, "1 day"), 50, "50 one-day grants")
    tap.is_(grants(cur, "full.short.", 1, 50, "1 second"), 50, "50 one-second grants fill the registry")
    time.sleep(1.2)
    tap.is_(grants(cur, "full.new.", 1, 50, "1 second"), 50,
            "50 new entries fit once the expired ones are reclaimed")
    err = sql_error(conn, "SELECT throttle.acquire('full.extra', '1 hour')")
    tap.ok(err is not None and err[0] == "53200", "full again: SQLSTATE 53200", repr(err))
    tap.is_(grants(cur, "full.day.", 1, 50, "1 day"), 0,
            "no live entry was dropped to make room: the one-day grants still deny")
    cur.execute("SELECT count(*) FROM throttle.status")
    tap.is_(cur.fetchone()[0], CAPACITY, "status shows the 100 live entries")
    # Entries created after a reclaim are reclaimed too once they expire.
    time.sleep(1.2)
    tap.is_(grants(cur, "full.later.", 1, 50, "1 hour"), 50,
            "entries created after a reclaim are reclaimed once they expire")
    err = sql_error(conn, "SELECT throttle.acquire('full.extra', '1 hour')")
    tap.ok(err is not None and err[0] == "53200", "and the registry is full again", repr(err))
    # A refused call granted nothing: the name is free once there is room.
    cur.execute("SELECT throttle.reset('full.later.1')")
    cur.execute("SELECT throttle.acquire('full.extra', '1 hour')")
    tap.ok(cur.fetchone()[0], "the refused name is granted once the registry has room")

    # Buckets: a full bucket is the same as an absent one and may be
    # reclaimed; a bucket that is still counting never is.
    clear(cur)
    tap.is_(allowed(cur, "full.counting.", "1 hour"), 50, "50 buckets counting for an hour")
    tap.is_(allowed(cur, "full.refills.", "1 second"), 50, "50 buckets that are full again after a second")
    err = sql_error(conn, "SELECT throttle.allow('full.bucket-extra', 1, '1 hour', 1)")
    tap.ok(err is not None and err[0] == "53200", "a new bucket while none is full: 53200", repr(err))
    cur.execute("SELECT allowed FROM throttle.take('full.peek', 1, '1 second', 1, 0)")
    tap.ok(cur.fetchone()[0], "a peek (cost 0) at a new bucket needs no entry")
    time.sleep(1.2)
    tap.is_(allowed(cur, "full.new-bucket.", "1 hour"), 50, "full buckets were reclaimed for 50 new ones")
    tap.is_(allowed(cur, "full.counting.", "1 hour"), 0, "no counting bucket was dropped: all 50 still deny")
    test_clock_apart(tap, conn, cur)
    conn = test_clock_after_restart(tap, conn)
    cur = conn.cursor()
    clear(cur)
    try:
        group_leases(tap, conn)
    except psycopg2.Error as e:
        tap.ok(False, f"the group leases' steps ran: {e}")
    conn.close()
    tap.done()


WORKER = "rf_worker"
RUN = f"rf{os.getpid()}."  # queue names of this run: a run again finds none of its events
GROUP_ROOM = 100  # a tenth of max_entries, at least 100


def as_worker(role_quota=None):
    """A session of the worker's role; `role_quota`: the quota a superuser sets for it."""
    conn = connect()
    if role_quota is not None:
        conn.cursor().execute("SET pg_throttle.role_quota = %s", (role_quota,))
    conn.cursor().execute(f"SET ROLE {WORKER}")
    return conn


def claim(conn, queue, worker):
    """claim_group's events as (ids, token, group_key); ([], None, None) when none."""
    with conn.cursor() as cur:
        cur.execute("SELECT id, claim_token, group_key FROM throttle.claim_group(%s, %s, "
                    "'1 minute')", (queue, worker))
        found = cur.fetchall()
    if not found:
        return [], None, None
    return [r[0] for r in found], found[0][1], found[0][2]


def schedule(conn, queue, groups, per_group=1):
    conn.cursor().execute(
        "SELECT count(throttle.schedule(%s, 'i' || g || '.' || n, now() - interval '1 second', "
        "group_key => 'g' || g)) FROM generate_series(1, %s) g, generate_series(1, %s) n",
        (queue, groups, per_group))


def race(conn, queue):
    """4 workers drain 8 groups of 8 events one event at a time; the spans from a claim's
    answer to its completion, per group."""
    schedule(conn, queue, 8, 8)
    spans, errors, lock = {}, [], threading.Lock()

    def work(n):
        worker = as_worker()
        try:
            idle = 0
            while idle < 20:
                ids, token, group = claim(worker, queue, f"w{n}")
                if not ids:
                    idle += 1
                    time.sleep(0.02)
                    continue
                idle = 0
                start = time.monotonic()
                time.sleep(0.002)
                end = time.monotonic()
                worker.cursor().execute("SELECT throttle.complete(%s, %s)", (ids, token))
                with lock:
                    spans.setdefault(group, []).append((start, end))
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(repr(e))
        finally:
            worker.close()

    threads = [threading.Thread(target=work, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    return spans, errors


def group_leases(tap, conn):
    cur = conn.cursor()
    cur.execute(f"DROP ROLE IF EXISTS {WORKER}; CREATE ROLE {WORKER}")
    worker = as_worker(role_quota=50)
    # The worker's own take() keys fill its quota (50% of 100).
    taken = one(worker, "SELECT count(*) FILTER (WHERE throttle.allow('rf.key.' || g, 1, "
                        "'1 hour', 1)) FROM generate_series(1, 50) g")[0]
    err = sql_error(worker, "SELECT throttle.allow('rf.key.51', 1, '1 hour', 1)")
    tap.ok(taken == 50 and err is not None and err[0] == "53400",
           "the worker's role holds its quota of take() keys (50, then 53400)", repr(err))
    schedule(worker, RUN + "own", 1)
    ids, token, _ = claim(worker, RUN + "own", "w1")
    tap.is_(len(ids), 1, "claim_group still claims a group for a role at its quota")
    tap.is_(one(worker, "SELECT throttle.complete(%s, %s)", (ids, token))[0], 1,
            "and completes it")
    worker.close()
    clear(cur)

    # Other roles' entries fill max_entries (a superuser lifts its quotas).
    cur.execute("SET pg_throttle.role_quota = 100; SET pg_throttle.database_quota = 100")
    tap.is_(grants(cur, "rf.fill.", 1, 100, "1 hour"), 100, "another role's entries fill the registry")
    err = sql_error(conn, "SELECT throttle.acquire('rf.fill.extra', '1 hour')")
    tap.ok(err is not None and err[0] == "53200", "a 101st entry: 53200", repr(err))
    worker = as_worker()
    schedule(worker, RUN + "full", 2)
    first = claim(worker, RUN + "full", "w1")
    other = as_worker()
    second = claim(other, RUN + "full", "w2")
    tap.ok(len(first[0]) == 1 and len(second[0]) == 1 and first[2] != second[2],
           "in a full registry two workers claim the two groups", repr((first, second)))
    schedule(worker, RUN + "full", 2)  # one more due event in each held group
    third = claim(other, RUN + "full", "w3")
    tap.is_(third[0], [], "a group held by one worker is not handed to another")
    for ids, token, _ in (first, second):
        worker.cursor().execute("SELECT throttle.complete(%s, %s)", (ids, token))
    worker.close()
    other.close()

    spans, errors = race(conn, RUN + "race")
    done = one(conn, "SELECT count(*) FROM throttle.event_history WHERE queue = %s "
                     "AND state = 'done'", (RUN + "race",))[0]
    tap.ok(not errors and done == 64, f"4 workers completed the 64 events of 8 groups in a full "
           f"registry ({done})", "\n".join(errors[:5]))
    tap.is_(max((most_at_once(s) for s in spans.values()), default=0), 1,
            "no group was ever held by two workers at once")

    # The room for leases is its own, and bounded.
    worker = as_worker()
    schedule(worker, RUN + "many", GROUP_ROOM + 1)
    held = []
    error = None
    for n in range(GROUP_ROOM + 1):
        try:
            held.append(claim(worker, RUN + "many", f"w{n}"))
        except Exception as e:  # noqa: BLE001 - the last one
            error = e
            break
    tap.ok(len(held) == GROUP_ROOM and all(h[0] for h in held),
           f"{GROUP_ROOM} groups held at once in a full registry ({len(held)})")
    tap.ok(error is not None and getattr(error, "pgcode", None) == "53200",
           "one more lease than its room: 53200", repr(error))
    for ids, token, _ in held:
        worker.cursor().execute("SELECT throttle.complete(%s, %s)", (ids, token))
    worker.close()

    # No role holds the whole room that every queue's workers share: at a
    # role quota of 50 %, a role holds half of it, and another still claims.
    hog = as_worker(role_quota=50)
    schedule(hog, RUN + "hog", GROUP_ROOM // 2 + 1)
    held = []
    error = None
    for n in range(GROUP_ROOM // 2 + 1):
        try:
            held.append(claim(hog, RUN + "hog", f"h{n}"))
        except psycopg2.Error as e:
            error = e
            break
    tap.ok(len(held) == GROUP_ROOM // 2 and error is not None and error.pgcode == "53400"
           and "group leases" in str(error),
           f"a role at a quota of 50 % holds {GROUP_ROOM // 2} group leases, then 53400",
           repr((len(held), error)))
    other = connect()
    schedule(other, RUN + "other", 1)
    got = claim(other, RUN + "other", "o1")
    tap.is_(len(got[0]), 1, "and another role still claims a group")
    other.cursor().execute("SELECT throttle.complete(%s, %s)", (got[0], got[1]))
    other.close()
    for ids, token, _ in held:
        hog.cursor().execute("SELECT throttle.complete(%s, %s)", (ids, token))
    hog.close()
    clear(cur)
    cur.execute("RESET pg_throttle.role_quota; RESET pg_throttle.database_quota")


if __name__ == "__main__":
    main()
