#!/usr/bin/python3
"""Fence tokens keep fencing after a migration (docs/locks.md, "Tokens across a
migration"; docs/operations.md, "A dump restored into another cluster").

A dump restored into a new cluster brings rows that carry the old cluster's fence tokens (a
writer's fence column, the queue's claim tokens), while the new cluster's counter starts again
at 1: without more, the documented fencing pattern refuses the new holders' writes. The
procedure: read the old cluster's floor with throttle.advance_fence(0), restore, advance the new
cluster's counter past it (or past the greatest token in the restored rows). Then new tokens
are greater, also after a postmaster kill (the advance is in WAL and in pg_throttle.fence) and
on a standby promoted later (WAL carries it). Only superusers may advance, only on a primary,
within 0 .. 2^62.

Runs servers of its own (old, new and a standby of the new), on Unix sockets in a temporary
directory, with the port number PGPORT + 10 (no TCP port is opened).
"""
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time

import psycopg2

sys.path.insert(0, os.path.dirname(__file__))
from cluster import BIN, OwnServer, as_postgres, kill_postmaster, reconnect  # noqa: E402
from pgconn import one, sql_error  # noqa: E402
from tap import Tap  # noqa: E402

DB = "app"
CONF = "shared_preload_libraries = 'pg_throttle'\nfsync = off\n"
CRASH_PAST = 5_000_000_000
CHECKPOINTED_PAST = 6_000_000_000
STANDBY_PAST = 12_000_000_000
HIGHER_PAST = 9_000_000_000
LOWER_PAST = 8_500_000_000
MOST = 2 ** 62


def lock(conn, name):
    return one(conn, "SELECT throttle.lock(%s, ttl => '1 hour')", (name,))[0]


def fill_old(tap, old):
    """The old cluster: 13 lock grants, a row written under the 13th token, a finished claim and
    an open one."""
    old.connect().cursor().execute(f"CREATE DATABASE {DB}")
    conn = old.connect(DB)
    cur = conn.cursor()
    cur.execute("CREATE EXTENSION pg_throttle")
    cur.execute("CREATE TABLE invoice (id bigint PRIMARY KEY, status text NOT NULL, "
                "fence bigint NOT NULL DEFAULT 0)")
    cur.execute("INSERT INTO invoice (id, status) VALUES (42, 'new')")
    tokens = [lock(conn, f"invoice:{i}") for i in range(1, 14)]
    tap.is_(tokens, list(range(1, 14)), "a fresh cluster's tokens run 1 .. 13")
    cur.execute("UPDATE invoice SET status = 'sent', fence = %s WHERE id = 42 AND fence <= %s",
                (tokens[-1], tokens[-1]))
    for group in ("done", "open"):
        cur.execute("SELECT throttle.schedule('mail', %s, now() - interval '1 second', "
                    "group_key => %s)", (group, group))
    done = one(conn, "SELECT claim_token FROM throttle.claim_group('mail', 'w1')")[0]
    cur.execute("SELECT throttle.complete(ARRAY(SELECT id FROM throttle.event "
                "WHERE item_key = 'done'), %s)", (done,))
    one(conn, "SELECT claim_token FROM throttle.claim_group('mail', 'w1')")
    floor = one(conn, "SELECT throttle.advance_fence(0)")[0]
    tap.is_(floor, 15, "advance_fence(0) on the old cluster answers its floor, the last token")
    tap.is_(lock(conn, "after"), 16, "advance_fence(0) moved nothing")
    conn.close()
    return floor


def restore(old, new, directory):
    dump = os.path.join(directory, "app.dump")
    as_postgres(f"{BIN}/pg_dump", "-h", old.directory, "-p", str(old.port), "-U", "postgres",
                "-Fc", "-f", dump, DB)
    new.connect().cursor().execute(f"CREATE DATABASE {DB}")
    as_postgres(f"{BIN}/pg_restore", "-h", new.directory, "-p", str(new.port), "-U",
                "postgres", "-d", DB, "--exit-on-error", dump)


