#!/usr/bin/env bash
# The hot paths against SELECT 1, the SQL recipes and Redis (part of make
# bench; make bench-hot runs it alone): pgbench (prepared protocol) over each
# contender of contenders.txt in interleaved rounds, the median round of each,
# its ratio to SELECT 1 checked against the last runs (ratio_check.py), then
# one client's latency of a pair of calls. Runs inside the cluster
# bench/run.sh starts.   BENCH_SECONDS (5)  BENCH_ROUNDS (3)  BENCH_CLIENTS (8)
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
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
/usr/bin/python3 ratio_check.py "$out/hot_paths.tsv" results
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

