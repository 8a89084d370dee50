#!/usr/bin/python3
"""Fault-injection soak test: pg_throttle's promises through crashes,
restarts and failovers, checked from what real clients saw.

Two clusters of its own on loopback: a primary and a streaming standby that
is synchronous (synchronous_standby_names = '*'), so that a promotion loses
nothing that was promised. Client processes (clients.py) call acquire,
allow and wait, lock / renew / unlock, schedule and claim_group / complete,
and log every answer. A driver, between stretches of work, injects one fault
per cycle, sometimes right after a CHECKPOINT:
  backend    a client's backend killed with SIGKILL (shared memory is reset)
  postmaster the primary's postmaster killed with SIGKILL, then started again
  restart    a clean restart (pg_ctl restart -m fast)
  promote    the primary's postmaster killed, the standby promoted, a new
             standby built from it (pg_basebackup) and made synchronous
  checkpointed-crashes
             a backend killed, pg_throttle's checkpoint written, then the
             postmaster killed: crash rules through a checkpoint between crashes
  started-as-primary
             the primary's postmaster killed, the standby stopped cleanly and
             started again without standby.signal (no promotion), a new
             standby built from it
Then the producer stops, the workers drain the queue, and the checker
(checker.py) reads the logs: no resource granted twice inside its interval,
no bucket above burst + rate * elapsed, no two holders of a lease or of a
queue group at once, fence tokens strictly increasing per name, every
scheduled event done.

  soak.py [--cycles N] [--seed S] [--summary FILE]
SOAK_CYCLES / SOAK_SEED set the defaults. Prints TAP.
"""
import argparse
import json
import multiprocessing
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter, defaultdict

import psycopg2

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "integration"))
import checker  # noqa: E402
import clients  # noqa: E402
from cluster import BIN, kill_postmaster  # noqa: E402
from tap import Tap  # noqa: E402

WORKLOAD = {"acquire": 2, "rate": 2, "lease": 3, "producer": 1, "worker": 3}
FAULTS = ["backend", "postmaster", "restart", "promote", "checkpointed-crashes",
          "started-as-primary"]
WORK_S = (3.0, 6.0)


def as_postgres(*command, check=True):
    return subprocess.run(["runuser", "-u", "postgres", "--", *command], check=check,
                          capture_output=True, text=True)


class Node:
    """One cluster: its own directory, port and socket."""

    def __init__(self, root, name, port):
        self.dir = os.path.join(root, name)
        self.data = os.path.join(self.dir, "data")
        self.port = port
        os.makedirs(self.dir, exist_ok=True)
        shutil.chown(self.dir, "postgres", "postgres")

    def configure(self):
        with open(os.path.join(self.data, "postgresql.conf"), "a") as f:
            f.write(f"""
listen_addresses = '127.0.0.1'
port = {self.port}
unix_socket_directories = '{self.dir}'
shared_preload_libraries = 'pg_throttle'
pg_throttle.max_lease = '30s'
pg_throttle.checkpoint_interval = '1s'
checkpoint_timeout = '30s'
max_connections = 40
hot_standby = on
wal_keep_size = '64MB'
""")
        with open(os.path.join(self.data, "pg_hba.conf"), "w") as f:
            f.write("local all all trust\nhost all all 127.0.0.1/32 trust\n"
                    "host replication all 127.0.0.1/32 trust\n")

    def pg_ctl(self, action, *extra, check=True):
        return as_postgres(f"{BIN}/pg_ctl", "-D", self.data, "-l", os.path.join(self.dir, "log"),
                           "-w", "-t", "60", action, *extra, check=check)

    def connect(self, dbname="soak"):
        conn = psycopg2.connect(host="127.0.0.1", port=self.port, dbname=dbname, user="postgres",
                                connect_timeout=5)
        conn.autocommit = True
        return conn

    def sql(self, statement, params=None, dbname="soak"):
        """Runs an idempotent statement, retrying while the server restarts."""
        for _ in range(600):
            conn = None
            try:
                conn = self.connect(dbname)
                with conn.cursor() as cur:
                    cur.execute(statement, params)
                    return cur.fetchall() if cur.description else None
            except psycopg2.OperationalError:
                time.sleep(0.1)
            finally:
                if conn is not None:
                    conn.close()
        raise RuntimeError(f"node on port {self.port} does not accept connections")

    def kill_postmaster(self):
        kill_postmaster(self.data, socket_dir=self.dir)

    def log_text(self):
        try:
            with open(os.path.join(self.dir, "log")) as f:
                return f.read()
        except FileNotFoundError:
            return ""


