#!/usr/bin/env bash
# What bounds a claim: one worker that claims and finishes one job at a time,
# with no claim, 1 000 and 10 000 claims in force (jobs other workers hold
# while they work, the oldest due), and 10 000 with a snapshot older than
# those claims open (a long report, pg_dump, hot_standby_feedback). Four ways:
#   recipe          FOR UPDATE SKIP LOCKED, one transaction per job, open
#                   while it works (its jobs in force: rows locked by a
#                   transaction left open);
#   no claim write  a claim that writes nothing to the event and tests each
#                   row against the claims in force, as a claim kept in a
#                   shared-memory table would, then complete's move to the
#                   history (two transactions per job, as throttle's);
#   key range       the same, but starting its scan past the claims in force,
#                   as a claim could if shared memory kept them ordered by
#                   (run_at, id) (here they are all before one key: its best
#                   case);
#   throttle        throttle.claim + throttle.complete (its claims in force: a
#                   claim of another worker).
# Then whole groups (10 events each), with no group and 1 000 groups in force:
# the advisory-lock cursor recipe (bench/queue_setup.sql; its groups in force:
# advisory locks of a transaction left open, their events still pending)
# against throttle.claim_group + throttle.complete (the groups claimed by
# another worker). One client, so the latency is the job's own; interleaved
# rounds, the median. Runs inside the cluster bench/run.sh starts.
#   BENCH_SECONDS (5)  BENCH_ROUNDS (3)
set -euo pipefail
cd "$(dirname "$0")"
source ./common.sh
# Enough due work that no run drains its queue (a job takes 0.4 ms at best).
DUE=$((6000 * SECONDS_PER_RUN))
GROUPS_FREE=$((2500 * SECONDS_PER_RUN))
psql -qX -v ON_ERROR_STOP=1 -f queue-bound/setup.sql
psql -qX -v ON_ERROR_STOP=1 -f queue_setup.sql
out=$(mktemp -d)
trap 'release_open; rm -rf "$out"' EXIT

# A transaction left open, by a session of its own.
holder_pid=
hold_open() {  # hold_open SQL: runs SQL in a transaction that stays open until release_open
    PGAPPNAME=queue-bound-holder psql -qX -v ON_ERROR_STOP=1 >"$out/holder.log" 2>&1 <<SQL &
BEGIN ISOLATION LEVEL REPEATABLE READ;
$1;
SELECT pg_sleep(3600);
SQL
    local job=$! deadline=$((SECONDS + 120))
    until holder_pid=$(psql -qXtAc "SELECT pid FROM pg_stat_activity
                                    WHERE application_name = 'queue-bound-holder'
                                      AND query LIKE 'SELECT pg_sleep(3600)%'") &&
        [ -n "$holder_pid" ]; do
        if ! kill -0 "$job" 2>/dev/null || [ $SECONDS -gt $deadline ]; then
            echo "queue-bound.sh: the open transaction did not start:" >&2
            cat "$out/holder.log" >&2
            exit 1
        fi
        sleep 0.1
    done
}

release_open() {
    [ -n "$holder_pid" ] || return 0
    psql -qXtAc "SELECT pg_terminate_backend($holder_pid)" >/dev/null
    until [ "$(psql -qXtAc "SELECT count(*) FROM pg_stat_activity WHERE pid = $holder_pid")" = 0 ]; do
        sleep 0.1
    done
    holder_pid=
    wait 2>/dev/null || true
}

latency() {  # latency SCRIPT [pgbench options]: ms per job (or group), one client
    local script=$1 result
    shift
    result=$(pgbench -n -M prepared -c 1 -j 1 -T "$SECONDS_PER_RUN" "$@" -f "$script" 2>&1) || true
    if ! grep -q '^latency average' <<<"$result"; then
        echo "queue-bound.sh: $script failed:" >&2
        echo "$result" >&2
        exit 1
    fi
    sed -n 's/^latency average = \([0-9.]*\) ms/\1/p' <<<"$result"
}

record() {  # record NAME SCRIPT [pgbench options]: one more round of NAME
    local name=$1
    shift
    latency "$@" >>"$out/$name"
}

fill() {  # fill IN_FORCE: DUE + IN_FORCE due jobs in each contender's queue
    local total=$((DUE + $1))
    psql -qX -v ON_ERROR_STOP=1 <<SQL
TRUNCATE bound_job;
DELETE FROM throttle.event WHERE queue IN ('bound', 'no_write', 'key_range');
DELETE FROM throttle.event_history WHERE queue IN ('bound', 'no_write', 'key_range');
INSERT INTO bound_job (run_at)
SELECT now() - interval '1 hour' + g * interval '1 millisecond' FROM generate_series(1, $total) AS g;
INSERT INTO throttle.event (queue, item_key, run_at, enqueued_at, enqueued_by)
SELECT q, 'e' || g, now() - interval '1 hour' + g * interval '1 millisecond', now(), 'bench'
FROM generate_series(1, $total) AS g, unnest(ARRAY['bound', 'no_write', 'key_range']) AS q;
-- The claims in force of the two that write nothing: the oldest due.
UPDATE throttle.event e SET claim_token = -1
FROM (SELECT q.queue, (SELECT array_agg(x.id) FROM (SELECT id FROM throttle.event
                                                    WHERE queue = q.queue
                                                    ORDER BY run_at, id LIMIT $1) AS x) AS ids
      FROM unnest(ARRAY['no_write', 'key_range']) AS q(queue)) AS held
WHERE e.queue = held.queue AND e.id = ANY (held.ids);
TRUNCATE bound_frontier;
INSERT INTO bound_frontier
SELECT coalesce(max(run_at), '-infinity'), coalesce(max(id), 0)
FROM throttle.event WHERE queue = 'key_range' AND claim_token IS NOT NULL;
VACUUM ANALYZE bound_job;
VACUUM ANALYZE throttle.event;
VACUUM ANALYZE throttle.event_history;
SQL
}

claim_in_force() {  # claim_in_force N: another worker claims the N oldest due events of 'bound'
    [ "$1" -eq 0 ] ||
        psql -qXtAc "SELECT count(*) FROM throttle.claim('bound', 'other worker', '1 hour', $1)" >/dev/null
}

run_throttle_rows() {  # run_throttle_rows CONFIG: the three that use throttle.event
    local frontier
    frontier=$(psql -qXtAc "SELECT '-D frontier_at=' || coalesce(to_char(run_at AT TIME ZONE 'UTC',
                                     'YYYY-MM-DD\"T\"HH24:MI:SS.USZ'), '-infinity')
                                   || ' -D frontier_id=' || id
                            FROM bound_frontier")
    record "no_claim_write,$1" queue-bound/no_claim_write.sql
    # shellcheck disable=SC2086  # two options, each a word
    record "key_range,$1" queue-bound/key_range.sql $frontier
    record "claim,$1" queue-bound/claim.sql
}

