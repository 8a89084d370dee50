#!/usr/bin/python3
"""throttle.concurrency_policy.fairness: claim's concurrency keys oldest first or in turn.

On the extension's clock (test_clock), one queue per check (the round-robin cursor lives in
shared memory, per queue): key A has 1 000 due events, older than those of B, C and D, which
have 3 each; max_claimed 1. A worker claims one event at a time and completes it:

- oldest_first (the default) serves A eight times in a row, and a claim made while A is held
  reads past A's 1 000 events to reach B;
- round_robin serves A, B, C, D, A, B, C, D (a change of policy applies to the next claim; the
  queue's first claim has no cursor and is served oldest first), passes a held A reading a few
  rows, wraps around, and serves the key served last only when no other has a due event;
- the events without a key take their turn after the last key;
- priority orders the events of one key, not the keys;
- a claim of several events takes one per key per round, within each key's room, from at most
  16 keys; it takes expired claims first; it passes a key whose lock a claim in progress holds;
- claim's cursor and claim_group's are apart; a paused queue hands out nothing;
- fairness takes only 'oldest_first' and 'round_robin' (23514).

Then a race on the real clock: 6 workers drain 30 keys of 10 events under round_robin with
max_claimed 2, claiming 3 events at a time; each logs when its claim returned and when it called
complete: no instant may fall in 3 spans of one key, and every event is completed exactly once.
"""
import collections
import os
import sys

sys.path.insert(0, os.path.dirname(__file__))
from pgconn import connect, drain_race, event_rows_read, race_verdict, rows, sql_error  # noqa: E402
from tap import Tap  # noqa: E402

RUN = f"{os.getpid()}"
QUEUE = f"it.keyfair.{RUN}"
CLOCK = "2030-01-01 12:00:00+00"


def claim(cur, worker, queue, max_=1):
    """Claims up to max_ events: [(id, concurrency_key, item_key)], and the claim's token."""
    got = rows(cur, "SELECT id, concurrency_key, item_key, claim_token FROM"
                    " throttle.claim(%s, %s, '1 minute', %s) ORDER BY id", (queue, worker, max_))
    return [r[:3] for r in got], (got[0][3] if got else None)


def complete(cur, ids, token):
    return rows(cur, "SELECT throttle.complete(%s::bigint[], %s)", (ids, token))[0][0]


def serve(cur, times, queue, what=1):
    """Claims one event and completes it, `times` times: the keys served (column `what`:
    1 the concurrency_key, 2 the item_key)."""
    served = []
    for _ in range(times):
        got, token = claim(cur, "w", queue)
        if got:
            complete(cur, [got[0][0]], token)
        served.append(got[0][what] if got else "nothing")
    return served


def policy(cur, queue, max_claimed, fairness="round_robin"):
    cur.execute("INSERT INTO throttle.concurrency_policy (queue, max_claimed, fairness)"
                " VALUES (%s, %s, %s) ON CONFLICT (queue) DO UPDATE"
                " SET max_claimed = excluded.max_claimed, fairness = excluded.fairness",
                (queue, max_claimed, fairness))


def setup(cur, queue, fairness="oldest_first", max_claimed=1, big=1000):
    cur.execute("SET pg_throttle.test_clock = %s", (CLOCK,))
    cur.execute("DELETE FROM throttle.event WHERE queue = %s", (queue,))
    policy(cur, queue, max_claimed, fairness)
    # A's events are the oldest: an hour ago on; the others ten minutes ago.
    cur.execute("SELECT count(throttle.schedule(%s, 'a' || g,"
                " throttle.now() - interval '1 hour' + g * interval '1 ms', concurrency_key => 'A'))"
                " FROM generate_series(1, %s) g", (queue, big))
    cur.execute("SELECT count(throttle.schedule(%s, t || g, throttle.now() - interval '10 minutes',"
                " concurrency_key => t)) FROM generate_series(1, 3) g, unnest('{B,C,D}'::text[]) t",
                (queue,))


