#!/usr/bin/env bash
# usage: bench/scripts/replicated.sh [BINDIR] [SECONDS] [ROUNDS]
#
# Three replicas against one node, on this machine, in one sitting: a
# single spoold (one shard) and a three-node cluster (one shard each,
# replication factor 3, every node a controller voter), rounds interleaved
# (single, cluster, single, ...), each on a fresh data directory and a
# fresh queue of 4 partitions, 1,600-byte messages (the capacity model's
# records). Phases, each one line:
#   produce   producers alone (consumers 0), closed loop;
#   drain     consumers alone on what `produce` left (producers 0);
#   mixed     both unlimited, closed loop;
#   rate5k    both, producers open loop at 5,000 msgs/s in all;
#   rate25k   both at 25,000 msgs/s (the capacity model's rate).
# Each line: enqueue and consume msgs/s, enqueue p50 / p99 (send or intended
# send → durable: on the cluster, on a majority), end-to-end p99, the CPU
# seconds of every spoold (all threads, /proc/<pid>/stat), the load average,
# and the journal MiB the largest node holds 3 s after the phase (its
# release passes run every second: after `drain` it shows what acked
# messages still hold on disk).
# The bench client talks to node 1 and follows the metadata to each
# partition's leader. A reference first: fio's 4 KiB write + fdatasync
# (`apt-get install fio`; skipped when absent), since every replica syncs
# on the same disk here.
# BINDIR holds spoold, spool and spool-bench (default target/release).
# MODES="cluster" (or "single") runs one side only, PHASES="rate25k" (a
# list) only those phases (`drain` needs `produce`); KEEP=DIR keeps each
# phase's JSON report there as MODE-PHASE-ROUND.json.
set -euo pipefail
BIN=${1:-$(cd "$(dirname "$0")/../.." && pwd)/target/release}
SECONDS_PER_PHASE=${2:-15}
ROUNDS=${3:-2}
WORK=$(mktemp -d "${TMPDIR:-/tmp}/spool-replicated.XXXX")
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$WORK"' EXIT
. "$(dirname "$0")/lib.sh"
HZ=$(getconf CLK_TCK)
MSG_BYTES=1600
PIDS=()

fio_sync() {
    command -v fio > /dev/null || { echo "fio: not installed, no disk reference"; return; }
    fio --name=ref --filename="$WORK/fio.tmp" --size=256M --bs=4k --rw=write \
        --ioengine=sync --fdatasync=1 --runtime=10 --time_based --output-format=json \
        > "$WORK/fio.json" 2> /dev/null
    python3 - "$WORK/fio.json" <<'PY'
import json, sys
j = json.load(open(sys.argv[1]))['jobs'][0]; s = j['sync']['lat_ns']['percentile']
print('fio 4 KiB write+fdatasync: %.0f syncs/s, sync p50 %.0f us, p99 %.0f us' % (
    j['write']['iops'], s['50.000000'] / 1e3, s['99.000000'] / 1e3))
PY
    rm -f "$WORK/fio.tmp"
}

