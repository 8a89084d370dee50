#!/usr/bin/python3
"""Pausing a queue, or one group of it (throttle.pause, throttle.resume):

- while a queue is paused claim and claim_group hand out none of its events,
  expired claims included, and schedule still accepts them; while a group is
  paused claim_group skips it and serves the others;
- pause and resume say whether they changed anything (false and a NOTICE
  when not), check their arguments as schedule does, and are for operators:
  an ordinary role gets 42501, and reads throttle.queue_pause;
- resume NOTIFYs the queue's channel with the due events claims now hand
  out (at most 64, none of a group or queue still paused);
- the exactness rule, with held transactions: a claim whose statement began
  before the pause committed keeps what it claimed, any claim that starts
  after the commit gets nothing, and a pause not committed yet pauses
  nothing;
- throttle.queue_metrics shows paused and paused_groups, also for a queue
  without events; two databases' queues of one name are paused apart.
"""
import os
import select
import sys

sys.path.insert(0, os.path.dirname(__file__))
from pgconn import connect, fresh_database, one, sql_error  # noqa: E402
from queue_interleavings import PROMPT, timed  # noqa: E402
from tap import Tap  # noqa: E402

DB = "pgt_pause"
OTHER_DB = "pgt_pause_other"
ROLE = "pgt_pause_worker"
PASSWORD = "pause-test-password"
CLOCK = "2030-01-01 12:00:00+00"


def notices(conn):
    """The NOTICEs conn received since the last call (their first line), and
    forgets them."""
    got = [n.strip().splitlines()[0] for n in conn.notices]
    del conn.notices[:]
    return got


def notified(conn, quiet=1.0):
    """The payloads of the notifications conn received until none came for
    `quiet` seconds (they arrive after the notifier's commit, on the
    listener's socket), and forgets them."""
    got = []
    while True:
        conn.poll()
        if conn.notifies:
            got += [n.payload for n in conn.notifies]
            del conn.notifies[:]
            continue
        if not select.select([conn], [], [], quiet)[0]:
            return got


def claimed(conn, queue, fn="claim", worker="w", lease="5 minutes", max_=100):
    return [r[0] for r in rows(conn, f"SELECT item_key FROM throttle.{fn}(%s, %s, %s, %s) ORDER BY id",
                               (queue, worker, lease, max_))]


def rows(conn, sql, params=None):
    with conn.cursor() as cur:
        cur.execute(sql, params)
        return cur.fetchall() if cur.description is not None else []


def at_clock(dbname, clock=CLOCK, autocommit=True):
    conn = connect(autocommit=autocommit, dbname=dbname)
    rows(conn, "SELECT set_config('pg_throttle.test_clock', %s, false)", (clock,))
    if not autocommit:
        conn.commit()
    return conn


