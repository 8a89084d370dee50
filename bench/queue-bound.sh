#!/usr/bin/env bash
# What bounds a claim: one worker that claims and finishes one job at a time,
# with no claim, 1 000 and 10 000 claims in force (jobs other workers hold
# while they work, the oldest due), three ways:
#   recipe          FOR UPDATE SKIP LOCKED, the transaction open while it works
#                   (its 10 000 in force: rows locked by an open transaction);
#   no claim write  a claim that writes nothing to the event and finds the
#                   claims in force per row, as a claim kept in shared memory
#                   would, then complete's move to the history;
#   throttle        throttle.claim + throttle.complete (its 10 000 in force: a
#                   claim of another worker).
# One client, so the latency is the job's own. Runs inside the cluster
# bench/run.sh starts.   BENCH_SECONDS (5)
set -euo pipefail
cd "$(dirname "$0")"
source ./common.sh
DUE=${BENCH_BOUND_DUE:-40000}
psql -qX -v ON_ERROR_STOP=1 -f queue-bound/setup.sql
psql -qX -v ON_ERROR_STOP=1 -f queue_setup.sql

fill() {  # fill IN_FORCE: DUE + IN_FORCE due jobs in each contender's queue
    local total=$((DUE + $1))
    psql -qX -v ON_ERROR_STOP=1 <<SQL
TRUNCATE bound_job;
DELETE FROM throttle.event WHERE queue IN ('bound', 'no_write');
DELETE FROM throttle.event_history WHERE queue IN ('bound', 'no_write');
INSERT INTO bound_job (run_at)
SELECT now() - interval '1 hour' + g * interval '1 millisecond' FROM generate_series(1, $total) AS g;
INSERT INTO throttle.event (queue, item_key, run_at, enqueued_at, enqueued_by)
SELECT q, 'e' || g, now() - interval '1 hour' + g * interval '1 millisecond', now(), 'bench'
FROM generate_series(1, $total) AS g, unnest(ARRAY['bound', 'no_write']) AS q;
UPDATE throttle.event SET claim_token = -1
WHERE queue = 'no_write' AND id IN (SELECT id FROM throttle.event WHERE queue = 'no_write'
                                    ORDER BY run_at LIMIT $1);
VACUUM ANALYZE bound_job;
VACUUM ANALYZE throttle.event;
VACUUM ANALYZE throttle.event_history;
SQL
}

latency() {  # latency SCRIPT: ms per job (or group), one client
    pgbench -n -M prepared -c 1 -j 1 -T "$SECONDS_PER_RUN" -f "$1" 2>/dev/null |
        sed -n 's/^latency average = \([0-9.]*\) ms/\1/p'
}

hold_open() {  # hold_open SQL: runs SQL in a transaction left open until release_open
    psql -qX -v ON_ERROR_STOP=1 >/dev/null 2>&1 <<SQL &
BEGIN;
$1;
SELECT pg_sleep(3600);
SQL
    until [ "$(psql -qXtAc "SELECT count(*) FROM pg_stat_activity WHERE query LIKE 'SELECT pg_sleep(3600)%'")" = 1 ]; do
        sleep 0.1
    done
}

release_open() {
    psql -qXtAc "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE query LIKE 'SELECT pg_sleep(3600)%'" >/dev/null
    wait 2>/dev/null || true
}

declare -A ms
IN_FORCE=(0 1000 10000)
for in_force in "${IN_FORCE[@]}"; do
    fill "$in_force"
    # The open transaction holds back the removal of dead rows for everyone:
    # the recipe runs alone with it.
    [ "$in_force" -eq 0 ] ||
        hold_open "SELECT count(*) FROM (SELECT id FROM bound_job WHERE state = 'pending'
                   ORDER BY run_at, id LIMIT $in_force FOR UPDATE) AS held"
    ms[recipe,$in_force]=$(latency queue-bound/recipe.sql)
    [ "$in_force" -eq 0 ] || release_open
    [ "$in_force" -eq 0 ] ||
        psql -qXtAc "SELECT count(*) FROM throttle.claim('bound', 'other worker', '1 hour', $in_force)" >/dev/null
    ms[no_claim_write,$in_force]=$(latency queue-bound/no_claim_write.sql)
    ms[claim,$in_force]=$(latency queue-bound/claim.sql)
