#!/usr/bin/python3
"""Wake-ups at the due time: a worker that only LISTENs hears of every event when it falls due,
not only when it is scheduled due:
- a run_at ahead (also more than a minute ahead, when the waker has left its worker slot and
  the launcher starts one before the instant), the end of a retry's backoff, the end of a claim's lease (with and without a
  group_key), each announced at its instant, never before it;
- a transaction that commits after its event's run_at: announced as it commits;
- each database's channel hears its own events only;
- DROP DATABASE, ALTER DATABASE ... RENAME and CREATE DATABASE ... TEMPLATE work while the
  database has a waker (it is sent away first);
- after a backend crash, a postmaster crash, a clean restart and a promotion: what falls due
  later is announced, and what fell due while the server was down is announced as it comes back
  (each checked more than once);
- DROP EXTENSION does not deadlock with a waker's pass;
- pg_throttle.wakeups = off sends nothing; the internal functions are not PUBLIC's;
- a recurring schedule that fires every second enqueues each second exactly once across all of
  the faults above, catching up what fell while the server was down.

Runs servers of its own (a primary and a standby) on Unix sockets in a temporary directory, with
the port number PGPORT + 20.
"""
import os
import select
import shutil
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(__file__))
from cluster import BIN, OwnServer, as_postgres, kill_postmaster, reconnect  # noqa: E402
from pgconn import one, sql_error  # noqa: E402
from tap import Tap  # noqa: E402

DB = "app"
CONF = "shared_preload_libraries = 'pg_throttle'\nfsync = off\nwal_level = replica\n"
# What a test allows between an event's instant and its NOTIFY on a loaded
# 2-core machine (make bench measures the lateness itself).
LATE = 1.5


class Listener:
    """A connection that LISTENs on channels and keeps (channel, payload, arrival) of each
    NOTIFY."""

    def __init__(self, server, dbname, *channels):
        self.conn = reconnect(dbname=dbname, user="postgres", **server.address())
        for channel in channels:
            self.conn.cursor().execute(f'LISTEN "{channel}"')
        self.heard = []

    def wait(self, seconds):
        deadline = time.time() + seconds
        while True:
            left = deadline - time.time()
            if left <= 0:
                return
            if select.select([self.conn], [], [], left)[0]:
                self.conn.poll()
                self.heard += [(n.channel, n.payload, time.time()) for n in self.conn.notifies]
                self.conn.notifies.clear()

    def first(self, payload):
        """When `payload` was first heard, or None."""
        return next((t for _, p, t in self.heard if p == str(payload)), None)

    def close(self):
        self.conn.close()


def schedule(conn, queue, key, seconds_ahead, **extra):
    """Schedules an event `seconds_ahead` of now; returns (id, run_at as epoch seconds)."""
    args = "".join(f", {k} => %({k})s" for k in extra)
    event_id = one(conn, f"SELECT throttle.schedule(%(q)s, %(k)s, now() + make_interval(secs => "
                         f"%(s)s){args})", {"q": queue, "k": key, "s": seconds_ahead, **extra})[0]
    return one(conn, "SELECT id, extract(epoch FROM run_at)::float8 FROM throttle.event "
                     "WHERE id = %s", (event_id,))


def heard_on_time(tap, listener, event, name):
    """`event` (id, instant) was heard at or after its instant and at most LATE after it."""
    event_id, instant = event
    at = listener.first(event_id)
    tap.ok(at is not None and instant <= at + 0.002 and at - instant <= LATE,
           f"{name}: announced at its instant",
           f"heard {None if at is None else round(at - instant, 3)} s after it")


def far_ahead_begin(server):
    """An event 63 s ahead, alone in its database: the waker passes, leaves its worker slot (its
    next instant is more than a minute away), and the launcher starts one before the instant."""
    server.connect().cursor().execute("CREATE DATABASE far")
    conn = server.connect("far")
    conn.cursor().execute("CREATE EXTENSION pg_throttle")
    listener = Listener(server, "far", "far")
    event = schedule(conn, "far", "f", 63.0)
    conn.close()
    return listener, event


