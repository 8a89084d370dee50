#!/usr/bin/python3
"""Clean restarts keep the registry exactly (intervals, bucket levels, leases
and fence tokens), and files that are damaged, missing or stale never let a
promise go:
- a damaged state file: a WARNING, and the crash rule for resources and buckets;
- a state file left by a server started as a standby is removed, never read
  after a later crash (it would bring back windows that have ended);
- a registry too small for the state file: the entries left out fall under
  the crash rule instead of being forgotten;
- a damaged or missing fence file: a WARNING, and tokens still grow;
- a damaged lease journal: a WARNING, the leases it still holds, and every
  other lock name held for pg_throttle.max_lease, through later crashes and
  clean restarts; a record damaged in the middle of a log counts as damage,
  not as a write a crash cut short;
- the crash rule outlives clean restarts, and each call decides on its own
  interval or bucket shape;
- a release whose WAL record was never flushed stays released after a
  postmaster kill (redo does not bring back the grant);
- a paused queue or group stays paused (throttle.queue_pause is a table);
- owners survive: after a clean restart and a crash a lease still belongs to
  the role that took it (only it may renew or unlock it), and each role's
  count of entries (its quota) is what it was; a journal written before
  leases had owners is still read, its leases owned by nobody known.

Restarts the cluster this suite runs against, so it runs on a cluster of its own
(pg_throttle.max_lease = 30 s).
"""
import datetime
import glob
import os
import struct
import sys
import time

import psycopg2

sys.path.insert(0, os.path.dirname(__file__))
from cluster import (execute, kill_backend, kill_postmaster, pg_ctlcluster,  # noqa: E402
                     reconnect, server_log)
from pgconn import connect, one  # noqa: E402
from tap import Tap  # noqa: E402

CLOCK = "2039-01-01 00:00:00+00"
MAX_LEASE_S = 30


def session():
    conn = connect()
    execute(conn, "SET pg_throttle.test_clock = %s", (CLOCK,))
    return conn


def acquire_or_full(conn, name, every):
    """acquire's answer; False when the registry is full (53200)."""
    try:
        return one(conn, "SELECT throttle.acquire(%s, %s)", (name, every))[0]
    except Exception as e:  # noqa: BLE001
        if getattr(e, "pgcode", None) == "53200":
            return False
        raise


