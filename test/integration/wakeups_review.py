#!/usr/bin/python3
"""Wake-ups under hostile roles and awkward interleavings (a review of the wake-ups; each check
here failed on the commit that introduced them):
- the waker runs as the bootstrap superuser: a database owner who sets the database's
  search_path must not get code run by it, nor a role that plants a schema `throttle` with an
  `_announce_due` in a database without pg_throttle (the launcher visits every database at
  start);
- a role that may not drop a database must not be able to hold its waker off by trying;
- DROP DATABASE ... WITH (FORCE) by a database owner who is not a superuser works while the
  database has a waker;
- a waker that cannot start (the database refused connections for a while) must not leave the
  database without wake-ups once it takes them again;
- a prepared transaction committed after the waker left (nothing was ahead) is announced, at
  the latest a minute later (docs/queue.md);
- a role that schedules events with many distinct priorities must not make DROP DATABASE of
  its database fail (that it slows the passes is documented);
- a pass that gives way to a lock (lock_not_available) does not skip its range;
- a launcher that receives SIGTERM comes back (else no waker ever starts again).

Runs a server of its own on a Unix socket in a temporary directory, port PGPORT + 20.
"""
import os
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(__file__))
from cluster import OwnServer, reconnect  # noqa: E402
from pgconn import one, sql_error  # noqa: E402
from tap import Tap  # noqa: E402
from wakeups import LATE, Listener, schedule, waker_of  # noqa: E402

DB = "app"
CONF = ("shared_preload_libraries = 'pg_throttle'\nfsync = off\nmax_prepared_transactions = 4\n"
        "max_worker_processes = 16\n")


def wait_for_pass(admin, dbname):
    """Until the waker of `dbname` is in a pass (at most 10 s); whether it is."""
    for _ in range(1000):
        if one(admin, "SELECT count(*) FROM pg_stat_activity WHERE backend_type = "
                      "'pg_throttle waker' AND datname = %s AND state = 'active'", (dbname,))[0]:
            return True
        time.sleep(0.01)
    return False


def is_superuser(conn, role):
    return one(conn, "SELECT rolsuper FROM pg_roles WHERE rolname = %s", (role,))[0]


def search_path_of_the_database(tap, server):
    """A database owner (not a superuser) sets the database's search_path ahead of pg_catalog,
    with a to_regprocedure of its own: the next waker's first pass must not call it."""
    admin = server.connect()
    admin.cursor().execute("CREATE ROLE owner1 LOGIN CREATEDB")
    owner = server.connect(user="owner1")
    owner.cursor().execute("CREATE DATABASE owned")
    owner.close()
    server.connect("owned").cursor().execute("CREATE EXTENSION pg_throttle")
    conn = server.connect("owned", user="owner1")
    cur = conn.cursor()
    cur.execute("CREATE SCHEMA evil")
    cur.execute("""CREATE FUNCTION evil.to_regprocedure(text) RETURNS regprocedure
                   LANGUAGE plpgsql AS $$
                   BEGIN
                       BEGIN EXECUTE 'ALTER ROLE owner1 SUPERUSER';
                       EXCEPTION WHEN OTHERS THEN NULL; END;
                       RETURN pg_catalog.to_regprocedure($1);
                   END $$""")
    cur.execute("ALTER DATABASE owned SET search_path = evil, pg_catalog")
    conn.close()
    for _ in range(150):  # the waker of the install leaves (nothing ahead)
        if not waker_of(admin, "owned"):
            break
        time.sleep(0.1)
    conn = server.connect("owned", user="owner1")
    schedule(conn, "q", "k", 3600)  # a new waker comes, whose first pass looks its function up
    conn.close()
    time.sleep(2)
    tap.ok(not is_superuser(admin, "owner1"),
           "a database owner's search_path runs none of its functions in the waker")
    admin.close()


def planted_function(tap, server):
    """A role with CREATEDB makes a database without pg_throttle, with a schema throttle and an
    _announce_due of its own: the launcher's visit at the next start must not call it."""
    admin = server.connect()
    admin.cursor().execute("CREATE ROLE planter LOGIN CREATEDB")
    planter = server.connect(user="planter")
    planter.cursor().execute("CREATE DATABASE planted")
    planter.close()
    conn = server.connect("planted", user="planter")
    cur = conn.cursor()
    cur.execute("CREATE SCHEMA throttle")
    cur.execute("""CREATE FUNCTION throttle._announce_due(timestamptz, timestamptz)
                   RETURNS timestamptz LANGUAGE plpgsql AS $$
                   BEGIN
                       BEGIN EXECUTE 'ALTER ROLE planter SUPERUSER';
                       EXCEPTION WHEN OTHERS THEN NULL; END;
                       RETURN NULL;
                   END $$""")
    conn.close()
    admin.close()
    server.ctl("restart", "-m", "fast")
    admin = reconnect(dbname="postgres", user="postgres", **server.address())
    time.sleep(3)
    tap.ok(not is_superuser(admin, "planter"),
           "a schema throttle planted in a database without pg_throttle runs nothing at start")
    admin.close()