def migration(tap, new, old_floor):
    conn = new.connect(DB)
    cur = conn.cursor()
    restored = one(conn, "SELECT greatest((SELECT max(fence) FROM invoice), "
                         "(SELECT max(claim_token) FROM throttle.event), "
                         "(SELECT max(claim_token) FROM throttle.event_history))")[0]
    tap.is_(restored, 15, "the restored rows carry the old cluster's tokens (up to 15)")
    # The procedure of docs/locks.md, from the old cluster's floor.
    floor = one(conn, "SELECT throttle.advance_fence(%s)", (old_floor,))[0]
    tap.is_(floor, old_floor, "advance_fence returns the new floor")
    token = lock(conn, "invoice:42")
    tap.ok(token > old_floor, f"a lock on the new cluster: token {token} > {old_floor}")
    cur.execute("UPDATE invoice SET status = 'void', fence = %s WHERE id = 42 AND fence <= %s",
                (token, token))
    tap.is_(cur.rowcount, 1, "the fencing pattern accepts the new holder's write")
    cur.execute("SELECT throttle.schedule('mail', 'later', now() - interval '1 second', "
                "group_key => 'later')")
    claim = one(conn, "SELECT claim_token FROM throttle.claim_group('mail', 'w2')")[0]
    tap.ok(claim > token, f"a claim on the new cluster: token {claim} > {token}")
    floor = one(conn, "SELECT throttle.advance_fence(3)")[0]
    tap.is_(floor, claim, "advancing below the floor moves nothing and answers the floor")
    conn.close()


def refusals(tap, new):
    conn = new.connect(DB)
    cur = conn.cursor()
    cur.execute("CREATE ROLE fence_app LOGIN; CREATE ROLE fence_granted LOGIN")
    cur.execute("GRANT EXECUTE ON FUNCTION throttle.advance_fence(bigint) TO fence_granted")
    for role, why in (("fence_app", "without EXECUTE"), ("fence_granted", "even with EXECUTE")):
        other = new.connect(DB, user=role)
        tap.is_((sql_error(other, "SELECT throttle.advance_fence(100)") or [None])[0], "42501",
                f"a role that is not a superuser cannot advance the counter, {why} (42501)")
        other.close()
    for past, code, what in (
            ("-1", "22023", "a negative past"),
            (str(MOST + 1), "22003", "a past above 2^62 (tokens keep room to grow)"),
            (str(2 ** 63 - 1), "22003", "the largest bigint"),
            ("NULL", "22004", "NULL")):
        tap.is_((sql_error(conn, f"SELECT throttle.advance_fence({past})") or [None])[0], code,
                f"advance_fence refuses {what} ({code})")
    conn.close()


def restart_after_kill(server):
    kill_postmaster(server.data, server.directory)
    server.ctl("start")
    return reconnect(dbname=DB, user="postgres", **server.address())


def crashes(tap, new):
    conn = new.connect(DB)
    tap.is_(one(conn, "SELECT throttle.advance_fence(%s)", (CRASH_PAST,))[0], CRASH_PAST,
            f"advance_fence({CRASH_PAST}) above the durable block")
    conn.close()
    conn = restart_after_kill(new)
    token = lock(conn, "after-kill")
    tap.ok(token > CRASH_PAST,
           f"after a postmaster kill right after the advance: {token} > {CRASH_PAST}")
    one(conn, "SELECT throttle.advance_fence(%s)", (CHECKPOINTED_PAST,))
    conn.cursor().execute("CHECKPOINT")
    conn.close()
    conn = restart_after_kill(new)
    token = lock(conn, "after-checkpoint-kill")
    tap.ok(token > CHECKPOINTED_PAST,
           f"after a checkpoint and a postmaster kill (pg_throttle.fence): {token} > "
           f"{CHECKPOINTED_PAST}")
    conn.close()


