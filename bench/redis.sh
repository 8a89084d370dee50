# Redis as a contender: sourced by bench/run.sh. A throwaway redis-server on
# loopback (no persistence), driven by redis-benchmark with the same number
# of clients as pgbench, one request in flight per client (no pipelining).
# redis-benchmark runs in its default single event loop: on 2 cores that is
# faster than --threads 2 (66 000 vs 51 000 requests/s in a trial), and
# Redis is measured at its best.

REDIS_PORT=$((16379 + $$ % 1000))

start_redis() {
    redis-server --bind 127.0.0.1 --port "$REDIS_PORT" --save '' --appendonly no \
        --daemonize yes --logfile "$1/redis.log" --dir "$1"
    for _ in $(seq 50); do
        redis-cli -p "$REDIS_PORT" ping >/dev/null 2>&1 && break
        sleep 0.1
    done
    # 100 000 live keys, named as redis-benchmark -r 100000 names them.
    seq 0 99999 | awk '{printf "SET throttle:%012d 1 PX 3600000\n", $1}' |
        redis-cli -p "$REDIS_PORT" >/dev/null
    redis_keys=$(redis-cli -p "$REDIS_PORT" dbsize)
    redis_bytes_per_key=$(redis-cli -p "$REDIS_PORT" info memory |
        sed -n 's/^used_memory:\([0-9]*\).*/\1/p' | awk -v k="$redis_keys" '{printf "%.0f", $1 / k}')
}

stop_redis() {
    redis-cli -p "$REDIS_PORT" shutdown nosave >/dev/null 2>&1 || true
}

# run_redis CONTENDER SECONDS CLIENTS: prints requests per second.
run_redis() {
    local requests=$(($2 * 65000)) key=throttle:hot range=()
    if [ "$1" = redis_set_100k ]; then
        key=throttle:__rand_int__
        range=(-r 100000)
    fi
    redis-benchmark -h 127.0.0.1 -p "$REDIS_PORT" -c "$3" -n "$requests" \
        "${range[@]}" --csv SET "$key" 1 NX PX 3600000 |
        awk -F'","' 'NR == 2 {print $2}'
}