CONFIGS=(0 1000 10000 10000old)
for round in $(seq "$ROUNDS"); do
    for config in "${CONFIGS[@]}"; do
        in_force=${config%old}
        fill "$in_force"
        if [ "$config" = "$in_force" ]; then
            # The recipe's jobs in force are locked by a transaction left open,
            # which also holds back the removal of dead rows: it runs alone with it.
            [ "$in_force" -eq 0 ] ||
                hold_open "SELECT count(*) FROM (SELECT id FROM bound_job WHERE state = 'pending'
                           ORDER BY run_at, id LIMIT $in_force FOR UPDATE) AS held"
            record "recipe,$config" queue-bound/recipe.sql
            release_open
            claim_in_force "$in_force"
        else
            # A snapshot older than the claims in force.
            hold_open "SELECT count(*) FROM bound_frontier"
            claim_in_force "$in_force"
        fi
        run_throttle_rows "$config"
        release_open
        echo "round $round, $config claims in force: done" >&2
    done
done

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

GROUP_CONFIGS=(0 1000)
for round in $(seq "$ROUNDS"); do
    for held in "${GROUP_CONFIGS[@]}"; do
        fill_groups "$held"
        [ "$held" -eq 0 ] ||
            hold_open "SELECT count(pg_advisory_xact_lock(hashtext('g' || n))) FROM generate_series(0, $held - 1) AS n"
        record "group_recipe,$held" queue/recipe.sql
        release_open
        for _ in $(seq "$held"); do
            echo "SELECT count(*) FROM throttle.claim_group('bench', 'other worker', '1 hour');"
        done | psql -qXtA -v ON_ERROR_STOP=1 >/dev/null
        record "group_claim,$held" queue/claim_group.sql
        # The group leases are in shared memory: end them before the next fill.
        [ "$held" -eq 0 ] ||
            psql -qXtAc "SELECT sum(throttle.release_group('bench', 'g' || n)) FROM generate_series(0, $held - 1) AS n" >/dev/null
        echo "round $round, $held groups in force: done" >&2
    done
done

row() {  # row NAME LABEL CONFIG...: the median of each config's rounds
    local name=$1 label=$2 config
    shift 2
    printf '| %s |' "$label"
    for config in "$@"; do
        if [ -s "$out/$name,$config" ]; then
            printf ' %s |' "$(median "$out/$name,$config")"
        else
            printf ' — |'
        fi
    done
    echo
}
echo
echo "What bounds a claim: one worker, pgbench -M prepared, median of $ROUNDS interleaved rounds of" \
    "${SECONDS_PER_RUN} s; $(psql -qXtAc 'SHOW server_version'), fsync $(psql -qXtAc 'SHOW fsync')"
echo
echo "One job per claim, $DUE due jobs free besides those in force; ms per job:"
echo
echo "| contender | no claim in force | 1 000 in force | 10 000 in force | 10 000 in force, an older snapshot open |"
echo "|---|---:|---:|---:|---:|"
row recipe "FOR UPDATE SKIP LOCKED recipe (one transaction per job, open while working)" "${CONFIGS[@]}"
row no_claim_write "a claim that writes nothing to the event, tested per row against the claims in force, + complete" "${CONFIGS[@]}"
row key_range "a claim that writes nothing to the event, its scan started past the claims in force, + complete" "${CONFIGS[@]}"
row claim "throttle.claim + throttle.complete" "${CONFIGS[@]}"
echo
echo "A whole group of 10 events per claim, $GROUPS_FREE due groups free besides those in force; ms per group:"
echo
echo "| contender | no group in force | 1 000 groups in force |"
echo "|---|---:|---:|"
row group_recipe "advisory-lock cursor recipe (transaction open while working)" "${GROUP_CONFIGS[@]}"
row group_claim "throttle.claim_group + throttle.complete" "${GROUP_CONFIGS[@]}"