def far_ahead_end(tap, server, listener, event):
    listener.wait(max(0.5, event[1] + LATE - time.time()))
    heard_on_time(tap, listener, event, "an event 63 s ahead, whose waker left meanwhile")
    listener.close()
    admin = server.connect()
    admin.cursor().execute("DROP DATABASE far")
    admin.close()


def due_time(tap, server, conn):
    # A retry's backoff, a claim's lease, a group's lease (their schedule, due, is announced by
    # schedule itself: before the listener listens).
    cur = conn.cursor()
    cur.execute("SELECT throttle.schedule('backoff', 'b', now())")
    cur.execute("SELECT id, claim_token FROM throttle.claim('backoff', 'w', '1 minute')")
    failed_id, token = cur.fetchone()
    cur.execute("SELECT throttle.fail(ARRAY[%s::bigint], %s, 'boom', interval '1.2 s')",
                (failed_id, token))
    backoff = one(conn, "SELECT id, extract(epoch FROM run_at)::float8 FROM throttle.event "
                        "WHERE id = %s", (failed_id,))
    cur.execute("SELECT throttle.schedule('lease', 'l', now())")
    lease = one(conn, "SELECT id, extract(epoch FROM lease_until)::float8 "
                      "FROM throttle.claim('lease', 'w', '1.5 s')")
    cur.execute("SELECT throttle.schedule('grouped', 'g', now(), group_key => 'tenant')")
    grouped = one(conn, "SELECT id, extract(epoch FROM lease_until)::float8 "
                        "FROM throttle.claim_group('grouped', 'w', '1.8 s')")
    listener = Listener(server, DB, "ahead", "backoff", "lease", "grouped", "late")
    ahead = [schedule(conn, "ahead", f"a{i}", 0.4 + 0.3 * i) for i in range(5)]
    # A transaction that commits after its event's run_at.
    late = reconnect(dbname=DB, user="postgres", autocommit=False, **server.address())
    late_event = schedule(late, "late", "x", 0.3)
    time.sleep(0.8)
    late.commit()
    committed = time.time()
    late.close()
    listener.wait(3.5)
    for i, event in enumerate(ahead):
        heard_on_time(tap, listener, event, f"run_at {0.4 + 0.3 * i:.1f} s ahead")
    heard_on_time(tap, listener, backoff, "a retry's backoff of 1.2 s")
    heard_on_time(tap, listener, lease, "a claim's lease of 1.5 s")
    heard_on_time(tap, listener, grouped, "a group claim's lease of 1.8 s")
    at = listener.first(late_event[0])
    tap.ok(at is not None and at - committed <= LATE,
           "an event whose run_at passed before its commit: announced as it commits",
           f"heard {None if at is None else round(at - committed, 3)} s after the commit")
    tap.is_(one(conn, "SELECT count(*) FROM throttle.claim('lease', 'w2')")[0], 1,
            "the worker that heard the lease end takes the event over")
    listener.close()