def drop(cur, queue):
    cur.execute("DELETE FROM throttle.event WHERE queue = %s", (queue,))
    cur.execute("DELETE FROM throttle.concurrency_policy WHERE queue = %s", (queue,))


def rows_read_past_held_key(conn, cur, queue):
    """With A held by another worker: the rows of throttle.event one claim reads."""
    holder = connect()
    hcur = holder.cursor()
    hcur.execute("SET pg_throttle.test_clock = %s", (CLOCK,))
    got, token = claim(hcur, "holder", queue)
    assert got and got[0][1] == "A", got
    conn.autocommit = False
    cur.execute("SET pg_throttle.test_clock = %s", (CLOCK,))
    before = event_rows_read(cur)  # counts not yet reported: earlier transactions' too
    other, _ = claim(cur, "other", queue)
    read = event_rows_read(cur) - before
    conn.rollback()
    conn.autocommit = True
    cur.execute("SET pg_throttle.test_clock = %s", (CLOCK,))
    complete(hcur, [got[0][0]], token)
    holder.close()
    return (other[0][1] if other else None), read


def order(tap):
    conn = connect()
    cur = conn.cursor()
    setup(cur, QUEUE)
    got, read_oldest = rows_read_past_held_key(conn, cur, QUEUE)
    tap.is_(got, "B", "oldest_first: with A held, the next claim gets B")
    tap.ok(read_oldest > 1000, "oldest_first: ... after reading past A's 1 000 due events",
           f"rows read: {read_oldest}")
    print(f"# oldest_first, A held: the claim read {read_oldest} rows of throttle.event")
    tap.is_(serve(cur, 8, QUEUE), ["A"] * 8, "oldest_first: A's old events are served eight times")

    cur.execute("UPDATE throttle.concurrency_policy SET fairness = 'round_robin' WHERE queue = %s",
                (QUEUE,))
    tap.is_(serve(cur, 8, QUEUE), ["A", "B", "C", "D"] * 2,
            "round_robin (a policy change applies): A, B, C, D in turn")
    got, read_fair = rows_read_past_held_key(conn, cur, QUEUE)
    tap.is_(got, "B", "round_robin: with A held, the next claim after D's turn gets B")
    tap.ok(read_fair < 100, "round_robin: ... reading a few rows, not A's events",
           f"rows read: {read_fair} (oldest_first: {read_oldest})")
    print(f"# round_robin, A held: the claim read {read_fair} rows of throttle.event")
    # The rolled-back claim of B moved the cursor all the same: B comes after A.
    tap.is_(serve(cur, 5, QUEUE), ["C", "D", "A", "B", "A"],
            "round_robin: the turn goes on after the key served last")
    tap.is_(serve(cur, 2, QUEUE), ["A", "A"],
            "round_robin: the cursor wraps around; the key served last comes again when alone")

    # The events without a key take their turn after the last key.
    cur.execute("SELECT count(throttle.schedule(%s, k, throttle.now() - interval '1 minute',"
                " concurrency_key => CASE WHEN k LIKE 'free%%' THEN NULL ELSE left(k, 1) END))"
                " FROM unnest('{B9,C9,free1,free2}'::text[]) k", (QUEUE,))
    tap.is_(serve(cur, 6, QUEUE), ["B", "C", None, "A", None, "A"],
            "round_robin: the events without a key come after the last key, once per round")

    # Priority orders neither a key's events (oldest first) nor the keys (their turn).
    cur.execute("SELECT throttle.schedule(%s, 'b_low', throttle.now() - interval '30 minutes',"
                " concurrency_key => 'B')", (QUEUE,))
    cur.execute("SELECT throttle.schedule(%s, 'b_high', throttle.now() - interval '1 minute',"
                " priority => 5, concurrency_key => 'B')", (QUEUE,))
    cur.execute("SELECT throttle.schedule(%s, 'c_top', throttle.now() - interval '1 minute',"
                " priority => 9, concurrency_key => 'C')", (QUEUE,))
    served = serve(cur, 4, QUEUE, what=2)
    tap.is_([served[0], served[1], served[2][0], served[3]], ["b_low", "c_top", "a", "b_high"],
            "round_robin: a key's oldest event first, whatever its priority; C's waits for its turn")

    # A paused queue hands out nothing; resumed, the turn goes on.
    cur.execute("SELECT throttle.pause(%s)", (QUEUE,))
    tap.is_(serve(cur, 1, QUEUE), ["nothing"], "round_robin: a paused queue hands out nothing")
    cur.execute("SELECT throttle.resume(%s)", (QUEUE,))
    tap.is_(serve(cur, 1, QUEUE), ["A"], "round_robin: resumed, the turn goes on")

    cur.execute("UPDATE throttle.concurrency_policy SET fairness = 'oldest_first' WHERE queue = %s",
                (QUEUE,))
    cur.execute("SELECT count(throttle.schedule(%s, 'z', throttle.now() - interval '2 hours',"
                " concurrency_key => 'Z'))", (QUEUE,))
    tap.is_(serve(cur, 2, QUEUE), ["Z", "A"], "oldest_first again: the oldest due event first")
    drop(cur, QUEUE)
    conn.close()


