# Shared by the scripts beside it (sourced, not run): ports, CPU ticks, the
# load average, and a spoold on a fresh data directory under $WORK.

# CPU ticks (user + system) of process $1, all its threads.
ticks() { awk '{print $14+$15}' "/proc/$1/stat"; }
# A random high port; the next ten above it are assumed free as well.
port() { echo $((20000 + RANDOM % 20000)); }
# The 1-, 5- and 15-minute load averages.
load() { cut -d' ' -f1-3 /proc/loadavg; }

# start_spoold BINARY [FLAGS...]: BINARY on a fresh $WORK/data, waiting for
# its admin port; sets SP (pid), PORT and APORT.
start_spoold() {
    local binary=$1; shift
    rm -rf "$WORK/data"
    PORT=$(port); APORT=$((PORT + 10))
    "$binary" --data-dir "$WORK/data" --listen "127.0.0.1:$PORT" \
        --admin-listen "127.0.0.1:$APORT" "$@" > "$WORK/spoold.log" 2>&1 &
    SP=$!
    for _ in $(seq 100); do
        curl -sf "127.0.0.1:$APORT/metrics" > /dev/null && return 0
        sleep 0.1
    done
    echo "spoold did not start" >&2; cat "$WORK/spoold.log" >&2; exit 1
}
stop_spoold() { kill "$SP"; wait "$SP" 2>/dev/null || true; }

# The three nodes of scripts/cluster-local.sh on ports 74N0 / 75N0 / 748N,
# started one by one here so a script may kill and start one again (which
# cluster-local.sh does not allow). Needs BIN, REPO, DIR and a PIDS array.

# local_cluster_configs: writes cluster-local.sh's node configs under $DIR
# (its own nodes stopped again at once).
local_cluster_configs() {
    SPOOLD=$BIN/spoold setsid bash "$REPO/scripts/cluster-local.sh" "$DIR" > "$DIR/cluster.out" 2>&1 &
    local local_pid=$!
    for _ in $(seq 100); do [ -f "$DIR/node3/spoold.toml" ] && break; sleep 0.2; done
    sleep 1; kill -TERM "$local_pid"; wait "$local_pid" 2> /dev/null || true; sleep 3
}
# start_node N: node N of $DIR, its pid in PIDS[N].
start_node() {
    "$BIN/spoold" --config "$DIR/node$1/spoold.toml" >> "$DIR/node$1/spoold.log" 2>&1 &
    PIDS[$1]=$!
}
# start_local_cluster QUEUE: the three nodes, waited for, and QUEUE of 4
# partitions created.
start_local_cluster() {
    for n in 1 2 3; do start_node "$n"; done
    for n in 1 2 3; do
        for _ in $(seq 100); do curl -sf "127.0.0.1:748$n/metrics" > /dev/null && break; sleep 0.3; done
    done
    for _ in $(seq 30); do
        "$BIN/spool" queue create "$1" --partitions 4 --addr 127.0.0.1:7410 > /dev/null 2>&1 && break
        sleep 1
    done
}
# cluster_cleanup: the EXIT trap of a script that started nodes: stops them
# (SIGKILL after 2 s) and removes $DIR.
cluster_cleanup() {
    kill "${PIDS[@]}" 2> /dev/null || true
    sleep 2
    kill -9 "${PIDS[@]}" 2> /dev/null || true
    rm -rf "$DIR"
}
