#!/usr/bin/env bash
# usage: bench/scripts/pace.sh ROUNDS SPOOLD_A [SPOOLD_B ...]
#
# Consumer pace, variants side by side: for each round and each spoold
# binary in turn (A, B, A, B, ... in the same sitting, so a busy machine
# hurts both alike), on a fresh data dir:
#   - the closed loop of references.sh (2 producers unlimited + 2 consumers
#     in one spool-bench process, 4 partitions, 10 s): enqueue and
#     claim+ack rates, their ratio, the claim round trip, and the broker's
#     consumer-pace counters (spool_pace_*) from /metrics at the end;
#   - --rate 5000 (open loop): enqueue p99, end-to-end p99, broker CPU.
# The load average is printed beside every figure. spool-bench and spool
# come from BINDIR (default target/release).
set -euo pipefail
ROUNDS=${1:?rounds}; shift
BIN=${BINDIR:-$(cd "$(dirname "$0")/../.." && pwd)/target/release}
WORK=$(mktemp -d "${TMPDIR:-/tmp}/spool-pace.XXXX")
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$WORK"' EXIT
. "$(dirname "$0")/lib.sh"
bench() { "$BIN/spool-bench" throughput --addr "127.0.0.1:$PORT" --partitions 4 --warmup-ms 0 "$@"; }

closed_loop() {
    start_spoold "$1"
    local t0; t0=$(ticks "$SP")
    bench --seconds 10 > "$WORK/closed.json" 2> /dev/null
    local t1; t1=$(ticks "$SP")
    curl -s "127.0.0.1:$APORT/metrics" > "$WORK/metrics"
    stop_spoold
    python3 - "$WORK/closed.json" "$WORK/metrics" "$((t1 - t0))" "$(getconf CLK_TCK)" "$(load)" <<'PY'
import json, sys
r = json.load(open(sys.argv[1])); e = r['enqueue']; c = r['claim_ack']
pace = {}
for line in open(sys.argv[2]):
    if line.startswith('spool_pace_'):
        name, v = line.rsplit(' ', 1); pace[name] = pace.get(name, 0) + float(v)
t = int(sys.argv[3]) / int(sys.argv[4])
print('  closed loop: enqueue %.0f/s, claim+ack %.0f/s, ratio %.2f; claim rtt p50 %.2f ms p99 %.1f ms; e2e p99 %.0f ms; broker CPU %.0f %%; load %s%s' % (
    e['msgs_per_s'], c['msgs_per_s'], c['msgs_per_s'] / max(e['msgs_per_s'], 1),
    c['claim_rtt_us']['p50'] / 1e3, c['claim_rtt_us']['p99'] / 1e3, r['e2e']['latency_us']['p99'] / 1e3,
    t * 10, sys.argv[5], ''.join('\n    %s %.0f' % kv for kv in sorted(pace.items()))))
PY
}

rate_run() {
    start_spoold "$1"
    local t0; t0=$(ticks "$SP")
    bench --rate 5000 --seconds 10 > "$WORK/rate.json" 2> /dev/null
    local t1; t1=$(ticks "$SP")
    stop_spoold
    python3 - "$WORK/rate.json" "$((t1 - t0))" "$(getconf CLK_TCK)" "$(load)" <<'PY'
import json, sys
r = json.load(open(sys.argv[1])); e = r['enqueue']; t = int(sys.argv[2]) / int(sys.argv[3])
print('  rate 5000: enqueue %.0f/s p50 %.2f ms p99 %.2f ms; e2e p50 %.2f ms p99 %.2f ms; claim+ack %.0f/s; broker CPU %.1f %% = %.1f us/msg; load %s' % (
    e['msgs_per_s'], e['latency_us']['p50'] / 1e3, e['latency_us']['p99'] / 1e3,
    r['e2e']['latency_us']['p50'] / 1e3, r['e2e']['latency_us']['p99'] / 1e3,
    r['claim_ack']['msgs_per_s'], t * 10, t * 1e6 / max(e['count'], 1), sys.argv[4]))
PY
}

for round in $(seq "$ROUNDS"); do
    for spoold in "$@"; do
        echo "== round $round, $spoold, load $(load)"
        closed_loop "$spoold"
        rate_run "$spoold"
    done
done