def rounds(tap):
    conn = connect()
    cur = conn.cursor()
    queue = QUEUE + ".rounds"
    setup(cur, queue, "round_robin", max_claimed=5, big=100)
    cur.execute("DELETE FROM throttle.event WHERE queue = %s AND concurrency_key = 'D'", (queue,))
    tap.is_(serve(cur, 1, queue), ["A"], "rounds: the queue's first claim, oldest first, sets the cursor")
    got, token = claim(cur, "w", queue, 7)
    keys = collections.Counter(k for _, k, _ in got)
    tap.is_(dict(keys), {"A": 2, "B": 3, "C": 2},
            "rounds: max 7 after A's turn takes B, C, A, B, C, A, B (one per key per round)")
    complete(cur, [i for i, _, _ in got], token)
    drop(cur, queue)

    # Each key's room: max_claimed 2 with nothing completed.
    setup(cur, queue, "round_robin", max_claimed=2, big=100)
    serve(cur, 1, queue)  # sets the cursor (A)
    got, _ = claim(cur, "w", queue, 50)
    keys = collections.Counter(k for _, k, _ in got)
    tap.is_(dict(keys), {"A": 2, "B": 2, "C": 2, "D": 2},
            "rounds: max 50 takes each key's room (max_claimed 2), no more")
    got, _ = claim(cur, "w", queue, 50)
    tap.is_(got, [], "rounds: and the next claim finds every key full")
    drop(cur, queue)

    # At most 16 keys per claim (one key lock each).
    policy(cur, queue, 5)
    cur.execute("SELECT count(throttle.schedule(%s, 'k' || k || '.' || n, throttle.now(),"
                " concurrency_key => 'K' || lpad(k::text, 2, '0')))"
                " FROM generate_series(1, 20) k, generate_series(1, 2) n", (queue,))
    tap.is_(serve(cur, 1, queue), ["K01"], "rounds: oldest first sets the cursor at K01")
    got, _ = claim(cur, "w", queue, 100)
    keys = collections.Counter(k for _, k, _ in got)
    tap.ok(sorted(keys) == [f"K{k:02}" for k in range(2, 18)] and all(n == 2 for n in keys.values()),
           "rounds: a claim of 100 takes the events of 16 keys after K01, two each",
           f"keys {dict(keys)}")
    drop(cur, queue)
    conn.close()


