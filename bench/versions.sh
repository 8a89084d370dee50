#!/usr/bin/env bash
# make bench-versions: pg_throttle's hot paths against SELECT 1 on each
# PostgreSQL version the test command covers (15, 17, 18; --pg VERSION picks),
# each on a throwaway cluster of its own version (fsync on), natively or inside
# the version's Debian tree (scripts/debian_tree.sh), one version after the
# other. Within a version the contenders' rounds are interleaved; the table
# gives each contender's median tps as a multiple of that version's SELECT 1
# (or SELECT 1; SELECT 1 for pairs), so versions are compared by ratio, not by
# tps measured minutes apart.
#   BENCH_SECONDS (5)  BENCH_ROUNDS (3)  BENCH_CLIENTS (8)  BENCH_THREADS (2)
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)

# The contenders, each with the baseline its ratio is taken against.
CONTENDERS=(
    "select1 select1"
    "acquire_hot_denied select1"
    "acquire_hot_granted select1"
    "take_hot_denied select1"
    "take_hot_allowed select1"
    "select1_pair select1_pair"
    "lock_unlock select1_pair"
    "lease_unlock select1_pair"
)

case "${1:-}" in
--inside)  # on a cluster of the version (pg_virtualenv): prints "contender tps"
    cd "$HERE"
    source "$HERE/common.sh"
    out=$(mktemp -d)
    psql -qX -v ON_ERROR_STOP=1 -f setup.sql >/dev/null
    for round in $(seq 1 "$ROUNDS"); do
        for entry in "${CONTENDERS[@]}"; do
            script=${entry%% *}
            tps "scripts/$script.sql" >>"$out/$script"
        done
        echo "round $round of $ROUNDS done" >&2
    done
    for entry in "${CONTENDERS[@]}"; do
        script=${entry%% *}
        echo "$script $(median "$out/$script") $(psql -qXtAc 'SHOW server_version' | cut -d' ' -f1)"
    done
    exit 0
    ;;
--version)  # builds and installs for PG_MAJOR here, then --inside on a cluster of it
    source "$HERE/../scripts/lib.sh"
    install_missing_packages >&2
    build_and_install >&2
    pg_virtualenv -v "$PG_MAJOR" -t -o fsync=on -o shared_preload_libraries=pg_throttle \
        -o max_connections=100 "$0" --inside 2>/dev/null
    exit 0
    ;;
esac

source "$HERE/../scripts/lib.sh"
source "$HERE/../scripts/versions.sh"
parse_pg_flags "bash bench/versions.sh [--pg VERSION]..." "$@"
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
for v in "${versions[@]}"; do
    echo "PostgreSQL $v ..." >&2
    run_on_version "$v" bench/versions.sh --version >"$out/$v"
done

echo
echo "pgbench -M prepared, ${BENCH_CLIENTS:-8} clients, ${BENCH_THREADS:-2} threads," \
    "${BENCH_ROUNDS:-3} interleaved rounds of ${BENCH_SECONDS:-5} s per version; $(nproc) cores"
echo
header="| contender |"
rule="|---|"
for v in "${versions[@]}"; do
    header+=" $(awk '$1 == "select1" {print $3}' "$out/$v"): tps | × baseline |"
    rule+="---:|---:|"
done
echo "$header"
echo "$rule"
for entry in "${CONTENDERS[@]}"; do
    script=${entry%% *}
    baseline=${entry##* }
    row="| $script |"
    for v in "${versions[@]}"; do
        tps=$(awk -v s="$script" '$1 == s {print $2}' "$out/$v")
        base=$(awk -v s="$baseline" '$1 == s {print $2}' "$out/$v")
        row+=$(awk -v t="$tps" -v b="$base" 'BEGIN {printf " %.0f | %.2f |", t, (b > 0 ? t / b : 0)}')
    done
    echo "$row"
done
