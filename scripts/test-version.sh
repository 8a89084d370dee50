#!/usr/bin/env bash
# Runs every suite that depends on the server version, for one PostgreSQL
# major version on this machine (natively, or inside a Debian tree where
# scripts/test.sh runs it): installs what is missing from Debian's packages,
# builds and installs pg_throttle for PG_MAJOR, then runs the core's unit
# tests, the CMake build, and on throwaway clusters pg_regress, pgTAP, the
# integration tests, the crash, restart and failover tests and the soak test.
# The last lines are the suites' counts, "==== counts: suite passed failed",
# which scripts/test.sh reads from this run's own output.
set -uo pipefail
source "$(dirname "$0")/lib.sh"
export PG_THROTTLE_RESULTS
PG_THROTTLE_RESULTS=$(mktemp)
trap 'rm -f "$PG_THROTTLE_RESULTS"' EXIT
chmod 644 "$PG_THROTTLE_RESULTS"
set -e
install_missing_packages
install_client_packages
build_and_install
set +e
cd "$ROOT"
source "$ROOT/test/results.sh"

echo "==== PostgreSQL $PG_MAJOR: $(pg_config --version)"
run_suite unit gtest make -s unit
run_suite cmake count scripts/cmake-build.sh
test/run-server-profiles.sh
sed 's/^/==== counts: /' "$PG_THROTTLE_RESULTS"
exit 0
