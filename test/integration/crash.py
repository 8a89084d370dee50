#!/usr/bin/python3
"""Crashes keep every promise: a backend killed with SIGKILL (PostgreSQL then
reinitialises shared memory), then the postmaster killed with SIGKILL. After
each, every crash rule is checked twice (crash_rules.py): resources, buckets,
peeks and waits keep the crash rule; a lease is still held by its holder with
its token and expiry, also one granted before a CHECKPOINT (crash recovery
replays WAL only from the checkpoint on); session locks and names nobody held
are free at once. The periodic checkpoint brings resources back exactly, and
a reset is never undone by one. Through crash, checkpoint, crash cycles a
crash rule's entry stays the rule (cycles); concurrent checkpoint writers never
install a damaged checkpoint; a reset under the rule clears the name. Queue groups: one whose claim still holds stays
held, the others are claimable at once.

Kills the cluster this suite runs against, so each fault (the argument:
backend, postmaster or damaged-checkpoint) runs on a fresh cluster of its own.
"""
import os
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(__file__))
from cluster import (execute, kill_backend, kill_postmaster, pg_ctlcluster,  # noqa: E402
                     reconnect, server_log)
from crash_rules import check_after_fault, grant_before  # noqa: E402
from pgconn import connect, one  # noqa: E402
from tap import Tap  # noqa: E402

CHECKS_PER_FAULT = 12


def next_grant(conn, name):
    row = one(conn, "SELECT next_grant_at FROM throttle.status WHERE kind = 'resource' AND name = %s",
              (name,))
    return row[0] if row else None


def wait_for_checkpoint(path, name, seconds=10):
    """Waits until the checkpoint file holds resource `name` (its records
    carry names as plain bytes)."""
    deadline = time.time() + seconds
    while time.time() < deadline:
        try:
            with open(path, "rb") as f:
                if name.encode() in f.read():
                    return True
        except FileNotFoundError:
            pass
        time.sleep(0.1)
    return False


def schedule_groups(conn):
    """Queue 'cq': group g1 claimed by w1 (its claim holds on), g2 claimed by
    w2 and completed, then a new event in it; g3 never claimed."""
    for key, group, minutes in (("e1", "g1", 3), ("e2", "g2", 2)):
        one(conn, "SELECT throttle.schedule('cq', %s, now() - %s * interval '1 minute', "
                  "group_key => %s)", (key, minutes, group))
    w1 = one(conn, "SELECT array_agg(id), min(group_key), min(claim_token) "
                  "FROM throttle.claim_group('cq', 'w1', '10 minutes')")
    w2 = one(conn, "SELECT array_agg(id), min(group_key), min(claim_token) "
                  "FROM throttle.claim_group('cq', 'w2', '10 minutes')")
    one(conn, "SELECT throttle.complete(%s, %s)", (w2[0], w2[2]))
    one(conn, "SELECT throttle.schedule('cq', 'e3', now() - interval '1 minute', group_key => 'g2')")
    one(conn, "SELECT throttle.schedule('cq', 'e4', now() - interval '1 minute', group_key => 'g3')")
    return w1, w2


def check_groups(tap, conn, w1, after):
    got = [one(conn, "SELECT min(group_key) FROM throttle.claim_group('cq', %s, '10 minutes')",
               (worker,))[0] for worker in ("w3", "w4", "w5")]
    tap.ok(sorted(got[:2]) == ["g2", "g3"] and got[2] is None,
           f"after {after}, the groups no claim holds are claimable at once; the held one is not",
           repr(got))
    tap.is_(one(conn, "SELECT throttle.complete(%s, %s)", (w1[0], w1[2]))[0], 1,
            f"after {after}, the worker whose claim still holds completes its group")
    execute(conn, "DELETE FROM throttle.event WHERE queue = 'cq'")


