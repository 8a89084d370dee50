#!/usr/bin/python3
"""What a backend keeps between calls answers as a fresh look-up would.

The hot paths keep three things for the backend's life instead of looking
them up on every call: whether the database is distributed (the anchor table
throttle.distribute() creates), take's result descriptor, and the session
locks it holds (for DISCARD ALL and exit). Each is checked against a change
made meanwhile: the anchor created and dropped by another session, or in the
caller's own transaction and rolled back; the extension dropped and created
again under a session that called take; session locks of names that share
their first bytes, one unlocked and taken by another session before DISCARD
ALL. Without Citus, a call that finds the anchor takes the distributed path
and fails on Citus's missing function: that failure is how the test sees
which path a call took.
"""
import os
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(__file__))
from pgconn import connect, one as row, sql_error  # noqa: E402
from tap import Tap  # noqa: E402

t = Tap(16)
RUN = str(time.time_ns())  # names of this run's own: the registry outlives a run
a = connect()
b = connect()


def one(conn, sql, params=None):
    """The first row, or its only value when it has one column."""
    found = row(conn, sql, params)
    return found[0] if found is not None and len(found) == 1 else found


ACQUIRE = f"SELECT throttle.acquire('call-caches-{RUN}', '1 microsecond')"


def path_of(conn):
    """'local' when acquire answered, 'distributed' when it looked for the shard."""
    error = sql_error(conn, ACQUIRE)
    if error is None:
        return "local"
    return "distributed" if "get_shard_id_for_distribution_column" in (error[1] or "") else error


t.is_(path_of(a), "local", "a plain database: acquire decides locally")
b.cursor().execute("CREATE TABLE throttle.key_shard (key text)")
t.is_(path_of(a), "distributed", "another session creates the anchor: the next call sees it")
t.is_(path_of(a), "distributed", "and the call after it")
b.cursor().execute("DROP TABLE throttle.key_shard")
t.is_(path_of(a), "local", "the anchor dropped by another session: local again")

a.autocommit = False
a.cursor().execute("CREATE TABLE throttle.key_shard (key text)")
t.is_(path_of(a), "distributed", "created in the caller's own transaction: seen at once")
a.rollback()
a.autocommit = True
t.is_(path_of(a), "local", "rolled back: local again")
t.is_(path_of(a), "local", "and on the call after it")

TAKE = f"SELECT allowed, remaining FROM throttle.take('call-caches-{RUN}', 5, '1 hour', 5, %s)"
t.is_(one(a, TAKE, (2,)), (True, 3), "take answers with its columns")
a.cursor().execute("INSERT INTO throttle.bucket (name, rate, per, burst) "
                   f"VALUES ('call-caches-declared-{RUN}', 4, '1 hour', 4)")
t.is_(one(a, f"SELECT allowed, remaining FROM throttle.take('call-caches-declared-{RUN}', 1)"),
      (True, 3), "the declared take beside it")
a.cursor().execute("DROP EXTENSION pg_throttle")
a.cursor().execute("CREATE EXTENSION pg_throttle")
t.is_(one(a, "SELECT allowed, remaining, retry_after, reset_after "
             f"FROM throttle.take('call-caches-new-{RUN}', 5, '1 hour', 5, 1)"),
      (True, 4, one(a, "SELECT interval '0'"), one(a, "SELECT interval '12 minutes'")),
      "the extension dropped and created again: take of the new function answers whole")

NAMES = [f"cc-{RUN}", f"cc-{RUN}-a", f"cc-{RUN}-ab", f"cc-{RUN}-b"]
for name in NAMES:
    one(a, "SELECT throttle.lock(%s)", (name,))
token = one(b, "SELECT token FROM throttle.locks WHERE name = %s", (NAMES[1],))
t.ok(one(a, "SELECT throttle.unlock(%s, %s)", (NAMES[1], token)),
     "four session locks of names sharing their first bytes; one unlocked")
t.ok(one(b, "SELECT throttle.lock(%s) IS NOT NULL", (NAMES[1],)), "another session takes the unlocked name")
a.cursor().execute("DISCARD ALL")
t.is_(one(b, "SELECT count(*) FROM throttle.locks WHERE name = ANY (%s)",
          ([NAMES[0], NAMES[2], NAMES[3]],)), 0,
      "DISCARD ALL releases the three the session held")
t.is_(one(b, "SELECT holder_pid = pg_backend_pid() FROM throttle.locks WHERE name = %s", (NAMES[1],)),
      True, "and leaves the name another session took since")

# The anchor appears while a call's look-up runs: the schema is renamed and
# a new one with the anchor created while the call sleeps, after its
# statement was parsed, so the look-up meets the invalidation halfway (the
# schema's old oid from the cache, then pg_class read afresh). The answer of
# that look-up must not be kept. (The session's first call: nothing is kept
# yet, so the racing call looks up.) In a database of its own: the extension's
# schema is renamed.
a.close()
b.close()
admin = connect()
admin.cursor().execute("DROP DATABASE IF EXISTS call_caches_race")
admin.cursor().execute("CREATE DATABASE call_caches_race")
a, b = connect(dbname="call_caches_race"), connect(dbname="call_caches_race")
a.cursor().execute("CREATE EXTENSION pg_throttle")


def move():
    time.sleep(1)
    b.cursor().execute("ALTER SCHEMA throttle RENAME TO throttle_old; CREATE SCHEMA throttle;"
                       " CREATE TABLE throttle.key_shard (key text)")


mover = threading.Thread(target=move)
mover.start()
racing = sql_error(a, f"SELECT pg_sleep(3) IS NULL, throttle.acquire('race-{RUN}', '1 microsecond')")
mover.join()
ACQUIRE = f"SELECT throttle_old.acquire('call-caches-{RUN}', '1 microsecond')"
fresh = connect(dbname="call_caches_race")
t.is_((path_of(a), path_of(fresh)), ("distributed", "distributed"),
      "the anchor created during a call's look-up: the next call sees it, as a new session does")
t.is_(path_of(a), "distributed", "and the call after it")
for conn in (a, b, fresh):
    conn.close()
admin.cursor().execute("DROP DATABASE call_caches_race")
admin.close()
t.done()
