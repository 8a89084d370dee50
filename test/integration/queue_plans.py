#!/usr/bin/python3
"""The queue's calls read what they need by index, whatever the table held
when a backend made its plans.

The queue's native functions prepare each statement once per backend and
keep its generic plan (src/pg/server/kept_plan.cpp) until the table's statistics
change. A worker that starts while the queue is empty makes its plans for
an empty table: a plan that scans the whole table, or hashes a whole index,
costs nothing there, and every call pays for it later, as the table grows,
until an ANALYZE makes the backend plan again (never, with autovacuum off).

Here a worker makes its plans in a fresh database whose event table is
empty, then another session fills the queue with 20 000 events for later,
600 groups of them, and 2 000 claims it holds, with autovacuum off on the
queue's tables (so no ANALYZE comes to the rescue). Each call the worker
makes then, in a transaction of its own, must read a few rows of
throttle.event, not thousands; and again after an ANALYZE, with a backlog
of due keyed events and groups: pg_stat_get_xact_tuples_returned counts
what the backend read of the table by sequential scans, and of each of
its indexes, and has not yet reported (never within a transaction).
"""
import os
import sys

sys.path.insert(0, os.path.dirname(__file__))
from pgconn import connect, event_rows_read, fresh_database, one  # noqa: E402
from tap import Tap  # noqa: E402

DB = "queue_plans"
QUEUE = "qp"
LATER = 20000
GROUPS = 600
HELD = 2000
# A call reads a few rows by index per event it touches; a plan that reads
# the table, or one of its indexes, whole, reads more than 20 000.
BOUND = 400


def measured(tap, conn, what, sql, params=None, plans="plans made on an empty table"):
    """Runs sql on conn in a transaction of its own; checks what it read."""
    with conn.cursor() as cur:
        cur.execute("BEGIN")
        before = event_rows_read(cur)  # counts not yet reported: earlier transactions' too
        cur.execute(sql, params)
        result = cur.fetchall()
        read = event_rows_read(cur) - before
        cur.execute("COMMIT")
    tap.ok(read <= BOUND, f"{what}: reads {read} rows of throttle.event (at most {BOUND}), {plans}")
    return result


