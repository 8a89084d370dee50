# Runs a suite, shows its output, and records how many of its tests passed and
# failed, read from the suite's own closing lines, as "NAME PASSED FAILED", or
# "NAME 0 0 SKIP REASON" for a suite that skipped itself (TAP's "1..0 # SKIP
# REASON", which prove shows as "skipped: REASON"). Returns non-zero when any failed.
# shellcheck shell=bash

: "${PG_THROTTLE_RESULTS:=/dev/null}"

# run_suite NAME FORMAT COMMAND...   FORMAT: gtest, regress, prove, node (node --test's
# summary), pytest or count
run_suite() {
    local name=$1 format=$2
    shift 2
    local log rc passed failed skipped=""
    log=$(mktemp)
    echo "---- $name: $*"
    "$@" 2>&1 | tee "$log"
    rc=${PIPESTATUS[0]}
    case "$format" in
    gtest)
        passed=$(sed -n 's/^\[  PASSED  \] \([0-9]*\) tests\?\./\1/p' "$log" | tail -1)
        failed=$(sed -n 's/^\[  FAILED  \] \([0-9]*\) tests\?, listed below:/\1/p' "$log" | tail -1)
        ;;
    regress)
        local total
        total=$(sed -n 's/.*All \([0-9]*\) tests passed.*/\1/p' "$log" | tail -1)
        if [ -n "$total" ]; then
            passed=$total failed=0
        else
            failed=$(sed -n 's/.* \([0-9]*\) of \([0-9]*\) tests failed.*/\1/p' "$log" | tail -1)
            total=$(sed -n 's/.* \([0-9]*\) of \([0-9]*\) tests failed.*/\2/p' "$log" | tail -1)
            passed=$(( ${total:-0} - ${failed:-0} ))
        fi
        ;;
    prove)
        local total
        total=$(sed -n 's/^Files=[0-9]*, Tests=\([0-9]*\),.*/\1/p' "$log" | tail -1)
        failed=$(sed -n 's/.*(Wstat: [0-9]* .*Tests: [0-9]* Failed: \([0-9]*\)).*/\1/p' "$log" |
            awk '{s += $1} END {print s + 0}')
        passed=$(( ${total:-0} - failed ))
        skipped=$(sed -n 's/^.* \.\. skipped: \(.*\)$/\1/p' "$log" | tail -1)
        ;;
    node)
        # node --test's summary: "ℹ pass N" (spec reporter) or "# pass N" (tap); a test
        # cancelled (its file died, or it timed out) has failed.
        passed=$(sed -n 's/^\(ℹ\|#\) pass \([0-9]*\)$/\2/p' "$log" | tail -1)
        failed=$(sed -n 's/^\(ℹ\|#\) \(fail\|cancelled\) \([0-9]*\)$/\3/p' "$log" |
            tail -2 | awk '{s += $1} END {print s + 0}')
        ;;
    pytest)
        # pytest's last line: "N passed, N failed, N error in S s" (any of them absent
        # when zero); an error (a fixture that failed) counts as a failure.
        local summary
        summary=$(grep -E '^(=+ )?[0-9]+ (passed|failed|errors?|skipped)' "$log" | tail -1)
        passed=$(grep -oE '[0-9]+ passed' <<<"$summary" | awk '{s += $1} END {print s + 0}')
        failed=$(grep -oE '[0-9]+ (failed|errors?)' <<<"$summary" | awk '{s += $1} END {print s + 0}')
        ;;
    count)
        # A check that is one test: passed when the command succeeds.
        passed=$(( rc == 0 ? 1 : 0 )) failed=$(( rc == 0 ? 0 : 1 ))
        ;;
    esac
    passed=${passed:-0} failed=${failed:-0}
    # A test runner that ran no test has proven nothing.
    if [ "$format" = node ] || [ "$format" = pytest ]; then
        [ $((passed + failed)) -eq 0 ] && failed=1
    fi
    # A suite that exits non-zero has failed, whatever it counted.
    if [ "$rc" -ne 0 ] && [ "$failed" -eq 0 ]; then
        failed=1
    fi
    rm -f "$log"
    if [ -n "$skipped" ] && [ "$passed" -eq 0 ] && [ "$failed" -eq 0 ]; then
        echo "$name 0 0 SKIP $skipped" >>"$PG_THROTTLE_RESULTS"
        echo "---- $name: skipped ($skipped)"
        return 0
    fi
    echo "$name $passed $failed" >>"$PG_THROTTLE_RESULTS"
    echo "---- $name: $passed passed, $failed failed"
    [ "$failed" -eq 0 ]
}

# summarize_results FILE: a line per suite recorded in FILE; a suite that
# skipped itself shows why ("NAME 0 0 SKIP REASON").
summarize_results() {
    awk '$4 == "SKIP" {reason = $0; sub(/^[^ ]* [0-9]* [0-9]* SKIP /, "", reason)
                       printf "  %-30s skipped: %s\n", $1, reason; next}
         {printf "  %-30s %4d passed, %d failed\n", $1, $2, $3}' "$1"
}
