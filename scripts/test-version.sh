#!/usr/bin/env bash
# Runs every suite that depends on the server version, for one PostgreSQL
# major version on this machine (natively, or inside a Debian tree where
# scripts/test.sh runs it): installs what is missing from Debian's packages,
# builds and installs pg_throttle for PG_MAJOR, then runs the core's unit
# tests, the CMake build, and on throwaway clusters pg_regress, pgTAP, the
# integration tests, the crash, restart and failover tests and the soak test.
#   bash scripts/test-version.sh --results FILE
# Each suite's counts go to FILE (relative to the repository) as
# "suite passed failed"; the file is emptied first.
set -uo pipefail
source "$(dirname "$0")/lib.sh"
[ "${1:-}" = --results ] && [ -n "${2:-}" ] || {
    echo "usage: bash scripts/test-version.sh --results FILE" >&2
    exit 2
}
export PG_THROTTLE_RESULTS
PG_THROTTLE_RESULTS=$(realpath -m "$ROOT/$2")
mkdir -p "$(dirname "$PG_THROTTLE_RESULTS")"
: >"$PG_THROTTLE_RESULTS"
set -e
install_missing_packages
build_and_install
set +e
cd "$ROOT"
source "$ROOT/test/results.sh"

echo "==== PostgreSQL $PG_MAJOR: $(pg_config --version)"
run_suite unit gtest make -s unit
run_suite cmake count scripts/cmake-build.sh
test/run-server-profiles.sh
exit 0
