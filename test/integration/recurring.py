#!/usr/bin/python3
"""Recurring schedules (throttle.recurring), fired by hand under the test clock
(throttle._fire_recurring, the waker's call), with the wake-ups off so that the waker, on the
real clock, never fires them meanwhile:
- DST in two zones (New York and Berlin, spring and autumn), month ends, a leap day: each firing
  once, at the documented instant;
- a firing is enqueued exactly once: a second call, a second firer behind the first one's open
  transaction (SKIP LOCKED, then nothing left), an event of the same item_key already pending;
- catch-up after downtime (none, latest, all within the window) and on_overlap = skip;
- disabled and enabled again: no backfill; bad rows refused with their SQLSTATEs; a schedule
  whose firing fails does not stop the others and is tried again;
- privileges: PUBLIC reads the table and the status view, writes nothing, calls no internal.
The crash, restart and promotion cases run on real time in test/integration/wakeups.py.
"""
import os
import sys
import time

sys.path.insert(0, os.path.dirname(__file__))
from pgconn import connect, fresh_database, one, set_wakeups, sql_error  # noqa: E402
from tap import Tap  # noqa: E402

DB = "recurring_test"


def at(cur, clock):
    cur.execute("SET pg_throttle.test_clock = %s", (clock,))


def fire(cur, upto=None):
    """Fires what is due at `upto` (the test clock's now by default); returns the count."""
    cur.execute("SELECT throttle._fire_recurring(coalesce(%s::timestamptz, throttle.now()))", (upto,))
    return cur.fetchone()[0]


def keys(cur, name):
    cur.execute("SELECT item_key FROM throttle.all_events WHERE item_key LIKE %s ORDER BY run_at, id",
                (f"recurring:{name}:%",))
    return [r[0].split(":", 2)[2] for r in cur.fetchall()]


def add(cur, name, cron, zone="UTC", **columns):
    cols = ", ".join(["name", "queue", "cron", "time_zone"] + list(columns))
    marks = ", ".join(["%s"] * (4 + len(columns)))
    cur.execute(f"INSERT INTO throttle.recurring ({cols}) VALUES ({marks})",
                (name, "jobs", cron, zone, *columns.values()))


def dst(tap, cur):
    # New York, spring: 02:30 does not exist on 2026-03-08; fires once at 03:00 EDT (07:00Z).
    at(cur, "2026-03-07 12:00:00+00")
    add(cur, "ny", "30 2 * * *", "America/New_York")
    at(cur, "2026-03-09 12:00:00+00")
    fire(cur, "2026-03-08 12:00:00+00")
    fire(cur, "2026-03-09 12:00:00+00")
    tap.is_(keys(cur, "ny"), ["2026-03-08T07:00:00.000000Z", "2026-03-09T06:30:00.000000Z"],
            "New York, spring: 02:30 fires once at 03:00 EDT, then at 02:30 EDT")
    # Autumn: 01:30 occurs twice on 2026-11-01; a schedule naming its hour fires the first only.
    at(cur, "2026-10-31 12:00:00+00")
    add(cur, "ny-fall", "30 1 * * *", "America/New_York")
    for upto in ("2026-11-01 05:30:00+00", "2026-11-01 06:30:00+00", "2026-11-02 12:00:00+00"):
        fire(cur, upto)
    tap.is_(keys(cur, "ny-fall"), ["2026-11-01T05:30:00.000000Z", "2026-11-02T06:30:00.000000Z"],
            "New York, autumn: the repeated 01:30 fires once, at its first occurrence (EDT)")
    # Berlin: 02:30 skipped on 2026-03-29 (fires at 03:00 CEST, 01:00Z), repeated on 2026-10-25.
    at(cur, "2026-03-28 12:00:00+00")
    add(cur, "berlin", "30 2 * * *", "Europe/Berlin")
    fire(cur, "2026-03-29 12:00:00+00")
    tap.is_(keys(cur, "berlin"), ["2026-03-29T01:00:00.000000Z"],
            "Berlin, spring: 02:30 fires once at 03:00 CEST")
    at(cur, "2026-10-24 12:00:00+00")
    cur.execute("UPDATE throttle.recurring SET cron = '30 2 * * *', time_zone = 'Europe/Berlin' "
                "WHERE name = 'berlin'")  # written again: next firing from the new now
    for upto in ("2026-10-25 00:30:00+00", "2026-10-25 01:30:00+00", "2026-10-25 12:00:00+00"):
        fire(cur, upto)
    tap.is_(keys(cur, "berlin")[1:], ["2026-10-25T00:30:00.000000Z"],
            "Berlin, autumn: the repeated 02:30 fires once, at its first occurrence (CEST)")
    # An every-hour schedule follows real time through the autumn change in New York.
    at(cur, "2026-11-01 04:00:00+00")
    add(cur, "ny-hourly", "30 * * * *", "America/New_York")
    fire(cur, "2026-11-01 05:29:59+00")
    for upto in ("2026-11-01 05:30:00+00", "2026-11-01 06:30:00+00"):
        fire(cur, upto)
    tap.is_(keys(cur, "ny-hourly"), ["2026-11-01T04:30:00.000000Z", "2026-11-01T05:30:00.000000Z",
                                     "2026-11-01T06:30:00.000000Z"],
            "an every-hour schedule fires at both 01:30 of the autumn day, an hour apart")


