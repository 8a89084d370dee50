#!/usr/bin/python3
"""Scale-out on Citus: a coordinator and two workers on loopback, each
preloading citus and pg_throttle. After throttle.distribute(), each key's
state lives on the worker that holds its shard; the promises hold through the
coordinator with several clients, and through a shard move (the move rule:
keys arriving on a node count as granted at the arrival, as after a crash).

Skipped, with the reason, when Citus is not installed (CI does not build it).
Builds clusters of its own on PGPORT + 60 .. 62.
"""
import os
import sys
import threading
import time

import psycopg2

sys.path.insert(0, os.path.dirname(__file__))
from citus_cluster import MAX_LEASE_S, CitusCluster, citus_missing  # noqa: E402
from tap import Tap  # noqa: E402

EVERY_S = 2.0
RATE, PER_S, BURST = 10, 1.0, 5


def q(conn, sql, params=None):
    with conn.cursor() as cur:
        cur.execute(sql, params)
        return cur.fetchall() if cur.description else None


def code_of(conn, sql, params=None):
    try:
        q(conn, sql, params)
        return None
    except psycopg2.Error as e:
        return e.pgcode


def shard_and_port(coord, key):
    return q(coord, "SELECT s.shardid, s.nodeport FROM citus_shards s"
                    " WHERE s.shardid = get_shard_id_for_distribution_column("
                    "'throttle.key_shard', %s)", (key,))[0]


def unmoved_key(coord, prefix, moved_keys):
    """A key of a shard none of `moved_keys`'s shards (keys under the move rule)."""
    moved = {shard_and_port(coord, k)[0] for k in moved_keys}
    return next(k for k in (f"{prefix}-{i}" for i in range(100))
                if shard_and_port(coord, k)[0] not in moved)


def holders(cluster, kind, key):
    """The nodes whose registry has an entry of `kind` for `key`."""
    found = []
    for node in cluster.nodes:
        conn = node.connect()
        if q(conn, "SELECT count(*) FROM throttle.status WHERE kind = %s AND name = %s",
             (kind, key))[0][0]:
            found.append(node.port)
        conn.close()
    return found


def move(coord, shard, source, target, mode):
    q(coord, "SELECT citus_move_shard_placement(%s, '127.0.0.1', %s, '127.0.0.1', %s,"
             " shard_transfer_mode => %s)", (shard, source, target, mode))


class Clients:
    """Several clients through the coordinator, each logging what it was granted."""

    def __init__(self, cluster, key, count):
        self.cluster, self.key, self.count = cluster, key, count
        self.stop = threading.Event()
        self.acquired, self.taken, self.leases, self.errors = [], [], [], []
        self.lock = threading.Lock()

    def run(self, index):
        conn = self.cluster.coordinator.connect()
        key = self.key
        while not self.stop.is_set():
            try:
                if q(conn, "SELECT throttle.acquire(%s, %s)", (key, f"{EVERY_S} seconds"))[0][0]:
                    with self.lock:
                        self.acquired.append(time.time())
                if q(conn, "SELECT throttle.allow(%s, %s, %s, %s)",
                     (key, RATE, f"{PER_S} seconds", BURST))[0][0]:
                    with self.lock:
                        self.taken.append(time.time())
                token = q(conn, "SELECT throttle.lock(%s, ttl => '2 seconds')", (key,))[0][0]
                if token is not None:
                    start = time.time()
                    time.sleep(0.01)
                    released = q(conn, "SELECT throttle.unlock(%s, %s)", (key, token))[0][0]
                    with self.lock:
                        self.leases.append((start, time.time(), token, released, index))
            except psycopg2.Error as e:
                with self.lock:
                    self.errors.append((time.time(), e.pgcode, str(e).splitlines()[0]))
                time.sleep(0.01)
        conn.close()

    def __enter__(self):
        self.threads = [threading.Thread(target=self.run, args=(i,)) for i in range(self.count)]
        self.started = time.time()
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        for t in self.threads:
            t.join()
        self.ended = time.time()