def held_and_expired(tap):
    conn = connect()
    cur = conn.cursor()
    queue = QUEUE + ".held"
    setup(cur, queue, "round_robin", max_claimed=3, big=10)
    serve(cur, 1, queue)  # cursor A
    # A claim in progress holds B's key lock (and its row): the next claim passes B.
    holder = connect()
    holder.autocommit = False
    hcur = holder.cursor()
    hcur.execute("SET pg_throttle.test_clock = %s", (CLOCK,))
    held, _ = claim(hcur, "holder", queue)
    tap.is_([k for _, k, _ in held], ["B"], "held: the claim in progress took B's turn")
    got, token = claim(cur, "w", queue, 3)
    tap.is_(sorted(k for _, k, _ in got), ["A", "C", "D"],
            "held: a claim meanwhile passes B, whose key lock the claim in progress holds")
    complete(cur, [i for i, _, _ in got], token)
    holder.rollback()
    holder.close()

    # Expired claims are taken over first.
    got, token = claim(cur, "w", queue, 1)
    expired_id = got[0][0]
    cur.execute("SET pg_throttle.test_clock = %s", ("2030-01-01 12:05:00+00",))
    again, _ = claim(cur, "w2", queue, 1)
    tap.is_([i for i, _, _ in again], [expired_id], "expired: a claim whose lease ended is taken first")
    drop(cur, queue)

    # claim's cursor and claim_group's are apart.
    both = QUEUE + ".both"
    setup(cur, both, "round_robin", max_claimed=1, big=3)
    cur.execute("INSERT INTO throttle.group_policy (queue, fairness) VALUES (%s, 'round_robin')",
                (both,))
    cur.execute("SELECT count(throttle.schedule(%s, g || n, throttle.now() - interval '1 minute',"
                " group_key => g)) FROM unnest('{G1,G2,G3}'::text[]) g, generate_series(1, 2) n",
                (both,))
    order_ = []
    for i in range(6):
        got, token = claim(cur, "w", both)
        complete(cur, [got[0][0]], token)
        order_.append(got[0][1])
        g = rows(cur, "SELECT id, group_key, claim_token FROM throttle.claim_group(%s, 'g', '1 minute', 1)",
                 (both,))
        complete(cur, [g[0][0]], g[0][2])
        order_.append(g[0][1])
    tap.is_(order_, ["A", "G1", "B", "G2", "C", "G3", "D", "G1", "A", "G2", "B", "G3"],
            "apart: claim's keys and claim_group's groups each go on in their own turn")
    cur.execute("DELETE FROM throttle.group_policy WHERE queue = %s", (both,))
    drop(cur, both)
    conn.close()


def serve_reading(conn, cur, queue):
    """serve(cur, 1, queue) in a transaction of its own: the key served, and the rows of
    throttle.event the claim and its complete read."""
    conn.autocommit = False
    cur.execute("SET pg_throttle.test_clock = %s", (CLOCK,))
    before = event_rows_read(cur)
    served = serve(cur, 1, queue)[0]
    read = event_rows_read(cur) - before
    conn.commit()
    conn.autocommit = True
    return served, read


