#!/usr/bin/env bash
# Runs every suite from scratch: installs what is missing from Debian's
# packages, builds and installs pg_throttle, then runs
#   lint (clang-format, clang-tidy), the core's unit tests, the CMake build,
#   pg_regress, pgTAP, the integration tests and the fault-injection soak test
#   on throwaway clusters. SOAK_CYCLES=40 runs a longer soak (6 by default).
# The last line is "N passed, N failed"; the exit code is non-zero on failure.
set -uo pipefail
source "$(dirname "$0")/lib.sh"
set -e
install_missing_packages
build_and_install
set +e
cd "$ROOT"

export PG_THROTTLE_RESULTS
PG_THROTTLE_RESULTS=$(mktemp)
trap 'rm -f "$PG_THROTTLE_RESULTS"' EXIT
chmod 644 "$PG_THROTTLE_RESULTS"
source "$ROOT/test/results.sh"

run_suite clang-format count make -s format-check
run_suite clang-tidy count make -s tidy
run_suite meta prove prove test/check_meta.py
run_suite unit gtest make -s unit
run_suite cmake count scripts/cmake-build.sh

test/run-server-profiles.sh

expected_suites=23
echo
echo "Suites:"
awk '{printf "  %-26s %4d passed, %d failed\n", $1, $2, $3}' "$PG_THROTTLE_RESULTS"
suites=$(wc -l <"$PG_THROTTLE_RESULTS")
passed=$(awk '{s += $2} END {print s + 0}' "$PG_THROTTLE_RESULTS")
failed=$(awk '{s += $3} END {print s + 0}' "$PG_THROTTLE_RESULTS")
if [ "$suites" -ne "$expected_suites" ]; then
    echo "  only $suites of $expected_suites suites reported"
    failed=$((failed + expected_suites - suites))
fi
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