def concurrency_setup(conn):
    """Queue 'cn', whose groups take 2 workers: group gn has 4 due events,
    2 of them held by two claims (max 1 each) that hold on. Queue 'ck', whose
    concurrency keys take 2 claims and are served in turn: key kk has 4 due
    events, 2 of them held by two claims that hold on."""
    execute(conn, "INSERT INTO throttle.group_policy (queue, workers) VALUES ('cn', 2)")
    one(conn, "SELECT throttle.schedule_many('cn', ARRAY['n1', 'n2', 'n3', 'n4'], "
              "array_fill(now() - interval '1 minute', ARRAY[4]), NULL, array_fill('gn'::text, ARRAY[4]))")
    # Round robin between keys: after the fault the queue's turn is gone from shared memory, so
    # the first claims are served oldest first and the later ones in turn; both keep the limit.
    execute(conn, "INSERT INTO throttle.concurrency_policy (queue, max_claimed, fairness)"
                  " VALUES ('ck', 2, 'round_robin')")
    one(conn, "SELECT throttle.schedule_many('ck', ARRAY['k1', 'k2', 'k3', 'k4'], "
              "array_fill(now() - interval '1 minute', ARRAY[4]), "
              "concurrency_keys => array_fill('kk'::text, ARRAY[4]))")
    groups = [one(conn, "SELECT array_agg(id), min(claim_token) "
                        "FROM throttle.claim_group('cn', %s, '10 minutes', 1)", (worker,))
              for worker in ("n1", "n2")]
    keys = [one(conn, "SELECT array_agg(id), min(claim_token) "
                      "FROM throttle.claim('ck', %s, '10 minutes', 1)", (worker,))
            for worker in ("k1", "k2")]
    return {"groups": groups, "keys": keys}


def check_concurrency(tap, conn, holders, after):
    for kind, claim, policy, queue, holder, what in [
            ("groups", "throttle.claim_group('cn', 'nx', '10 minutes', 1)", "group_policy", "cn",
             "a group that takes 2 workers and has 2 claims holding", "claim gets the group"),
            ("keys", "throttle.claim('ck', 'kx', '10 minutes', 4)", "concurrency_policy", "ck",
             "a concurrency key that takes 2 claims and has 2 holding", "event of the key is claimed")]:
        def claims(claim=claim):
            return one(conn, f"SELECT count(*) FROM {claim}")[0]
        tap.is_([claims(), claims()], [0, 0], f"after {after}, {holder} admits none (two calls)")
        tap.is_(one(conn, "SELECT throttle.complete(%s, %s)", holders[kind][0])[0], 1,
                f"after {after}, one of its holders completes")
        tap.is_([claims(), claims()], [1, 0], f"after {after}, then exactly one more {what}")
        execute(conn, f"DELETE FROM throttle.{policy} WHERE queue = %s", (queue,))
        execute(conn, "DELETE FROM throttle.event WHERE queue = %s", (queue,))


def unsynced_setup(conn):
    """Queue 'ca': an event and a group of two to be claimed with
    synchronous_commit off just before the fault; queue 'cb': an event
    claimed now for 3 seconds, to be extended then. The WAL writer waits 10 s
    between its flushes meanwhile, so that only the claims' own commits can
    have put them on disk."""
    execute(conn, "ALTER SYSTEM SET wal_writer_delay = '10s'")
    one(conn, "SELECT pg_reload_conf()")
    one(conn, "SELECT throttle.schedule('ca', 'a1', now() - interval '1 minute')")
    for key in ("a2", "a3"):
        one(conn, "SELECT throttle.schedule('ca', %s, now() - interval '1 minute', group_key => 'ga')",
            (key,))
    one(conn, "SELECT throttle.schedule('cb', 'b1', now() - interval '1 minute')")
    short = one(conn, "SELECT array_agg(id), min(claim_token) FROM throttle.claim('cb', 'wb', '3 seconds')")
    return {"short": short, "short_at": time.monotonic()}


def unsynced_claims(setup):
    """claim, claim_group and extend from a session with synchronous_commit
    off, right before the fault: each is a promise, so each commit must be
    durable anyway."""
    session = connect()
    execute(session, "SET synchronous_commit = off")
    setup["claim"] = one(session, "SELECT array_agg(id), min(claim_token) "
                                  "FROM throttle.claim('ca', 'wa', '10 minutes')")
    setup["group"] = one(session, "SELECT array_agg(id), min(claim_token) "
                                  "FROM throttle.claim_group('ca', 'wa', '10 minutes')")
    setup["extended"] = one(session, "SELECT throttle.extend(%s, %s, '10 minutes')",
                            setup["short"])[0]
    session.close()


