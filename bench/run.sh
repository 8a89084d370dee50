#!/usr/bin/env bash
# make bench: pg_throttle against SELECT 1, the SQL recipes and Redis, on a
# throwaway cluster, with pgbench (prepared protocol) and redis-benchmark.
# Rounds are interleaved so that drift hits every contender alike; the table
# reports the median round.
#   BENCH_SECONDS (5)  BENCH_ROUNDS (3)  BENCH_CLIENTS (8)  BENCH_THREADS (2)
# First bench/hot-paths.sh (the hot paths against SELECT 1), then bench/queue.sh (the event queue against its SQL recipe),
# bench/queue-node.sh (the queue from Node workers against the recipes,
# graphile-worker and pg-boss),
# bench/queue-real.sh (the same contenders as they really run: 32 workers,
# 20 ms jobs, long jobs held, a stream's latency, an old snapshot),
# bench/queue-bound.sh (what bounds a claim: one worker, with claims in force),
# bench/wakeups.sh (idle LISTENing workers: lateness after a run_at ahead, a
# backoff, a lease's end, against polling),
# bench/fairness.sh (small tenants' lateness behind a big one, claim_group
# oldest first against round robin),
# bench/status_scan.sh (grants while sessions loop over throttle.status) and
# bench/scale.sh (1 000 000 live keys: memory per entry and throughput).
# Each hot-path ratio to SELECT 1 is compared with its best of the last five
# runs, kept in bench/results/hot_paths_history.tsv (bench/ratio_check.py): a
# drop of more than 10 % and a missed target are flagged.
set -euo pipefail
source "$(dirname "$0")/../scripts/lib.sh"

# bench/run.sh --only NAME: only bench/NAME.sh, on the same throwaway cluster.
if [ "${1:-}" = "--only" ]; then
    export BENCH_ONLY=${2:?usage: bench/run.sh --only NAME (bench/NAME.sh)}
    shift 2
fi

if [ "${1:-}" != "--inside" ]; then
    install_missing_packages bc redis-server
    build_and_install
    # fsync on, as on a real server (pg_virtualenv turns it off): commits and lease grants flush.
    # One role fills 200 000 entries on purpose: quotas off. bench/queue-real.sh's recipe
    # holds about 250 connections.
    pg_virtualenv -t -o fsync=on -o shared_preload_libraries=pg_throttle -o max_connections=400 -o pg_throttle.max_entries=300000 \
        -o pg_throttle.role_quota=100 -o pg_throttle.database_quota=100 \
        -o shared_buffers=256MB "$0" --inside
    [ -n "${BENCH_ONLY:-}" ] && exit 0
    bash "$ROOT/bench/status_scan.sh"
    exec bash "$ROOT/bench/scale.sh"
fi

if [ -n "${BENCH_ONLY:-}" ]; then
    # What hot-paths.sh's setup.sql makes first in a whole run.
    psql -qX -v ON_ERROR_STOP=1 -c "CREATE EXTENSION IF NOT EXISTS pg_throttle"
    exec bash "$ROOT/bench/$BENCH_ONLY.sh"
fi
bash "$ROOT/bench/hot-paths.sh"
bash "$ROOT/bench/queue.sh"
bash "$ROOT/bench/queue-node.sh"
bash "$ROOT/bench/queue-real.sh"
bash "$ROOT/bench/queue-bound.sh"
bash "$ROOT/bench/wakeups.sh"
bash "$ROOT/bench/fairness.sh"
