#!/usr/bin/env bash
# make bench-sustained: 30 minutes of steady enqueue and drain of pg_throttle's
# event queue at 70 % of its measured maximum, autovacuum at its defaults, with
# a snapshot held open from minute 10 to 20 (bench/queue-node/sustained.mjs);
# then bench/sustained_report.py prints the samples and the goal check and
# draws OUT_DIR/sustained.png. Not part of make bench.
#
# Starts a throwaway cluster as make bench does (fsync on), unless called with
# --inside: then it runs on the cluster the libpq environment names.
#   BENCH_SUSTAINED_MINUTES (30; the snapshot's window, the reference sample
#   and the recovery time scale with it)  BENCH_SUSTAINED_SAMPLE_SECONDS (60)
#   BENCH_SUSTAINED_WORKERS (8)  BENCH_SUSTAINED_JOB_MS (0)
#   BENCH_SUSTAINED_RATE (events/s; else 70 % of BENCH_SUSTAINED_MAXIMUM, else
#   of a maximum measured for BENCH_SUSTAINED_CALIBRATE_SECONDS (30))
#   BENCH_SUSTAINED_KEEP_SECONDS (history kept by the purge: a sixth of the run)
#   BENCH_SUSTAINED_RECIPE=1 (then the same load on the SKIP LOCKED recipe)
#   BENCH_SUSTAINED_OUT (build/sustained: meta.json, the CSVs, sustained.png)
set -euo pipefail
source "$(dirname "$0")/../scripts/lib.sh"

if [ "${1:-}" != "--inside" ]; then
    install_missing_packages python3-matplotlib
    build_and_install
    # fsync on, as on a real server; autovacuum at its defaults.
    exec pg_virtualenv -t -o fsync=on -o shared_preload_libraries=pg_throttle \
        -o max_connections=100 -o shared_buffers=256MB "$0" --inside
fi

out=${BENCH_SUSTAINED_OUT:-$ROOT/build/sustained}
mkdir -p "$out"
out=$(cd "$out" && pwd)
rm -f "$out"/*.csv "$out/meta.json" "$out/sustained.png"
source "$ROOT/bench/node.sh"
(cd "$NODE_BENCH_DIR" && "$NODE" sustained.mjs "$out")
/usr/bin/python3 "$ROOT/bench/sustained_report.py" "$out"
