#!/usr/bin/python3
"""The history of attempts under real workers, on the real clock.

Six workers drain ungrouped events (claim) and grouped ones (claim_group)
with short leases. Each claim, at random, completes, fails, or is abandoned
(its lease ends and another claim takes the events over). Every worker
logs what it did under a name of its own per claim. Then every event's
attempt_history must tell the same story as the log: one row per claim,
in order, each with the outcome its worker saw, and nothing else.
"""
import collections
import os
import random
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(__file__))
from pgconn import connect  # noqa: E402
from tap import Tap  # noqa: E402

WORKERS = 6
EVENTS = 400        # ungrouped
GROUPED = 200       # over 40 groups
QUEUE = "it.history"
LEASE = "200 milliseconds"
MAX_ATTEMPTS = 3
SECONDS = 60


def worker(index, log, errors, stop_at):
    conn = connect()
    cur = conn.cursor()
    rng = random.Random(index)
    n = 0
    try:
        while time.monotonic() < stop_at:
            n += 1
            claim = f"w{index}.{n}"   # claimed_by names this one claim
            if n % 2:
                cur.execute("SELECT id, claim_token, attempts FROM throttle.claim(%s, %s, %s, 3)",
                            (QUEUE, claim, LEASE))
            else:
                cur.execute("SELECT id, claim_token, attempts FROM throttle.claim_group(%s, %s, %s)",
                            (QUEUE, claim, LEASE))
            rows = cur.fetchall()
            if not rows:
                cur.execute("SELECT count(*) FROM throttle.all_events WHERE queue = %s "
                            "AND state IN ('pending', 'claimed')", (QUEUE,))
                if cur.fetchone()[0] == 0:
                    return
                time.sleep(0.01)
                continue
            ids, token = [r[0] for r in rows], rows[0][1]
            roll = rng.random()
            if roll < 0.6:
                cur.execute("SELECT throttle.complete(%s::bigint[], %s)", (ids, token))
                outcome = "completed"
            elif roll < 0.85:
                cur.execute("SELECT throttle.fail(%s::bigint[], %s, %s, '0 seconds')",
                            (ids, token, f"error of {claim}"))
                outcome = "failed"
            else:
                outcome = "expired"   # abandoned: the lease ends, someone takes over
            ended = len(ids) if outcome == "expired" else cur.fetchone()[0]
            # A claim that ended before its worker called (it took longer than
            # the lease) ended for someone else: expired, whatever it called.
            if ended != len(ids):
                outcome += "?"   # this one, or expired: the log cannot say which
            for event_id, _, attempt in rows:
                log.append((event_id, attempt, claim, outcome))
    except Exception as e:  # noqa: BLE001 - reported as a test failure
        errors.append(f"w{index}: {e}")
    finally:
        conn.close()


MOVES = "it.moves"


def where_is(cur, item_key):
    """(table, state) of each event of item_key in MOVES, oldest first."""
    cur.execute("SELECT 'event', state, id FROM throttle.event WHERE queue = %s AND item_key = %s"
                " UNION ALL SELECT 'history', state, id FROM throttle.event_history"
                " WHERE queue = %s AND item_key = %s ORDER BY 3", (MOVES, item_key, MOVES, item_key))
    return [(table, state) for table, state, _ in cur.fetchall()]