def clean_restarts(tap, data_dir):
    conn = session()
    tap.ok(one(conn, "SELECT throttle.acquire('rs.job', '1 hour')")[0], "resource granted before")
    one(conn, "SELECT * FROM throttle.take('rs.bucket', 10, '1 second', 10, 7)")
    lease = one(conn, "SELECT throttle.lock('rs.lease', ttl => '10 seconds')")[0]
    expires = one(conn, "SELECT expires_at FROM throttle.locks WHERE name = 'rs.lease'")[0]
    session_lock = one(conn, "SELECT throttle.lock('rs.session')")[0]
    # The same name on the test clock and on the real clock: two entries.
    # (The real clock's calls ask for a millisecond: an earlier part left the
    # crash rule in force, under which a new name counts as granted at R.)
    one(conn, "SELECT throttle.acquire('rs.both', '1 hour')")
    real = connect()
    tap.ok(one(real, "SELECT throttle.acquire('rs.both', '1 millisecond')")[0],
           "a grant on the test clock does not hold the same resource on the real clock")
    real.close()
    before = one(conn, "SELECT count(*) FROM throttle.status WHERE kind <> 'lock'")[0]
    # A paused queue and a paused group (rows of throttle.queue_pause).
    one(conn, "SELECT throttle.schedule('rs.paused', 'a', throttle.now() - interval '1 hour'),"
              "       throttle.schedule('rs.paused', 'g', throttle.now() - interval '1 hour', group_key => 'G'),"
              "       throttle.schedule('rs.paused.g', 'h', throttle.now() - interval '1 hour', group_key => 'H'),"
              "       throttle.pause('rs.paused'), throttle.pause('rs.paused.g', 'H')")
    conn.close()

    pg_ctlcluster("restart", "-m", "fast")
    conn = session()
    tap.is_(one(conn, "SELECT (SELECT count(*) FROM throttle.claim('rs.paused', 'w')),"
                      "       (SELECT count(*) FROM throttle.claim_group('rs.paused', 'w')),"
                      "       (SELECT count(*) FROM throttle.claim_group('rs.paused.g', 'w'))"),
            (0, 0, 0), "after a clean restart a paused queue and a paused group hand out nothing")
    tap.is_(one(conn, "SELECT array_agg(queue || ':' || paused || ':' || paused_groups ORDER BY queue) "
                      "FROM throttle.queue_metrics WHERE queue LIKE 'rs.paused%'")[0],
            ["rs.paused:true:0", "rs.paused.g:false:1"], "and queue_metrics still shows them paused")
    tap.ok(not one(conn, "SELECT throttle.acquire('rs.job', '1 hour')")[0],
           "after a clean restart the resource is still taken")
    tap.is_(one(conn, "SELECT remaining FROM throttle.take('rs.bucket', 10, '1 second', 10, 0)")[0], 3,
            "the bucket's level is exactly what it was (3 of 10 left)")
    tap.ok(one(conn, "SELECT throttle.lock('rs.lease', ttl => '10 seconds')")[0] is None,
           "the lease is still held")
    tap.is_(one(conn, "SELECT token, expires_at FROM throttle.locks WHERE name = 'rs.lease'"),
            (lease, expires), "with the same fence token and expiry")
    tap.ok(one(conn, "SELECT throttle.renew('rs.lease', %s, '10 seconds')", (lease,))[0],
           "which its holder can still renew")
    after_token = one(conn, "SELECT throttle.lock('rs.session')")[0]
    tap.ok(after_token is not None, "a session lock died with its session")
    tap.ok(after_token > max(lease, session_lock), "new tokens stay above every token before the restart")
    tap.is_(one(conn, "SELECT count(*) FROM throttle.status WHERE kind <> 'lock'")[0], before,
            "status shows the same resources and buckets")
    real = connect()
    answers = [one(c, "SELECT throttle.acquire('rs.both', %s)", (every,))[0]
               for c, every in ((conn, "1 hour"), (real, "1 millisecond"), (conn, "1 hour"))]
    tap.ok(answers == [False, True, False],
           "after the restart the test clock's grant still holds on its clock (two calls), "
           "and not on the real clock", repr(answers))
    real.close()
    conn.close()

    # A smart shutdown (waits for sessions to end) keeps it all the same way.
    pg_ctlcluster("restart", "-m", "smart")
    conn = session()
    tap.is_(one(conn, "SELECT remaining FROM throttle.take('rs.bucket', 10, '1 second', 10, 0)")[0], 3,
            "after a smart restart the bucket's level is still exactly 3")
    tap.is_(one(conn, "SELECT token FROM throttle.locks WHERE name = 'rs.lease'")[0], lease,
            "and the lease keeps its token")
    conn.close()

    # A damaged file: a WARNING in the log, the crash rule, a running server.
    pg_ctlcluster("stop", "-m", "fast")
    with open(os.path.join(data_dir, "pg_throttle.state"), "r+b") as f:
        f.seek(40)
        f.write(b"\xff\xff\xff\xff")
    pg_ctlcluster("start")
    tap.ok("ignoring pg_throttle state file" in server_log(), "a damaged state file: a WARNING")
    real = connect()
    tap.ok([one(real, "SELECT throttle.acquire('rs.job', '1 hour')")[0] for _ in range(2)] == [False, False],
           "and the resource it held counts as granted at the start (two calls)")
    conn = session()
    tap.ok(one(conn, "SELECT throttle.acquire('rs.job', '1 hour')")[0],
           "(a test clock past that window is granted: the server runs)")
    conn.close()
    real.close()


PASSWORD = "restart-test-password"


