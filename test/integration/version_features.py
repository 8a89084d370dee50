#!/usr/bin/python3
"""What a newer server shows of pg_throttle (src/pg/server/compat.hpp), checked on
the version the suite runs against:

- every version: a session waiting in throttle.lock or throttle.wait waits
  with wait_event_type "Extension";
- 17 and later: each of those waits has a name of its own in wait_event
  (ThrottleLock, ThrottleWait), listed in pg_wait_events; before 17
  wait_event is "Extension";
- 17 and later: an infinite interval ('infinity', new in 17) is refused
  where a length of time is needed (every, per, ttl, lease, retry_in: 22023,
  or a check violation in throttle.resource and throttle.bucket), and means
  "no limit" as a timeout, like NULL;
- 18 and later: pg_get_loaded_modules() names the module and its version.
"""
import os
import re
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(__file__))
from pgconn import connect, one, sql_error  # noqa: E402
from tap import Tap  # noqa: E402

ROOT = os.path.join(os.path.dirname(__file__), "..", "..")
EVENTS = ("ThrottleLock", "ThrottleWait")


def control_version():
    with open(os.path.join(ROOT, "pg_throttle.control")) as f:
        return re.search(r"^default_version = '([^']*)'", f.read(), re.M).group(1)


def wait_of(observer, pid, seconds=5.0):
    """(wait_event_type, wait_event) of backend `pid` once it waits in an
    extension; what it last waited on otherwise."""
    deadline = time.monotonic() + seconds
    row = None
    while time.monotonic() < deadline:
        row = one(observer, "SELECT wait_event_type, wait_event FROM pg_stat_activity "
                            "WHERE pid = %s", (pid,))
        if row and row[0] == "Extension":
            break
        time.sleep(0.02)
    return tuple(row) if row else None


def waiting_in(observer, statement, setup=None):
    """Runs `statement` in a new session and returns what that session waits on."""
    session = connect()
    pid = one(session, "SELECT pg_backend_pid()")[0]
    if setup:
        setup()
    t = threading.Thread(target=lambda: one(session, statement))
    t.start()
    seen = wait_of(observer, pid)
    t.join(30)
    session.close()
    return seen


def main():
    observer = connect()
    version = one(observer, "SELECT current_setting('server_version_num')::int")[0]
    named = version >= 170000
    tap = Tap(2 + (9 if named else 0) + (1 if version >= 180000 else 0))

    def expected(name):
        return ("Extension", name if named else "Extension")

    # A session waiting in the queue of a lock another session holds.
    holder = connect()
    token = one(holder, "SELECT throttle.lock('vf.lock')")[0]
    seen = waiting_in(observer, "SELECT throttle.lock('vf.lock', NULL, '2 seconds')")
    one(holder, "SELECT throttle.unlock('vf.lock', %s)", (token,))
    tap.is_(seen, expected("ThrottleLock"), "throttle.lock waits as " + expected("ThrottleLock")[1])

    # A session sleeping in throttle.wait until its bucket lets it pass.
    one(observer, "SELECT throttle.take('vf.bucket', 1, '2 seconds')")
    seen = waiting_in(observer, "SELECT throttle.wait('vf.bucket', 1, '2 seconds')")
    tap.is_(seen, expected("ThrottleWait"), "throttle.wait waits as " + expected("ThrottleWait")[1])

    if named:
        listed = one(observer, "SELECT array_agg(name ORDER BY name) FROM pg_wait_events "
                               "WHERE type = 'Extension' AND name LIKE 'Throttle%%'")[0]
        tap.is_(listed, sorted(EVENTS), "pg_wait_events lists both waits")

        # 17 has infinite intervals: never a length of time, "no limit" as a timeout.
        def refused(statement):
            error = sql_error(observer, statement)
            return error[:2] if error else None

        for statement, want in [
            ("SELECT throttle.acquire('vf.inf', 'infinity')",
             ("22023", "every must be a finite interval")),
            ("SELECT throttle.acquire('vf.inf', '-infinity')",
             ("22023", "every must be a positive interval")),
            ("SELECT throttle.take('vf.inf', 1, 'infinity')",
             ("22023", "per must be a finite interval")),
            ("SELECT throttle.lock('vf.inf', 'infinity')",
             ("22023", "ttl must be a finite interval")),
            ("SELECT throttle.claim('vf', 'w', 'infinity')",
             ("22023", "lease must be a finite interval")),
            ("SELECT throttle.fail('{}', 0, 'e', 'infinity')",
             ("22023", "retry_in must be a finite interval")),
        ]:
            tap.is_(refused(statement), want, f"{statement}: {want[0]}")
        tap.is_([refused("INSERT INTO throttle.resource (name, every) VALUES ('vf.inf', 'infinity')")[0],
                 refused("INSERT INTO throttle.bucket (name, rate, per) VALUES ('vf.inf', 1, 'infinity')")[0]],
                ["23514", "23514"], "throttle.resource and throttle.bucket refuse 'infinity' (23514)")
        one(observer, "SELECT throttle.take('vf.winf', 1, '300 milliseconds')")
        t0 = time.monotonic()
        passed = one(observer, "SELECT throttle.wait('vf.winf', 1, '300 milliseconds', 1, 1, 'infinity')")[0]
        took = time.monotonic() - t0
        tap.ok(passed is True and 0.2 < took < 2.0,
               f"throttle.wait with timeout 'infinity' waits for its turn ({took * 1000:.0f} ms)")

    if version >= 180000:
        row = one(observer, "SELECT module_name, version FROM pg_get_loaded_modules() "
                            "WHERE file_name LIKE 'pg_throttle%%'")
        tap.is_(tuple(row) if row else None, ("pg_throttle", control_version()),
                "pg_get_loaded_modules() names pg_throttle and its version")
    tap.done()


if __name__ == "__main__":
    main()