def no_key_hint(tap):
    """The events without a key: the look for them reads past the due keyed events; a claim that
    found none pending keeps a hint with the queue's cursor, which every commit of such an event
    (and the time it falls due) voids: never one left behind."""
    conn = connect()
    cur = conn.cursor()
    queue = QUEUE + ".hint"
    cur.execute("SET pg_throttle.test_clock = %s", (CLOCK,))
    policy(cur, queue, 5)
    cur.execute("SELECT count(throttle.schedule(%s, k || n, throttle.now() - interval '1 hour'"
                " + n * interval '1 ms', concurrency_key => k))"
                " FROM unnest('{A,B}'::text[]) k, generate_series(1, 300) n", (queue,))
    tap.is_(serve(cur, 2, queue), ["A", "B"], "hint: oldest first sets the cursor, then B")
    served, read_look = serve_reading(conn, cur, queue)
    tap.ok(served == "A" and read_look > 600,
           "hint: the wrap after B looks for events without a key, past the keyed ones",
           f"served {served}, rows read {read_look}")
    tap.is_(serve(cur, 1, queue), ["B"], "hint: then B")
    served, read_hinted = serve_reading(conn, cur, queue)
    tap.ok(served == "A" and read_hinted < 50,
           "hint: the next wrap skips the look (none was pending, none written since)",
           f"served {served}, rows read {read_hinted} (the look: {read_look})")
    print(f"# the wrap that looks read {read_look} rows, the hinted one {read_hinted}")

    # A writer in progress while a claim looks: its commit voids the hint.
    cur.execute("SELECT throttle.schedule(%s, 'x1', throttle.now())", (queue,))
    writer = connect()
    writer.autocommit = False
    wcur = writer.cursor()
    wcur.execute("SET pg_throttle.test_clock = %s", (CLOCK,))
    wcur.execute("SELECT throttle.schedule(%s, 'late1', throttle.now())", (queue,))
    # B, then x1 (its commit voided the hint), A, B, and A after a look that could not see late1.
    tap.is_(serve(cur, 5, queue, what=2)[1], "x1",
            "hint: a committed event without a key voids it: taken at its turn")
    writer.commit()
    writer.close()
    tap.is_(serve(cur, 2, queue, what=2)[1], "late1",
            "hint: an event whose writer was in progress while a claim looked is taken at its turn")

    # An event scheduled for later: the hint lasts until it falls due.
    cur.execute("SELECT throttle.schedule(%s, 'future1', throttle.now() + interval '10 minutes')",
                (queue,))
    tap.is_(serve(cur, 5, queue), ["A", "B", "A", "B", "A"],
            "hint: an event without a key scheduled for later is not due yet")
    cur.execute("SET pg_throttle.test_clock = %s", ("2030-01-01 12:11:00+00",))
    tap.is_(serve(cur, 2, queue, what=2)[1], "future1",
            "hint: ... and taken at its turn once it is due")
    drop(cur, queue)
    conn.close()


def keys_not_due(tap):
    """Review: keys whose pending events are all for later (or all held back by their item_key)
    must not use up the 16 keys a claim may meet: a key with due events after 16 such keys in
    the turn is served. Keys a cursor slot cannot keep as they are ('' and keys over 1 024
    bytes, which schedule refuses but a direct INSERT may write) are served in turn too."""
    conn = connect()
    cur = conn.cursor()
    queue = QUEUE + ".notdue"
    cur.execute("SET pg_throttle.test_clock = %s", (CLOCK,))
    policy(cur, queue, 5)
    cur.execute("SELECT count(throttle.schedule(%s, 'f' || g, throttle.now() + interval '1 year',"
                " concurrency_key => 'k' || lpad(g::text, 2, '0'))) FROM generate_series(1, 20) g",
                (queue,))
    cur.execute("SELECT count(throttle.schedule(%s, 'z' || g, throttle.now() - interval '1 minute',"
                " concurrency_key => 'z')) FROM generate_series(1, 5) g", (queue,))
    tap.is_(serve(cur, 3, queue), ["z", "z", "z"],
            "a key after 20 keys with no due event is served in turn")
    # A key with 3 000 events scheduled for later: its turn reads none of them.
    cur.execute("SELECT count(throttle.schedule(%s, 'later' || g, throttle.now() + g * interval '1 s',"
                " concurrency_key => 'y')) FROM generate_series(1, 3000) g", (queue,))
    served, read = serve_reading(conn, cur, queue)
    tap.ok(served == "z" and read < 100,
           "a key with 3 000 events for later costs its turn a few rows, not its events",
           f"served {served}, rows read {read}")
    drop(cur, queue)

    # Keys no cursor slot keeps as they are, written directly (schedule refuses both): '' (the
    # events without a key are marked apart, not by '') and over 1 024 bytes (the turn goes on
    # at the first key after it).
    queue = QUEUE + ".emptykey"
    policy(cur, queue, 5)
    cur.execute("SELECT count(throttle.schedule(%s, 'a' || g, throttle.now() - interval '1 minute',"
                " concurrency_key => 'a')) FROM generate_series(1, 3) g", (queue,))
    cur.execute("INSERT INTO throttle.event (queue, item_key, run_at, enqueued_at, enqueued_by,"
                " concurrency_key) SELECT %s, 'e' || g, throttle.now() - interval '2 minutes',"
                " throttle.now(), 'test', '' FROM generate_series(1, 3) g", (queue,))
    tap.is_(serve(cur, 6, queue), ["", "a", "", "a", "", "a"],
            "events with concurrency_key '' (written directly) are served in turn")
    drop(cur, queue)

    queue = QUEUE + ".longkey"
    policy(cur, queue, 100)
    cur.execute("SELECT count(throttle.schedule(%s, k || g, throttle.now() - interval '3 minutes',"
                " concurrency_key => k)) FROM generate_series(1, 5) g, unnest('{a,c}'::text[]) k",
                (queue,))
    cur.execute("SELECT count(throttle.schedule(%s, 'u' || g, throttle.now() - interval '1 minute'))"
                " FROM generate_series(1, 5) g", (queue,))
    cur.execute("INSERT INTO throttle.event (queue, item_key, run_at, enqueued_at, enqueued_by,"
                " concurrency_key) SELECT %s, 'l' || g, throttle.now() - interval '2 minutes',"
                " throttle.now(), 'test', repeat('b', 2000) FROM generate_series(1, 10) g",
                (queue,))
    served = [k and k[:1] for k in serve(cur, 8, queue)]
    tap.is_(served, ["a", "b", "c", None, "a", "b", "c", None],
            "a key of 2 000 bytes takes its turn, and the keys after it and the events without a"
            " key theirs")
    drop(cur, queue)
    conn.close()