def as_role(role):
    return connect(user=role, password=PASSWORD)


def owners(tap, data_dir):
    admin = connect()
    for role in ("rs_alice", "rs_bob"):
        if one(admin, "SELECT count(*) FROM pg_roles WHERE rolname = %s", (role,))[0] == 0:
            execute(admin, f"CREATE ROLE {role} LOGIN PASSWORD '{PASSWORD}'")
    admin.close()
    alice = as_role("rs_alice")
    one(alice, "SELECT count(*) FROM (SELECT throttle.acquire('own.job.' || g, '1 hour') "
               "FROM generate_series(1, 5) AS g) s")
    lease = one(alice, "SELECT throttle.lock('own.lease', ttl => '20 seconds')")[0]
    alice.close()

    def usage():
        conn = connect()
        row = one(conn, "SELECT entries FROM throttle.usage WHERE scope = 'role' "
                        "AND name = 'rs_alice'")
        conn.close()
        return row[0] if row else 0

    before = usage()
    pg_ctlcluster("restart", "-m", "fast")
    tap.is_(usage(), before, f"after a clean restart the role still holds its {before} entries")
    bob = as_role("rs_bob")
    tap.is_(one(bob, "SELECT throttle.renew('own.lease', %s, '20 seconds')", (lease,))[0], False,
            "another role still cannot renew the lease")
    alice = as_role("rs_alice")
    tap.ok(one(alice, "SELECT throttle.renew('own.lease', %s, '20 seconds')", (lease,))[0],
           "its owner can")
    kill_backend(alice)
    alice = reconnect(user="rs_alice", password=PASSWORD)
    try:
        one(bob, "SELECT 1")
    except psycopg2.Error:
        pass
    bob.close()
    bob = reconnect(user="rs_bob", password=PASSWORD)
    tap.is_(one(bob, "SELECT throttle.unlock('own.lease', %s)", (lease,))[0], False,
            "after a crash the lease restored from the journal is still the owner's: another "
            "role cannot unlock it")
    tap.ok(one(alice, "SELECT throttle.unlock('own.lease', %s)", (lease,))[0],
           "and its owner can (twice: the second is false)")
    tap.ok(not one(alice, "SELECT throttle.unlock('own.lease', %s)", (lease,))[0],
           "the second unlock finds it released")
    alice.close()
    bob.close()


def crc32c(data):
    crc = 0xFFFFFFFF
    for byte in data:
        crc ^= byte
        for _ in range(8):
            crc = (crc >> 1) ^ (0x82F63B78 & -(crc & 1))
    return crc ^ 0xFFFFFFFF


PG_EPOCH_US = 946_684_800 * 1_000_000  # 2000-01-01 on the Unix clock, in microseconds


def record_before_owners(tap, data_dir):
    """A lease journal written before leases had owners (records of 312
    bytes, magic "PGLR") is still read: its lease comes back, owned by nobody
    known, so that only a superuser may release it."""
    admin = connect()
    dbid = one(admin, "SELECT oid FROM pg_database WHERE datname = current_database()")[0]
    token = one(admin, "SELECT throttle.lock('v2.probe')")[0] + 1000
    admin.close()
    pg_ctlcluster("stop", "-m", "fast")
    now_us = int(time.time() * 1_000_000) - PG_EPOCH_US
    name = b"v2.lease"
    lease = struct.pack("<qqqqIiB200s64s", 1 << 50, token, now_us, now_us + 60_000_000, dbid,
                        4242, len(name), name, b"an older pg_throttle")
    lease += b"\0" * (312 - len(lease))
    block = struct.pack("<II", 0x50474C52, crc32c(lease)) + lease
    block += b"\0" * (512 - len(block))
    logs = sorted(glob.glob(os.path.join(data_dir, "pg_throttle.lease_log.*")),
                  key=lambda p: int(p.rsplit(".", 1)[1]))
    with open(logs[-1], "r+b") as f:
        f.seek(0, os.SEEK_END)
        f.write(b"\0" * (-f.tell() % 512) + block)
    pg_ctlcluster("start")
    admin = reconnect()
    tap.is_(one(admin, "SELECT owner, token FROM throttle.locks WHERE name = 'v2.lease'"),
            (None, token), "a record of before owners is read: its lease is back, owner not known")
    alice = as_role("rs_alice")
    tap.is_(one(alice, "SELECT token FROM throttle.locks WHERE name = 'v2.lease'")[0], None,
            "an ordinary role does not see its token")
    tap.is_(one(alice, "SELECT throttle.unlock('v2.lease', %s)", (token,))[0], False,
            "nor can it release it, even with the token")
    tap.ok(one(admin, "SELECT throttle.unlock('v2.lease', %s)", (token,))[0],
           "a superuser can")
    alice.close()
    admin.close()