def check_unsynced(tap, conn, setup, after):
    time.sleep(max(0.0, setup["short_at"] + 4 - time.monotonic()))  # the 3 s lease is over
    others = [one(conn, sql)[0] for sql in (
        "SELECT count(*) FROM throttle.claim('ca', 'wx', '1 minute', 10)",
        "SELECT count(*) FROM throttle.claim_group('ca', 'wx', '1 minute')",
        "SELECT count(*) FROM throttle.claim('cb', 'wx', '1 minute', 10)")]
    again = [one(conn, "SELECT count(*) FROM throttle.claim('ca', 'wy', '1 minute', 10)")[0],
             one(conn, "SELECT count(*) FROM throttle.claim_group('ca', 'wy', '1 minute')")[0],
             one(conn, "SELECT count(*) FROM throttle.claim('cb', 'wy', '1 minute', 10)")[0]]
    tap.ok(setup["extended"] == 1 and others == [0, 0, 0] and again == [0, 0, 0],
           f"after {after}, claims and an extend made with synchronous_commit off still hold "
           "(no other worker gets their events, twice)", repr((setup["extended"], others, again)))
    tap.is_(one(conn, "SELECT throttle.complete(%s, %s)", setup["claim"])[0], 1,
            f"after {after}, the worker of the unsynced claim completes it")
    tap.is_(one(conn, "SELECT throttle.complete(%s, %s)", setup["group"])[0], 2,
            f"after {after}, the worker of the unsynced group claim completes it")
    tap.is_(one(conn, "SELECT throttle.complete(%s, %s)", setup["short"])[0], 1,
            f"after {after}, the worker whose lease was extended completes its event")
    execute(conn, "ALTER SYSTEM RESET wal_writer_delay")
    one(conn, "SELECT pg_reload_conf()")
    execute(conn, "DELETE FROM throttle.event WHERE queue IN ('ca', 'cb')")


def rate_limited_setup(conn):
    """Queue 'cl', limited by a bucket of 3 an hour: its 3 units are claimed
    just before the fault; 3 more events and a group wait."""
    execute(conn, "INSERT INTO throttle.bucket (name, rate, per, burst) VALUES ('cl.bucket', 3, '1 hour', 3)")
    execute(conn, "INSERT INTO throttle.queue_bucket (queue, bucket) VALUES ('cl', 'cl.bucket')")
    one(conn, "SELECT count(throttle.schedule('cl', 'l' || g, now() - interval '1 minute')) "
              "FROM generate_series(1, 6) g")
    one(conn, "SELECT throttle.schedule('cl', 'lg', now() - interval '1 minute', group_key => 'g')")
    # Queue 'cg' gives each group a bucket of 3 an hour: group g1's 3 units
    # are claimed just before the fault; 2 more of its events wait.
    execute(conn, "INSERT INTO throttle.group_bucket (queue, bucket) VALUES ('cg', 'cl.bucket')")
    one(conn, "SELECT count(throttle.schedule('cg', 'g' || g, now() - interval '1 minute', group_key => 'g1'))"
              " FROM generate_series(1, 5) g")
    group = one(conn, "SELECT array_agg(id), min(claim_token) FROM throttle.claim_group('cg', 'wg', '1 minute')")
    one(conn, "SELECT throttle.complete(%s, %s)", group)
    # 30 more groups that no claim has looked at yet.
    one(conn, "SELECT count(throttle.schedule('cg', 'h' || g, now(), group_key => 'h' || g))"
              " FROM generate_series(1, 30) g")
    return one(conn, "SELECT count(*) FROM throttle.claim('cl', 'wl', '10 minutes', 10)")[0] * 10 + len(group[0])


