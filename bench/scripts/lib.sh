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
