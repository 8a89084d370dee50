#!/usr/bin/env bash
# The event queue: claim_group against the advisory-lock cursor recipe, with
# the same number of workers, on a backlog of 10 000 and of 1 000 000 due
# events (10 per group): each worker claims and finishes groups until 10 000
# (all of the small backlog) or 160 000 events are done. Runs inside the
# cluster bench/run.sh starts.   BENCH_CLIENTS (8)  BENCH_THREADS (2)
set -euo pipefail
cd "$(dirname "$0")"
source ./common.sh
psql -qX -v ON_ERROR_STOP=1 -f queue_setup.sql

fill() {  # fill N: N due events, 10 per group, in both queues
    psql -qX -v ON_ERROR_STOP=1 <<SQL
TRUNCATE recipe_event;
DELETE FROM throttle.event WHERE queue = 'bench';
DELETE FROM throttle.event_history WHERE queue = 'bench';
INSERT INTO recipe_event (group_key, run_at)
SELECT 'g' || (g % ($1 / 10)), now() - interval '1 hour' + g * interval '1 microsecond'
FROM generate_series(1, $1) AS g;
INSERT INTO throttle.event (queue, item_key, group_key, run_at, enqueued_at, enqueued_by)
SELECT 'bench', 'e' || g, 'g' || (g % ($1 / 10)), now() - interval '1 hour' + g * interval '1 microsecond',
       now(), 'bench'
FROM generate_series(1, $1) AS g;
VACUUM ANALYZE recipe_event;
VACUUM ANALYZE throttle.event;
VACUUM ANALYZE throttle.event_history;
SQL
}

done_count() {
    psql -qXtAc "SELECT (SELECT count(*) FROM recipe_event WHERE state = 'done'), (SELECT count(*) FROM throttle.event_history WHERE queue = 'bench' AND state = 'done')"
}

run() {  # run SCRIPT EVENTS: prints "events/s latency_ms events_done"
    local before after out lat col started ended
    col=$([ "$1" = recipe ] && echo 1 || echo 2)
    before=$(done_count | cut -d'|' -f"$col")
    started=$(date +%s.%N)
    out=$(pgbench -n -M prepared -c "$CLIENTS" -j "$THREADS" -t $(($2 / 10 / CLIENTS)) \
        -f "queue/$1.sql" 2>/dev/null)
    ended=$(date +%s.%N)
    after=$(done_count | cut -d'|' -f"$col")
    lat=$(echo "$out" | sed -n 's/^latency average = \([0-9.]*\) ms/\1/p')
    printf '%.0f %s %d\n' "$(echo "($after - $before) / ($ended - $started)" | bc -l)" "$lat" \
        "$((after - before))"
}

echo
echo "Event queue: $CLIENTS workers, 10 due events per group"
echo
echo "| backlog (due events) | contender | events done | events/s | claim + finish latency (ms) |"
echo "|---:|---|---:|---:|---:|"
for size in 10000 1000000; do
    drain=$((size < 160000 ? size : 160000))
    fill "$size"
    read -r eps lat done < <(run recipe "$drain")
    printf '| %s | advisory-lock cursor recipe (transaction open while working) | %s | %s | %s |\n' \
        "$size" "$done" "$eps" "$lat"
    read -r eps lat done < <(run claim_group "$drain")
    printf '| %s | throttle.claim_group + throttle.complete | %s | %s | %s |\n' "$size" "$done" "$eps" "$lat"
done