def calendar(tap, cur):
    at(cur, "2028-01-15 00:00:00+00")
    add(cur, "month-end", "0 0 $ * *")
    for upto in ("2028-02-01", "2028-03-01", "2028-04-01"):
        fire(cur, upto + " 00:00:00+00")
    tap.is_(keys(cur, "month-end"), ["2028-01-31T00:00:00.000000Z", "2028-02-29T00:00:00.000000Z",
                                     "2028-03-31T00:00:00.000000Z"],
            "$: the last day of each month, February 29 in a leap year")
    at(cur, "2026-06-01 00:00:00+00")
    add(cur, "leap", "0 12 29 2 *")
    cur.execute("SELECT next_firing::text FROM throttle.recurring WHERE name = 'leap'")
    tap.is_(cur.fetchone()[0], "2028-02-29 12:00:00+00", "a leap-day schedule waits for 2028")


def exactly_once(tap, cur, db):
    at(cur, "2027-01-01 00:00:00+00")
    add(cur, "once", "*/5 * * * *", payload='{"n": 1}')
    decided = [fire(cur, "2027-01-01 00:05:00+00"), fire(cur, "2027-01-01 00:05:00+00")]
    tap.is_((decided, keys(cur, "once")), ([1, 0], ["2027-01-01T00:05:00.000000Z"]),
            "a second call at the same instant decides nothing: one event")
    # A second firer behind the first one's open transaction.
    first = connect(dbname=db, autocommit=False)
    fcur = first.cursor()
    at(fcur, "2027-01-01 00:10:00+00")
    tap.is_(fire(fcur), 1, "a firer decides the 00:10 firing in an open transaction")
    second = connect(dbname=db)
    scur = second.cursor()
    at(scur, "2027-01-01 00:10:00+00")
    started = time.time()
    tap.ok(fire(scur) == 0 and time.time() - started < 2,
           "a second firer skips the locked schedule at once")
    first.commit()
    tap.is_((fire(scur), keys(cur, "once")[1:]), (0, ["2027-01-01T00:10:00.000000Z"]),
            "and after the first commits, nothing is left to fire: one event")
    # A rolled-back firing is fired again.
    fcur = first.cursor()
    at(fcur, "2027-01-01 00:15:00+00")
    fire(fcur)
    first.rollback()
    tap.is_((fire(scur, "2027-01-01 00:15:00+00"), keys(cur, "once")[2:]),
            (1, ["2027-01-01T00:15:00.000000Z"]), "a firing rolled back is fired by the next call")
    first.close()
    second.close()
    # An event of the firing's item_key already pending: not scheduled twice.
    cur.execute("SELECT throttle.schedule('jobs', 'recurring:once:2027-01-01T00:20:00.000000Z', "
                "'2027-01-01 00:20:00+00', '{\"n\": 2}')")
    fire(cur, "2027-01-01 00:20:00+00")
    cur.execute("SELECT count(*), min(payload->>'n') FROM throttle.event "
                "WHERE item_key = 'recurring:once:2027-01-01T00:20:00.000000Z'")
    tap.is_(cur.fetchone(), (1, "2"), "a pending event of the firing's item_key is left as it is")


