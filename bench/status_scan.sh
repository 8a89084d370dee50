#!/usr/bin/env bash
# Grants while other sessions scan the registry: lock/unlock pairs and takes
# on 100 000 live buckets (8 clients), alone and while 3 more sessions loop
# over throttle.status (which any role may read) on a registry of 200 000
# entries, in interleaved rounds, on a throwaway cluster. Called by
# bench/run.sh; runs alone too.
#   BENCH_SECONDS (5)  BENCH_ROUNDS (3)  BENCH_CLIENTS (8)  BENCH_THREADS (2)
set -euo pipefail
source "$(dirname "$0")/../scripts/lib.sh"
SCANNERS=3

if [ "${1:-}" != "--inside" ]; then
    # One role fills the registry on purpose: quotas off.
    exec pg_virtualenv -t -o fsync=on -o shared_preload_libraries=pg_throttle -o max_connections=100 \
        -o pg_throttle.max_entries=300000 -o pg_throttle.role_quota=100 \
        -o pg_throttle.database_quota=100 -o shared_buffers=256MB "$0" --inside
fi

cd "$ROOT/bench"
source "$ROOT/bench/common.sh"
out=$(mktemp -d)

psql -qX -v ON_ERROR_STOP=1 -c "CREATE EXTENSION IF NOT EXISTS pg_throttle"
fill_keys 100000 "throttle.acquire('bench.key.' || g, '1 hour')"
fill_keys 100000 "throttle.allow('bench.bucket.' || g, 10, '1 second', 10)"

workloads=(
    "lock_unlock|scripts/lock_unlock.sql|throttle.lock + unlock (session lock)"
    "take_100k|scripts/take_100k.sql|throttle.take, 100 000 live buckets"
)
for round in $(seq 1 "$ROUNDS"); do
    for w in "${workloads[@]}"; do
        IFS='|' read -r name script _ <<<"$w"
        alone=$(tps "$script")
        # The scanners run for the same seconds as the measured clients.
        pgbench -n -M prepared -c "$SCANNERS" -j 1 -T "$SECONDS_PER_RUN" -f scripts/status_scan.sql \
            2>/dev/null >"$out/scan.log" &
        scanning=$(tps "$script")
        wait
        scans=$(sed -n 's/^tps = \([0-9.]*\) (without initial connection time)/\1/p' "$out/scan.log")
        echo "$alone" >>"$out/$name.alone"
        echo "$scanning" >>"$out/$name.scanning"
        echo "$scans" >>"$out/$name.scans"
        printf 'round %d  %-12s alone %10.0f tps  scanning %10.0f tps  (%s scans/s)\n' \
            "$round" "$name" "$alone" "$scanning" "$scans" >&2
    done
done

live=$(psql -XAtc "SELECT count(*) FROM throttle.status")
echo
echo "Grants while $SCANNERS sessions loop over throttle.status ($live entries in force);" \
    "$CLIENTS clients, $ROUNDS interleaved rounds of ${SECONDS_PER_RUN} s, median round:"
echo
echo "| workload | alone, tps | while scanning, tps | × alone | status scans/s |"
echo "|---|---:|---:|---:|---:|"
for w in "${workloads[@]}"; do
    IFS='|' read -r name _ label <<<"$w"
    a=$(median "$out/$name.alone")
    s=$(median "$out/$name.scanning")
    printf '| %s | %.0f | %.0f | %.2f | %.1f |\n' "$label" "$a" "$s" "$(echo "$s / $a" | bc -l)" \
        "$(median "$out/$name.scans")"
done
echo
