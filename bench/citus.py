#!/usr/bin/python3
"""make bench-citus: pg_throttle spread over a three-node Citus cluster on this
machine (a coordinator and two workers on loopback, fsync on), through the
coordinator, against SELECT 1 on the coordinator, a Citus router read of a
distributed table (the cost of the hop to a worker) and the recipe a Citus user
would write (an UPDATE of a table distributed by the key). pgbench -M prepared;
interleaved rounds, the median. Needs Citus installed for the server (it is
not built by the project); says so and stops otherwise.
  BENCH_SECONDS (5)  BENCH_ROUNDS (3)  BENCH_CLIENTS (8)  BENCH_THREADS (2)
"""
import os
import re
import statistics
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "test", "integration"))
from citus_cluster import CitusCluster, citus_missing  # noqa: E402
from cluster import BIN  # noqa: E402

SECONDS = int(os.environ.get("BENCH_SECONDS", "5"))
ROUNDS = int(os.environ.get("BENCH_ROUNDS", "3"))
CLIENTS = int(os.environ.get("BENCH_CLIENTS", "8"))
THREADS = int(os.environ.get("BENCH_THREADS", "2"))
CONTENDERS = [
    ("select1", "SELECT 1 on the coordinator (ceiling)"),
    ("router_read", "Citus router read of a distributed table, 100 000 keys (the hop)"),
    ("acquire_100k", "throttle.acquire through the coordinator, 100 000 resources"),
    ("allow_100k", "throttle.allow through the coordinator, 100 000 keys"),
    ("update_100k", "recipe: UPDATE task_keys ... RETURNING, distributed, 100 000 keys"),
    ("lease_unlock", "throttle.lock(ttl) + throttle.unlock through the coordinator (pair)"),
]


def pgbench(port, script):
    out = subprocess.run([f"{BIN}/pgbench", "-n", "-M", "prepared", "-c", str(CLIENTS),
                          "-j", str(THREADS), "-T", str(SECONDS), "-h", "127.0.0.1",
                          "-p", str(port), "-U", "postgres", "-f",
                          os.path.join(HERE, "citus", f"{script}.sql"), "postgres"],
                         capture_output=True, text=True)
    found = re.search(r"tps = ([0-9.]+) \(without initial connection time\)", out.stdout)
    if not found:
        sys.exit(f"pgbench {script} failed:\n{out.stdout}{out.stderr}")
    return float(found.group(1))


def psql(port, sql):
    done = subprocess.run([f"{BIN}/psql", "-qX", "-v", "ON_ERROR_STOP=1", "-o", "/dev/null",
                           "-h", "127.0.0.1", "-p", str(port), "-U", "postgres", "postgres"],
                          input=sql, capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"psql failed:\n{done.stderr}")


def main():
    missing = citus_missing()
    if missing:
        print(f"bench-citus: skipped: {missing}")
        return
    # fsync on, as on a real server; 100 000 resources, 100 000 buckets and
    # the leases of one role: quotas off, as bench/run.sh does.
    cluster = CitusCluster(int(os.environ.get("PGPORT", "5432")) + 70, extra_conf="""
fsync = on
pg_throttle.max_entries = 300000
pg_throttle.role_quota = 100
pg_throttle.database_quota = 100
""")
    try:
        cluster.start()
        port = cluster.coordinator.port
        psql(port, open(os.path.join(HERE, "citus", "setup.sql")).read())
        # The 100 000 resources exist before the runs, one statement each: a
        # call Citus sends to a worker stands alone in its statement.
        psql(port, "".join(f"SELECT throttle.acquire('bench.key.{g}', '1 hour');\n"
                           for g in range(1, 100001)))
        results = {name: [] for name, _ in CONTENDERS}
        for round_ in range(1, ROUNDS + 1):
            for name, _ in CONTENDERS:
                tps = pgbench(port, name)
                results[name].append(tps)
                print(f"round {round_}  {name:<14} {tps:12.0f} tps", file=sys.stderr)
        base = statistics.median(results["select1"])
        hop = statistics.median(results["router_read"])
        version = subprocess.run([f"{BIN}/psql", "-qXtAc", "SELECT extversion FROM pg_extension"
                                  " WHERE extname = 'citus'", "-h", "127.0.0.1", "-p", str(port),
                                  "-U", "postgres", "postgres"],
                                 capture_output=True, text=True).stdout.strip()
        print(f"\npgbench -M prepared, {CLIENTS} clients, {THREADS} threads, {ROUNDS} interleaved "
              f"rounds of {SECONDS} s, against the coordinator; Citus {version}, a coordinator and "
              f"two workers on one {os.cpu_count()}-core machine, fsync on, 32 shards\n")
        print("| contender | median tps | × SELECT 1 | × router read | rounds (min – max) |")
        print("|---|---:|---:|---:|---:|")
        for name, label in CONTENDERS:
            m = statistics.median(results[name])
            print(f"| {label} | {m:.0f} | {m / base:.2f} | {m / hop:.2f} | "
                  f"{min(results[name]):.0f} – {max(results[name]):.0f} |")
    finally:
        cluster.stop()


if __name__ == "__main__":
    main()
