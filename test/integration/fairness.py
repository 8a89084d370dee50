#!/usr/bin/python3
"""throttle.group_policy.fairness: claim_group's groups oldest first or in turn.

On the extension's clock (test_clock), one queue per run (the round-robin
cursor lives in shared memory, per queue): tenant A has 1 000 due events,
older than those of B, C and D, which have 3 each. A worker claims one event
at a time and completes it:

- oldest_first (the default) serves A eight times in a row, and a claim made
  while A is held reads past A's 1 000 events to reach B;
- round_robin serves A, B, C, D, A, B, C, D (a change of policy applies to
  the next claim), reads a few rows to pass a held A, wraps around to A once
  B, C and D are drained, and serves the group served last only when no
  other is free;
- with round_robin, a held group is passed over (one claim per group), a
  paused group too, workers = 2 gives two claims per group in turn, and
  strict_order still hands a group's events out in id order;
- fairness takes only 'oldest_first' and 'round_robin' (23514).

Then a race on the real clock: 6 workers drain 40 groups of 8 events under
round_robin with workers = 2, claiming 2 events at a time; each logs when its
claim returned and when it called complete, spans inside the time the claim
held its group: no instant may fall in 3 spans of one group, and every event
is completed exactly once.
"""
import os
import sys

sys.path.insert(0, os.path.dirname(__file__))
from pgconn import connect, drain_race, event_rows_read, race_verdict, rows, sql_error  # noqa: E402
from tap import Tap  # noqa: E402

RUN = f"{os.getpid()}"
QUEUE = f"it.fair.{RUN}"
CLOCK = "2030-01-01 12:00:00+00"


def claim(cur, worker, queue=QUEUE, max_=1):
    got = rows(cur, "SELECT id, group_key, claim_token FROM throttle.claim_group(%s, %s, '1 minute', %s)"
                    " ORDER BY id", (queue, worker, max_))
    return [r[0] for r in got], (got[0][1] if got else None), (got[0][2] if got else None)


def complete(cur, ids, token):
    return rows(cur, "SELECT throttle.complete(%s::bigint[], %s)", (ids, token))[0][0]


def serve(cur, times, queue=QUEUE):
    """Claims one event and completes it, `times` times: the groups served."""
    served = []
    for _ in range(times):
        ids, group, token = claim(cur, "w", queue)
        if ids:
            complete(cur, ids, token)
        served.append(group)
    return served


def setup(cur, queue):
    cur.execute("SET pg_throttle.test_clock = %s", (CLOCK,))
    cur.execute("DELETE FROM throttle.event WHERE queue = %s", (queue,))
    cur.execute("DELETE FROM throttle.group_policy WHERE queue = %s", (queue,))
    # A's events are the oldest: an hour ago on; the others ten minutes ago.
    cur.execute("SELECT count(throttle.schedule(%s, 'a' || g,"
                " throttle.now() - interval '1 hour' + g * interval '1 ms', group_key => 'A'))"
                " FROM generate_series(1, 1000) g", (queue,))
    cur.execute("SELECT count(throttle.schedule(%s, t || g, throttle.now() - interval '10 minutes',"
                " group_key => t)) FROM generate_series(1, 3) g, unnest('{B,C,D}'::text[]) t",
                (queue,))


def rows_read_past_held_group(conn, cur):
    """With A held by another worker: the rows of throttle.event one claim reads."""
    holder = connect()
    hcur = holder.cursor()
    hcur.execute("SET pg_throttle.test_clock = %s", (CLOCK,))
    ids, group, token = claim(hcur, "holder")
    assert group == "A", group
    conn.autocommit = False
    cur.execute("SET pg_throttle.test_clock = %s", (CLOCK,))
    before = event_rows_read(cur)  # counts not yet reported: earlier transactions' too
    _, got, _ = claim(cur, "other")
    read = event_rows_read(cur) - before
    conn.rollback()
    conn.autocommit = True
    cur.execute("SET pg_throttle.test_clock = %s", (CLOCK,))
    complete(hcur, ids, token)
    holder.close()
    return got, read


