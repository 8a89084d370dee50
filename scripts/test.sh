#!/usr/bin/env bash
# Runs every suite from scratch, on every supported PostgreSQL version that
# Debian ships: 15, 17 and 18 (16 has no Debian package).
#
#   bash scripts/test.sh              all three
#   bash scripts/test.sh --pg 17      one version only (repeat --pg for more)
#
# Lint (clang-format, clang-tidy, every version #if in src/pg/server/compat.hpp, the
# C++ / PostgreSQL boundary rules: make boundary-check) and
# META.json are checked once, here. Then
# for each version scripts/test-version.sh builds, installs and runs the
# unit tests, the CMake build, pg_regress, pgTAP, the integration tests, the
# crash, restart and failover tests and the soak test: natively when this
# machine's Debian ships that version (or it is installed), otherwise inside
# a Debian tree that ships it (scripts/debian_tree.sh: bookworm for 15,
# trixie for 17, sid for 18), made with debootstrap and cached in
# $PG_THROTTLE_TREES between runs. SOAK_CYCLES=40 runs a longer soak (6 by
# default). The last line is "N passed, N failed"; the exit code is non-zero
# on failure.
set -uo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
source "$HERE/lib.sh"
source "$HERE/versions.sh"
parse_pg_flags "bash scripts/test.sh [--pg VERSION]..." "$@"

# The host's own packages: lint, the build, and debootstrap when a tree is needed.
set -e
if versions_need_a_tree; then
    install_missing_packages "${LINT_PACKAGES[@]}" pgxnclient debootstrap
else
    install_missing_packages "${LINT_PACKAGES[@]}" pgxnclient
fi
# test/client_install.py installs the client packages as a user does (pip, npm).
install_client_packages
set +e
cd "$ROOT"

results=$(mktemp)
trap 'rm -f "$results"' EXIT
chmod 644 "$results"
source "$ROOT/test/results.sh"

PG_THROTTLE_RESULTS=$results run_suite clang-format count make -s format-check
PG_THROTTLE_RESULTS=$results run_suite clang-tidy count make -s tidy
PG_THROTTLE_RESULTS=$results run_suite compat-layer count make -s compat-check
PG_THROTTLE_RESULTS=$results run_suite boundary count make -s boundary-check
PG_THROTTLE_RESULTS=$results run_suite meta prove prove test/check_meta.py
PG_THROTTLE_RESULTS=$results run_suite dist prove prove --verbose test/dist_check.py
PG_THROTTLE_RESULTS=$results run_suite results prove prove --verbose test/results_check.py
PG_THROTTLE_RESULTS=$results run_suite client-install prove prove --verbose test/client_install.py
version_independent_suites=8

# run_version V: every version-dependent suite for PostgreSQL V; the counts
# it prints last are added to $results as "V/suite passed failed". They are
# read from this run's own output, never from a file another run could share.
run_version() {
    local v=$1 log
    log=$(mktemp)
    run_on_version "$v" scripts/test-version.sh | tee "$log"
    sed -n "s|^==== counts: \([^ ]* [0-9]* [0-9]*\( SKIP .*\)\{0,1\}\)\$|$v/\1|p" "$log" >>"$results"
    rm -f "$log"
}

for v in "${versions[@]}"; do
    start=$SECONDS
    run_version "$v"
    echo "==== PostgreSQL $v: $((SECONDS - start)) s"
done

# Each version runs unit, cmake and the server suites (test/run-server-profiles.sh).
suites_per_version=51
echo
echo "Suites:"
summarize_results "$results"
passed=$(awk '{s += $2} END {print s + 0}' "$results")
failed=$(awk '{s += $3} END {print s + 0}' "$results")
# Every version must report each of its suites once, and nothing else: a
# missing suite, an extra one and one reported twice each count as failures.
check_count() {
    local what=$1 lines=$2 want=$3 names have
    names=$(awk '{print $1}' <<<"$lines" | sed '/^$/d')
    have=$(sort -u <<<"$names" | sed '/^$/d' | wc -l)
    if [ "$have" -ne "$want" ]; then
        echo "  $what: $have suites reported, $want expected"
        failed=$((failed + (have > want ? have - want : want - have)))
    fi
    if [ "$(wc -l <<<"$names" | sed 's/ //g')" -ne "$have" ] && [ -n "$names" ]; then
        echo "  $what: a suite reported more than once"
        failed=$((failed + $(wc -l <<<"$names") - have))
    fi
}
check_count "lint and meta" "$(grep -v '^[0-9][0-9]*/' "$results")" "$version_independent_suites"
for v in "${versions[@]}"; do
    check_count "PostgreSQL $v" "$(grep "^$v/" "$results")" "$suites_per_version"
done
skipped=$(awk '$4 == "SKIP"' "$results" | wc -l)
echo "PostgreSQL ${versions[*]}: $SECONDS s in all; suites skipped: $skipped (reasons above)"
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