def check_logs(tap, clients, what):
    gaps = [b - a for a, b in zip(clients.acquired, clients.acquired[1:])]
    # Grants are logged after the call returns: allow the logging delay.
    tap.ok(clients.acquired and min(gaps, default=EVERY_S) >= EVERY_S - 0.1,
           f"{what}: acquire granted at most once per {EVERY_S} s "
           f"({len(clients.acquired)} grants)", f"gaps {gaps}")
    elapsed = clients.ended - clients.started
    bound = BURST + RATE * elapsed / PER_S
    tap.ok(0 < len(clients.taken) <= bound,
           f"{what}: allow granted {len(clients.taken)} of at most {bound:.0f} "
           f"(burst + rate x {elapsed:.1f} s)")
    leases = sorted(clients.leases)
    overlaps = [(a, b) for a, b in zip(leases, leases[1:]) if b[0] < a[1] - 0.005 and a[3]]
    tap.ok(leases and not overlaps, f"{what}: {len(leases)} leases, never two holders at once",
           f"{overlaps[:3]}")
    tokens = [lease[2] for lease in leases]
    tap.ok(tokens == sorted(tokens) and len(set(tokens)) == len(tokens),
           f"{what}: fence tokens grow with each lease")


def sleepers_through_move(tap, cluster, coord, key, away_and_back):
    """A wait and a lock waiter sleep while the key's shard moves (away, or
    away and back): the move does not wait for them, and neither passes
    after it."""
    what = "away and back" if away_and_back else "away"
    q(coord, "SELECT throttle.take(%s, 1, '8 seconds', 1)", (key,))
    tap.ok(q(coord, "SELECT throttle.lock(%s, ttl => '5 seconds')", (key,))[0][0] is not None,
           "a lease is held, for a waiter to queue behind")
    outcomes = {}

    def sleeper(name, sql):
        conn = cluster.coordinator.connect()
        try:
            outcomes[name] = q(conn, sql, (key,))[0][0]
        except psycopg2.Error as e:
            outcomes[name] = e.pgcode
        conn.close()

    threads = [threading.Thread(target=sleeper, args=(
                   "wait", "SELECT throttle.wait(%s, 1, '8 seconds', 1)")),
               threading.Thread(target=sleeper, args=(
                   "lock", "SELECT throttle.lock(%s, ttl => '5 seconds', wait => '20 seconds')"))]
    for t in threads:
        t.start()
    time.sleep(1.0)
    shard, source = shard_and_port(coord, key)
    target = next(w.port for w in cluster.workers if w.port != source)
    started = time.time()
    move(coord, shard, source, target, "block_writes")
    if away_and_back:
        move(coord, shard, target, source, "block_writes")
    took = time.time() - started
    tap.ok(took < 3.5, f"moving the shard {what} does not wait for calls sleeping in wait or a "
                       f"lock's queue ({took:.1f} s)")
    for t in threads:
        t.join()
    tap.is_(outcomes["wait"], "55000",
            f"a wait that reserved before the shard moved {what} does not pass (55000): the node "
            f"that holds it now counts the bucket as emptied at the arrival")
    tap.is_(outcomes["lock"], "55000",
            f"a lock waiter woken after the shard moved {what} is told so (55000) instead of "
            f"being handed the lock")
    tap.is_(q(coord, "SELECT throttle.lock(%s, ttl => '1 second')", (key,))[0][0], None,
            "and the node that holds the key now does not give the lease either")