def databases_apart(tap, server, conn):
    server.connect().cursor().execute("CREATE DATABASE other")
    other = server.connect("other")
    other.cursor().execute("CREATE EXTENSION pg_throttle")
    here = Listener(server, DB, "shared")
    there = Listener(server, "other", "shared")
    mine = schedule(conn, "shared", "k", 0.5)
    theirs = schedule(other, "shared", "k", 0.7)
    here.wait(1.5)
    there.wait(0.1)
    tap.ok(here.first(mine[0]) is not None and there.first(mine[0]) is None,
           "an event is announced on its own database's channel only")
    tap.ok(there.first(theirs[0]) is not None, "and the other database's on its own")
    here.close()
    there.close()
    # The statements that need a database alone, while it has a waker.
    schedule(other, "shared", "later", 50)  # within a minute: the waker stays (further, it leaves)
    other.close()
    admin = server.connect()
    time.sleep(0.5)
    tap.ok(waker_of(admin, "other"), "a database with an event ahead has a waker")
    for statement, name in (("CREATE DATABASE copy TEMPLATE other", "CREATE DATABASE ... TEMPLATE"),
                            ("ALTER DATABASE other RENAME TO renamed", "ALTER DATABASE ... RENAME"),
                            ("DROP DATABASE renamed", "DROP DATABASE")):
        if statement.startswith("DROP"):
            time.sleep(1.5)  # the launcher has started the renamed database's waker again
            tap.ok(waker_of(admin, "renamed"), "the renamed database has its waker again")
        started = time.time()
        error = sql_error(admin, statement)
        tap.ok(error is None and time.time() - started < 4,
               f"{name} works while the database has a waker",
               f"{error}, {time.time() - started:.1f} s")
    admin.cursor().execute("DROP DATABASE copy")
    admin.close()


def drop_extension_mid_pass(tap, server):
    """DROP EXTENSION while the waker's pass waits for a lock the dropping transaction holds:
    the pass gives way (its lock_timeout is short), no deadlock."""
    server.connect().cursor().execute("CREATE DATABASE ddl")
    setup = server.connect("ddl")
    setup.cursor().execute("CREATE EXTENSION pg_throttle")
    setup.close()
    dropper = server.connect("ddl", autocommit=False)
    dropper.cursor().execute("LOCK TABLE throttle.event IN ACCESS EXCLUSIVE MODE")
    other = server.connect("ddl")
    other.cursor().execute("INSERT INTO throttle.recurring (name, queue, cron) "
                           "VALUES ('each-second', 'q', '* * * * * *')")
    other.close()
    time.sleep(1.5)  # the waker's pass: it read throttle.recurring, waits for throttle.event
    error = None
    try:
        dropper.cursor().execute("DROP EXTENSION pg_throttle")
        dropper.commit()
    except Exception as e:  # noqa: BLE001 - reported below
        error = e
    tap.ok(error is None, "DROP EXTENSION while a waker's pass waits on its lock: no deadlock",
           str(error))
    dropper.close()
    admin = server.connect()
    admin.cursor().execute("DROP DATABASE ddl")
    admin.close()


def waker_of(conn, dbname):
    return one(conn, "SELECT count(*) FROM pg_stat_activity WHERE backend_type = "
                     "'pg_throttle waker' AND datname = %s", (dbname,))[0] == 1


def set_wakeups(server, on):
    conn = server.connect()
    conn.cursor().execute(f"ALTER SYSTEM SET pg_throttle.wakeups = {'on' if on else 'off'}")
    conn.cursor().execute("SELECT pg_reload_conf()")
    conn.close()
    time.sleep(0.5)


def after_fault(tap, server, fault, fell_due_while_down):
    """Events ahead across `fault` (a callable that breaks and brings back the server) are
    announced at their instant; with `fell_due_while_down`, one that fell due while the server
    was down is announced when wake-ups come back (they come back off, then are turned on with a
    listener connected, so the first pass is heard)."""
    conn = reconnect(dbname=DB, user="postgres", **server.address())
    down = schedule(conn, "fault", f"down-{fault.__name__}", 1.0) if fell_due_while_down else None
    ahead = [schedule(conn, "fault", f"{fault.__name__}-{i}", 4.0 + i) for i in range(2)]
    conn.close()
    if fell_due_while_down:
        set_wakeups(server, False)
    fault(server)
    if fell_due_while_down:
        time.sleep(max(0.0, down[1] + 0.5 - time.time()))
    listener = Listener(server, DB, "fault")
    if fell_due_while_down:
        turned_on = time.time()
        set_wakeups(server, True)
    listener.wait(max(0.5, ahead[-1][1] + LATE - time.time()))
    if fell_due_while_down:
        at = listener.first(down[0])
        tap.ok(at is not None and at - turned_on <= 3,
               f"{fault.__name__}: what fell due while it was down is announced as it comes back",
               f"heard {None if at is None else round(at - turned_on, 3)} s after")
    for i, event in enumerate(ahead):
        heard_on_time(tap, listener, event, f"{fault.__name__}: an event ahead ({i + 1} of 2)")
    listener.close()


