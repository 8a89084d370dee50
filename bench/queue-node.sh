#!/usr/bin/env bash
# The event queue from real clients: pg_throttle, the SQL recipes,
# graphile-worker and pg-boss side by side (bench/queue-node/queues.mjs), on
# the cluster the libpq environment names (bench/run.sh's). Node and the
# packages come from the npm registry (bench/node.sh).
#   BENCH_QUEUE_JOBS (20000)  BENCH_QUEUE_GROUPS (2000)  BENCH_CLIENTS (8)  BENCH_QUEUE_ROUNDS (2)
#   BENCH_QUEUE_ONLY (a regular expression: only the workloads it matches)
set -euo pipefail
source "$(dirname "$0")/node.sh"
cd "$NODE_BENCH_DIR"
exec "$NODE" queues.mjs "${BENCH_QUEUE_JOBS:-20000}" \
    "${BENCH_QUEUE_GROUPS:-2000}" "${BENCH_CLIENTS:-8}" "${BENCH_QUEUE_ROUNDS:-2}"
