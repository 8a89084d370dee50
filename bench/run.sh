#!/usr/bin/env bash
# make bench: pg_throttle against SELECT 1, the SQL recipes and Redis, on a
# throwaway cluster, with pgbench (prepared protocol) and redis-benchmark.
# Rounds are interleaved so that drift hits every contender alike; the table
# reports the median round.
#   BENCH_SECONDS (5)  BENCH_ROUNDS (3)  BENCH_CLIENTS (8)  BENCH_THREADS (2)
# Then bench/queue.sh (the event queue against its SQL recipe),
# bench/queue-node.sh (the queue from Node workers against the recipes,
# graphile-worker and pg-boss),
# bench/queue-real.sh (the same contenders as they really run: 32 workers,
# 20 ms jobs, long jobs held, a stream's latency, an old snapshot),
# bench/queue-bound.sh (what bounds a claim: one worker, with claims in force),
# bench/status_scan.sh (grants while sessions loop over throttle.status) and
# bench/scale.sh (1 000 000 live keys: memory per entry and throughput).
# Each ratio to SELECT 1 is compared with the last run's, kept in
# bench/results/hot_paths.tsv (bench/ratio_check.py): a drop of more than 10 %
# and a missed target are flagged.
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

[ -z "${BENCH_ONLY:-}" ] || exec bash "$ROOT/bench/$BENCH_ONLY.sh"
cd "$ROOT/bench"
source "$ROOT/bench/common.sh"
out=$(mktemp -d)
source "$ROOT/bench/redis.sh"
start_redis "$out"
trap stop_redis EXIT

psql -qX -v ON_ERROR_STOP=1 -f setup.sql
# The 100 000 resources exist before the runs: every call is a lookup of a live key.
fill_keys 100000 "throttle.acquire('bench.key.' || g, '1 hour')"
fill_keys 100000 "throttle.allow('bench.bucket.' || g, 10, '1 second', 10)"

mapfile -t scripts < <(grep -v '^#' contenders.txt | awk '{print $1}')
for round in $(seq 1 "$ROUNDS"); do
    for script in "${scripts[@]}"; do
        if [[ $script == redis_* ]]; then
            tps=$(run_redis "$script" "$SECONDS_PER_RUN" "$CLIENTS")
        else
            tps=$(tps "scripts/$script.sql")
        fi
        echo "$tps" >>"$out/$script"
        printf 'round %d  %-22s %12.0f tps\n' "$round" "$script" "$tps" >&2
    done
done

base=$(median "$out/select1")
echo
echo "pgbench -M prepared, $CLIENTS clients, $THREADS threads, $ROUNDS interleaved rounds of ${SECONDS_PER_RUN} s;"
echo "$(nproc) cores, $(sed -n 's/^model name\s*: //p' /proc/cpuinfo | head -1);" \
    "$(psql -qXtAc 'SHOW server_version')"
echo
echo "| contender | median tps | × SELECT 1 | rounds (min – max) |"
echo "|---|---:|---:|---:|"
grep -v '^#' contenders.txt | while read -r script label; do
    m=$(median "$out/$script")
    lo=$(sort -g "$out/$script" | head -1)
    hi=$(sort -g "$out/$script" | tail -1)
    printf '| %s | %.0f | %.2f | %.0f – %.0f |\n' "$label" "$m" "$(echo "$m / $base" | bc -l)" "$lo" "$hi"
done
echo
# The ratios against the last run's (bench/results/hot_paths.tsv) and the targets.
printf 'script\tmedian_tps\tratio_to_select1\n' >"$out/hot_paths.tsv"
grep -v '^#' contenders.txt | while read -r script _; do
    m=$(median "$out/$script")
    printf '%s\t%.0f\t%.3f\n' "$script" "$m" "$(echo "$m / $base" | bc -l)"
done >>"$out/hot_paths.tsv"
/usr/bin/python3 ratio_check.py "$out/hot_paths.tsv" results/hot_paths.tsv
echo
echo "Redis $(redis-server --version | sed -n 's/.*v=\([0-9.]*\).*/\1/p'): redis-benchmark, $CLIENTS clients (one event loop), no pipelining," \
    "loopback TCP, like pgbench; $redis_keys keys preloaded, $redis_bytes_per_key bytes of used_memory per key."
stop_redis
rm -rf "$out"

# What a durable lease costs one caller: one client, so the latency is the
# call's own (the journal's fdatasync, unshared) and not a queue's.
echo
echo "One client, pgbench -M prepared, ${SECONDS_PER_RUN} s each: latency of a pair of calls"
echo
echo "| pair | ms per pair |"
echo "|---|---:|"
for script in select1_pair lock_unlock lease_unlock lease_row_pair; do
    latency=$(pgbench -n -M prepared -c 1 -j 1 -T "$SECONDS_PER_RUN" -f "scripts/$script.sql" 2>/dev/null |
        sed -n 's/^latency average = \([0-9.]*\) ms/\1/p')
    printf '| %s | %s |\n' "$(grep "^$script " contenders.txt | sed "s/^$script *//")" "$latency"
done

bash "$ROOT/bench/queue.sh"
bash "$ROOT/bench/queue-node.sh"
bash "$ROOT/bench/queue-real.sh"
bash "$ROOT/bench/queue-bound.sh"