def order(tap):
    conn = connect()
    cur = conn.cursor()
    setup(cur, QUEUE)
    got, read_oldest = rows_read_past_held_group(conn, cur)
    tap.is_(got, "B", "oldest_first: with A held, the next claim gets B")
    tap.ok(read_oldest > 1000, "oldest_first: ... after reading past A's 1 000 due events",
           f"rows read: {read_oldest}")
    print(f"# oldest_first, A held: the claim read {read_oldest} rows of throttle.event")
    tap.is_(serve(cur, 8), ["A"] * 8, "oldest_first: A's old events are served eight times in a row")

    cur.execute("INSERT INTO throttle.group_policy (queue, fairness) VALUES (%s, 'round_robin')",
                (QUEUE,))
    tap.is_(serve(cur, 8), ["A", "B", "C", "D"] * 2,
            "round_robin (a policy change applies): A, B, C, D in turn")
    got, read_fair = rows_read_past_held_group(conn, cur)
    tap.is_(got, "B", "round_robin: with A held, the next claim after D's turn gets B")
    tap.ok(read_fair < 100, "round_robin: ... reading a few rows, not A's events",
           f"rows read: {read_fair} (oldest_first: {read_oldest})")
    print(f"# round_robin, A held: the claim read {read_fair} rows of throttle.event")
    # The rolled-back claim of B moved the cursor all the same: B comes after A.
    tap.is_(serve(cur, 5), ["C", "D", "A", "B", "A"],
            "round_robin: the turn goes on after the group served last")
    tap.is_(serve(cur, 3), ["A", "A", "A"],
            "round_robin: the cursor wraps around; the group served last comes again when alone")

    # Held groups are passed over: one claim per group, then none.
    cur.execute("SELECT count(throttle.schedule(%s, t || 'x', throttle.now(), group_key => t))"
                " FROM unnest('{B,C}'::text[]) t", (QUEUE,))
    held = [claim(cur, f"h{i}")[1] for i in range(4)]
    tap.is_(held, ["B", "C", "A", None],
            "round_robin: claims that hold their group get B, C, A in turn, then nothing")
    cur.execute("SELECT throttle.release_group(%s, g) FROM unnest('{A,B,C}'::text[]) g", (QUEUE,))

    # A paused group is passed over.
    cur.execute("SELECT throttle.pause(%s, 'B')", (QUEUE,))
    tap.is_(serve(cur, 3), ["C", "A", "A"], "round_robin: a paused group is passed over")
    cur.execute("SELECT throttle.resume(%s, 'B')", (QUEUE,))

    # Back to oldest first.
    cur.execute("UPDATE throttle.group_policy SET fairness = 'oldest_first' WHERE queue = %s",
                (QUEUE,))
    cur.execute("SELECT count(throttle.schedule(%s, 'z', throttle.now() - interval '2 hours',"
                " group_key => 'Z'))", (QUEUE,))
    tap.is_(serve(cur, 2), ["Z", "A"], "oldest_first again: the oldest due event's group first")
    cur.execute("DELETE FROM throttle.event WHERE queue = %s", (QUEUE,))
    cur.execute("DELETE FROM throttle.group_policy WHERE queue = %s", (QUEUE,))
    conn.close()


