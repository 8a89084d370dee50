# Settings and helpers shared by the bench scripts (sourced).
#   BENCH_SECONDS (5)  BENCH_ROUNDS (3)  BENCH_CLIENTS (8)  BENCH_THREADS (2)
SECONDS_PER_RUN=${BENCH_SECONDS:-5}
ROUNDS=${BENCH_ROUNDS:-3}
CLIENTS=${BENCH_CLIENTS:-8}
THREADS=${BENCH_THREADS:-2}

# tps SCRIPT: one pgbench run (prepared protocol) of SCRIPT; prints its tps.
tps() {
    pgbench -n -M prepared -c "$CLIENTS" -j "$THREADS" -T "$SECONDS_PER_RUN" -f "$1" 2>/dev/null |
        sed -n 's/^tps = \([0-9.]*\) (without initial connection time)/\1/p'
}

# median FILE: the median of the numbers in FILE, one per line.
median() {
    sort -g "$1" | awk '{v[NR] = $1} END {print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2}'
}

# fill_keys N CALL: runs CALL (an SQL boolean expression of g) for g = 1..N in one
# statement, so that N keys are in the registry before the runs.
fill_keys() {
    psql -qX -v ON_ERROR_STOP=1 -c "SELECT count(*) FROM generate_series(1, $1) AS g WHERE $2" >/dev/null
}