def finished_events_move(tap, cur):
    """Every path that finishes an event moves it to throttle.event_history
    in its own transaction: complete, cancel, a failed run superseded by a
    newer one, an expired claim superseded (claim), a released group's
    superseded claim (release_group). purge deletes from there."""
    cur.execute("SET pg_throttle.test_clock = '2030-01-01 12:00:00+00'")
    for key in ("a", "b", "d", "e"):
        cur.execute("SELECT throttle.schedule(%s, %s, '2030-01-01 11:00:00+00')", (MOVES, key))
    cur.execute("SELECT throttle.schedule(%s, 'c', '2030-01-02 00:00:00+00')", (MOVES,))
    cur.execute("SELECT throttle.schedule(%s, 'g1', '2030-01-01 11:00:00+00', group_key => 'G')", (MOVES,))
    cur.execute("SELECT throttle.cancel(%s, 'c')", (MOVES,))
    cur.execute("SELECT array_agg(id ORDER BY item_key), min(claim_token) "
                "FROM throttle.claim(%s, 'w', '10 minutes', max => 4)", (MOVES,))
    ids, token = cur.fetchone()
    a, b, d, _ = ids
    cur.execute("SELECT throttle.complete(%s, %s)", ([a], token))
    # Newer runs of b and d, scheduled while they are claimed.
    cur.execute("SELECT throttle.schedule(%s, 'b', '2030-01-01 11:30:00+00')", (MOVES,))
    cur.execute("SELECT throttle.schedule(%s, 'd', '2030-01-01 11:30:00+00')", (MOVES,))
    cur.execute("SELECT throttle.fail(%s, %s, 'boom')", ([b], token))
    cur.execute("SELECT count(*) FROM throttle.claim_group(%s, 'w', '10 minutes')", (MOVES,))
    cur.execute("SELECT throttle.schedule(%s, 'g1', '2030-01-01 11:30:00+00', group_key => 'G')", (MOVES,))
    cur.execute("SELECT throttle.release_group(%s, 'G')", (MOVES,))
    # d's claim expires; the next claim finds its newer run waiting.
    cur.execute("SET pg_throttle.test_clock = '2030-01-01 13:00:00+00'")
    cur.execute("SELECT count(*) FROM throttle.claim(%s, 'w', '10 minutes', max => 10)", (MOVES,))
    got = {key: where_is(cur, key) for key in ("a", "b", "c", "d", "g1")}
    tap.is_(got, {"a": [("history", "done")],
                  "b": [("history", "cancelled"), ("event", "claimed")],
                  "c": [("history", "cancelled")],
                  "d": [("history", "cancelled"), ("event", "pending")],
                  "g1": [("history", "cancelled"), ("event", "pending")]},
            "complete, cancel, fail, claim and release_group move what they finish to "
            "throttle.event_history, and only that")
    cur.execute("SELECT reason FROM throttle.retry(%s)", ([a],))
    tap.is_(cur.fetchone()[0], "the event is done, not dead", "retry names the state of a finished event")
    cur.execute("SELECT count(*) FROM throttle.event_attempt WHERE event_id = %s", (b,))
    attempts_of_b = cur.fetchone()[0]
    cur.execute("SET pg_throttle.test_clock = '2030-01-01 14:00:00+00'")
    cur.execute("SELECT throttle.purge('1 minute', queue => %s)", (MOVES,))
    purged = cur.fetchone()[0]
    cur.execute("SELECT (SELECT count(*) FROM throttle.event_history WHERE queue = %s),"
                " (SELECT count(*) FROM throttle.event WHERE queue = %s),"
                " (SELECT count(*) FROM throttle.event_attempt WHERE event_id = %s)", (MOVES, MOVES, b))
    tap.is_((attempts_of_b, purged) + cur.fetchone(), (1, 5, 0, 4, 0),
            "purge empties the history of the queue, with the attempts, and leaves the live events")
    cur.execute("RESET pg_throttle.test_clock")