def check_rate_limited(tap, conn, before, after):
    got = [one(conn, "SELECT count(*) FROM throttle.claim('cl', 'wl2', '1 minute', 10)")[0],
           one(conn, "SELECT count(*) FROM throttle.claim_group('cl', 'wl2', '1 minute')")[0],
           one(conn, "SELECT count(*) FROM throttle.claim('cl', 'wl3', '1 minute', 10)")[0]]
    got += [one(conn, "SELECT count(*) FROM throttle.claim_group('cg', 'wg2', '1 minute')")[0] for _ in range(2)]
    # Every group's bucket starts empty after the fault; looking at 31 of
    # them stores none (each would take an entry of the role's quota).
    got.append(one(conn, "SELECT count(*) FROM throttle.status WHERE kind = 'group_bucket'")[0])
    tap.ok(before == 33 and got == [0, 0, 0, 0, 0, 0],
           f"after {after}, a rate-limited queue whose bucket was used up hands out nothing more "
           "(claim, claim_group, claim again), nor a group whose own bucket was, nor the 30 groups "
           "no claim had looked at (claim_group twice), and those looks store no entry",
           repr((before, got)))
    execute(conn, "DELETE FROM throttle.queue_bucket WHERE queue = 'cl'")
    execute(conn, "DELETE FROM throttle.group_bucket WHERE queue = 'cg'")
    execute(conn, "DELETE FROM throttle.event WHERE queue IN ('cl', 'cg')")


def backend_killed(tap, conn, data_dir, checkpoint):
    # The background worker's checkpoint, every second for this part.
    execute(conn, "ALTER SYSTEM SET pg_throttle.checkpoint_interval = '1s'")
    one(conn, "SELECT pg_reload_conf()")
    # A resource granted on a test clock goes into the checkpoint as such.
    test_clock = connect()
    execute(test_clock, "SET pg_throttle.test_clock = '2031-01-01 00:00:00+00'")
    one(test_clock, "SELECT throttle.acquire('ck.test', '1 day')")
    test_clock.close()
    tap.ok(one(conn, "SELECT throttle.acquire('ck.early', '1 hour')")[0], "resource granted")
    early = next_grant(conn, "ck.early")
    tap.ok(wait_for_checkpoint(checkpoint, "ck.early"), "the background worker writes a checkpoint")
    execute(conn, "ALTER SYSTEM RESET pg_throttle.checkpoint_interval")
    one(conn, "SELECT pg_reload_conf()")
    w1, _ = schedule_groups(conn)
    concurrent = concurrency_setup(conn)
    holder = connect()
    before = grant_before(tap, conn, holder, "cr")
    # Crash recovery replays WAL only from the last checkpoint on: the lease
    # was granted before it, so only the lease journal can bring it back.
    unsynced = unsynced_setup(conn)
    limited = rate_limited_setup(conn)
    execute(conn, "CHECKPOINT")
    unsynced_claims(unsynced)
    kill_backend(conn)
    holder.close()
    conn = reconnect()
    tap.ok(conn is not None, "the server came back after the backend crash")
    check_after_fault(tap, conn, "cr", "a backend crash", before)
    tap.is_(next_grant(conn, "ck.early"), early,
            "a resource in the last checkpoint comes back exactly (not restart + 1 hour)")
    tap.ok("resources from its checkpoint" in server_log(), "the log says what the checkpoint restored")
    # Without its own checkpoint record it would be born at the restart, and
    # 2031 is long past that.
    test_clock = connect()
    execute(test_clock, "SET pg_throttle.test_clock = '2031-01-01 12:00:00+00'")
    tap.ok([one(test_clock, "SELECT throttle.acquire('ck.test', '1 day')")[0] for _ in range(2)]
           == [False, False],
           "a test clock's resource comes back from the checkpoint on its own clock (two calls)")
    test_clock.close()
    tap.ok("leases from its lease journal" in server_log(),
           "the log says the lease came back from the journal")
    check_groups(tap, conn, w1, "a backend crash")
    check_concurrency(tap, conn, concurrent, "a backend crash")
    check_unsynced(tap, conn, unsynced, "a backend crash")
    check_rate_limited(tap, conn, limited, "a backend crash")
    conn.close()


