#!/usr/bin/env bash
# Runs the suites that need a server, against the cluster named by the libpq
# environment (pg_virtualenv sets it). One profile per server configuration:
#   main           pg_throttle preloaded, default settings: pg_regress, pgTAP, real clients,
#                  the documentation's examples, what newer servers show (version_features.py),
#                  the Prometheus exporter, PgBouncer, the client packages (clients/: Node's
#                  and Python's test suites, the dashboard's in headless Chromium), the
#                  examples on them (examples/) and Citus (a three-node cluster of its own;
#                  skipped without Citus)
#   small-registry pg_throttle preloaded, pg_throttle.max_entries = 100
#   crash PHASE    pg_throttle preloaded, on a cluster the suite crashes itself (one per
#                  fault: backend, postmaster, damaged-checkpoint, cycles)
#   restart        pg_throttle preloaded, on a cluster the suite restarts (and crashes) itself
#   failover       pg_throttle preloaded, a standby of it promoted after the primary stops
#   upgrade        pg_throttle preloaded, on a cluster the suite restarts after installing
#                  0.1.0 and 0.2.0 (built from the git history) and then the current version
#   not-preloaded  pg_throttle installed but not in shared_preload_libraries
#   soak           two clusters of its own (primary, synchronous standby) that the
#                  fault-injection soak test crashes, restarts and fails over
#                  (SOAK_CYCLES cycles, 6 by default)
# Each suite's counts are appended to $PG_THROTTLE_RESULTS as "suite passed failed".
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
source "$ROOT/test/results.sh"
cd "$ROOT"

# node_suite DIR: `npm ci` in DIR (a package of clients/), then its tests with Node's runner,
# one file at a time (they share the cluster).
node_suite() {
    (cd "$1" && npm ci --no-audit --no-fund --loglevel=error >/dev/null &&
        node --test --test-concurrency=1 --test-reporter=spec test/*.test.js)
}

profile=${1:?profile: main, small-registry, crash, restart, failover, upgrade, not-preloaded or soak}
status=0
case "$profile" in
main)
    run_suite pg_regress regress make -s installcheck || { status=1; cat regression.diffs; }
    psql -qX -v ON_ERROR_STOP=1 -c "CREATE EXTENSION IF NOT EXISTS pgtap" \
        -c "CREATE EXTENSION IF NOT EXISTS pg_throttle" || status=1
    run_suite pgtap prove pg_prove --verbose test/pgtap/*.sql || status=1
    run_suite concurrency prove prove --verbose test/integration/concurrency.py || status=1
    run_suite rate-clients prove prove --verbose test/integration/rate_concurrency.py || status=1
    run_suite wait prove prove --verbose test/integration/wait.py || status=1
    run_suite locks prove prove --verbose test/integration/locks.py || status=1
    run_suite call-caches prove prove --verbose test/integration/call_caches.py || status=1
    run_suite ended-waits prove prove --verbose test/integration/ended_waits.py || status=1
    run_suite queue prove prove --verbose test/integration/queue.py || status=1
    run_suite queue-interleavings prove prove --verbose test/integration/queue_interleavings.py || status=1
    run_suite pause prove prove --verbose test/integration/pause.py || status=1
    run_suite schedule-batch prove prove --verbose test/integration/schedule_batch.py || status=1
    # Servers of its own (a primary it crashes and restarts, and a standby it promotes).
    run_suite wakeups prove prove --verbose test/integration/wakeups.py || status=1
    run_suite wakeups-review prove prove --verbose test/integration/wakeups_review.py || status=1
    run_suite recurring prove prove --verbose test/integration/recurring.py || status=1
    run_suite queue-rate prove prove --verbose test/integration/queue_rate.py || status=1
    run_suite queue-history prove prove --verbose test/integration/queue_history.py || status=1
    run_suite queue-plans prove prove --verbose test/integration/queue_plans.py || status=1
    run_suite queue-scan-floor prove prove --verbose test/integration/queue_scan_floor.py ||
        status=1
    run_suite group-policy prove prove --verbose test/integration/group_policy.py ||
        status=1
    run_suite fairness prove prove --verbose test/integration/fairness.py || status=1
    run_suite pause-fairness-edges prove prove --verbose test/integration/pause_fairness_edges.py ||
        status=1
    run_suite concurrency-key prove prove --verbose test/integration/concurrency_key.py ||
        status=1
    run_suite key-fairness prove prove --verbose test/integration/key_fairness.py || status=1
    run_suite security prove prove --verbose test/integration/security.py || status=1
    run_suite dump-restore prove prove --verbose test/integration/dump_restore.py || status=1
    # Servers of its own (old, new and a standby), on Unix sockets only.
    run_suite fence-migration prove prove --verbose test/integration/fence_migration.py ||
        status=1
    run_suite least-privilege prove prove --verbose test/integration/least_privilege.py ||
        status=1
    run_suite readme prove prove --verbose test/integration/readme_examples.py || status=1
    run_suite version-features prove prove --verbose test/integration/version_features.py ||
        status=1
    run_suite exporter prove prove --verbose test/integration/exporter.py || status=1
    # Skips itself, with the reason, unless Citus is installed for this server.
    run_suite citus prove prove --verbose test/integration/citus.py || status=1
    run_suite pgbouncer prove prove --verbose test/integration/pgbouncer.py || status=1
    run_suite client-node node node_suite clients/node || status=1
    run_suite client-python pytest env PYTHONPATH="$ROOT/clients/python/src" \
        /usr/bin/python3 -m pytest -q -p no:cacheprovider clients/python/tests || status=1
    run_suite dashboard node node_suite clients/dashboard || status=1
    run_suite examples-python prove prove --verbose test/integration/examples_python.py ||
        status=1
    run_suite examples-node prove prove --verbose test/integration/examples_node.py ||
        status=1
    ;;
small-registry)
    run_suite registry-full prove prove --verbose test/integration/registry_full.py || status=1
    ;;
crash)
    phase=${2:?crash needs a phase: backend, postmaster, damaged-checkpoint or cycles}
    run_suite "crash-$phase" prove prove --verbose test/integration/crash.py :: "$phase" || status=1
    ;;
restart)
    run_suite restart prove prove --verbose test/integration/restart.py || status=1
    ;;
failover)
    run_suite failover prove prove --verbose test/integration/failover.py || status=1
    ;;
upgrade)
    run_suite upgrade prove prove --verbose test/integration/upgrade.py || status=1
    ;;
not-preloaded)
    run_suite not-preloaded prove prove --verbose test/integration/not_preloaded.py || status=1
    ;;
soak)
    run_suite soak-checker prove prove --verbose test/soak/checker_test.py || status=1
    run_suite soak prove prove --verbose test/soak/soak.py || status=1
    ;;
*)
    echo "unknown profile $profile" >&2
    exit 2
    ;;
esac
exit $status