def stale_state_file(tap, data_dir):
    """A server started as a standby never reads the state file; it must not
    leave it for a later start either. Promoted and stopped cleanly before any
    call noticed the promotion, it must not pass off its own registry as
    complete."""
    conn = connect()
    tap.ok(one(conn, "SELECT throttle.acquire('st.job', '1 second')")[0], "a one-second resource")
    conn.close()
    pg_ctlcluster("stop", "-m", "fast")
    state = os.path.join(data_dir, "pg_throttle.state")
    tap.ok(os.path.exists(state), "a clean shutdown writes the state file")
    open(os.path.join(data_dir, "standby.signal"), "w").close()
    pg_ctlcluster("start")
    tap.ok(not os.path.exists(state), "a server started as a standby removes the state file")
    conn = reconnect()
    tap.ok(one(conn, "SELECT pg_promote(true, 30)")[0], "and is promoted")
    promoted = one(conn, "SELECT now()")[0]
    conn.close()
    pg_ctlcluster("restart", "-m", "fast")
    conn = reconnect()
    answers = [one(conn, "SELECT throttle.acquire('st.fresh', '1 hour')")[0] for _ in range(2)]
    since = one(conn, "SELECT granted_at FROM throttle.status WHERE name = 'st.fresh'")
    tap.ok(answers == [False, False] and since is not None and since[0] >= promoted,
           "promoted and restarted before any call noticed the promotion: a new resource counts "
           "as granted at that restart, after the promotion (two calls)", repr((answers, since)))
    time.sleep(1.5)  # the one-second window has ended
    kill_backend(conn)
    conn = reconnect()
    tap.ok([one(conn, "SELECT throttle.acquire('st.job', '1 hour')")[0] for _ in range(2)] == [False, False],
           "after a crash the resource counts as granted at the restart, not as the stale file said")
    conn.close()