def main():
    tap = Tap(15)
    admin, db = fresh_database(DB)
    with db.cursor() as cur:
        for table in ("event", "event_history", "event_attempt"):
            cur.execute(f"ALTER TABLE throttle.{table} SET (autovacuum_enabled = false)")

    # The worker makes every plan on the empty table: each call once.
    worker = connect(dbname=DB)
    with worker.cursor() as cur:
        cur.execute("SELECT throttle.schedule(%s, 'w1', now())", (QUEUE,))
        cur.execute("SELECT throttle.schedule(%s, 'w1', now())", (QUEUE,))  # the duplicate's path
        cur.execute("SELECT throttle.schedule(%s, 'w2', now())", (QUEUE,))
        cur.execute("SELECT throttle.schedule(%s, 'w3', now(), group_key => 'wg')", (QUEUE,))
        cur.execute("SELECT throttle.schedule(%s, 'w4', now(), group_key => 'wg')", (QUEUE,))
        first = one(worker, "SELECT array_agg(id), min(claim_token) FROM throttle.claim(%s, 'w', max => 1)",
                    (QUEUE,))
        cur.execute("SELECT throttle.complete(%s, %s)", first)
        second = one(worker, "SELECT array_agg(id), min(claim_token) FROM throttle.claim(%s, 'w')", (QUEUE,))
        cur.execute("SELECT throttle.fail(%s, %s, 'boom', '1 day')", second)
        group = one(worker, "SELECT array_agg(id ORDER BY id), min(claim_token) FROM throttle.claim_group(%s, 'w')",
                    (QUEUE,))
        cur.execute("SELECT throttle.extend(%s, %s, '5 minutes')", group)
        cur.execute("SELECT throttle.fail(%s, %s, 'boom', '1 day')", ([group[0][0]], group[1]))
        cur.execute("SELECT throttle.complete(%s, %s)", ([group[0][1]], group[1]))

    # Another session fills the table: events for later, groups, and claims
    # it holds (the statements that look for claimed runs meet them all).
    with db.cursor() as cur:
        cur.execute("SELECT throttle.schedule_many(%s, array_agg('later' || i), array_agg(now() + interval '1 day'),"
                    " group_keys => array_agg(CASE WHEN i %% 2 = 0 THEN 'g' || i %% %s END))"
                    " FROM generate_series(1, %s) i", (QUEUE, GROUPS, LATER))
        cur.execute("SELECT throttle.schedule_many(%s, array_agg('held' || i), array_agg(now()))"
                    " FROM generate_series(1, %s) i", (QUEUE, HELD))
        cur.execute("SELECT count(*) FROM throttle.claim(%s, 'holder', '1 hour', %s)", (QUEUE, HELD))
        held = cur.fetchone()[0]
        # The claims left the pending versions of their events dead, and
        # their entries in the due index with them, until a scan passes them
        # and marks them (vacuum, which would also give the worker new
        # plans, is off): the next claim, which finds nothing, is that scan.
        cur.execute("SELECT count(*) FROM throttle.claim(%s, 'holder', '1 hour', 1)", (QUEUE,))
        cur.execute("SELECT count(*) FROM throttle.event")
        total = cur.fetchone()[0]
    tap.is_(held, HELD, f"the table holds {total} events, {HELD} of them claimed by another session")

    # Then the worker's calls, each with its plans of the empty table.
    measured(tap, worker, "schedule of a new due event", "SELECT throttle.schedule(%s, 'n1', now())", (QUEUE,))
    measured(tap, worker, "schedule of an item_key with a pending event",
             "SELECT throttle.schedule(%s, 'n1', now())", (QUEUE,))
    claim = measured(tap, worker, "claim of one due event",
                     "SELECT array_agg(id), min(claim_token) FROM throttle.claim(%s, 'w', max => 1)", (QUEUE,))[0]
    measured(tap, worker, "complete of it", "SELECT throttle.complete(%s, %s)", claim)
    with worker.cursor() as cur:
        cur.execute("SELECT throttle.schedule(%s, 'n2', now())", (QUEUE,))
    claim = one(worker, "SELECT array_agg(id), min(claim_token) FROM throttle.claim(%s, 'w', max => 1)", (QUEUE,))
    measured(tap, worker, "fail of a claimed event", "SELECT throttle.fail(%s, %s, 'boom', '1 day')", claim)
    with worker.cursor() as cur:
        cur.execute("SELECT throttle.schedule(%s, 'n3', now(), group_key => 'ng')", (QUEUE,))
        cur.execute("SELECT throttle.schedule(%s, 'n4', now(), group_key => 'ng')", (QUEUE,))
    group = measured(tap, worker, "claim_group of a group of 2",
                     "SELECT array_agg(id ORDER BY id), min(claim_token) FROM throttle.claim_group(%s, 'w')",
                     (QUEUE,))[0]
    measured(tap, worker, "extend of the group claim", "SELECT throttle.extend(%s, %s, '5 minutes')", group)
    measured(tap, worker, "fail of one event of the group claim", "SELECT throttle.fail(%s, %s, 'boom', '1 day')",
             ([group[0][0]], group[1]))
    measured(tap, worker, "complete of the other", "SELECT throttle.complete(%s, %s)", ([group[0][1]], group[1]))
    tap.is_(one(worker, "SELECT array_agg(state ORDER BY item_key) FROM throttle.all_events "
                        "WHERE queue = %s AND item_key IN ('n1', 'n2', 'n3', 'n4')", (QUEUE,))[0],
            ["done", "pending", "pending", "done"], "and each call did its work")

    # Then with statistics that see the table as it is (ANALYZE, which makes
    # the worker plan again) and a backlog: 3 000 due events of 500
    # concurrency_keys and 300 due groups of 3. A claim stops at the first
    # events it may take: a plan that tests every due event before it sorts
    # them reads the backlog.
    with db.cursor() as cur:
        cur.execute("SELECT throttle.schedule_many(%s, array_agg('due' || i), array_agg(now() - interval '1 minute'),"
                    " concurrency_keys => array_agg(CASE WHEN i <= 3000 THEN 'ck' || i %% 500 END),"
                    " group_keys => array_agg(CASE WHEN i > 3000 THEN 'dg' || i %% 300 END))"
                    " FROM generate_series(1, 3900) i", (QUEUE,))
        cur.execute("ANALYZE throttle.event")
    analyzed = "plans made after ANALYZE"
    claim = measured(tap, worker, "claim of one of 3 000 due events with concurrency_keys",
                     "SELECT array_agg(id), min(claim_token) FROM throttle.claim(%s, 'w', max => 1)", (QUEUE,),
                     analyzed)[0]
    measured(tap, worker, "complete of it", "SELECT throttle.complete(%s, %s)", claim, analyzed)
    group = measured(tap, worker, "claim_group of one of 300 due groups",
                     "SELECT array_agg(id ORDER BY id), min(claim_token) FROM throttle.claim_group(%s, 'w')",
                     (QUEUE,), analyzed)[0]
    measured(tap, worker, "complete of the group", "SELECT throttle.complete(%s, %s)", group, analyzed)

    worker.close()
    db.close()
    with admin.cursor() as cur:
        cur.execute(f"DROP DATABASE {DB}")
    admin.close()
    tap.done()


if __name__ == "__main__":
    main()