def catch_up(tap, cur):
    for policy in ("none", "latest", "all"):
        at(cur, "2027-02-01 00:00:00+00")
        add(cur, f"cu-{policy}", "0 * * * *", catch_up=policy, catch_up_window="3 hours")
    # The server is "down" from 00:00 to 10:30: ten firings missed.
    at(cur, "2027-02-01 10:30:00+00")
    fire(cur)
    got = {p: keys(cur, f"cu-{p}") for p in ("none", "latest", "all")}
    tap.is_(got["none"], [], "catch_up none: the missed firings are skipped")
    tap.is_(got["latest"], ["2027-02-01T10:00:00.000000Z"], "catch_up latest: the newest one only")
    tap.is_(got["all"], [f"2027-02-01T{h:02d}:00:00.000000Z" for h in (8, 9, 10)],
            "catch_up all: each one within the 3-hour window")
    cur.execute("SELECT name, last_outcome, next_firing::text FROM throttle.recurring_status "
                "WHERE name LIKE 'cu-%' ORDER BY name")
    tap.is_(cur.fetchall(), [("cu-all", "enqueued", "2027-02-01 11:00:00+00"),
                             ("cu-latest", "enqueued", "2027-02-01 11:00:00+00"),
                             ("cu-none", "skipped: missed", "2027-02-01 11:00:00+00")],
            "recurring_status: each one's outcome, and the next firing after now")
    # A firer that runs on time with catch_up none enqueues.
    at(cur, "2027-02-01 11:00:00.2+00")
    fire(cur)
    tap.is_(keys(cur, "cu-none"), ["2027-02-01T11:00:00.000000Z"],
            "catch_up none: a firing decided on time is enqueued")


def overlap(tap, cur):
    at(cur, "2027-03-01 00:00:00+00")
    add(cur, "lap", "* * * * *", on_overlap="skip")
    fire(cur, "2027-03-01 00:01:00+00")
    fire(cur, "2027-03-01 00:02:00+00")
    tap.is_((keys(cur, "lap"), one(cur.connection, "SELECT last_outcome FROM throttle.recurring "
                                                    "WHERE name = 'lap'")[0]),
            (["2027-03-01T00:01:00.000000Z"], "skipped: overlap"),
            "on_overlap skip: a firing while the last event is pending is skipped")
    at(cur, "2027-03-01 00:02:30+00")
    cur.execute("SELECT throttle.claim('jobs', 'w', max => 1000)")
    cur.execute("SELECT throttle.complete(array_agg(id), min(claim_token)) FROM throttle.event "
                "WHERE queue = 'jobs' AND state = 'claimed'")
    fire(cur, "2027-03-01 00:03:00+00")
    tap.is_(keys(cur, "lap")[1:], ["2027-03-01T00:03:00.000000Z"], "and enqueued once it is done")


