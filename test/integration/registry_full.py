#!/usr/bin/python3
"""A small registry (pg_throttle.max_entries = 100): reclaiming and refusing.

Entries whose interval has passed are reclaimed when room is needed; live ones
never are, and when only live ones remain the call fails with 53200. Reclaim
is decided on the real clock: a session whose pg_throttle.test_clock is far in
the future, in another database, does not evict anyone's entries; and a sweep
on the real clock never evicts a test clock's entry that is in force on the
test clock.
"""
import os
import sys
import time

sys.path.insert(0, os.path.dirname(__file__))
from pgconn import connect, sql_error  # noqa: E402
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


def main():
    tap = Tap(28)
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
    conn.close()
    tap.done()


if __name__ == "__main__":
    main()