def backend_crash(server):
    conn = server.connect(DB)
    pid = one(conn, "SELECT pg_backend_pid()")[0]
    os.kill(pid, 9)
    conn.close()
    time.sleep(0.5)


def postmaster_crash(server):
    kill_postmaster(server.data, server.directory)
    time.sleep(1.5)
    server.ctl("start")


def clean_restart(server):
    server.ctl("restart", "-m", "fast")


def promotion(tap, primary, directory):
    standby = OwnServer(os.path.join(directory, "standby"), primary.port + 1,
                        CONF + "hot_standby = on\n")
    standby.make_directory()
    as_postgres(f"{BIN}/pg_basebackup", "-h", primary.directory, "-p", str(primary.port), "-U",
                "postgres", "-D", standby.data, "-R", "-X", "stream", "-c", "fast")
    standby.configure()
    standby.ctl("start")
    conn = primary.connect(DB)
    ahead = [schedule(conn, "failover", f"f{i}", 5.0 + i) for i in range(2)]
    lsn = one(conn, "SELECT pg_current_wal_lsn()")[0]
    conn.close()
    replica = reconnect(dbname=DB, user="postgres", **standby.address())
    for _ in range(100):
        if one(replica, "SELECT pg_last_wal_replay_lsn() >= %s::pg_lsn", (lsn,))[0]:
            break
        time.sleep(0.1)
    tap.ok(not waker_of(replica, DB), "a standby runs no waker")
    replica.close()
    primary.ctl("stop", "-m", "fast")
    standby.ctl("promote")
    listener = Listener(standby, DB, "failover")
    listener.wait(max(0.5, ahead[-1][1] + LATE - time.time()))
    for i, event in enumerate(ahead):
        heard_on_time(tap, listener, event, f"after a promotion: an event ahead ({i + 1} of 2)")
    listener.close()
    every_second_once(tap, standby)
    standby.ctl("stop", "-m", "fast")


def every_second_once(tap, server):
    """The every-second schedule 'tick' ran across every fault above: each second from its first
    firing to now enqueued exactly once (catch_up all filled what fell while the server was down
    or the wake-ups were off), and it still fires on the promoted server."""
    conn = reconnect(dbname=DB, user="postgres", **server.address())
    time.sleep(2.5)
    rows = one(conn, "SELECT count(*), count(DISTINCT item_key), "
                     "extract(epoch FROM max(run_at) - min(run_at))::int + 1, "
                     "extract(epoch FROM now() - max(run_at)) FROM throttle.all_events "
                     "WHERE queue = 'ticks'")
    count, distinct, span, behind = rows
    tap.ok(count == distinct == span and count > 20,
           f"recurring every second across crashes, restarts and a promotion: each of {span} "
           f"seconds enqueued once", f"{count} events, {distinct} keys, {span} seconds")
    tap.ok(float(behind) < 2.5, "and the promoted server fires it on time",
           f"the last firing {float(behind):.1f} s ago")
    conn.close()


def switched_off(tap, server):
    set_wakeups(server, False)
    conn = server.connect(DB)
    listener = Listener(server, DB, "quiet")
    event = schedule(conn, "quiet", "q", 0.3)
    listener.wait(1.2)
    tap.ok(listener.first(event[0]) is None, "pg_throttle.wakeups = off: nothing is announced")
    tap.ok(not waker_of(conn, DB), "and no waker runs")
    listener.close()
    set_wakeups(server, True)
    listener = Listener(server, DB, "quiet")
    later = schedule(conn, "quiet", "q2", 0.5)
    listener.wait(0.5 + LATE)
    heard_on_time(tap, listener, later, "turned on again")
    listener.close()
    conn.close()