def crash_then_clean_restarts(tap, data_dir):
    """The crash rule outlives clean restarts: a name first asked for after
    them still counts as granted at the crash's restart. Each call decides on
    its own terms: a short interval or a fast bucket asked first does not
    shorten the rule for a longer one."""
    kill_postmaster(data_dir)
    pg_ctlcluster("start")
    conn = reconnect()
    # A wait cancelled while it sleeps gives its reservation back, and the
    # bucket is again what the rule says: empty at R for every shape.
    execute(conn, "SET statement_timeout = '1s'")
    try:
        one(conn, "SELECT throttle.wait('cr.waited', 10, '1 minute', 10, 1)")
        cancelled = False
    except psycopg2.Error as e:
        cancelled = e.pgcode == "57014"
    execute(conn, "RESET statement_timeout")
    takes = [one(conn, "SELECT allowed FROM throttle.take('cr.waited', 100, '1 hour', 100, 50)")[0]
             for _ in range(2)]
    tap.ok(cancelled and takes == [False, False],
           "after a postmaster kill, a wait cancelled while it sleeps leaves the bucket empty "
           "(two takes)")
    # The restart R, from the entry a denied call leaves; then the test clock
    # puts the calls at exact instants after it.
    one(conn, "SELECT throttle.acquire('cr.probe', '1 hour')")
    restart = one(conn, "SELECT granted_at FROM throttle.status WHERE name = 'cr.probe'")[0]
    at = lambda delta: (restart + delta).isoformat()  # noqa: E731
    execute(conn, "SET pg_throttle.test_clock = %s", (at(datetime.timedelta(seconds=1)),))
    tap.ok(not one(conn, "SELECT throttle.acquire('cr.mixed', '2 seconds')")[0],
           "after a postmaster kill, a new name asked for two seconds is not granted 1 s later")
    one(conn, "SELECT * FROM throttle.take('cr.peeked', 1000, '1 second', 1000, 0)")
    execute(conn, "SET pg_throttle.test_clock = %s", (at(datetime.timedelta(minutes=1)),))
    tap.ok([one(conn, "SELECT throttle.acquire('cr.mixed', '1 hour')")[0] for _ in range(2)]
           == [False, False],
           "a minute later, the same name asked for an hour is still taken (two calls)")
    tap.ok([one(conn, "SELECT allowed FROM throttle.take('cr.peeked', 10, '1 hour', 10)")[0]
            for _ in range(2)] == [False, False],
           "a bucket peeked with a fast shape is still empty for a slow one (two takes)")
    # Waits alone: the bucket is full again one burst period after R, and
    # each wait counts from R, not from the wait before it.
    waits = [one(conn, "SELECT throttle.wait('cr.waits', 10, '10 seconds', 10, 5, "
                       "timeout => '100 milliseconds')")[0] for _ in range(2)]
    tap.ok(waits == [True, True], "a minute after R, two waits take the whole burst at once",
           repr(waits))
    conn.close()
    for restart in (1, 2):
        pg_ctlcluster("restart", "-m", "fast")
        conn = reconnect()
        answers = [one(conn, f"SELECT throttle.acquire('cr.unknown{restart}', '1 hour')")[0],
                   one(conn, f"SELECT throttle.acquire('cr.unknown{restart}', '1 hour')")[0],
                   one(conn, f"SELECT throttle.allow('cr.bucket{restart}', 10, '1 hour', 10)")[0],
                   one(conn, f"SELECT throttle.allow('cr.bucket{restart}', 10, '1 hour', 10)")[0]]
        tap.ok(answers == [False] * 4,
               f"after the crash and {restart} clean restart(s), new names still count as "
               "granted at the crash (two acquires, two allows)", repr(answers))
        conn.close()


def release_before_crash(tap, data_dir):
    """A release is journaled but its WAL record is not flushed: after a
    postmaster kill, redo of the (flushed) grant must not bring the lease back."""
    conn = connect()
    execute(conn, "ALTER SYSTEM SET wal_writer_delay = '10s'")
    one(conn, "SELECT pg_reload_conf()")
    time.sleep(0.5)
    token = one(conn, "SELECT throttle.lock('rb.lease', ttl => '30 seconds')")[0]
    tap.ok(one(conn, "SELECT throttle.unlock('rb.lease', %s)", (token,))[0], "a lease released")
    conn.close()
    kill_postmaster(data_dir)
    pg_ctlcluster("start")
    conn = reconnect()
    again = [one(conn, "SELECT throttle.lock('rb.lease', ttl => '5 seconds')")[0] for _ in range(2)]
    tap.ok(again[0] is not None and again[0] > token and again[1] is None,
           "after a postmaster kill, the released lease stays released (two calls)", repr(again))
    execute(conn, "ALTER SYSTEM RESET wal_writer_delay")
    one(conn, "SELECT pg_reload_conf()")
    conn.close()