wait_admin() {
    for _ in $(seq 200); do
        curl -sf "127.0.0.1:$1/metrics" > /dev/null && return 0
        sleep 0.1
    done
    echo "spoold (admin $1) did not start" >&2; cat "$WORK"/*.log >&2; exit 1
}

start_single() {
    rm -rf "$WORK/single"
    PORT=$(port)
    "$BIN/spoold" --data-dir "$WORK/single" --listen "127.0.0.1:$PORT" \
        --admin-listen "127.0.0.1:$((PORT + 5))" --cores 1 > "$WORK/single.log" 2>&1 &
    PIDS=($!)
    wait_admin $((PORT + 5))
}

# Node n: clients on BASE+10n, peers on BASE+10n+2 (its controller on +3),
# admin on BASE+10n+5. PORT is node 1's client port.
start_cluster() {
    local base n nodes=""
    base=$(port); PORT=$((base + 10)); PIDS=()
    rm -rf "$WORK/cluster"; mkdir -p "$WORK/cluster"
    head -c 32 /dev/urandom > "$WORK/cluster/secret"
    for n in 1 2 3; do
        nodes+="  { id = $n, client = \"127.0.0.1:$((base + 10 * n))\", peer = \"127.0.0.1:$((base + 10 * n + 2))\", failure_domain = \"d$n\" },"$'\n'
    done
    for n in 1 2 3; do
        mkdir -p "$WORK/cluster/node$n"
        cat > "$WORK/cluster/node$n/spoold.toml" <<EOF
listen = "127.0.0.1:$((base + 10 * n))"
admin_listen = "127.0.0.1:$((base + 10 * n + 5))"
data_dir = "$WORK/cluster/node$n/data"
cores = 1

[cluster]
node_id = $n
replication_factor = 3
controller_voters = 3
secret_file = "$WORK/cluster/secret"
nodes = [
$nodes]
EOF
        "$BIN/spoold" --config "$WORK/cluster/node$n/spoold.toml" > "$WORK/node$n.log" 2>&1 &
        PIDS+=($!)
    done
    for n in 1 2 3; do wait_admin $((base + 10 * n + 5)); done
}

stop_all() {
    kill "${PIDS[@]}" 2> /dev/null || true
    wait "${PIDS[@]}" 2> /dev/null || true
}

all_ticks() {
    local total=0 pid
    for pid in "${PIDS[@]}"; do total=$((total + $(ticks "$pid"))); done
    echo $total
}

# A fresh queue; on the cluster the create waits for the controller's
# leader (the client follows it) and the bench waits for the partitions'.
fresh_queue() {
    "$BIN/spool" --addr "127.0.0.1:$PORT" --timeout-ms 30000 queue delete rep --yes \
        > /dev/null 2>&1 || true
    for _ in $(seq 30); do
        "$BIN/spool" --addr "127.0.0.1:$PORT" --timeout-ms 30000 \
            queue create rep --partitions 4 > /dev/null 2>&1 && return 0
        sleep 1
    done
    echo "queue create failed" >&2; exit 1
}

phase() {
    local name=$1 mode=$2; shift 2
    local warmup=2000
    [[ $name == drain ]] && warmup=0
    local t0 t1 l0
    l0=$(load | cut -d" " -f1); t0=$(all_ticks)
    "$BIN/spool-bench" throughput --addr "127.0.0.1:$PORT" --queue rep --msg-bytes $MSG_BYTES \
        --warmup-ms "$warmup" --seconds "$SECONDS_PER_PHASE" "$@" > "$WORK/out.json"
    t1=$(all_ticks)
    local l1; l1=$(load | cut -d" " -f1)
    [[ -n ${KEEP:-} ]] && cp "$WORK/out.json" "$KEEP/$mode-$name-$ROUND.json"
    sleep 3
    python3 - "$WORK/out.json" "$name" "$mode" "$(( t1 - t0 ))" "$HZ" "$l0" "$l1" \
        "$(journal_mib "$mode")" <<'PY'
import json, sys
r = json.load(open(sys.argv[1])); name, mode = sys.argv[2], sys.argv[3]
cpu = int(sys.argv[4]) / int(sys.argv[5])
enq = r['enqueue']['msgs_per_s']; con = r['claim_ack']['msgs_per_s']
lat = lambda s, q: '%.1f' % (s[q] / 1e3) if s['count'] else '-'
e = r['enqueue']['latency_us']; e2e = r['e2e']['latency_us']
print('| %-7s | %-7s | %8.0f | %8.0f | %s / %s | %s | %6.1f | %s → %s | %s |' % (
    name, mode, enq, con, lat(e, 'p50'), lat(e, 'p99'), lat(e2e, 'p99'), cpu,
    sys.argv[6], sys.argv[7], sys.argv[8]))
PY
}

# The journal MiB the largest node of `mode` holds now.
journal_mib() {
    local dirs
    if [[ $1 == single ]]; then dirs=("$WORK"/single/shard-*/journal)
    else dirs=("$WORK"/cluster/node*/data/shard-*/journal); fi
    du -sm "${dirs[@]}" 2> /dev/null | sort -n | tail -1 | cut -f1
}

wanted() { [[ " ${PHASES:-produce drain mixed rate5k rate25k} " == *" $1 "* ]]; }

run() {
    local mode=$1
    if [[ $mode == single ]]; then start_single; else start_cluster; fi
    if wanted produce; then
        fresh_queue
        phase produce "$mode" --consumers 0
        if wanted drain; then phase drain "$mode" --producers 0; fi
    fi
    if wanted mixed; then fresh_queue; phase mixed "$mode"; fi
    if wanted rate5k; then fresh_queue; phase rate5k "$mode" --rate 5000; fi
    if wanted rate25k; then fresh_queue; phase rate25k "$mode" --rate 25000; fi
    stop_all
}

echo "load before: $(load)"
fio_sync
echo "| phase   | mode    | enqueue/s | consume/s | enq p50 / p99 ms | e2e p99 ms | CPU-s | load 1m | journal MiB |"
echo "|---|---|---|---|---|---|---|---|---|"
for ROUND in $(seq "$ROUNDS"); do
    for mode in ${MODES:-single cluster}; do run "$mode"; done
done
