#!/usr/bin/env bash
# 1 000 000 live keys: shared memory per registry entry, and throughput on
# 1 000 000 live resources (and 1 000 000 live buckets) against one hot key,
# in interleaved rounds, on a throwaway cluster with room for 2 200 000
# entries. Called by bench/run.sh.
#   BENCH_SECONDS (5)  BENCH_ROUNDS (3)  BENCH_CLIENTS (8)  BENCH_THREADS (2)
set -euo pipefail
source "$(dirname "$0")/../scripts/lib.sh"
ENTRIES=2200000  # headroom: a registry kept full pays for sweeps (docs/operations.md, When the registry is full)
KEYS=1000000

if [ "${1:-}" != "--inside" ]; then
    # One role fills the registry on purpose: quotas off.
    exec pg_virtualenv -t -o fsync=on -o shared_preload_libraries=pg_throttle -o max_connections=100 \
        -o pg_throttle.max_entries=$ENTRIES -o pg_throttle.role_quota=100 \
        -o pg_throttle.database_quota=100 -o shared_buffers=128MB "$0" --inside
fi

cd "$ROOT/bench"
source "$ROOT/bench/common.sh"
out=$(mktemp -d)

# Shared memory the server asks for, as PostgreSQL computes it (postgres -C
# shared_memory_size needs the server stopped), with a registry of 100 and
# of $ENTRIES entries: the difference is what the entries cost.
config=$(psql -XAtc "SHOW config_file")
data=$(psql -XAtc "SHOW data_directory")
pg_ctlcluster "$PGVERSION" regress stop -m fast
shm_mb() {
    runuser -u postgres -- "$(pg_config --bindir)/postgres" -D "$data" --config-file="$config" \
        -C shared_memory_size -c "pg_throttle.max_entries=$1" | tr -dc '0-9'
}
small=$(shm_mb 100)
large=$(shm_mb $ENTRIES)
pg_ctlcluster "$PGVERSION" regress start

psql -qX -v ON_ERROR_STOP=1 -c "CREATE EXTENSION IF NOT EXISTS pg_throttle"
started=$(date +%s.%N)
fill_keys $KEYS "throttle.acquire('bench.m.' || g, '1 hour')"
fill_keys $KEYS "throttle.allow('bench.mb.' || g, 10, '1 hour', 10)"
filled=$(date +%s.%N)
# The checkpoint of 1 000 000 resources, written once now (the background
# worker then skips its rounds: denied calls change nothing).
checkpoint_ms=$(psql -qXAt -c '\timing on' -c "SELECT throttle.checkpoint()" |
    sed -n 's/^Time: \([0-9.]*\) ms.*/\1/p')
checkpoint_mb=$(du -m "$data/pg_throttle.checkpoint" | cut -f1)
live=$(psql -XAtc "SELECT count(*) FROM throttle.status")

contenders=(
    "select1|scripts/select1.sql|SELECT 1 (ceiling)"
    "acquire_hot|scripts/acquire_hot_denied.sql|throttle.acquire, 1 hot resource (denied)"
    "acquire_1m|scale/acquire_1m.sql|throttle.acquire, 1 000 000 live resources (denied)"
    "take_hot|scripts/take_hot_allowed.sql|throttle.take, 1 hot key (allowed)"
    "take_1m|scale/take_1m.sql|throttle.take, 1 000 000 live buckets"
)
for round in $(seq 1 "$ROUNDS"); do
    for c in "${contenders[@]}"; do
        IFS='|' read -r name script _ <<<"$c"
        tps=$(tps "$script")
        echo "$tps" >>"$out/$name"
        printf 'round %d  %-14s %12.0f tps\n' "$round" "$name" "$tps" >&2
    done
done

echo
echo "Scale: $live live registry entries ($KEYS resources + $KEYS buckets, filled in" \
    "$(echo "$filled - $started" | bc -l | xargs printf '%.1f') s); pg_throttle.max_entries = $ENTRIES."
echo "throttle.checkpoint() of $KEYS resources: $(printf '%.0f' "$checkpoint_ms") ms, ${checkpoint_mb} MB written" \
    "(each of the registry's 16 partition locks is held in shared mode while its entries are copied)."
echo "Shared memory (postgres -C shared_memory_size): ${small} MB with 100 entries, ${large} MB with" \
    "$ENTRIES: $(echo "($large - $small) * 1048576 / ($ENTRIES - 100)" | bc -l | xargs printf '%.0f') bytes per entry."
echo
echo "| contender | median tps | × SELECT 1 | × hot key |"
echo "|---|---:|---:|---:|"
base=$(median "$out/select1")
for c in "${contenders[@]}"; do
    IFS='|' read -r name _ label <<<"$c"
    m=$(median "$out/$name")
    hot=$base
    case $name in acquire_1m) hot=$(median "$out/acquire_hot") ;; take_1m) hot=$(median "$out/take_hot") ;; esac
    printf '| %s | %.0f | %.2f | %s |\n' "$label" "$m" "$(echo "$m / $base" | bc -l)" \
        "$([ "$hot" = "$base" ] && echo "" || printf '%.2f' "$(echo "$m / $hot" | bc -l)")"
done
rm -rf "$out"