def run(tap, cluster):
    coord = cluster.coordinator.connect()
    q(coord, "SELECT throttle.acquire('before', '1 hour')")
    tap.is_(code_of(coord, "SELECT throttle.distribute(8)"), "55000",
            "throttle.distribute() refuses while the coordinator holds keys in force (55000)")
    q(coord, "SELECT throttle.reset('before')")
    tap.is_(q(coord, "SELECT throttle.distribute(8)")[0][0], 11,
            "throttle.distribute() distributes the 11 key-taking functions")
    tap.is_(q(coord, "SELECT count(DISTINCT shard_id) FROM throttle.key_shard")[0][0], 8,
            "the anchor table names the first placement of each of its 8 shards")
    tap.is_(q(coord, "SELECT throttle.distribute()")[0][0], 11,
            "throttle.distribute() again is harmless")
    tap.is_(code_of(coord, "SELECT throttle.distribute(4)"), "55000",
            "a second distribute with another shard count is refused (55000)")
    worker = cluster.workers[0].connect()
    tap.is_(code_of(worker, "SELECT throttle.distribute()"), "55000",
            "throttle.distribute() on a worker is refused (55000)")
    q(coord, "CREATE DATABASE plain")
    plain = cluster.coordinator.connect(dbname="plain")
    q(plain, "CREATE EXTENSION pg_throttle")
    tap.is_(code_of(plain, "SELECT throttle.distribute()"), "55000",
            "throttle.distribute() without the citus extension is refused (55000)")
    tap.is_(q(plain, "SELECT throttle.acquire('local', '1 hour')")[0][0], True,
            "a database that is not distributed keeps working alone")
    plain.close()

    # Keys land on the worker that holds their shard, and only there.
    keys = [f"key-{i}" for i in range(16)]
    for key in keys:
        q(coord, "SELECT throttle.acquire(%s, '1 hour')", (key,))
    misplaced = []
    ports = set()
    for key in keys:
        _, port = shard_and_port(coord, key)
        ports.add(port)
        if holders(cluster, "resource", key) != [port]:
            misplaced.append((key, port, holders(cluster, "resource", key)))
    tap.ok(not misplaced, "each of 16 keys lives on exactly the worker that holds its shard",
           misplaced)
    tap.is_(len(ports), 2, "and the keys are spread over both workers")
    tap.is_(q(coord, "SELECT throttle.acquire('key-0', '1 hour')")[0][0], False,
            "a second acquire through the coordinator is denied (same worker, same state)")

    # What is refused.
    code = code_of(coord, "BEGIN; SELECT throttle.acquire('key-0', '1 hour')")
    q(coord, "ROLLBACK")
    tap.is_(code, "55000", "a call Citus does not delegate (in a transaction block) runs on the "
                           "coordinator, which does not hold the key: refused (55000)")
    other = next(w for w in cluster.workers if w.port != shard_and_port(coord, "key-0")[1])
    wrong = other.connect()
    # (Citus 13.2.2 itself crashes planning a distributed function called
    # from a FROM list on a worker, so the call runs in a transaction block.)
    tap.is_(q(wrong, "SELECT throttle.acquire('key-0', '1 hour')")[0][0], False,
            "a call made on a worker that does not hold the key is delegated by Citus to the one "
            "that does")
    code = code_of(wrong, "BEGIN; SELECT throttle.acquire('key-0', '1 hour')")
    q(wrong, "ROLLBACK")
    tap.is_(code, "55000", "a call run on a worker that does not hold the key is refused (55000)")
    wrong.close()
    tap.is_(code_of(coord, "SELECT throttle.lock('session-lock')"), "0A000",
            "a session lock through the coordinator is refused (0A000)")
    direct = cluster.workers[0].connect()
    q(direct, "SET search_path = public, pg_catalog")
    tap.is_(code_of(direct, "BEGIN; SELECT throttle.lock('session-lock')"), "0A000",
            "and on a worker directly (no end a shard move could wait out)")
    q(direct, "ROLLBACK")
    direct.close()
    token = q(coord, "SELECT throttle.lock('lease-a', ttl => '5 seconds')")[0][0]
    tap.ok(token is not None, "a lease through the coordinator is granted")
    tap.is_(q(coord, "SELECT throttle.unlock('lease-a', %s)", (token,))[0][0], True,
            "and released by its token")
    tap.is_(q(coord, "SELECT throttle.reset('key-0')")[0][0], 1,
            "throttle.reset reaches the key's worker")
    tap.is_(q(coord, "SELECT throttle.acquire('key-0', '1 hour')")[0][0], True,
            "and the reset resource is granted again")
    rows = q(coord, "SELECT count(*) FROM run_command_on_workers("
                    "$$SELECT count(*) FROM throttle.status WHERE name LIKE 'key-%'$$)"
                    " WHERE success")[0][0]
    tap.is_(rows, 2, "throttle.status is read across the cluster with run_command_on_workers")

    # Several clients through the coordinator; the key's shard moves under them.
    key = "moving"
    shard, source = shard_and_port(coord, key)
    target = next(w.port for w in cluster.workers if w.port != source)
    with Clients(cluster, key, 6) as clients:
        time.sleep(1.5)
        move(coord, shard, source, target, "block_writes")
        moved_at = time.time()
        time.sleep(EVERY_S * 2 + 0.5)
    tap.is_(shard_and_port(coord, key)[1], target, "the shard moved (block_writes)")
    check_logs(tap, clients, "6 clients through a block_writes move")
    after = [t for t in clients.acquired if t > moved_at]
    tap.ok(after and min(after) - moved_at >= EVERY_S - 0.1 - 1.0,
           "after the move, acquire waits out an interval from the arrival",
           f"first grant {min(after, default=0) - moved_at:.2f} s after the move")
    tap.ok(all(code == "55000" for _, code, _ in clients.errors),
           f"the only errors were calls that raced the move (55000): {len(clients.errors)}",
           clients.errors[:3])
    shard, source = shard_and_port(coord, key)
    target = next(w.port for w in cluster.workers if w.port != source)
    with Clients(cluster, key, 6) as clients:
        time.sleep(1.0)
        move(coord, shard, source, target, "force_logical")
        time.sleep(EVERY_S * 2 + 0.5)
    tap.is_(shard_and_port(coord, key)[1], target,
            "the shard moved back to its first node (force_logical)")
    check_logs(tap, clients, "6 clients through a logical move back")

    # The move rule, call by call, each call twice.
    key = "rule"
    q(coord, "SELECT throttle.acquire(%s, '1 hour')", (key,))
    token = q(coord, "SELECT throttle.lock(%s, ttl => %s)", (key, f"{MAX_LEASE_S} seconds"))[0][0]
    q(coord, "SELECT throttle.take(%s, 1, '1 hour', 2, 2)", (key,))
    shard, source = shard_and_port(coord, key)
    target = next(w.port for w in cluster.workers if w.port != source)
    move(coord, shard, source, target, "block_writes")
    # Microseconds since 2000-01-01, as PostgreSQL counts them (the arrival
    # is noted by the first call below).
    arrival = q(coord, "SELECT ((extract(epoch FROM clock_timestamp()) - 946684800)"
                       " * 1000000)::bigint")[0][0]
    for attempt in ("first", "second"):
        tap.is_(q(coord, "SELECT throttle.acquire(%s, '1 second')", (key,))[0][0], False,
                f"after the move, acquire is denied ({attempt} call): granted at the arrival")
        tap.is_(q(coord, "SELECT allowed FROM throttle.take(%s, 1, '1 hour', 2, 0)",
                  (key,))[0][0], False,
                f"a peek at the bucket finds it empty ({attempt} call)")
        tap.is_(q(coord, "SELECT throttle.lock(%s, ttl => '1 second')", (key,))[0][0], None,
                f"the lease is not given to a second holder ({attempt} call)")
    tap.is_(q(coord, "SELECT throttle.renew(%s, %s, '1 second')", (key, token))[0][0], False,
            "the old holder cannot renew a lease its node no longer holds")
    tap.is_(q(coord, "SELECT throttle.unlock(%s, %s)", (key, token))[0][0], False,
            "nor unlock it")
    time.sleep(MAX_LEASE_S + 0.5)
    new_token = q(coord, "SELECT throttle.lock(%s, ttl => '1 second')", (key,))[0][0]
    tap.ok(new_token is not None and new_token > token,
           "pg_throttle.max_lease after the arrival the lease is granted, with a token above "
           "the old node's", f"{token} -> {new_token}")
    tap.ok(new_token is not None and new_token >= arrival + MAX_LEASE_S * 1000000,
           "its token starts at the end of the move rule (arrival + max_lease in microseconds), "
           "clear of the old node's counter however near its clock that ran",
           f"{new_token} < {arrival} + {MAX_LEASE_S} s")
    tap.is_(q(coord, "SELECT throttle.acquire(%s, '1 second')", (key,))[0][0], True,
            "and a short interval is granted again")

    # A move waits for a call in progress on the old node (forced here with a
    # transaction held open on the worker that holds the key), and once it
    # has committed the old node refuses the key.
    key = "held"
    shard, source = shard_and_port(coord, key)
    target = next(w.port for w in cluster.workers if w.port != source)
    held = cluster.worker_of_port(source).connect()
    q(held, "BEGIN")
    q(held, "SELECT throttle.acquire(%s, '1 hour')", (key,))

    def move_in_background():
        conn = cluster.coordinator.connect()
        move(conn, shard, source, target, "block_writes")
        conn.close()

    mover = threading.Thread(target=move_in_background)
    mover.start()
    time.sleep(1.5)
    tap.ok(mover.is_alive(), "a move waits for a call whose transaction is still open on the "
                             "old node")
    q(held, "COMMIT")
    mover.join(30)
    tap.ok(not mover.is_alive() and shard_and_port(coord, key)[1] == target,
           "and completes once that transaction ends")
    q(held, "BEGIN")
    code = code_of(held, "SELECT throttle.acquire(%s, '1 hour')", (key,))
    q(held, "ROLLBACK")
    tap.is_(code, "55000", "after the move the old node refuses the key (55000)")
    held.close()

    # A call sleeping in wait or in a lock's queue does not hold a move back
    # (nor, behind that move, every call of the shard); woken after the move,
    # each is told its key moved rather than passed or handed the lock on the
    # old node.
    sleepers_through_move(tap, cluster, coord, "sleepers", False)
    sleepers_back = unmoved_key(coord, "sleepers", ("moving", "rule", "held", "sleepers"))
    sleepers_through_move(tap, cluster, coord, sleepers_back, True)

    # Back to a node whose memory still has the key from before: that entry is stale.
    key = back_key = unmoved_key(coord, "back", ("moving", "rule", "held", "sleepers",
                                                  sleepers_back))
    shard, first = shard_and_port(coord, key)
    second = next(w.port for w in cluster.workers if w.port != first)
    tap.is_(q(coord, "SELECT throttle.acquire(%s, '3 seconds')", (key,))[0][0], True,
            "a resource granted on its first node")
    move(coord, shard, first, second, "block_writes")
    tap.is_(q(coord, "SELECT throttle.acquire(%s, '3 seconds')", (key,))[0][0], False,
            "on the second node, the first call notes the arrival and is denied")
    time.sleep(3.2)
    tap.is_(q(coord, "SELECT throttle.acquire(%s, '3 seconds')", (key,))[0][0], True,
            "granted again on the second node an interval after the arrival")
    move(coord, shard, second, first, "block_writes")
    for attempt in ("first", "second"):
        tap.is_(q(coord, "SELECT throttle.acquire(%s, '3 seconds')", (key,))[0][0], False,
                f"back on the first node, its old entry does not grant within the second node's "
                f"interval ({attempt} call)")

    # A split is a move of the keys into new shards (the lock that names a
    # shard's metadata changes with the shards' order, too).
    key = unmoved_key(coord, "split", ("moving", "rule", "held", "sleepers",
                                            sleepers_back, back_key))
    shard, port = shard_and_port(coord, key)
    tap.is_(q(coord, "SELECT throttle.acquire(%s, '1 hour')", (key,))[0][0], True,
            "a resource granted before its shard is split")
    low, high = q(coord, "SELECT shardminvalue::int, shardmaxvalue::int FROM pg_dist_shard"
                         " WHERE shardid = %s", (shard,))[0]
    node = q(coord, "SELECT nodeid FROM pg_dist_node WHERE nodeport = %s", (port,))[0][0]
    q(coord, "SELECT citus_split_shard_by_split_points(%s, ARRAY[%s], ARRAY[%s, %s],"
             " shard_transfer_mode => 'block_writes')",
      (shard, str(low + (high - low) // 2), node, node))
    for attempt in ("first", "second"):
        tap.is_(q(coord, "SELECT throttle.acquire(%s, '1 second')", (key,))[0][0], False,
                f"after the split, the key counts as granted at its arrival in the new shard "
                f"({attempt} call)")
    time.sleep(1.1)
    tap.is_(q(coord, "SELECT throttle.acquire(%s, '1 second')", (key,))[0][0], True,
            "and is granted an interval later")
    coord.close()
    worker.close()


def main():
    missing = citus_missing()
    if missing:
        print(f"1..0 # SKIP {missing}", flush=True)
        return
    tap = Tap(66)
    cluster = CitusCluster(int(os.environ.get("PGPORT", "5432")) + 60)
    try:
        cluster.start()
        run(tap, cluster)
    finally:
        cluster.stop()
    tap.done()


if __name__ == "__main__":
    main()