def privileges(tap, server):
    conn = server.connect(DB)
    conn.cursor().execute("CREATE ROLE plain LOGIN")
    plain = server.connect(DB, user="plain")
    for call in ("throttle._announce_due('-infinity', now())", "throttle._waker_start()"):
        tap.is_((sql_error(plain, f"SELECT {call}") or ("",))[0], "42501",
                f"{call.split('(')[0]} is not PUBLIC's")
    plain.close()
    # The pass itself, by hand: what fell due in (after, upto], and the next instant.
    cur = conn.cursor()
    cur.execute("LISTEN byhand")
    cur.execute("SELECT throttle.schedule('byhand', 'k' || g, "
                "'2100-01-01'::timestamptz + g * interval '1 minute') FROM generate_series(1, 3) g")
    ids = [r[0] for r in cur.fetchall()]
    conn.notifies.clear()
    cur.execute("SELECT throttle._announce_due('2100-01-01 00:00:30', '2100-01-01 00:02:00')")
    nxt = cur.fetchone()[0]
    conn.poll()
    tap.is_(sorted(int(n.payload) for n in conn.notifies if n.channel == "byhand"), ids[:2],
            "_announce_due announces the events due in (after, upto]")
    tap.is_(nxt.isoformat(), "2100-01-01T00:03:00+00:00", "and answers the next instant")
    cur.execute("SELECT throttle.cancel('byhand', 'k' || g) FROM generate_series(1, 3) g")
    conn.close()


def main():
    tap = Tap(44)
    port = int(os.environ.get("PGPORT", "5432")) + 20
    directory = tempfile.mkdtemp(prefix="pg_throttle_wakeups.")
    os.chmod(directory, 0o755)
    subprocess.run(["chown", "postgres:postgres", directory], check=True)
    server = OwnServer(os.path.join(directory, "primary"), port,
                       CONF + "max_wal_senders = 4\nlog_min_messages = log\n")
    try:
        server.init()
        server.connect().cursor().execute(f"CREATE DATABASE {DB}")
        conn = server.connect(DB)
        conn.cursor().execute("CREATE EXTENSION pg_throttle")
        far = far_ahead_begin(server)
        time.sleep(2)
        tap.ok(not waker_of(server.connect(), "far"),
               "a waker whose next instant is over a minute away leaves its worker slot")
        due_time(tap, server, conn)
        databases_apart(tap, server, conn)
        conn.close()
        switched_off(tap, server)
        drop_extension_mid_pass(tap, server)
        privileges(tap, server)
        far_ahead_end(tap, server, *far)
        ticks = server.connect(DB)
        ticks.cursor().execute("INSERT INTO throttle.recurring (name, queue, cron, catch_up, "
                               "catch_up_window) VALUES ('tick', 'ticks', '* * * * * *', 'all', "
                               "'1 hour')")
        ticks.close()
        for fault in (backend_crash, postmaster_crash, clean_restart):
            after_fault(tap, server, fault, fell_due_while_down=False)
        for fault in (postmaster_crash, clean_restart):
            after_fault(tap, server, fault, fell_due_while_down=True)
        promotion(tap, server, directory)
    finally:
        for name in ("primary", "standby"):
            data = os.path.join(directory, name, "data")
            if os.path.exists(os.path.join(data, "postmaster.pid")):
                subprocess.run(["runuser", "-u", "postgres", "--", f"{BIN}/pg_ctl", "-D", data,
                                "-m", "immediate", "stop"], capture_output=True)
        if tap.failed:
            print(server.log()[-6000:], file=sys.stderr)
        shutil.rmtree(directory, ignore_errors=True)
    tap.done()


if __name__ == "__main__":
    main()
