#!/usr/bin/env bash
# usage: bench/scripts/cpu_per_msg.sh SPOOLD_BIN RATE SECONDS   (EXTRA="--admin-listen off" for extra spoold flags)
# Starts spoold (2 shards) on a fresh dir, runs spool-bench throughput --rate RATE
# against it, prints broker CPU seconds / messages acked, plus the bench summary.
set -euo pipefail
BIN=$1; RATE=$2; SECS=$3
D=${CPM_DIR:-/tmp/spool-cpm-$$}; rm -rf $D; mkdir -p $D
$BIN --data-dir $D/data --listen 127.0.0.1:17500 --cores 2 ${EXTRA:-} > $D/spoold.log 2>&1 &
PID=$!; sleep 1.5
TCK=$(getconf CLK_TCK)
read u0 s0 < <(awk '{print $14, $15}' /proc/$PID/stat)
"$(dirname "$0")/../../target/release/spool-bench" throughput --addr 127.0.0.1:17500 --shards 2 --rate $RATE --seconds $SECS --warmup-ms 0 > $D/out.json 2>$D/err.txt
read u1 s1 < <(awk '{print $14, $15}' /proc/$PID/stat)
kill $PID; wait $PID 2>/dev/null || true
python3 - "$D/out.json" $((u1-u0)) $((s1-s0)) $TCK <<'PY'
import json,sys
r=json.load(open(sys.argv[1])); u=int(sys.argv[2]); s=int(sys.argv[3]); t=int(sys.argv[4])
e=r['enqueue']; c=r['claim_ack']
n=e['count']; cpu=(u+s)/t
print(f"enq {e['msgs_per_s']:.0f}/s acked {c['msgs_per_s']:.0f}/s enq p50/p99 {e['latency_us']['p50']/1000:.2f}/{e['latency_us']['p99']/1000:.2f} ms ack_rtt p50/p99 {c['ack_rtt_us']['p50']/1000:.2f}/{c['ack_rtt_us']['p99']/1000:.2f} ms e2e p50/p99 {r['e2e']['latency_us']['p50']/1000:.2f}/{r['e2e']['latency_us']['p99']/1000:.2f} ms | broker cpu {cpu:.2f}s user {u/t:.2f} sys {s/t:.2f} -> {cpu/n*1e6:.2f} us/msg")
PY
rm -rf "$D"