def main():
    tap = Tap(47)
    admin, db = fresh_database(DB)
    _, other = fresh_database(OTHER_DB)
    with admin.cursor() as cur:
        cur.execute(f"DROP ROLE IF EXISTS {ROLE}")
        cur.execute(f"CREATE ROLE {ROLE} LOGIN PASSWORD '{PASSWORD}'")
    c = at_clock(DB)

    # 1-5: pause a queue; claims hand out nothing, schedule accepts.
    rows(c, "SELECT throttle.schedule('p.q', 'a', now() - interval '1 hour'),"
            "       throttle.schedule('p.q', 'g1', now() - interval '1 hour', group_key => 'G1')")
    tap.is_(one(c, "SELECT throttle.pause('p.q')")[0], True, "pause: true when it pauses")
    notices(c)
    tap.ok(one(c, "SELECT throttle.pause('p.q')")[0] is False
           and notices(c) == ["NOTICE:  queue 'p.q' is already paused"],
           "pause again: false, with a NOTICE")
    tap.is_((claimed(c, "p.q"), claimed(c, "p.q", "claim_group")), ([], []),
            "claim and claim_group hand out nothing of a paused queue")
    ids = one(c, "SELECT throttle.schedule('p.q', 'b', now() - interval '1 hour'),"
                 "       throttle.schedule_many('p.q', ARRAY['c', 'd'], ARRAY[now(), now()])")
    tap.ok(ids[0] is not None and len(ids[1]) == 2
           and one(c, "SELECT count(*) FROM throttle.event WHERE queue = 'p.q' AND state = 'pending'")[0] == 5,
           "schedule and schedule_many still accept events of a paused queue", str(ids))
    tap.is_(one(c, "SELECT paused, paused_groups, due FROM throttle.queue_metrics WHERE queue = 'p.q'"),
            (True, 0, 5), "queue_metrics: the queue is paused, with its due events")

    # 6-8: who and when; resume.
    tap.is_(one(c, "SELECT group_key, paused_at = throttle.now(), paused_by LIKE 'postgres%' "
                   "FROM throttle.queue_pause WHERE queue = 'p.q'"),
            (None, True, True), "queue_pause: the whole queue (group_key NULL), when and by whom")
    tap.is_(one(c, "SELECT throttle.resume('p.q')")[0], True, "resume: true when it resumes")
    tap.is_(claimed(c, "p.q"), ["a", "b", "c", "d"], "after resume, claim hands out the queue's events")
    notices(c)
    tap.ok(one(c, "SELECT throttle.resume('p.q')")[0] is False
           and notices(c) == ["NOTICE:  queue 'p.q' is not paused"],
           "resume again: false, with a NOTICE")

    # 10-14: pause one group: claim_group skips it and serves the others.
    rows(c, "SELECT throttle.schedule('p.g', k, now() - interval '1 hour', group_key => g) "
            "FROM (VALUES ('x1', 'X'), ('x2', 'X'), ('y1', 'Y'), ('z1', 'Z')) v(k, g)")
    rows(c, "SELECT throttle.schedule('p.g', 'u', now() - interval '1 hour')")
    tap.is_(one(c, "SELECT throttle.pause('p.g', 'X')")[0], True, "pause of a group: true")
    notices(c)
    tap.ok(one(c, "SELECT throttle.pause('p.g', 'X')")[0] is False
           and notices(c) == ["NOTICE:  group 'X' of queue 'p.g' is already paused"],
           "pause of a paused group: false, with a NOTICE naming the group")
    got = [claimed(c, "p.g", "claim_group") for _ in range(3)]
    tap.is_(got, [["y1"], ["z1"], []], "claim_group serves the other groups, never the paused one")
    tap.is_(claimed(c, "p.g"), ["u"], "claim still hands out the events without a group")
    tap.is_(one(c, "SELECT paused, paused_groups FROM throttle.queue_metrics WHERE queue = 'p.g'"),
            (False, 1), "queue_metrics: one paused group, the queue itself not paused")

    # 15-18: resume NOTIFYs the due events claims now hand out.
    listener = connect(dbname=DB)
    rows(listener, 'LISTEN "p.g"')
    x_ids = [str(r[0]) for r in rows(c, "SELECT id FROM throttle.event WHERE queue = 'p.g' AND group_key = 'X' "
                                        "ORDER BY run_at, id")]
    rows(c, "SELECT throttle.pause('p.g')")
    tap.is_(one(c, "SELECT throttle.resume('p.g', 'X')")[0], True, "resume of a group: true")
    tap.is_(notified(listener), [], "resuming a group of a queue still paused NOTIFYs nothing")
    rows(c, "SELECT throttle.resume('p.g')")
    tap.is_(sorted(notified(listener)), sorted(x_ids), "resuming the queue NOTIFYs its due events, by id")
    notices(c)
    tap.ok(one(c, "SELECT throttle.resume('p.g', 'X')")[0] is False
           and notices(c) == ["NOTICE:  group 'X' of queue 'p.g' is not paused"],
           "resume of a group not paused: false, with a NOTICE")

    # 19-20: at most 64 notifications, the oldest; none for a paused group.
    rows(c, "SELECT throttle.schedule_many('p.many', array_agg('k' || g ORDER BY g),"
            " array_agg(now() - interval '1 hour' + g * interval '1 second' ORDER BY g)) "
            "FROM generate_series(1, 100) g")
    rows(c, "SELECT throttle.schedule('p.many', 'held' || g, now() - interval '2 hours', group_key => 'H') "
            "FROM generate_series(1, 3) g")
    rows(c, "SELECT throttle.pause('p.many'), throttle.pause('p.many', 'H')")
    rows(listener, 'LISTEN "p.many"')
    rows(c, "SELECT throttle.resume('p.many')")
    want = [str(r[0]) for r in rows(c, "SELECT id FROM throttle.event WHERE queue = 'p.many' AND group_key IS NULL "
                                       "ORDER BY run_at, id LIMIT 64")]
    got = notified(listener)
    tap.is_(sorted(got), sorted(want), "resume NOTIFYs at most 64 due events, the oldest, none of a group still paused")
    tap.is_(claimed(c, "p.many", "claim_group"), [], "the group still paused is not handed out")

    # 21-24: expired claims of a paused queue or group are not taken over.
    late = at_clock(DB, "2030-01-01 12:10:00+00")
    rows(c, "SELECT throttle.schedule('p.exp', 'e', '2030-01-01 11:00+00'),"
            "       throttle.schedule('p.exp', 'f', '2030-01-01 11:00+00', group_key => 'F')")
    claimed(c, "p.exp", lease="1 minute")
    claimed(c, "p.exp", "claim_group", lease="1 minute")
    rows(c, "SELECT throttle.pause('p.exp')")
    tap.is_((claimed(late, "p.exp"), claimed(late, "p.exp", "claim_group")), ([], []),
            "expired claims of a paused queue are not taken over")
    rows(c, "SELECT throttle.resume('p.exp'), throttle.pause('p.exp', 'F')")
    tap.is_(claimed(late, "p.exp", "claim_group"), [], "an expired claim of a paused group is not taken over")
    tap.is_(claimed(late, "p.exp"), ["e"], "an expired claim without a group is, once the queue resumed")
    rows(c, "SELECT throttle.resume('p.exp', 'F')")
    tap.is_(claimed(late, "p.exp", "claim_group"), ["f"], "and the group's, once it resumed")

    # 25-28: arguments, as schedule checks them.
    tap.is_(sql_error(c, "SELECT throttle.pause(NULL)")[:2], ("22004", "queue must not be NULL"), "NULL queue: 22004")
    tap.is_(sql_error(c, "SELECT throttle.pause('')")[:2], ("22023", "queue name must have 1 to 63 bytes"),
            "empty queue: 22023")
    tap.is_(sql_error(c, "SELECT throttle.resume(repeat('q', 64))")[:2],
            ("22023", "queue name must have 1 to 63 bytes"), "a queue name of 64 bytes: 22023")
    tap.is_(sql_error(c, "SELECT throttle.pause('q', repeat('g', 1025))")[:2],
            ("22023", "group_key must have at most 1024 bytes"), "a group_key of 1025 bytes: 22023")

    # 29-32: privileges.
    w = connect(dbname=DB, user=ROLE, password=PASSWORD)
    tap.is_(sql_error(w, "SELECT throttle.pause('p.q')")[0], "42501", "an ordinary role may not pause: 42501")
    tap.is_(sql_error(w, "SELECT throttle.resume('p.g', 'X')")[0], "42501", "nor resume: 42501")
    rows(c, "SELECT throttle.pause('p.priv')")
    tap.is_(one(w, "SELECT count(*) FROM throttle.queue_pause WHERE queue = 'p.priv'")[0], 1,
            "an ordinary role reads throttle.queue_pause")
    tap.is_(sql_error(w, "INSERT INTO throttle.queue_pause VALUES ('p.w', NULL, now(), 'me')")[0], "42501",
            "and may not write it: 42501")

    # 33-34: queue_metrics lists a paused queue without events; a group
    # paused in a queue without events counts too.
    rows(c, "SELECT throttle.pause('p.empty', 'G')")
    tap.is_(one(c, "SELECT due, scheduled, claimed, claims_expired, dead, oldest_due_seconds, paused, paused_groups "
                   "FROM throttle.queue_metrics WHERE queue = 'p.priv'"),
            (0, 0, 0, 0, 0, 0.0, True, 0), "queue_metrics lists a paused queue without events")
    tap.is_(one(c, "SELECT paused, paused_groups FROM throttle.queue_metrics WHERE queue = 'p.empty'"),
            (False, 1), "and a queue with only a paused group")

    # 35-36: two databases: a queue of one name is paused in one only.
    rows(other, "SELECT throttle.schedule('p.q', 'o', now() - interval '1 minute')")
    rows(c, "SELECT throttle.pause('p.q')")
    tap.is_(claimed(other, "p.q"), ["o"], "a pause in one database leaves the other's queue of that name alone")
    tap.is_(one(other, "SELECT count(*) FROM throttle.queue_pause")[0], 0, "the other database has no pause")
    rows(c, "SELECT throttle.resume('p.q')")

    # 37-41: the exactness rule. A claim in a transaction left open keeps
    # what it claimed; a pause neither waits for it nor ends it.
    rows(c, "SELECT throttle.schedule('p.x', k, now() - interval '1 hour') FROM unnest(ARRAY['x1', 'x2']) k")
    a = at_clock(DB, autocommit=False)
    held = rows(a, "SELECT id, claim_token FROM throttle.claim('p.x', 'wa', '5 minutes', 1)")
    b = at_clock(DB)
    result, took, thread = timed(b, "SELECT throttle.pause('p.x')")
    thread.join(timeout=30)
    tap.ok(result.get("rows") == [(True,)] and took < PROMPT,
           "pause does not wait for a claim in a transaction left open", f"{result}, {took:.1f} s")
    tap.is_(claimed(b, "p.x"), [], "a claim that starts after the pause committed gets nothing")
    a.commit()
    tap.is_(one(b, "SELECT state, claimed_by FROM throttle.event WHERE id = %s", (held[0][0],)), ("claimed", "wa"),
            "the claim made before the pause stays claimed, by its worker")
    tap.is_(one(a, "SELECT throttle.complete(ARRAY[%s]::bigint[], %s)", (held[0][0], held[0][1]))[0], 1,
            "and completes while the queue is paused")
    a.commit()
    # A transaction begun before the pause committed, whose claim starts
    # after it (read committed: each statement sees the latest commit).
    rows(b, "SELECT throttle.resume('p.x')")
    a2 = at_clock(DB, autocommit=False)
    rows(a2, "SELECT 1")
    rows(b, "SELECT throttle.pause('p.x')")
    tap.is_(claimed(a2, "p.x"), [], "a claim in a transaction begun before the pause, started after it, gets nothing")
    a2.rollback()

    # 42-44: a pause not committed yet pauses nothing; its commit does.
    rows(b, "SELECT throttle.resume('p.x')")
    p = at_clock(DB, autocommit=False)
    rows(p, "SELECT throttle.pause('p.x')")
    d = at_clock(DB, autocommit=False)
    tap.is_(claimed(d, "p.x"), ["x2"], "a claim while the pause is not committed yet hands out the event")
    p.commit()
    rows(b, "SELECT throttle.schedule('p.x', 'x3', now() - interval '1 hour')")
    tap.is_(claimed(b, "p.x"), [], "once the pause committed, claims get nothing")
    d.commit()
    tap.is_(one(b, "SELECT state FROM throttle.event WHERE queue = 'p.x' AND item_key = 'x2'")[0], "claimed",
            "the claim made before the commit stands")

    # 45-47: the same for claim_group, whose claim reads the pause with its policy.
    rows(c, "SELECT throttle.schedule('p.xg', k, now() - interval '1 hour', group_key => k) "
            "FROM unnest(ARRAY['A', 'B']) k")
    a = at_clock(DB, autocommit=False)
    got_a = claimed(a, "p.xg", "claim_group")
    result, took, thread = timed(b, "SELECT throttle.pause('p.xg')")
    thread.join(timeout=30)
    tap.ok(got_a == ["A"] and result.get("rows") == [(True,)] and took < PROMPT,
           "pause does not wait for a claim_group in a transaction left open", f"{got_a}, {result}, {took:.1f} s")
    tap.is_(claimed(b, "p.xg", "claim_group"), [], "a claim_group after the pause committed gets nothing")
    a.commit()
    tap.is_(one(b, "SELECT state, claimed_by FROM throttle.event WHERE queue = 'p.xg' AND item_key = 'A'"),
            ("claimed", "w"), "the group claimed before the pause stays claimed")

    for conn in (a, a2, b, c, d, p, w, late, listener, other, db):
        conn.close()
    with admin.cursor() as cur:
        cur.execute(f"DROP DATABASE {DB}")
        cur.execute(f"DROP DATABASE {OTHER_DB}")
        cur.execute(f"DROP ROLE {ROLE}")
    tap.done()


if __name__ == "__main__":
    main()
