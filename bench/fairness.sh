#!/usr/bin/env bash
# Fair claims between tenants (bench/fairness.py): one tenant with 100 000 due
# events and 99 with 10 each, tenants as groups (workers on claim_group +
# complete) and as concurrency keys (claim + complete); the small tenants'
# lateness and the cost per claim, fairness 'oldest_first' against
# 'round_robin'. On the cluster the libpq environment names (bench/run.sh's).
# Alone: make bench-fairness.
#   BENCH_FAIR_BIG (100000)  BENCH_FAIR_TENANTS (99)  BENCH_FAIR_SMALL (10)
#   BENCH_FAIR_WORKERS (4)  BENCH_FAIR_MAX (10)  BENCH_FAIR_KEY_ROOM (10)
#   BENCH_FAIR_TIMEOUT (300)
set -euo pipefail
echo "== fairness: small tenants' lateness behind a big one (bench/fairness.py) =="
exec /usr/bin/python3 "$(dirname "$0")/fairness.py"