def postmaster_killed(tap, conn, data_dir, checkpoint):
    # A reset must not be undone by a checkpoint taken before it.
    one(conn, "SELECT throttle.acquire('ck.reset', '1 hour')")
    one(conn, "SELECT throttle.checkpoint()")
    one(conn, "SELECT throttle.reset('ck.reset')")
    tap.ok(not os.path.exists(checkpoint), "throttle.reset deletes the checkpoint")
    time.sleep(0.01)
    tap.ok(one(conn, "SELECT throttle.acquire('ck.reset', '1 hour')")[0], "after the reset it is granted again")
    regranted = next_grant(conn, "ck.reset")
    w1, _ = schedule_groups(conn)
    concurrent = concurrency_setup(conn)
    holder = connect()
    before = grant_before(tap, conn, holder, "pm")
    # A renew made before the crash is what comes back.
    one(conn, "SELECT throttle.renew('pm.lease', %s, '25 seconds')", (before["lease"],))
    before["expires"] = one(conn, "SELECT expires_at FROM throttle.locks WHERE name = 'pm.lease'")[0]
    unsynced = unsynced_setup(conn)
    limited = rate_limited_setup(conn)
    unsynced_claims(unsynced)
    conn.close()
    kill_postmaster(data_dir)
    holder.close()
    pg_ctlcluster("start")
    conn = reconnect()
    tap.ok(conn is not None, "the server starts after its postmaster was killed")
    check_after_fault(tap, conn, "pm", "a postmaster kill", before)
    tap.ok(not one(conn, "SELECT throttle.acquire('ck.reset', '1 hour')")[0],
           "a resource reset and granted again stays taken")
    after_reset = next_grant(conn, "ck.reset")
    tap.ok(after_reset is None or after_reset >= regranted,
           "and not from the checkpoint taken before the reset", repr((after_reset, regranted)))
    check_groups(tap, conn, w1, "a postmaster kill")
    check_concurrency(tap, conn, concurrent, "a postmaster kill")
    check_unsynced(tap, conn, unsynced, "a postmaster kill")
    check_rate_limited(tap, conn, limited, "a postmaster kill")
    conn.close()


def damaged_checkpoint(tap, conn, data_dir, checkpoint):
    """A damaged checkpoint: a WARNING, and the crash rules alone."""
    tap.ok(one(conn, "SELECT throttle.acquire('dc.job', '1 hour')")[0], "resource granted before")
    tap.is_(one(conn, "SELECT throttle.checkpoint() >= 1")[0], True, "and checkpointed")
    with open(checkpoint, "r+b") as f:
        f.seek(48)
        f.write(b"\xff\xff\xff\xff")
    kill_backend(conn)
    conn = reconnect()
    tap.ok("ignoring pg_throttle checkpoint" in server_log(), "a damaged checkpoint: a WARNING")
    tap.ok([one(conn, "SELECT throttle.acquire('dc.job', '1 hour')")[0] for _ in range(2)] == [False, False],
           "and the resource is still not granted again (the crash rule, two calls)")
    conn.close()


def twice(conn, sql, params=None):
    return [one(conn, sql, params)[0] for _ in range(2)]


def concurrent_checkpoints(tap, conn, checkpoint):
    """Several writers at once (sessions calling throttle.checkpoint and the
    background worker) never install a damaged or an empty checkpoint, and one
    that began before a reset never brings the reset name back."""
    execute(conn, "ALTER SYSTEM SET pg_throttle.checkpoint_interval = '1s'")
    one(conn, "SELECT pg_reload_conf()")
    one(conn, "SELECT throttle.acquire('cw.kept', '1 hour')")
    one(conn, "SELECT throttle.acquire('cw.reset', '1 hour')")
    stop = threading.Event()
    failures = []

    def writer():
        c = connect()
        try:
            while not stop.is_set():
                one(c, "SELECT throttle.checkpoint()")
        except Exception as e:  # noqa: BLE001 - reported below
            failures.append(repr(e))
        finally:
            c.close()

    threads = [threading.Thread(target=writer) for _ in range(3)]
    for t in threads:
        t.start()
    tap_ok = wait_for_checkpoint(checkpoint, "cw.kept")
    reads = missing = 0
    deadline = time.time() + 3
    while time.time() < deadline:
        try:
            with open(checkpoint, "rb") as f:
                data = f.read()
        except FileNotFoundError:
            data = b""
        reads += 1
        if b"cw.kept" not in data:
            missing += 1
    # A reset while the writers run; the name is granted again after it.
    one(conn, "SELECT throttle.reset('cw.reset')")
    one(conn, "SELECT throttle.acquire('cw.reset', '1 hour')")
    regranted = next_grant(conn, "cw.reset")
    time.sleep(0.5)
    stop.set()
    for t in threads:
        t.join()
    execute(conn, "ALTER SYSTEM RESET pg_throttle.checkpoint_interval")
    one(conn, "SELECT pg_reload_conf()")
    tap.ok(tap_ok and not failures and missing == 0,
           "three sessions and the background worker writing checkpoints at once: every read of "
           "the installed checkpoint holds the resource", repr((failures, missing, reads)))
    log = server_log()
    bad = [line for line in log.splitlines()
           if "pg_throttle.checkpoint" in line and ("could not" in line or "ignoring" in line)]
    tap.ok(not bad, "and no writer failed on another's temporary file", repr(bad[:3]))
    return regranted


