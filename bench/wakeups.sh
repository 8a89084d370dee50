#!/usr/bin/env bash
# Wake-ups at the due time (bench/wakeups.py): idle workers that only LISTEN,
# the lateness of their claims after a run_at ahead, a retry's backoff and a
# lease's end, against workers that poll every 5 s. On the cluster the libpq
# environment names (bench/run.sh's). Alone: make bench-wakeups.
#   BENCH_WAKEUP_EVENTS (1000)  BENCH_WAKEUP_SECONDS (60)  BENCH_WAKEUP_WORKERS (3)
set -euo pipefail
echo "== wake-ups: lateness of idle LISTENing workers (bench/wakeups.py) =="
exec /usr/bin/python3 "$(dirname "$0")/wakeups.py"