done

GROUPS_FREE=${BENCH_BOUND_GROUPS:-8000}
fill_groups() {  # fill_groups HELD: GROUPS_FREE + HELD groups of 10 due events, the held ones oldest
    local total=$(((GROUPS_FREE + $1) * 10))
    psql -qX -v ON_ERROR_STOP=1 <<SQL
TRUNCATE recipe_event;
DELETE FROM throttle.event WHERE queue = 'bench';
DELETE FROM throttle.event_history WHERE queue = 'bench';
INSERT INTO recipe_event (group_key, run_at)
SELECT 'g' || (g - 1) / 10, now() - interval '1 hour' + g * interval '1 millisecond'
FROM generate_series(1, $total) AS g;
INSERT INTO throttle.event (queue, item_key, group_key, run_at, enqueued_at, enqueued_by)
SELECT 'bench', 'e' || g, 'g' || (g - 1) / 10, now() - interval '1 hour' + g * interval '1 millisecond',
       now(), 'bench'
FROM generate_series(1, $total) AS g;
VACUUM ANALYZE recipe_event;
VACUUM ANALYZE throttle.event;
VACUUM ANALYZE throttle.event_history;
SQL
}

GROUPS_IN_FORCE=(0 1000)
for held in "${GROUPS_IN_FORCE[@]}"; do
    fill_groups "$held"
    [ "$held" -eq 0 ] ||
        hold_open "SELECT count(pg_advisory_xact_lock(hashtext('g' || n))) FROM generate_series(0, $held - 1) AS n"
    ms[group_recipe,$held]=$(latency queue/recipe.sql)
    [ "$held" -eq 0 ] || release_open
    for _ in $(seq "$held"); do
        echo "SELECT count(*) FROM throttle.claim_group('bench', 'other worker', '1 hour');"
    done | psql -qXtA -v ON_ERROR_STOP=1 >/dev/null
    ms[group_claim,$held]=$(latency queue/claim_group.sql)
done

row() {  # row SCRIPT LABEL IN_FORCE...
    local script=$1 label=$2 n
    shift 2
    printf '| %s |' "$label"
    for n in "$@"; do printf ' %s |' "${ms[$script,$n]}"; done
    echo
}
echo
echo "What bounds a claim: one worker, pgbench -M prepared, ${SECONDS_PER_RUN} s each;" \
    "$(psql -qXtAc 'SHOW server_version'), fsync $(psql -qXtAc 'SHOW fsync')"
echo
echo "One job per claim, $DUE due jobs free:"
echo
echo "| contender | ms per job, no claim in force | 1 000 claims in force | 10 000 claims in force |"
echo "|---|---:|---:|---:|"
row recipe "FOR UPDATE SKIP LOCKED recipe (transaction open while working)" "${IN_FORCE[@]}"
row no_claim_write "a claim that writes nothing to the event (shared-memory bookkeeping at best) + complete" "${IN_FORCE[@]}"
row claim "throttle.claim + throttle.complete" "${IN_FORCE[@]}"
echo
echo "A whole group of 10 events per claim, $GROUPS_FREE due groups free:"
echo
echo "| contender | ms per group, no group in force | 1 000 groups in force |"
echo "|---|---:|---:|"
row group_recipe "advisory-lock cursor recipe (transaction open while working)" "${GROUPS_IN_FORCE[@]}"
row group_claim "throttle.claim_group + throttle.complete" "${GROUPS_IN_FORCE[@]}"
