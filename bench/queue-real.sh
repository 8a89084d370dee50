#!/usr/bin/env bash
# Queues as they really run (bench/queue-node/real.mjs): pg_throttle, the
# FOR UPDATE SKIP LOCKED recipe, graphile-worker and pg-boss with 32 workers
# whose jobs take 20 ms, a backlog of 100 000 due jobs, 200 long jobs held
# all run and a stream of new jobs whose latency is measured; each once as it
# is and once with a snapshot older than the long jobs' claims held open. On
# the cluster the libpq environment names (bench/run.sh's; the recipe needs
# about 250 connections). Alone: make bench-real.
#   BENCH_REAL_JOBS (100000)  BENCH_REAL_WORKERS (32)  BENCH_REAL_SECONDS (60)
#   BENCH_REAL_JOB_MS (20)  BENCH_REAL_LONG (200)  BENCH_REAL_ROUNDS (1)
#   BENCH_REAL_RATE (stream jobs/s; default: 70 % of the slowest contender,
#   measured first for BENCH_REAL_CALIBRATE_SECONDS (15))
#   BENCH_REAL_POOL (10)  BENCH_REAL_ONLY (a regular expression of contenders)
set -euo pipefail
source "$(dirname "$0")/node.sh"
cd "$NODE_BENCH_DIR"
exec "$NODE" real.mjs
