#!/usr/bin/python3
"""pg_throttle behind a real PgBouncer in transaction pooling mode: 12 clients
share 3 server connections. Each client keeps a log of its calls with
client-side timestamps, and the promises are checked from the logs:

- leases (lock with ttl, renew, unlock): one holder per name at a time, tokens
  increasing, unlock and renew with the current token true, a stale one false;
- take/allow and wait: no more than burst + rate x elapsed;
- acquire: one grant per window;
- the queue: claim, claim_group and complete in autocommit, every event
  completed once, no group held by two clients at once.

Then what does not work behind a transaction pooler, as it happens: session
locks (the lock belongs to the pooled server backend, not the client; session
pooling works, as DISCARD ALL between clients releases them), and LISTEN (a
notification is lost, or goes to whichever client the backend serves).
"""
import collections
import os
import random
import select
import sys
import threading
import time
import uuid

import psycopg2

sys.path.insert(0, os.path.dirname(__file__))
from pgconn import connect, most_at_once, one, rows  # noqa: E402
from polling import wait_until  # noqa: E402
from pooler import PgBouncer  # noqa: E402
from tap import Tap  # noqa: E402

CLIENTS = 12
POOL = 3
SLACK = 0.002  # seconds: the server's clock against the client's monotonic clock


# ---- The checkers: pure functions of the clients' logs (a list of problems, empty when
# the promise held), kept apart so that they can be fed a fabricated log.

def lease_violations(holds):
    """holds: (name, token, granted, unlock_called), with `granted` the time the lock
    call returned and `unlock_called` the time the unlock was sent: inside the time the
    server had the lease held. Per name, such spans must not overlap, and the tokens
    must grow in grant order."""
    problems = []
    by_name = collections.defaultdict(list)
    for hold in holds:
        by_name[hold[0]].append(hold)
    for name, spans in by_name.items():
        spans.sort(key=lambda h: h[2])
        for prev, cur in zip(spans, spans[1:]):
            if cur[2] < prev[3]:
                problems.append(f"{name}: token {cur[1]} granted while {prev[1]} was held")
            if cur[1] <= prev[1]:
                problems.append(f"{name}: token {cur[1]} granted after {prev[1]}")
    return problems


def rate_violations(calls, burst, interval):
    """calls: (started, returned, allowed) for one fresh bucket with emission interval
    `interval` (per / rate) and `burst`. A fresh bucket's k-th grant needs k <= burst +
    (t - t0) / interval, t0 its first call, t the grant: with the first call's start
    and each grant's return (later than both), that must hold of the logs too."""
    if not calls:
        return []
    t0 = min(c[0] for c in calls)
    returns = sorted(c[1] for c in calls if c[2])
    return [f"grant {k} at +{t - t0:.3f} s, bound {burst + (t - t0 + SLACK) / interval:.2f}"
            for k, t in enumerate(returns, 1) if k > burst + (t - t0 + SLACK) / interval]


def acquire_violations(grants, every):
    """grants: (started, returned) of the calls of one resource that returned true.
    The grants are `every` apart at least; each happened within its call, so of any two
    the later one's return is at least `every` after the earlier one's start."""
    problems = []
    for i, a in enumerate(grants):
        for b in grants[i + 1:]:
            if b[1] - a[0] < every - SLACK and a[1] - b[0] < every - SLACK:
                problems.append(f"grants in [{a[0]:.3f}, {a[1]:.3f}] and [{b[0]:.3f}, {b[1]:.3f}]")
    return problems


def group_violations(claims):
    """claims: (groups, claimed, complete_called) per claim. A group's claims must
    not overlap: none claimed before the previous claim of the group was completed."""
    by_group = collections.defaultdict(list)
    for groups, claimed, completing in claims:
        for group in groups:
            by_group[group].append((claimed, completing))
    return [f"group {g} held by {most_at_once(spans)} claims at once"
            for g, spans in by_group.items() if most_at_once(spans) > 1]


