#!/usr/bin/env bash
# usage: bench/scripts/peer.sh [BINDIR] [SECONDS]
#
# Spool beside Redis Streams with AOF `appendfsync always` (every write
# fsynced before its reply, as Spool's enqueue and ack are), one broker at a
# time, in one sitting, on the same workload: 1 KiB messages, 2 producers
# with 256 sends in flight each, 2 consumers that take at most 64 per claim
# (XREADGROUP COUNT 64) and ack each batch before the next. Phases, each on
# a fresh queue / stream except the drain:
#   produce   producers alone (consumers 0), closed loop;
#   drain     consumers alone on what `produce` left (producers 0);
#   mixed     both unlimited, closed loop;
#   rate5k    both, producers open loop at 5,000 msgs/s in all;
#   rate25k   both at 25,000 msgs/s.
# Each line: enqueue and consume msgs/s, consume ÷ enqueue, enqueue p99,
# end-to-end p99 (send or intended send → delivered), the broker's CPU
# seconds over the phase (all its threads, /proc/<pid>/stat), and the load
# average. spoold runs with its defaults (one shard per core; the queue has
# 4 partitions); redis-server 7 single-threaded. Needs redis-server
# (`apt-get install redis-server`). BINDIR holds spoold, spool and
# spool-bench (default target/release). PEERS="spool" (or "redis") runs
# one side only.
set -euo pipefail
BIN=${1:-$(cd "$(dirname "$0")/../.." && pwd)/target/release}
SECONDS_PER_PHASE=${2:-20}
PEERS=${PEERS:-spool redis}
WORK=$(mktemp -d "${TMPDIR:-/tmp}/spool-peer.XXXX")
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$WORK"' EXIT
. "$(dirname "$0")/lib.sh"
HZ=$(getconf CLK_TCK)
command -v redis-server > /dev/null || { echo "redis-server not found" >&2; exit 2; }

start_redis() {
    rm -rf "$WORK/redis"; mkdir -p "$WORK/redis"
    RPORT=$(port)
    redis-server --port "$RPORT" --bind 127.0.0.1 --dir "$WORK/redis" --save "" \
        --appendonly yes --appendfsync always --daemonize no > "$WORK/redis.log" 2>&1 &
    SP=$!
    for _ in $(seq 100); do
        redis-cli -p "$RPORT" ping > /dev/null 2>&1 && return 0
        sleep 0.1
    done
    echo "redis-server did not start" >&2; cat "$WORK/redis.log" >&2; exit 1
}

fresh_queue() {
    "$BIN/spool" --addr "127.0.0.1:$PORT" queue delete peer --yes > /dev/null 2>&1 || true
    "$BIN/spool" --addr "127.0.0.1:$PORT" queue create peer --partitions 4 > /dev/null
}

# phase NAME BROKER ARGS...: one run, one line. The drain has no warm-up:
# a warm-up would eat the backlog the produce phase left.
phase() {
    local name=$1 broker=$2; shift 2
    local warmup=2000
    [[ $name == drain ]] && warmup=0
    local t0 t1 l0
    l0=$(load | cut -d" " -f1); t0=$(ticks "$SP")
    if [[ $broker == spool ]]; then
        "$BIN/spool-bench" throughput --addr "127.0.0.1:$PORT" --queue peer --window 256 \
            --slots 64 --claims-in-flight 1 --warmup-ms "$warmup" --seconds "$SECONDS_PER_PHASE" \
            "$@" > "$WORK/out.json"
    else
        "$BIN/spool-bench" redis-streams --addr "127.0.0.1:$RPORT" --stream peer --window 256 \
            --count 64 --warmup-ms "$warmup" --seconds "$SECONDS_PER_PHASE" "$@" > "$WORK/out.json"
    fi
    t1=$(ticks "$SP")
    python3 - "$WORK/out.json" "$name" "$broker" "$(( t1 - t0 ))" "$HZ" "$l0" "$(load | cut -d" " -f1)" <<'PY'
import json, sys
r = json.load(open(sys.argv[1])); name, broker = sys.argv[2], sys.argv[3]
cpu = int(sys.argv[4]) / int(sys.argv[5])
enq = r['enqueue']['msgs_per_s']
con = (r['claim_ack'] if 'claim_ack' in r else r['consume'])['msgs_per_s']
e2e = r['e2e']['latency_us'] if 'e2e' in r else r['e2e_latency_us']
ratio = '%.2f' % (con / enq) if enq > 0 and con > 0 else '-'
p99 = lambda s: '%.1f' % (s['p99'] / 1e3) if s['count'] else '-'
print('| %-7s | %-5s | %8.0f | %8.0f | %5s | %8s | %8s | %6.1f | %s → %s |' % (
    name, broker, enq, con, ratio, p99(r['enqueue']['latency_us']), p99(e2e), cpu,
    sys.argv[6], sys.argv[7]))
PY
}

echo "| phase   | peer  | enqueue/s | consume/s | ratio | enq p99 ms | e2e p99 ms | CPU-s | load 1m |"
echo "|---|---|---|---|---|---|---|---|---|"
if [[ " $PEERS " == *" spool "* ]]; then
start_spoold "$BIN/spoold"
fresh_queue
phase produce spool --consumers 0
phase drain spool --producers 0
fresh_queue
phase mixed spool
fresh_queue
phase rate5k spool --rate 5000
fresh_queue
phase rate25k spool --rate 25000
stop_spoold
fi

if [[ " $PEERS " == *" redis "* ]]; then
start_redis
phase produce redis --fresh --consumers 0
phase drain redis --producers 0
phase mixed redis --fresh
phase rate5k redis --fresh --rate 5000
phase rate25k redis --fresh --rate 25000
stop_spoold  # SP is redis-server here
fi