class Soak:
    def __init__(self, root, seed):
        self.rng = random.Random(seed)
        base = int(os.environ.get("SOAK_PORT", "5610"))
        self.primary = Node(root, "a", base)
        self.standby = Node(root, "b", base + 1)
        self.faults = Counter()

    def init_primary(self):
        as_postgres(f"{BIN}/initdb", "-D", self.primary.data, "-A", "trust", "--no-sync")
        self.primary.configure()
        self.primary.pg_ctl("start")
        self.primary.sql("CREATE DATABASE soak", dbname="postgres")
        self.primary.sql("CREATE EXTENSION pg_throttle")

    def build_standby(self):
        shutil.rmtree(self.standby.data, ignore_errors=True)
        as_postgres(f"{BIN}/pg_basebackup", "-h", "127.0.0.1", "-p", str(self.primary.port),
                    "-U", "postgres", "-D", self.standby.data, "-R", "-X", "stream", "-c", "fast")
        self.standby.configure()
        self.standby.pg_ctl("start")
        # Synchronous once it streams: from then on a promotion loses nothing.
        self.primary.sql("ALTER SYSTEM SET synchronous_standby_names = '*'")
        self.primary.sql("SELECT pg_reload_conf()")
        for _ in range(600):
            rows = self.primary.sql("SELECT count(*) FROM pg_stat_replication WHERE sync_state = 'sync'")
            if rows[0][0] > 0:
                return
            time.sleep(0.1)
        raise RuntimeError("the standby never became synchronous")

    def kill_a_backend(self):
        rows = self.primary.sql("SELECT pid FROM pg_stat_activity WHERE backend_type = "
                                "'client backend' AND pid <> pg_backend_pid()")
        if rows:
            os.kill(self.rng.choice(rows)[0], signal.SIGKILL)

    def inject(self, fault):
        self.faults[fault] += 1
        if self.rng.random() < 0.5:
            # The lease journal must carry leases granted before the redo point.
            self.primary.sql("CHECKPOINT")
        if fault == "backend":
            self.kill_a_backend()
        elif fault == "postmaster":
            self.primary.kill_postmaster()
            self.primary.pg_ctl("start")
        elif fault == "restart":
            self.primary.pg_ctl("restart", "-m", "fast")
        elif fault == "checkpointed-crashes":
            self.kill_a_backend()
            time.sleep(0.5)  # the clients' calls after the crash, under its rules
            self.primary.sql("SELECT throttle.checkpoint()")
            self.primary.kill_postmaster()
            self.primary.pg_ctl("start")
        elif fault in ("promote", "started-as-primary"):
            self.primary.kill_postmaster()
            if fault == "promote":
                self.standby.pg_ctl("promote")
            else:
                self.standby.pg_ctl("stop", "-m", "fast")
                os.unlink(os.path.join(self.standby.data, "standby.signal"))
                self.standby.pg_ctl("start")
            self.primary, self.standby = self.standby, self.primary
            self.primary.sql("ALTER SYSTEM RESET synchronous_standby_names")
            self.primary.sql("SELECT pg_reload_conf()")
            self.build_standby()
        self.primary.sql("SELECT 1")  # back in service

    def schedule(self, cycles):
        """Every kind of fault at least once, the rest at random."""
        plan = FAULTS[:] if cycles >= len(FAULTS) else FAULTS[:cycles]
        plan += [self.rng.choice(FAULTS) for _ in range(cycles - len(plan))]
        self.rng.shuffle(plan)
        return plan


def read_logs(log_dir):
    records = []
    for name in sorted(os.listdir(log_dir)):
        with open(os.path.join(log_dir, name)) as f:
            for line in f:
                if line.strip():
                    records.append(json.loads(line))
    return records


def leases_from(records):
    """One record per lease grant, with its renews and its release."""
    leases = {}
    for r in records:
        key = (r.get("name"), r.get("token"))
        if r["op"] == "lock" and r["token"] is not None:
            leases[key] = {"name": r["name"], "token": r["token"], "s": r["s"], "e": r["e"],
                           "renews": [], "released": None}
        elif r["op"] == "renew" and key in leases:
            leases[key]["renews"].append((r["s"], r["e"], r["ok"]))
        elif r["op"] == "unlock" and key in leases:
            leases[key]["released"] = r["s"]
    return list(leases.values())


def group_claims(records):
    """Each claim as an interval: from its answer until its complete started or
    its lease surely ended."""
    claims = {}
    for r in records:
        key = (r.get("worker"), r.get("token"))
        if r["op"] == "claim":
            claims[key] = {"name": r["group"], "token": r["token"], "s": r["s"], "e": r["e"],
                           "worker": r["worker"], "released": None}
        elif r["op"] == "complete" and key in claims:
            claims[key]["released"] = r["s"]
    return list(claims.values())


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--cycles", type=int, default=int(os.environ.get("SOAK_CYCLES", "6")))
    parser.add_argument("--seed", type=int, default=int(os.environ.get("SOAK_SEED", str(int(time.time())))))
    parser.add_argument("--summary")
    args = parser.parse_args()
    tap = Tap(12)
    print(f"# seed {args.seed}, {args.cycles} cycles", flush=True)
    root = tempfile.mkdtemp(prefix="pg_throttle_soak.")
    shutil.chown(root, "postgres", "postgres")
    log_dir = os.path.join(root, "client-logs")
    os.makedirs(log_dir)
    soak = Soak(root, args.seed)
    try:
        run(args, tap, soak, root, log_dir)
    finally:
        # Whatever happened, no server or client outlives the test.
        for node in (soak.primary, soak.standby):
            if os.path.exists(os.path.join(node.data, "postmaster.pid")):
                node.pg_ctl("stop", "-m", "immediate", check=False)
        for p in multiprocessing.active_children():
            p.terminate()
    if tap.failed == 0:
        shutil.rmtree(root, ignore_errors=True)
    else:
        print(f"# clusters' logs and client logs kept in {root}", flush=True)
    tap.done()