def checkpoint_cycles(tap, conn, data_dir, checkpoint):
    """Crash-rule entries through crash, checkpoint, crash cycles: a probe
    with a short interval, checkpointed, never turns into a real grant that
    ends early; a reset under the rule clears what it says it clears."""
    regranted = concurrent_checkpoints(tap, conn, checkpoint)
    tap.ok(one(conn, "SELECT throttle.acquire('cy.job', '3 minutes')")[0],
           "a resource granted for 3 minutes")
    one(conn, "SELECT * FROM throttle.take('cy.bucket', 1, '1 hour', 2, 2)")
    kill_backend(conn)
    conn = reconnect()
    tap.ok(twice(conn, "SELECT throttle.acquire('cy.job', '3 seconds')") == [False, False],
           "after a crash, a probe with a 3 s interval is refused (two calls)")
    tap.ok(twice(conn, "SELECT remaining FROM throttle.take('cy.bucket', 1, '1 hour', 2, 0)")
           == [0, 0], "and a peek sees the bucket empty (two peeks)")
    started = time.time()
    for cycle in (1, 2):
        tap.ok(one(conn, "SELECT throttle.checkpoint()")[0] >= 1,
               f"cycle {cycle}: a checkpoint holds the probed resource")
        kill_backend(conn)
        conn = reconnect()
        # Past the probe's 3 s from the first restart: read from the
        # checkpoint as a real grant, the probe's window would now be over.
        time.sleep(max(0.0, 3.5 - (time.time() - started)))
        tap.ok(twice(conn, "SELECT throttle.acquire('cy.job', '3 minutes')") == [False, False],
               f"cycle {cycle}: after the next crash the 3-minute resource is still refused, past "
               "the probe's interval (two calls)")
        tap.ok(twice(conn, "SELECT allowed FROM throttle.take('cy.bucket', 1, '1 hour', 2)")
               == [False, False], f"cycle {cycle}: the bucket is still empty (two takes)")
    after_reset = next_grant(conn, "cw.reset")
    tap.ok(after_reset is None or after_reset >= regranted,
           "a checkpoint written while a reset ran does not bring the reset window back",
           repr((after_reset, regranted)))

    # reset under the crash rule
    tap.ok(twice(conn, "SELECT throttle.acquire('cy.reset', '1 hour')") == [False, False],
           "under the crash rule a resource nobody asked for is refused")
    tap.is_(one(conn, "SELECT throttle.reset('cy.reset', 'resource')")[0], 1,
            "reset clears it (1)")
    tap.ok(twice(conn, "SELECT throttle.acquire('cy.reset', '1 hour')") == [True, False],
           "then it is granted at once, and once")
    one(conn, "SELECT throttle.reset('cy.never')")
    tap.ok(twice(conn, "SELECT throttle.acquire('cy.never', '1 hour')") == [True, False],
           "a name nobody had asked for, reset, is granted at once, and once")
    tap.ok(twice(conn, "SELECT allowed FROM throttle.take('cy.rbucket', 1, '1 hour', 2)")
           == [False, False], "under the crash rule a bucket starts empty")
    one(conn, "SELECT throttle.reset('cy.rbucket', 'bucket')")
    got = [one(conn, "SELECT allowed FROM throttle.take('cy.rbucket', 1, '1 hour', 2)")[0]
           for _ in range(3)]
    tap.ok(got == [True, True, False], "reset, it is full: its burst of 2 passes, then no more",
           repr(got))
    # A reset that needs room sweeps for it first, as any call does.
    execute(conn, "SET pg_throttle.role_quota = 1")  # 1 000 of the 100 000 entries
    held = one(conn, "SELECT entries FROM throttle.usage WHERE scope = 'role' "
                     "AND name = current_user")[0]
    one(conn, "SELECT count(throttle.acquire('cq.' || g, '1 millisecond')) "
              "FROM generate_series(1, %s) g", (1000 - held,))
    tap.is_(one(conn, "SELECT entries FROM throttle.usage WHERE scope = 'role' "
                      "AND name = current_user")[0], 1000,
            "the role holds its quota (1 000 entries, expired)")
    time.sleep(0.1)
    got = [one(conn, "SELECT throttle.reset('cy.roomless')")[0] >= 0,
           one(conn, "SELECT throttle.acquire('cy.roomless', '1 hour')")[0]]
    tap.ok(got == [True, True], "a reset at its role's quota of expired entries sweeps for room, "
           "and the name it clears is granted", repr(got))
    # What it clears outlives the sweeps of the next minutes.
    one(conn, "SELECT throttle.reset('cy.kept')")
    one(conn, "SELECT count(throttle.acquire('cr.' || g, '1 millisecond')) FROM "
              "generate_series(1, 1000 - (SELECT entries FROM throttle.usage WHERE scope = 'role' "
              "AND name = current_user)) g")
    time.sleep(0.1)
    one(conn, "SELECT throttle.acquire('cr.sweep', '1 hour')")  # at the quota: a sweep
    execute(conn, "RESET pg_throttle.role_quota")
    tap.ok(twice(conn, "SELECT throttle.acquire('cy.kept', '1 hour')") == [True, False],
           "a name reset under the rule, then a sweep for room: still clear (two calls)")
    one(conn, "SELECT throttle.reset('cy.later')")
    conn.close()
    pg_ctlcluster("restart", "-m", "fast")
    conn = reconnect()
    tap.ok(twice(conn, "SELECT throttle.acquire('cy.later', '1 hour')") == [True, False],
           "a name reset and not used before a clean restart is still clear after it")
    tap.ok(twice(conn, "SELECT throttle.acquire('cy.reset', '1 hour')") == [False, False],
           "and the one granted after its reset is still taken")

    # Locks: the lease journal lost, locks fall under the rule.
    conn.close()
    pg_ctlcluster("stop", "-m", "immediate")
    for name in os.listdir(data_dir):
        if name.startswith("pg_throttle.lease"):
            os.unlink(os.path.join(data_dir, name))
    pg_ctlcluster("start")
    conn = reconnect()
    tap.ok(twice(conn, "SELECT throttle.lock('cy.lock', ttl => '5 seconds') IS NULL")
           == [True, True], "with the lease journal lost, a lock nobody held counts as leased")
    one(conn, "SELECT throttle.reset('cy.lock', 'lock')")
    one(conn, "SELECT throttle.reset('cy.lock2', 'lock')")
    got = [one(conn, f"SELECT throttle.lock('{n}', ttl => '5 seconds') IS NOT NULL")[0]
           for n in ("cy.lock", "cy.lock", "cy.lock2", "cy.lock2")]
    tap.ok(got == [True, False, True, False],
           "reset, a lock held by the rule and one nobody touched are each granted once",
           repr(got))
    conn.close()


# Each fault runs on a fresh cluster: the crash rule one leaves in force (for
# good: it outlives clean restarts) would deny the grants the next makes first.
PHASES = {"backend": (backend_killed, CHECKS_PER_FAULT + 21),
          "postmaster": (postmaster_killed, CHECKS_PER_FAULT + 19),
          "damaged-checkpoint": (damaged_checkpoint, 4),
          "cycles": (checkpoint_cycles, 25)}


def main():
    if len(sys.argv) != 2 or sys.argv[1] not in PHASES:
        sys.exit("usage: crash.py " + "|".join(PHASES))
    run, planned = PHASES[sys.argv[1]]
    tap = Tap(planned)
    conn = connect()
    one(conn, "CREATE EXTENSION IF NOT EXISTS pg_throttle; SELECT 1")
    data_dir = one(conn, "SHOW data_directory")[0]
    run(tap, conn, data_dir, os.path.join(data_dir, "pg_throttle.checkpoint"))
    tap.done()


if __name__ == "__main__":
    main()