def main():
    tap = Tap(10)
    conn = connect()
    cur = conn.cursor()
    for queue in (QUEUE, MOVES):
        cur.execute("DELETE FROM throttle.event_attempt WHERE event_id IN "
                    "(SELECT id FROM throttle.all_events WHERE queue = %s)", (queue,))
        cur.execute("DELETE FROM throttle.event WHERE queue = %s", (queue,))
        cur.execute("DELETE FROM throttle.event_history WHERE queue = %s", (queue,))
    finished_events_move(tap, cur)
    cur.execute("SELECT throttle.schedule_many(%s, ARRAY(SELECT 'u' || g FROM generate_series(1, %s) g), "
                "array_fill(now(), ARRAY[%s]), max_attempts => %s)", (QUEUE, EVENTS, EVENTS, MAX_ATTEMPTS))
    cur.execute("SELECT throttle.schedule_many(%s, ARRAY(SELECT 'g' || g FROM generate_series(1, %s) g), "
                "array_fill(now(), ARRAY[%s]), group_keys => ARRAY(SELECT 'G' || (g %% 40) "
                "FROM generate_series(1, %s) g), max_attempts => %s)",
                (QUEUE, GROUPED, GROUPED, GROUPED, MAX_ATTEMPTS))

    log, errors = [], []
    stop_at = time.monotonic() + SECONDS
    threads = [threading.Thread(target=worker, args=(i, log, errors, stop_at)) for i in range(WORKERS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    tap.is_(errors, [], "no worker failed")
    cur.execute("SELECT count(*) FILTER (WHERE state IN ('done', 'dead')), count(*) "
                "FROM throttle.all_events WHERE queue = %s", (QUEUE,))
    finished, total = cur.fetchone()
    tap.ok(finished == total == EVENTS + GROUPED, "every event ended done or dead",
           f"{finished} of {total}")
    cur.execute("SELECT (SELECT count(*) FROM throttle.event WHERE queue = %s AND state = 'done'),"
                " (SELECT count(*) FROM throttle.event_history WHERE queue = %s AND state = 'done'),"
                " (SELECT count(*) FROM throttle.all_events WHERE queue = %s AND state = 'done')",
                (QUEUE, QUEUE, QUEUE))
    in_event, in_history, done = cur.fetchone()
    tap.ok(in_event == 0 and in_history == done > 0,
           f"every done event is in throttle.event_history ({in_history}), none in throttle.event",
           f"{in_event} in throttle.event")

    # In attempt order: workers append to the log in whatever order they
    # get to it (one that stalled past its lease logs after the one that
    # took over). The test never retries, so attempts number each claim.
    told = collections.defaultdict(list)
    for event_id, attempt, claim, outcome in sorted(log):
        told[event_id].append((claim, outcome, attempt))
    cur.execute("SELECT h.event_id, h.claimed_by, h.outcome, h.attempt, e.state, e.attempts "
                "FROM throttle.attempt_history h JOIN throttle.all_events e ON e.id = h.event_id "
                "WHERE e.queue = %s ORDER BY h.event_id, h.attempt", (QUEUE,))
    kept = collections.defaultdict(list)
    state = {}
    for event_id, claimed_by, outcome, attempt, st, attempts in cur.fetchall():
        kept[event_id].append((claimed_by, outcome, attempt))
        state[event_id] = (st, attempts)

    def agrees(said, row):
        if said[0] != row[0] or said[2] != row[2]:
            return False
        if said[1].endswith("?"):
            return row[1] in (said[1][:-1], "expired")
        return said[1] == row[1]
    differ = [e for e in told if len(told[e]) != len(kept.get(e, [])) or
              not all(agrees(s, r) for s, r in zip(told[e], kept[e]))]
    tap.ok(not differ, f"each event's history is its workers' log, claim by claim "
           f"({len(log)} claims of {len(told)} events)",
           "; ".join(f"{e}: log {told[e]} history {kept.get(e)}" for e in differ[:3]))
    tap.ok(all([r[2] for r in kept[e]] == list(range(1, len(kept[e]) + 1)) and
               state[e][1] == len(kept[e]) for e in kept),
           "attempts count 1, 2, 3 ... and the event's attempts is the last")
    wrong_end = [e for e in kept if
                 (state[e][0] == "done") != (kept[e][-1][1] == "completed") or
                 (state[e][0] == "dead" and state[e][1] != MAX_ATTEMPTS)]
    tap.ok(not wrong_end, "done events end with their completed attempt, dead ones after "
           f"{MAX_ATTEMPTS} attempts", repr(wrong_end[:5]))
    outcomes = collections.Counter(o for rows in kept.values() for _, o, _ in rows)
    tap.ok(all(outcomes[o] > 0 for o in ("completed", "failed", "expired")),
           "the run had completed, failed and expired attempts", repr(dict(outcomes)))
    cur.execute("DELETE FROM throttle.event_attempt WHERE event_id IN "
                "(SELECT id FROM throttle.all_events WHERE queue = %s)", (QUEUE,))
    cur.execute("DELETE FROM throttle.event WHERE queue = %s", (QUEUE,))
    conn.close()
    tap.done()


if __name__ == "__main__":
    main()
