#!/usr/bin/env bash
# Runs test/server-suites.sh once per server configuration, each on its own
# throwaway cluster (pg_virtualenv). Needs pg_throttle installed.
set -uo pipefail
cd "$(dirname "$0")"
# The version scripts/lib.sh chose; pg_virtualenv would otherwise make a
# cluster for every version installed.
pg_virtualenv() { command pg_virtualenv ${PG_MAJOR:+-v "$PG_MAJOR"} "$@"; }
rc=0
pg_virtualenv -t -o shared_preload_libraries=pg_throttle ./server-suites.sh main || rc=1
pg_virtualenv -t -o shared_preload_libraries=pg_throttle -o pg_throttle.max_entries=100 \
    -o pg_throttle.role_quota=100 -o pg_throttle.database_quota=100 \
    ./server-suites.sh small-registry || rc=1
for phase in backend postmaster damaged-checkpoint cycles; do
    pg_virtualenv -t -o shared_preload_libraries=pg_throttle -o pg_throttle.max_lease=30 \
        -o pg_throttle.checkpoint_interval=0 \
        ./server-suites.sh crash "$phase" || rc=1
done
pg_virtualenv -t -o shared_preload_libraries=pg_throttle -o pg_throttle.max_lease=30 \
    -o pg_throttle.checkpoint_interval=0 \
    ./server-suites.sh restart || rc=1
pg_virtualenv -t -o shared_preload_libraries=pg_throttle -o pg_throttle.max_lease=30 \
    ./server-suites.sh failover || rc=1
pg_virtualenv -t -o shared_preload_libraries=pg_throttle ./server-suites.sh upgrade || rc=1
pg_virtualenv -t ./server-suites.sh not-preloaded || rc=1
# The soak test makes its own primary and standby, to crash and fail them over.
./server-suites.sh soak || rc=1
exit $rc