def failed_drop(tap, server):
    """DROP DATABASE by a role that may not drop it fails at once: the database's waker must
    not be held off for 30 s by the attempt."""
    admin = server.connect()
    admin.cursor().execute("CREATE ROLE nobody LOGIN")
    conn = server.connect(DB)
    listener = Listener(server, DB, "held")
    event = schedule(conn, "held", "h", 2.0)
    nobody = server.connect(user="nobody")
    error = sql_error(nobody, f"DROP DATABASE {DB}")
    nobody.close()
    listener.wait(2.0 + LATE)
    at = listener.first(event[0])
    tap.ok(error is not None and error[0] == "42501" and at is not None
           and at - event[1] <= LATE,
           "a DROP DATABASE refused for want of privilege does not hold the waker off",
           f"{error}; heard {None if at is None else round(at - event[1], 3)} s after its instant")
    listener.close()
    conn.close()
    admin.close()


def forced_drop(tap, server):
    """DROP DATABASE ... WITH (FORCE) by the database's owner, not a superuser, while the
    database has a waker: the waker is sent away, the drop works."""
    admin = server.connect()
    admin.cursor().execute("CREATE ROLE owner3 LOGIN CREATEDB")
    owner = server.connect(user="owner3")
    owner.cursor().execute("CREATE DATABASE forced")
    conn = server.connect("forced")
    conn.cursor().execute("CREATE EXTENSION pg_throttle")
    # Enough priorities ahead that a pass lasts about a second: the drop comes during one
    # (on an idle machine the waker may otherwise be gone before the drop looks).
    # Within a minute, so that the waker stays (one whose next instant is further leaves).
    conn.cursor().execute("SELECT count(throttle.schedule('q', 'p' || i, now() + interval "
                          "'50 seconds', priority => i)) FROM generate_series(1, 50000) i")
    time.sleep(2)
    has_waker = waker_of(admin, "forced")
    schedule(conn, "q", "k", 0.2)
    conn.close()
    has_waker = wait_for_pass(admin, "forced") and has_waker
    error = sql_error(owner, "DROP DATABASE forced WITH (FORCE)")
    tap.ok(has_waker and error is None,
           "DROP DATABASE ... WITH (FORCE) by its owner works while the database has a waker",
           f"waker: {has_waker}; {error}")
    owner.close()
    admin.close()


def failed_start(tap, server):
    """The database refuses connections while its waker is replaced: the launcher's start
    fails. Once it takes connections again, an event scheduled ahead is announced."""
    admin = server.connect()
    admin.cursor().execute("CREATE DATABASE closing")
    conn = server.connect("closing")
    conn.cursor().execute("CREATE EXTENSION pg_throttle")
    first = schedule(conn, "closing", "first", 3.0)
    conn.close()
    time.sleep(0.5)
    admin.cursor().execute("ALTER DATABASE closing ALLOW_CONNECTIONS false")
    admin.cursor().execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                           "WHERE backend_type = 'pg_throttle waker' AND datname = 'closing'")
    time.sleep(1.5)  # the launcher starts another, which cannot connect
    admin.cursor().execute("ALTER DATABASE closing ALLOW_CONNECTIONS true")
    time.sleep(max(0.0, first[1] + 0.5 - time.time()))
    conn = server.connect("closing")
    listener = Listener(server, "closing", "closing")
    later = schedule(conn, "closing", "later", 1.0)
    listener.wait(1.0 + LATE)
    at = listener.first(later[0])
    tap.ok(at is not None and at - later[1] <= LATE,
           "after a waker could not start, the database's events ahead are announced again",
           f"heard {None if at is None else round(at - later[1], 3)} s after its instant")
    listener.close()
    conn.close()
    admin.close()