def rules(tap):
    conn = connect()
    err = sql_error(conn, "INSERT INTO throttle.concurrency_policy (queue, fairness)"
                          " VALUES (%s, 'random')", (QUEUE,))
    tap.is_(err and err[0], "23514", "fairness takes only oldest_first and round_robin")
    cur = conn.cursor()
    tap.is_(rows(cur, "SELECT column_default FROM information_schema.columns"
                      " WHERE table_schema = 'throttle' AND table_name = 'concurrency_policy'"
                      "   AND column_name = 'fairness'")[0][0], "'oldest_first'::text",
            "fairness defaults to oldest_first")
    conn.close()


RACE_KEYS, RACE_PER_KEY, RACE_WORKERS = 30, 10, 6


def race(tap):
    conn = connect()
    cur = conn.cursor()
    queue = QUEUE + ".race"
    policy(cur, queue, 2)
    cur.execute("SELECT throttle.schedule_many(%s, array_agg('e' || n ORDER BY n),"
                " array_agg(now() - interval '1 minute' ORDER BY n), NULL, NULL,"
                " concurrency_keys => array_agg('k' || lpad(((n - 1) / %s)::text, 2, '0') ORDER BY n))"
                " FROM generate_series(1, %s) n", (queue, RACE_PER_KEY, RACE_KEYS * RACE_PER_KEY))
    log, errors = drain_race(queue, "SELECT id, claim_token, concurrency_key FROM throttle.claim("
                                    "%s, %s, '1 minute', 3)", RACE_WORKERS)
    tap.is_(errors, [], "race: no worker failed")
    worst, completed = race_verdict(log, per_event=True)
    tap.ok(worst <= 2, "race: no key had more than 2 events claimed at once under round_robin",
           f"most at once: {worst}")
    tap.ok(len(completed) == RACE_KEYS * RACE_PER_KEY and max(completed.values()) == 1,
           "race: every event was completed exactly once",
           f"{len(completed)} events, most completions of one: {max(completed.values(), default=0)}")
    cur.execute("DELETE FROM throttle.concurrency_policy WHERE queue = %s", (queue,))
    print(f"# race: {len(log)} claims, most claimed events of one key at once: {worst}")
    conn.close()


def main():
    tap = Tap(40)
    order(tap)
    rounds(tap)
    held_and_expired(tap)
    no_key_hint(tap)
    keys_not_due(tap)
    rules(tap)
    race(tap)
    return tap.done()


if __name__ == "__main__":
    sys.exit(main())