def many_generations(tap, data_dir):
    """The journal's generation (one per compaction and per start) has no
    bound that a long-lived server could reach: past 2^24 its logs are still
    found."""
    pg_ctlcluster("stop", "-m", "fast")
    path = os.path.join(data_dir, "pg_throttle.lease_log.16777215")
    open(path, "w").close()
    os.chown(path, os.stat(data_dir).st_uid, os.stat(data_dir).st_gid)
    pg_ctlcluster("start")
    conn = reconnect()
    token = one(conn, "SELECT throttle.lock('mg.lease', ttl => '30 seconds')")[0]
    conn.close()
    kill_postmaster(data_dir)
    pg_ctlcluster("start")
    conn = reconnect()
    tap.is_(one(conn, "SELECT token FROM throttle.locks WHERE name = 'mg.lease'"), (token,),
            "a lease journaled in generation 2^24 comes back after a postmaster kill")
    conn.close()


def smaller_registry(tap):
    conn = connect()
    # 90 for an hour and 30 for two seconds: after the restart the short ones
    # expire and make room, so a name left out could be granted again.
    names = [f"me.{i}" for i in range(90)]
    short = [f"ms.{i}" for i in range(30)]
    tap.is_(sum(one(conn, "SELECT throttle.acquire(%s, %s)::int", (n, every))[0]
                for n, every in [(n, "1 hour") for n in names] + [(n, "2 seconds") for n in short]),
            120, "120 resources granted")
    execute(conn, "ALTER SYSTEM SET pg_throttle.max_entries = 100")
    conn.close()
    pg_ctlcluster("restart", "-m", "fast")
    conn = connect()
    tap.ok("could not restore" in server_log(), "restarted with room for 100: a WARNING")
    time.sleep(2.5)
    tap.ok([sum(acquire_or_full(conn, n, "1 hour") for n in names) for _ in range(2)] == [0, 0],
           "none of the 90 is granted again within the hour, restored or left out (two rounds)")
    execute(conn, "ALTER SYSTEM RESET pg_throttle.max_entries")
    conn.close()
    pg_ctlcluster("restart", "-m", "fast")


def fence_file(tap, data_dir):
    conn = connect()
    top = one(conn, "SELECT max(throttle.lock('fe.u' || g, ttl => '1 second')) FROM generate_series(1, 5) g")[0]
    conn.close()
    pg_ctlcluster("stop", "-m", "fast")
    with open(os.path.join(data_dir, "pg_throttle.fence"), "r+b") as f:
        f.seek(8)
        f.write(b"\x00\x00\x00\x00")
    pg_ctlcluster("start")
    conn = reconnect()
    tap.ok("pg_throttle fence file \"pg_throttle.fence\" is damaged" in server_log(),
           "a damaged fence file: a WARNING")
    fresh = one(conn, "SELECT throttle.lock('fe.fresh', ttl => '1 second')")[0]
    tap.ok(fresh is not None and fresh > top, "and tokens still grow", repr((fresh, top)))
    # Missing, after a crash (no state file to continue from either).
    conn.close()
    kill_postmaster(data_dir)
    os.unlink(os.path.join(data_dir, "pg_throttle.fence"))
    pg_ctlcluster("start")
    conn = reconnect()
    tap.ok("pg_throttle fence file \"pg_throttle.fence\" is missing" in server_log(),
           "a missing fence file after a crash: a WARNING")
    again = one(conn, "SELECT throttle.lock('fe.again', ttl => '1 second')")[0]
    tap.ok(again is not None and again > fresh, "and tokens still grow", repr((again, fresh)))
    conn.close()


