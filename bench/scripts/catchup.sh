#!/usr/bin/env bash
# usage: bench/scripts/catchup.sh [BINDIR] [SECONDS]
#
# A follower's catch-up: the three nodes of `scripts/cluster-local.sh`
# (ports 74N0 / 75N0 / 748N, so nothing else may use them), a queue of 4
# partitions, node 3 SIGKILLed, SECONDS (default 15) of closed-loop produce
# of 1,600-byte messages to the two left, node 3 started again; then every
# second each partition's `spool_partition_applied_index` on node 1 (the
# target) and node 3, until node 3 has them all (at most 60 s), and the
# entries and messages a second it caught up at. Then a 15 s drain.
# BINDIR holds spoold, spool and spool-bench (default target/release).
set -euo pipefail
BIN=${1:-$(cd "$(dirname "$0")/../.." && pwd)/target/release}
SECONDS_OF_PRODUCE=${2:-15}
REPO=$(cd "$(dirname "$0")/../.." && pwd)
DIR=$(mktemp -d "${TMPDIR:-/tmp}/spool-catchup.XXXX")
PIDS=()
. "$(dirname "$0")/lib.sh"
trap cluster_cleanup EXIT

local_cluster_configs
start_local_cluster catchup

# Sum of the queue's applied indexes on node $1 (empty when unreachable).
applied() {
    curl -s -m 2 "127.0.0.1:748$1/metrics" | awk '/^spool_partition_applied_index/ && /queue="catchup"/ {s += $NF} END {print s + 0}'
}
echo "load before: $(load)"
kill -KILL "${PIDS[3]}"
"$BIN/spool-bench" throughput --addr 127.0.0.1:7410 --queue catchup --producers 2 --consumers 0 \
    --msg-bytes 1600 --seconds "$SECONDS_OF_PRODUCE" --warmup-ms 0 > "$DIR/produce.json"
python3 - "$DIR/produce.json" <<'PY'
import json, sys
j = json.loads(open(sys.argv[1]).read().strip().splitlines()[-1])
print('produce with node 3 down: %.0f msgs/s, %d messages' % (j['enqueue']['msgs_per_s'], j['enqueue']['count']))
PY
COUNT=$(python3 -c 'import json,sys; print(json.loads(open(sys.argv[1]).read().strip().splitlines()[-1])["enqueue"]["count"])' "$DIR/produce.json")
TARGET=$(applied 1)
start_node 3
BEGIN=$(date +%s.%N); AT3=0
for t in $(seq 60); do
    sleep 1
    AT3=$(applied 3); echo "t=${t}s node 1 applied $TARGET, node 3 $AT3"
    [ "${AT3:-0}" -ge "$TARGET" ] && break
done
python3 - "$BEGIN" "$(date +%s.%N)" "$TARGET" "$AT3" "$COUNT" <<'PY'
import sys
begin, end, target, at3, count = map(float, sys.argv[1:])
secs = end - begin; share = min(at3 / target, 1.0) if target else 0
print('node 3: %.0f of %.0f entries in %.1f s (from its start): %.0f entries/s, %.0f msgs/s' % (
    at3, target, secs, at3 / secs, count * share / secs))
PY
"$BIN/spool-bench" throughput --addr 127.0.0.1:7410 --queue catchup --producers 0 --consumers 2 \
    --msg-bytes 1600 --seconds 15 --warmup-ms 0 > "$DIR/drain.json"
python3 - "$DIR/drain.json" <<'PY'
import json, sys
j = json.loads(open(sys.argv[1]).read().strip().splitlines()[-1])
print('drain: %.0f msgs/s' % j['claim_ack']['msgs_per_s'])
PY
echo "load after: $(load)"