def concurrent_advances(tap, new):
    """Two advances at once, the first (higher) held in its wait for the
    synchronous standbys after its write: the second must not write a lower
    limit over it, which a checkpoint and a postmaster kill would believe."""
    conn = new.connect(DB)
    conn.cursor().execute("ALTER SYSTEM SET synchronous_standby_names = 'nosuch'")
    one(conn, "SELECT pg_reload_conf()")
    time.sleep(0.5)
    results = {}

    def advance(past):
        c = new.connect(DB)
        try:
            results[past] = one(c, "SELECT throttle.advance_fence(%s)", (past,))[0]
        finally:
            c.close()

    def held(past):
        for _ in range(100):
            if one(conn, "SELECT count(*) FROM pg_stat_activity WHERE query LIKE %s "
                         "AND wait_event = 'SyncRep'", (f"%advance_fence({past})%",))[0]:
                return True
            time.sleep(0.05)
        return False

    threads = []
    for past in (HIGHER_PAST, LOWER_PAST):
        thread = threading.Thread(target=advance, args=(past,))
        thread.start()
        threads.append(thread)
        held(past)
    conn.cursor().execute("ALTER SYSTEM RESET synchronous_standby_names")
    one(conn, "SELECT pg_reload_conf()")
    for thread in threads:
        thread.join(30)
    conn.cursor().execute("CHECKPOINT")
    conn.close()
    conn = restart_after_kill(new)
    token = lock(conn, "after-concurrent-advances")
    tap.ok(results.get(HIGHER_PAST, 0) >= HIGHER_PAST and token > HIGHER_PAST,
           f"two advances at once, a checkpoint and a postmaster kill: {token} > {HIGHER_PAST}",
           repr(results))
    conn.close()


def standby_of(tap, new, directory):
    standby = OwnServer(os.path.join(directory, "standby"), new.port, CONF + "hot_standby = on\n")
    standby.make_directory()
    as_postgres(f"{BIN}/pg_basebackup", "-h", new.directory, "-p", str(new.port), "-U",
                "postgres", "-D", standby.data, "-R", "-X", "stream", "-c", "fast")
    standby.configure()
    standby.ctl("start")
    replica = reconnect(dbname=DB, user="postgres", **standby.address())
    tap.is_((sql_error(replica, "SELECT throttle.advance_fence(1)") or [None])[0], "25006",
            "a standby refuses advance_fence (25006)")
    primary = new.connect(DB)
    one(primary, "SELECT throttle.advance_fence(%s)", (STANDBY_PAST,))
    target = one(primary, "SELECT pg_current_wal_flush_lsn()")[0]
    for _ in range(300):
        if one(replica, "SELECT pg_last_wal_replay_lsn() >= %s::pg_lsn", (target,))[0]:
            break
        time.sleep(0.1)
    primary.close()
    replica.close()
    new.ctl("stop", "-m", "immediate")
    standby.ctl("promote")
    promoted = reconnect(dbname=DB, user="postgres", **standby.address())
    for _ in range(300):
        if not one(promoted, "SELECT pg_is_in_recovery()")[0]:
            break
        time.sleep(0.1)
    token = lock(promoted, "after-promotion")
    tap.ok(token > STANDBY_PAST,
           f"a standby promoted after the advance continues above it: {token} > {STANDBY_PAST}")
    promoted.close()
    return standby


def main():
    tap = Tap(22)
    port = int(os.environ.get("PGPORT", "5432")) + 10
    directory = tempfile.mkdtemp(prefix="pg_throttle_fence.")
    os.chmod(directory, 0o755)
    subprocess.run(["chown", "postgres:postgres", directory], check=True)
    servers = [OwnServer(os.path.join(directory, name), port, CONF) for name in ("old", "new")]
    old, new = servers
    try:
        for server in servers:
            server.init()
        old_floor = fill_old(tap, old)
        restore(old, new, directory)
        old.ctl("stop", "-m", "fast")
        probe = new.connect(DB)
        tap.ok(lock(probe, "probe") <= 15,
               "without the procedure the new cluster's counter starts again below the old one")
        probe.close()
        migration(tap, new, old_floor)
        refusals(tap, new)
        crashes(tap, new)
        concurrent_advances(tap, new)
        servers.append(standby_of(tap, new, directory))
    except (psycopg2.Error, OSError, subprocess.CalledProcessError) as e:
        stderr = getattr(e, "stderr", "") or ""
        tap.ok(False, f"the migration steps ran: {e}",
               stderr + "\n".join(s.log()[-3000:] for s in servers))
    finally:
        for server in servers:
            try:
                server.ctl("stop", "-m", "immediate")
            except Exception:  # noqa: BLE001 - already stopped
                pass
        shutil.rmtree(directory, ignore_errors=True)
    tap.done()


if __name__ == "__main__":
    main()