def workers_and_strict(tap):
    conn = connect()
    cur = conn.cursor()
    queue = QUEUE + ".w"
    setup(cur, queue)
    cur.execute("INSERT INTO throttle.group_policy (queue, workers, fairness)"
                " VALUES (%s, 2, 'round_robin')", (queue,))
    held = [claim(cur, f"h{i}", queue)[1] for i in range(9)]
    tap.is_(held, ["A", "B", "C", "D", "A", "B", "C", "D", None],
            "round_robin with workers = 2: two claims per group, in turn, then nothing")

    strict = QUEUE + ".s"
    setup(cur, strict)
    cur.execute("INSERT INTO throttle.group_policy (queue, strict_order, fairness)"
                " VALUES (%s, true, 'round_robin')", (strict,))
    # In X the later-scheduled event is due first: strict order serves by id.
    cur.execute("SELECT throttle.schedule(%s, 'x1', throttle.now() - interval '1 minute',"
                " group_key => 'X')", (strict,))
    cur.execute("SELECT throttle.schedule(%s, 'x2', throttle.now() - interval '2 hours',"
                " group_key => 'X')", (strict,))
    got = []
    for _ in range(10):
        found = rows(cur, "SELECT group_key, item_key, claim_token, id FROM"
                          " throttle.claim_group(%s, 'w', '1 minute', 1)", (strict,))
        if found:
            complete(cur, [found[0][3]], found[0][2])
            got.append(found[0][1] if found[0][0] == "X" else found[0][0])
    # The queue's first claim has no cursor: oldest first (X, whose x2 is due first, gives x1 by
    # strict order), then the turn goes on after X, wrapping to A.
    tap.is_(got, ["x1", "A", "B", "C", "D", "x2", "A", "B", "C", "D"],
            "round_robin with strict_order: groups in turn, X's events in id order")
    for q in (queue, strict):
        cur.execute("DELETE FROM throttle.event WHERE queue = %s", (q,))
        cur.execute("DELETE FROM throttle.group_policy WHERE queue = %s", (q,))
    conn.close()


def rules(tap):
    conn = connect()
    err = sql_error(conn, "INSERT INTO throttle.group_policy (queue, fairness) VALUES (%s, 'random')",
                    (QUEUE,))
    tap.is_(err and err[0], "23514", "fairness takes only oldest_first and round_robin")
    cur = conn.cursor()
    tap.is_(rows(cur, "SELECT column_default FROM information_schema.columns"
                      " WHERE table_schema = 'throttle' AND table_name = 'group_policy'"
                      "   AND column_name = 'fairness'")[0][0], "'oldest_first'::text",
            "fairness defaults to oldest_first")
    conn.close()


RACE_GROUPS, RACE_PER_GROUP, RACE_WORKERS = 40, 8, 6


def race(tap):
    conn = connect()
    cur = conn.cursor()
    queue = QUEUE + ".race"
    cur.execute("INSERT INTO throttle.group_policy (queue, workers, fairness)"
                " VALUES (%s, 2, 'round_robin')", (queue,))
    cur.execute("SELECT throttle.schedule_many(%s, array_agg('e' || n ORDER BY n),"
                " array_agg(now() - interval '1 minute' ORDER BY n), NULL,"
                " array_agg('g' || lpad(((n - 1) / %s)::text, 2, '0') ORDER BY n))"
                " FROM generate_series(1, %s) n", (queue, RACE_PER_GROUP, RACE_GROUPS * RACE_PER_GROUP))
    log, errors = drain_race(queue, "SELECT id, claim_token, group_key FROM throttle.claim_group("
                                    "%s, %s, '1 minute', 2)", RACE_WORKERS)
    tap.is_(errors, [], "race: no worker failed")
    worst, completed = race_verdict(log, per_event=False)
    tap.ok(worst <= 2, "race: no group was held by more than 2 claims at once under round_robin",
           f"most at once: {worst}")
    tap.ok(len(completed) == RACE_GROUPS * RACE_PER_GROUP and max(completed.values()) == 1,
           "race: every event was completed exactly once",
           f"{len(completed)} events, most completions of one: {max(completed.values(), default=0)}")
    cur.execute("DELETE FROM throttle.group_policy WHERE queue = %s", (queue,))
    print(f"# race: {len(log)} claims, most holders of one group at once: {worst}")
    conn.close()


def main():
    tap = Tap(18)
    order(tap)
    workers_and_strict(tap)
    rules(tap)
    race(tap)
    return tap.done()


if __name__ == "__main__":
    sys.exit(main())