# ---- The clients

def run_clients(pooler, body, clients=CLIENTS):
    """Runs body(index, conn) in `clients` threads, each with its own connection through
    the pooler; returns the errors they raised."""
    errors = []

    def client(i):
        try:
            conn = pooler.connect()
            try:
                body(i, conn)
            finally:
                conn.close()
        except Exception as e:  # noqa: BLE001 - reported as a test failure
            errors.append(f"client {i}: {e!r}")

    threads = [threading.Thread(target=client, args=(i,), daemon=True) for i in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    return errors + [f"client {i} still running" for i, t in enumerate(threads) if t.is_alive()]


def leases(tap, pooler):
    """Many clients, three names, leases taken without waiting, renewed, unlocked."""
    names = [f"pgb.lease.{n}" for n in range(3)]
    holds, misses, renewals, unlocks, backends = [], [], [], [], set()
    deadline = time.monotonic() + 3

    def body(i, conn):
        rng = random.Random(i)
        cur = conn.cursor()
        while time.monotonic() < deadline:
            name = rng.choice(names)
            cur.execute("SELECT throttle.lock(%s, ttl => '10 seconds', wait => '0'), pg_backend_pid()",
                        (name,))
            token, pid = cur.fetchone()
            granted = time.monotonic()
            backends.add(pid)
            if token is None:
                misses.append(name)
                continue
            time.sleep(rng.uniform(0, 0.004))  # the work
            if rng.random() < 0.5:
                cur.execute("SELECT throttle.renew(%s, %s, '10 seconds')", (name, token))
                renewals.append(cur.fetchone()[0])
            unlock_called = time.monotonic()
            cur.execute("SELECT throttle.unlock(%s, %s)", (name, token))
            unlocks.append(cur.fetchone()[0])
            holds.append((name, token, granted, unlock_called))

    errors = run_clients(pooler, body)
    tap.is_(errors, [], f"{CLIENTS} clients took leases through PgBouncer without an error")
    tap.ok(len(backends) <= POOL, f"the {CLIENTS} clients were served by {len(backends)} server "
           f"backends (pool of {POOL})", repr(sorted(backends)))
    tap.ok(len(holds) > 50 and len(misses) > 0,
           f"{len(holds)} leases held, {len(misses)} refused while another client held the name")
    problems = lease_violations(holds)
    tap.is_(problems[:5], [], "never two holders of a name at once; tokens grow in grant order")
    tap.ok(unlocks and all(unlocks) and renewals and all(renewals),
           f"every unlock ({len(unlocks)}) and renew ({len(renewals)}) with the current token "
           "returned true, whatever backend served it",
           f"unlock false: {unlocks.count(False)}, renew false: {renewals.count(False)}")

    # A stale token: the lease expires, another client gets it, the first is fenced.
    first, second = pooler.connect(), pooler.connect()
    try:
        t0 = time.monotonic()  # before the grant: the lease ends at least 1 s after t0
        old = one(first, "SELECT throttle.lock('pgb.stale', ttl => '1 second')")[0]
        new = one(second, "SELECT throttle.lock('pgb.stale', ttl => '10 seconds', wait => '5 seconds')")[0]
        took = time.monotonic() - t0
        tap.ok(old is not None and new is not None and new > old and took >= 0.9,
               f"a waiting client gets the lease when it expires ({took:.2f} s), with a greater token",
               f"old {old}, new {new}")
        stale = one(first, "SELECT throttle.unlock('pgb.stale', %s), throttle.renew('pgb.stale', %s, '1 minute')",
                    (old, old))
        current = one(second, "SELECT throttle.unlock('pgb.stale', %s)", (new,))[0]
        tap.is_((stale, current), ((False, False), True),
                "unlock and renew with the stale token return false; the current one unlocks")
    finally:
        first.close()
        second.close()


def rates(tap, pooler):
    """take/allow hammered by every client; wait by half of them."""
    key, rate, burst = f"pgb.rate.{uuid.uuid4().hex}", 50, 5
    calls = []
    deadline = time.monotonic() + 2

    def body(i, conn):
        cur = conn.cursor()
        statement = ("SELECT allowed FROM throttle.take(%s, %s, '1 second', %s)" if i % 2
                     else "SELECT throttle.allow(%s, %s, '1 second', %s)")
        while time.monotonic() < deadline:
            started = time.monotonic()
            cur.execute(statement, (key, rate, burst))
            calls.append((started, time.monotonic(), cur.fetchone()[0]))

    errors = run_clients(pooler, body)
    allowed = sum(1 for c in calls if c[2])
    tap.ok(not errors and allowed >= burst and allowed < len(calls),
           f"take/allow: {allowed} of {len(calls)} calls allowed", "\n".join(errors))
    problems = rate_violations(calls, burst, 1 / rate)
    tap.is_(problems[:5], [], f"never more than burst + rate x elapsed ({burst} + {rate}/s)")

    # wait: each passing call holds its server connection while it sleeps, which is
    # fine for the promise: 12 passes, at most 1 + 10/s x elapsed.
    key, rate = f"pgb.wait.{uuid.uuid4().hex}", 10
    waits = []

    def waiter(i, conn):
        for _ in range(2):
            started = time.monotonic()
            passed = one(conn, "SELECT throttle.wait(%s, %s, '1 second', 1, timeout => '10 seconds')",
                         (key, rate))[0]
            waits.append((started, time.monotonic(), passed))

    errors = run_clients(pooler, waiter, clients=6)
    tap.ok(not errors and len(waits) == 12 and all(w[2] for w in waits),
           "12 throttle.wait calls from 6 clients all passed", "\n".join(errors) or repr(waits))
    tap.is_(rate_violations(waits, 1, 1 / rate)[:5], [], "and no faster than 1 + 10/s x elapsed")


def acquires(tap, pooler):
    """acquire: one grant per window, with a key per window and with one key."""
    windows = [f"pgb.window.{uuid.uuid4().hex}:{n}" for n in range(20)]
    granted = collections.Counter()

    def per_window(i, conn):
        for name in random.Random(i).sample(windows, len(windows)):
            if one(conn, "SELECT throttle.acquire(%s, '10 minutes')", (name,))[0]:
                granted[name] += 1

    errors = run_clients(pooler, per_window)
    tap.ok(not errors and all(granted[w] == 1 for w in windows),
           f"a key per window: each of {len(windows)} windows granted to exactly one of {CLIENTS} clients",
           "\n".join(errors) or repr(granted))

    key, every = f"pgb.acquire.{uuid.uuid4().hex}", 0.3
    grants = []
    deadline = time.monotonic() + 2

    def one_key(i, conn):
        cur = conn.cursor()
        while time.monotonic() < deadline:
            started = time.monotonic()
            cur.execute("SELECT throttle.acquire(%s, '300 milliseconds')", (key,))
            if cur.fetchone()[0]:
                grants.append((started, time.monotonic()))
            time.sleep(0.001)

    errors = run_clients(pooler, one_key)
    tap.ok(not errors and len(grants) >= 3, f"one key every 300 ms: {len(grants)} grants in 2 s",
           "\n".join(errors))
    tap.is_(acquire_violations(grants, every)[:5], [], "no two grants within 300 ms of each other")


def queue(tap, pooler, direct):
    """The event queue worked by every client, claims and completions in autocommit."""
    name = f"pgb.queue.{uuid.uuid4().hex}"  # a fresh queue, also when run twice
    groups, per_group, loose = 16, 10, 80
    with direct.cursor() as cur:
        cur.execute("""
            SELECT count(throttle.schedule(%s, 'e' || g, now(), '{}',
                                           CASE WHEN g <= %s THEN 'g' || (g %% %s) END))
            FROM generate_series(1, %s) AS g""",
                    (name, groups * per_group, groups, groups * per_group + loose))
    total = groups * per_group + loose
    claims = []
    deadline = time.monotonic() + 30

    def worker(i, conn):
        rng = random.Random(i)
        cur = conn.cursor()
        while time.monotonic() < deadline:
            if rng.random() < 0.5:
                # max 2: each group is claimed five times, by whichever clients
                cur.execute("SELECT id, group_key, claim_token "
                            "FROM throttle.claim_group(%s, %s, '30 seconds', max => 2)", (name, f"c{i}"))
            else:
                cur.execute("SELECT id, group_key, claim_token FROM throttle.claim(%s, %s, '30 seconds', max => 4)",
                            (name, f"c{i}"))
            events = cur.fetchall()
            claimed = time.monotonic()
            if not events:
                cur.execute("SELECT count(*) FROM throttle.event WHERE queue = %s", (name,))
                if cur.fetchone()[0] == 0:
                    return
                time.sleep(0.005)
                continue
            ids = [e[0] for e in events]
            time.sleep(rng.uniform(0, 0.003))  # the work
            completing = time.monotonic()
            cur.execute("SELECT throttle.complete(%s::bigint[], %s)", (ids, events[0][2]))
            claims.append((f"c{i}", ids, {e[1] for e in events if e[1]}, claimed, completing,
                           cur.fetchone()[0]))

    errors = run_clients(pooler, worker)
    tap.is_(errors, [], f"{CLIENTS} workers drained the queue through PgBouncer without an error")
    with direct.cursor() as cur:
        done = dict(rows(cur, """SELECT id, claimed_by FROM throttle.event_history
                                 WHERE queue = %s AND state = 'done'""", (name,)))
    left = one(direct, "SELECT count(*) FROM throttle.event WHERE queue = %s", (name,))[0]
    tap.ok(len(done) == total and left == 0, f"all {total} events done ({len(done)}), none left ({left})")
    completed = collections.Counter(i for c in claims for i in c[1])
    tap.ok(all(c[5] == len(c[1]) for c in claims) and set(completed) == set(done)
           and set(completed.values()) == {1},
           f"{len(claims)} claims: every complete with its token took all its events, each event once",
           repr([c for c in claims if c[5] != len(c[1])][:5]))
    by_log = {i: c[0] for c in claims for i in c[1]}
    tap.ok(by_log == done and len(set(by_log.values())) > 1,
           f"the history names the client that logged each event ({len(set(by_log.values()))} clients worked)")
    per_group = collections.Counter(g for c in claims for g in c[2])
    tap.ok(min(per_group.values(), default=0) >= 2
           and not group_violations([(c[2], c[3], c[4]) for c in claims]),
           f"{len(per_group)} groups claimed {sum(per_group.values())} times: "
           "no group held by two clients at overlapping times",
           "\n".join(group_violations([(c[2], c[3], c[4]) for c in claims])[:5]))


def held(direct, name):
    """The backend pid shown as holder of lock `name`, or None when nobody holds it."""
    row = one(direct, "SELECT holder FROM throttle.locks WHERE name = %s", (name,))
    return row and int(row[0].split("pid=")[1].split()[0])


def released_within(direct, name, seconds):
    return wait_until(lambda: held(direct, name) is None, seconds)


def session_locks(tap, pooler, direct):
    """A session lock belongs to the server backend, whichever client sent the call."""
    # 'single': one server connection, so every client is served by the same backend.
    a, b = pooler.connect("single"), pooler.connect("single")
    token, backend = one(a, "SELECT throttle.lock('pgb.session'), pg_backend_pid()")
    t0 = time.monotonic()
    other = one(b, "SELECT throttle.lock('pgb.session', wait => '3 seconds')")[0]
    took = time.monotonic() - t0
    tap.ok(token is not None and other is None and took < 1.0,
           f"session lock: client B, served by A's backend, gets NULL at once ({took * 1000:.0f} ms "
           "of a 3 s wait): the lock is its own session's, and not re-entrant")
    tap.is_(one(b, "SELECT throttle.unlock('pgb.session', %s)", (token,))[0], True,
            "client B unlocks client A's session lock with A's token")

    token = one(a, "SELECT throttle.lock('pgb.session')")[0]
    a.close()
    time.sleep(0.2)
    tap.is_(held(direct, "pgb.session"), backend,
            "client A disconnected: the lock stays held by the pooled server backend")
    one(direct, "SELECT pg_terminate_backend(%s)", (backend,))
    tap.ok(released_within(direct, "pgb.session", 5),
           "it is released only when that server connection ends (here pg_terminate_backend)")
    b.close()

    # 'pair': two server connections. While another client's transaction holds the
    # backend that took A's lock, A's own unlock is served by the other one.
    a = pooler.connect("pair")
    token, backend = one(a, "SELECT throttle.lock('pgb.pair'), pg_backend_pid()")
    pinned = []
    for _ in range(2):  # of two open transactions on two backends, one is on A's
        conn = pooler.connect("pair", autocommit=False)
        pinned.append((conn, one(conn, "SELECT pg_backend_pid()")[0]))
        if pinned[-1][1] == backend:
            break
    pin = next((conn for conn, pid in pinned if pid == backend), None)
    for conn, pid in pinned:
        if conn is not pin:
            conn.commit()
    own = one(a, "SELECT throttle.unlock('pgb.pair', %s), pg_backend_pid()", (token,))
    tap.ok(pin is not None and own[0] is False and own[1] != backend
           and held(direct, "pgb.pair") == backend,
           "client A's unlock with its own token, served by the other backend, returns false; "
           "the lock stays held", f"unlock {own}, lock on {backend}")
    tap.is_(pin and one(pin, "SELECT throttle.unlock('pgb.pair', %s)", (token,))[0], True,
            "the client whose transaction has A's backend unlocks it")
    for conn, _ in pinned:
        conn.rollback()
        conn.close()
    a.close()

    # Session pooling: PgBouncer runs DISCARD ALL between clients. It releases advisory
    # locks, and pg_throttle's session locks with them: the next client gets both.
    a = pooler.connect("session")
    token, advisory, backend = one(a, "SELECT throttle.lock('pgb.discard'), pg_try_advisory_lock(28800), "
                                      "pg_backend_pid()")
    a.close()
    b = pooler.connect("session")
    after = one(b, "SELECT throttle.lock('pgb.discard'), pg_try_advisory_lock(28800), pg_backend_pid()")
    tap.ok(token is not None and advisory and after[2] == backend and after[1] is True
           and after[0] is not None and after[0] > token and held(direct, "pgb.discard") == backend,
           "session pooling: after DISCARD ALL the next client on the same backend gets the "
           "advisory lock and the pg_throttle session lock, with a new token", repr(after))
    one(b, "SELECT throttle.unlock('pgb.discard', %s)", (after[0],))
    b.close()
    released_within(direct, "pgb.discard", 5)


def blocking_and_listen(tap, pooler, direct):
    # A blocking call holds its server connection: on 'single', a client's SELECT 1
    # waits for another client's throttle.wait to pass.
    key = f"pgb.block.{uuid.uuid4().hex}"
    sleeper, other = pooler.connect("single"), pooler.connect("single")
    one(sleeper, "SELECT throttle.allow(%s, 1, '2 seconds', 1)", (key,))  # the bucket is empty now
    t = threading.Thread(target=one, args=(sleeper, "SELECT throttle.wait(%s, 1, '2 seconds', 1)", (key,)),
                         daemon=True)
    t.start()
    # Until the wait sleeps on the server (a slow machine may take its time to send it).
    sleeping = "SELECT count(*) FROM pg_stat_activity WHERE query LIKE 'SELECT throttle.wait(%%' " \
               "AND wait_event_type = 'Extension'"
    wait_until(lambda: one(direct, sleeping)[0] == 1, 10)
    t0 = time.monotonic()
    one(other, "SELECT 1")
    took = time.monotonic() - t0
    t.join(10)
    tap.ok(took >= 0.5, f"a client's SELECT 1 waited {took:.2f} s for the server connection that "
           "another client's throttle.wait held")

    # LISTEN through the pooler: the LISTEN stays on a server backend, not with the client.
    channel = "pgb.notify"
    listener = pooler.connect("single")
    with listener.cursor() as cur:
        cur.execute(f'LISTEN "{channel}"')
    one(direct, "SELECT throttle.schedule(%s, 'idle', now())", (channel,))  # NOTIFYs at commit
    time.sleep(0.3)
    one(listener, "SELECT 1")
    one(other, "SELECT 1")
    tap.is_((listener.notifies, other.notifies), ([], []),
            "LISTEN through the pooler: a due event's NOTIFY while the backend is idle reaches nobody")

    t = threading.Thread(target=one, args=(other, "SELECT pg_sleep(2)"), daemon=True)
    t.start()
    wait_until(lambda: one(direct, "SELECT count(*) FROM pg_stat_activity "
                                   "WHERE query = 'SELECT pg_sleep(2)' AND state = 'active'")[0] == 1, 10)
    busy = one(direct, "SELECT throttle.schedule(%s, 'busy', now())", (channel,))[0]
    t.join(5)
    one(listener, "SELECT 1")
    # The busy event's NOTIFY reaches the client the backend serves. A NOTIFY is a hint, so
    # it may come twice (the waker announces what fell due as well), and on a loaded machine
    # the idle event's may still be queued on that backend: what counts is that the client
    # that never listened gets the channel's notifications, the listener none.
    tap.ok(listener.notifies == [] and {n.channel for n in other.notifies} == {channel}
           and str(busy) in [n.payload for n in other.notifies],
           "while the backend serves another client, that client gets the NOTIFY, "
           "though it never listened", f"listener {listener.notifies}, other {other.notifies}")
    for conn in (sleeper, other, listener):
        conn.close()

    # The remedy: LISTEN on a direct connection, claim through the pooler.
    direct_listener = connect()
    with direct_listener.cursor() as cur:
        cur.execute(f'LISTEN "{channel}"')
    one(direct, "SELECT throttle.schedule(%s, 'direct', now())", (channel,))
    deadline = time.monotonic() + 5
    while not direct_listener.notifies and time.monotonic() < deadline:
        select.select([direct_listener], [], [], 0.1)
        direct_listener.poll()
    tap.is_([n.channel for n in direct_listener.notifies], [channel],
            "a LISTEN on a direct connection gets the NOTIFY")
    direct_listener.close()


def main():
    tap = Tap(31)
    direct = connect()
    pooler = PgBouncer(pool_size=POOL, max_client_conn=4 * CLIENTS)
    try:
        pooler.start()
        modes = {p["database"]: p["pool_mode"] for p in pooler.admin("SHOW POOLS")}
        dbname = os.environ.get("PGDATABASE", "postgres")
        tap.is_(modes.get(dbname), "transaction",
                f"PgBouncer on 127.0.0.1:{pooler.port} pools {dbname} in transaction mode")
        leases(tap, pooler)
        rates(tap, pooler)
        acquires(tap, pooler)
        queue(tap, pooler, direct)
        session_locks(tap, pooler, direct)
        blocking_and_listen(tap, pooler, direct)
    except (psycopg2.Error, RuntimeError) as e:
        tap.ok(False, f"the test ran to its end: {e!r}", pooler.log_tail())
    finally:
        pooler.stop()
        direct.close()
    tap.done()


if __name__ == "__main__":
    main()