def prepared(tap, server):
    """A prepared transaction schedules an event 20 s ahead; the waker leaves (nothing else
    ahead); COMMIT PREPARED: the event is announced, at the latest a minute later."""
    admin = server.connect()
    admin.cursor().execute("CREATE DATABASE twophase")
    conn = server.connect("twophase")
    conn.cursor().execute("CREATE EXTENSION pg_throttle")
    conn.close()
    listener = Listener(server, "twophase", "twophase")
    xact = server.connect("twophase", autocommit=False)
    event = schedule(xact, "twophase", "p", 20.0)
    xact.cursor().execute("PREPARE TRANSACTION 'wake'")
    xact.close()
    for _ in range(150):
        if not waker_of(admin, "twophase"):
            break
        time.sleep(0.1)
    conn = server.connect("twophase")
    conn.cursor().execute("COMMIT PREPARED 'wake'")
    committed = time.time()
    conn.close()
    while listener.first(event[0]) is None and time.time() < committed + 61:
        listener.wait(1.0)
    at = listener.first(event[0])
    tap.ok(at is not None and at >= event[1] - 0.002,
           "a prepared transaction committed after the waker left: announced within a minute",
           f"heard {None if at is None else round(at - event[1], 3)} s after its instant")
    listener.close()
    admin.close()


def many_priorities(tap, server):
    """A plain role schedules 300 000 events a day ahead, each with a priority of its own: the
    waker's passes then take seconds (one index descent per priority, docs/queue.md says so),
    and DROP DATABASE still works while one runs (the waker ends its pass at once)."""
    admin = server.connect()
    admin.cursor().execute("CREATE DATABASE crowded")
    conn = server.connect("crowded")
    conn.cursor().execute("CREATE EXTENSION pg_throttle")
    admin.cursor().execute("CREATE ROLE crowder LOGIN")
    crowder = server.connect("crowded", user="crowder")
    crowder.cursor().execute("SELECT count(throttle.schedule('mine', 'p' || i, "
                             "now() + interval '1 day', priority => i)) "
                             "FROM generate_series(1, 300000) i")
    crowder.close()
    time.sleep(1)
    schedule(conn, "theirs", "u", 0.3)
    conn.close()
    in_pass = wait_for_pass(admin, "crowded")
    error = sql_error(admin, "DROP DATABASE crowded")
    tap.ok(in_pass and error is None, "DROP DATABASE works while a long pass runs",
           f"in a pass: {in_pass}; {error}")
    admin.close()


def lock_at_the_instant(tap, server):
    """A superuser's LOCK TABLE throttle.event (as ALTER EXTENSION UPDATE, TRUNCATE, VACUUM FULL,
    REINDEX take) spans an event's instant: the pass that gives way must not skip its range; the
    event is announced once the lock is gone (a second later)."""
    conn = server.connect(DB)
    listener = Listener(server, DB, "locked")
    event = schedule(conn, "locked", "l", 1.0)
    locker = server.connect(DB, autocommit=False)
    locker.cursor().execute("LOCK TABLE throttle.event IN ACCESS EXCLUSIVE MODE")
    time.sleep(max(0.0, event[1] + 1.5 - time.time()))
    locker.commit()
    released = time.time()
    locker.close()
    listener.wait(1.0 + LATE)
    at = listener.first(event[0])
    tap.ok(at is not None and at - released <= 1.0 + LATE,
           "an event whose instant fell during a lock on throttle.event is announced after it",
           f"heard {None if at is None else round(at - released, 3)} s after the lock went")
    listener.close()
    conn.close()


def launcher_terminated(tap, server):
    """pg_terminate_backend of the launcher (SIGTERM, as a superuser's clean-up script sends to
    every other backend): the postmaster starts it again after its restart time (5 s)."""
    admin = server.connect()
    admin.cursor().execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                           "WHERE backend_type = 'pg_throttle wakeup launcher'")
    time.sleep(8)
    count = one(admin, "SELECT count(*) FROM pg_stat_activity "
                       "WHERE backend_type = 'pg_throttle wakeup launcher'")[0]
    tap.is_(count, 1, "a launcher terminated by SIGTERM comes back")
    admin.close()


def main():
    tap = Tap(9)
    port = int(os.environ.get("PGPORT", "5432")) + 20
    directory = tempfile.mkdtemp(prefix="pg_throttle_wakeups_review.")
    os.chmod(directory, 0o755)
    subprocess.run(["chown", "postgres:postgres", directory], check=True)
    server = OwnServer(os.path.join(directory, "primary"), port, CONF)
    try:
        server.init()
        server.connect().cursor().execute(f"CREATE DATABASE {DB}")
        server.connect(DB).cursor().execute("CREATE EXTENSION pg_throttle")
        search_path_of_the_database(tap, server)
        planted_function(tap, server)
        failed_drop(tap, server)
        forced_drop(tap, server)
        failed_start(tap, server)
        prepared(tap, server)
        many_priorities(tap, server)
        lock_at_the_instant(tap, server)
        launcher_terminated(tap, server)
    finally:
        try:
            server.ctl("stop", "-m", "immediate")
        except subprocess.CalledProcessError:
            pass
        subprocess.run(["rm", "-rf", directory], check=False)
    tap.done()


if __name__ == "__main__":
    main()