def run(args, tap, soak, root, log_dir):
    started = time.time()
    soak.init_primary()
    soak.build_standby()
    ports = [soak.primary.port, soak.standby.port]

    stop = multiprocessing.Event()
    produce = multiprocessing.Event()
    produce.set()
    processes = []
    for kind, count in WORKLOAD.items():
        for i in range(count):
            p = multiprocessing.Process(target=clients.run_client, daemon=True,
                                        args=(kind, i, ports, os.path.join(log_dir, f"{kind}-{i}.log"),
                                              stop, produce))
            p.start()
            processes.append(p)

    plan = soak.schedule(args.cycles)
    last_fault = started
    for cycle, fault in enumerate(plan, 1):
        time.sleep(soak.rng.uniform(*WORK_S))
        t = time.time()
        soak.inject(fault)
        last_fault = time.time()
        print(f"# cycle {cycle}: {fault} ({last_fault - t:.1f} s to recover)", flush=True)
    time.sleep(soak.rng.uniform(*WORK_S))  # work after the last fault too

    # Drain: nothing new is scheduled; the workers finish what is there.
    produce.clear()
    time.sleep(1.0)
    drained = False
    for _ in range(900):
        rows = soak.primary.sql("SELECT count(*) FROM throttle.all_events WHERE queue = 'soak' "
                                "AND state IN ('pending', 'claimed')")
        if rows[0][0] == 0:
            drained = True
            break
        time.sleep(0.1)
    stop.set()
    for p in processes:
        p.join(timeout=30)
    elapsed = time.time() - started

    records = read_logs(log_dir)
    ops = Counter(r["op"] for r in records)
    final = defaultdict(list)
    for key, state in soak.primary.sql("SELECT item_key, state FROM throttle.all_events WHERE queue = 'soak'"):
        final[key].append(state)
    scheduled = {r["key"] for r in records if r["op"] == "schedule"}
    acquired = [r for r in records if r["op"] == "acquire" and r["granted"]]
    allowed = [r for r in records if r["op"] == "take" and r["allowed"]]
    leases = leases_from(records)
    claims = group_claims(records)

    violations = {
        "resources": checker.resource_violations(acquired, clients.EVERY_S),
        "bucket": checker.bucket_violations(allowed, clients.BURST, clients.PER_S / clients.RATE),
        "leases": checker.overlap_violations(checker.holding_intervals(leases, clients.LEASE_TTL_S),
                                             "lease"),
        "lease tokens": checker.token_violations(leases, "lease"),
        "groups": checker.overlap_violations(checker.holding_intervals(claims, clients.CLAIM_LEASE_S),
                                             "group"),
        "group tokens": checker.token_violations(claims, "group"),
        "events": checker.event_violations(scheduled, final),
    }
    tap.ok(set(soak.faults) == set(FAULTS) or args.cycles < len(FAULTS),
           f"faults injected: {dict(soak.faults)}")
    tap.ok(min(len(acquired), len(allowed), len(leases), len(claims), len(scheduled)) > 0,
           f"every workload made progress: {len(acquired)} grants, {len(allowed)} units, "
           f"{len(leases)} leases, {len(claims)} group claims, {len(scheduled)} events")
    tap.ok(any(r["op"] == "lock" and r["token"] is not None and r["s"] > last_fault for r in records),
           "leases are granted again after the last fault")
    tap.ok(drained, "the queue drained after the faults")
    for name, found in violations.items():
        tap.ok(not found, f"{name}: no violation", "\n".join(found[:20]))
    promoted = sum(1 for n in (soak.primary, soak.standby) if "pg_throttle noticed the promotion" in n.log_text())
    tap.ok(soak.faults["promote"] == 0 or promoted > 0, "the promoted server noticed its promotion")
    total = sum(len(v) for v in violations.values())
    print(f"# soak: {args.cycles} crash cycles {dict(soak.faults)}, {sum(ops.values())} logged calls "
          f"({dict(ops)}), {total} violations, {elapsed:.0f} s", flush=True)
    if args.summary:
        with open(args.summary, "w") as f:
            json.dump({"seed": args.seed, "cycles": args.cycles, "faults": dict(soak.faults),
                       "calls": sum(ops.values()), "by_op": dict(ops), "violations": total,
                       "seconds": round(elapsed)}, f)



if __name__ == "__main__":
    main()