def edits(tap, cur):
    at(cur, "2027-04-01 00:00:00+00")
    add(cur, "toggle", "0 * * * *")
    cur.execute("UPDATE throttle.recurring SET enabled = false WHERE name = 'toggle'")
    tap.is_(one(cur.connection, "SELECT next_firing FROM throttle.recurring WHERE name = 'toggle'")[0],
            None, "disabled: no next firing")
    at(cur, "2027-04-01 05:30:00+00")
    cur.execute("UPDATE throttle.recurring SET enabled = true WHERE name = 'toggle'")
    fire(cur, "2027-04-01 06:00:00+00")
    tap.is_(keys(cur, "toggle"), ["2027-04-01T06:00:00.000000Z"],
            "enabled again: from now on, nothing backfilled")
    for statement, code, name in (
            ("INSERT INTO throttle.recurring (name, queue, cron) VALUES ('b1', 'jobs', '61 * * * *')",
             "22023", "a cron expression out of range"),
            ("INSERT INTO throttle.recurring (name, queue, cron) VALUES ('b2', 'jobs', '@reboot')",
             "22023", "@reboot"),
            ("INSERT INTO throttle.recurring (name, queue, cron, time_zone) "
             "VALUES ('b3', 'jobs', '* * * * *', 'Mars/Olympus')", "22023", "an unknown time zone"),
            ("INSERT INTO throttle.recurring (name, queue, cron, group_key, concurrency_key) "
             "VALUES ('b4', 'jobs', '* * * * *', 'g', 'k')", "23514", "a group_key and a concurrency_key"),
            ("INSERT INTO throttle.recurring (name, queue, cron, catch_up_window) "
             "VALUES ('b5', 'jobs', '* * * * *', '32 days')", "23514", "a window over 31 days"),
            ("INSERT INTO throttle.recurring (name, queue, cron) VALUES ('b6', '', '* * * * *')",
             "23514", "an empty queue name"),
            ("UPDATE throttle.recurring SET cron = 'nonsense' WHERE name = 'toggle'", "22023",
             "an update to a bad expression")):
        tap.is_((sql_error(cur.connection, statement) or ("",))[0], code, f"refused: {name}")
    # A schedule whose firing fails leaves the others alone and is tried again.
    at(cur, "2027-05-01 00:00:00+00")
    cur.execute("UPDATE throttle.recurring SET enabled = false")
    add(cur, "broken", "* * * * *")
    cur.execute("UPDATE throttle.recurring SET queue = 'broken' WHERE name = 'broken'")
    add(cur, "fine", "* * * * *")
    cur.execute("""CREATE FUNCTION public.refuse() RETURNS trigger LANGUAGE plpgsql AS $$
                   BEGIN RAISE EXCEPTION 'queue broken is closed'; END $$""")
    cur.execute("CREATE TRIGGER refuse BEFORE INSERT ON throttle.event FOR EACH ROW "
                "WHEN (NEW.queue = 'broken') EXECUTE FUNCTION public.refuse()")
    fire(cur, "2027-05-01 00:01:00+00")
    cur.execute("SELECT name, last_outcome FROM throttle.recurring WHERE name IN ('broken', 'fine') "
                "ORDER BY name")
    tap.is_(cur.fetchall(), [("broken", "failed: queue broken is closed"), ("fine", "enqueued")],
            "a firing that fails is recorded as failed, and the others fire")
    cur.execute("DROP TRIGGER refuse ON throttle.event")
    fire(cur, "2027-05-01 00:01:30+00")
    tap.is_(keys(cur, "broken"), ["2027-05-01T00:01:00.000000Z"], "and it fires at the next call")


def privileges(tap, cur, db):
    cur.execute("DROP ROLE IF EXISTS plain_rec")
    cur.execute("CREATE ROLE plain_rec")
    plain = connect(dbname=db)
    pcur = plain.cursor()
    pcur.execute("SET ROLE plain_rec")
    pcur.execute("SELECT count(*) > 0 FROM throttle.recurring_status")
    tap.ok(pcur.fetchone()[0], "PUBLIC reads recurring_status")
    for statement, name in (
            ("INSERT INTO throttle.recurring (name, queue, cron) VALUES ('x', 'q', '* * * * *')",
             "INSERT into throttle.recurring"),
            ("UPDATE throttle.recurring SET enabled = false", "UPDATE of throttle.recurring"),
            ("SELECT throttle._fire_recurring(now())", "throttle._fire_recurring"),
            ("SELECT throttle._wake_at(now())", "throttle._wake_at")):
        tap.is_((sql_error(plain, statement) or ("",))[0], "42501", f"PUBLIC may not: {name}")
    plain.close()
    cur.execute("DROP ROLE plain_rec")


def main():
    tap = Tap(36)
    admin, db = fresh_database(DB)
    set_wakeups(admin, False)
    try:
        cur = db.cursor()
        dst(tap, cur)
        calendar(tap, cur)
        exactly_once(tap, cur, DB)
        catch_up(tap, cur)
        overlap(tap, cur)
        edits(tap, cur)
        privileges(tap, cur, DB)
    finally:
        db.close()
        set_wakeups(admin, True)
        admin.cursor().execute(f"DROP DATABASE IF EXISTS {DB}")
    tap.done()


if __name__ == "__main__":
    main()