def damaged_lease_journal(tap, data_dir):
    conn = connect()
    lease = one(conn, "SELECT throttle.lock('dj.lease', ttl => '30 seconds')")[0]
    with open(os.path.join(data_dir, "pg_throttle.leases"), "r+b") as f:
        f.write(b"\xff\xff\xff\xff")
    kill_backend(conn)
    conn = reconnect()
    restarted = time.time()
    tap.ok("pg_throttle lease snapshot \"pg_throttle.leases\" is damaged" in server_log(),
           "a damaged lease journal: a WARNING")
    tap.is_(one(conn, "SELECT token FROM throttle.locks WHERE name = 'dj.lease'"), (lease,),
            "the leases its logs still hold come back")
    tap.ok([one(conn, "SELECT throttle.lock('dj.never', ttl => '1 second') IS NULL")[0] for _ in range(2)]
           == [True, True], "any other lock name counts as leased by an unknown holder (two calls)")
    # The rule outlives a crash and a clean restart (the journal then reads
    # whole), until max_lease after the start that found the damage.
    conn.close()
    kill_postmaster(data_dir)
    pg_ctlcluster("start")
    pg_ctlcluster("restart", "-m", "fast")
    conn = reconnect()
    tap.ok([one(conn, "SELECT throttle.lock('dj.never', ttl => '1 second') IS NULL")[0] for _ in range(2)]
           == [True, True], "after a postmaster kill and a clean restart, still held (two calls)")
    tap.is_(one(conn, "SELECT token FROM throttle.locks WHERE name = 'dj.lease'"), (lease,),
            "and the lease is still held by its holder")
    time.sleep(max(0.0, restarted + MAX_LEASE_S + 0.3 - time.time()))
    tap.ok(one(conn, "SELECT throttle.lock('dj.never', ttl => '1 second')")[0] is not None,
           "until pg_throttle.max_lease after the restart")
    conn.close()


def damaged_record(tap, data_dir):
    """A damaged record followed by whole ones was not torn by a crash: it was
    damaged after it was written, and its lease is not known."""
    conn = connect()
    lost = one(conn, "SELECT throttle.lock('dr.lost', ttl => '30 seconds')")[0]
    kept = one(conn, "SELECT throttle.lock('dr.kept', ttl => '30 seconds')")[0]
    conn.close()
    kill_postmaster(data_dir)
    logs = sorted(glob.glob(os.path.join(data_dir, "pg_throttle.lease_log.*")),
                  key=lambda p: int(p.rsplit(".", 1)[1]))
    with open(logs[-1], "r+b") as f:
        f.seek(40)  # inside the first record, past its magic number
        byte = f.read(1)
        f.seek(40)
        f.write(bytes([byte[0] ^ 0xFF]))
    pg_ctlcluster("start")
    conn = reconnect()
    tap.ok("pg_throttle lease journal has 1 damaged records" in server_log(),
           "a record damaged in the middle of a log: a WARNING")
    tap.is_(one(conn, "SELECT token FROM throttle.locks WHERE name = 'dr.kept'"), (kept,),
            "the lease after it comes back")
    tap.ok([one(conn, "SELECT throttle.lock('dr.lost', ttl => '1 second') IS NULL")[0] for _ in range(2)]
           == [True, True], "the damaged record's lease is not handed out again (two calls)",
           repr(lost))
    conn.close()


def main():
    tap = Tap(60)
    conn = connect()
    one(conn, "CREATE EXTENSION IF NOT EXISTS pg_throttle; SELECT 1")
    data_dir = one(conn, "SHOW data_directory")[0]
    # Parts here fill the registry on purpose: the superuser's sessions may
    # use all of it (quotas have their own suite, security.py).
    execute(conn, "ALTER ROLE CURRENT_USER SET pg_throttle.role_quota = 100")
    database = one(conn, "SELECT current_database()")[0]
    execute(conn, f'ALTER DATABASE "{database}" SET pg_throttle.database_quota = 100')
    conn.close()
    # Each part leaves the crash rule in force for its successors, which use
    # new names (or the test clock); the first needs a registry without it.
    smaller_registry(tap)
    clean_restarts(tap, data_dir)
    stale_state_file(tap, data_dir)
    owners(tap, data_dir)
    record_before_owners(tap, data_dir)
    crash_then_clean_restarts(tap, data_dir)
    release_before_crash(tap, data_dir)
    many_generations(tap, data_dir)
    fence_file(tap, data_dir)
    damaged_lease_journal(tap, data_dir)
    damaged_record(tap, data_dir)
    tap.done()


if __name__ == "__main__":
    main()
