#!/usr/bin/env bash
# usage: bench/scripts/snapshot.sh [BINDIR] [SECONDS]
#
# A member caught up by snapshots (`docs/design/replication.md` §6): the
# three nodes of `scripts/cluster-local.sh` (ports 74N0 / 75N0 / 748N, so
# nothing else may use them) with `journal_retain_bytes` at 128 MiB, a
# queue of 4 partitions, SECONDS (default 20) of closed-loop produce of
# 1,600-byte messages, never claimed (the backlog the snapshots carry);
# then every node's logs released (`spool_partition_first_index` > 1);
# then node 3 SIGKILLed, its data directory deleted, started again, and
# timed until its `spool_partition_applied_index` sum reaches node 1's:
# the bytes it installed (`spool_snapshot_bytes_total{outcome="installed"}`)
# a second, against fio's 1 MiB O_DIRECT sequential write on the same disk
# in the same run. BINDIR holds spoold, spool and spool-bench (default
# target/release).
set -euo pipefail
BIN=${1:-$(cd "$(dirname "$0")/../.." && pwd)/target/release}
SECONDS_OF_PRODUCE=${2:-20}
REPO=$(cd "$(dirname "$0")/../.." && pwd)
DIR=$(mktemp -d "${TMPDIR:-/tmp}/spool-snapshot.XXXX")
PIDS=()
. "$(dirname "$0")/lib.sh"
trap cluster_cleanup EXIT

local_cluster_configs
for n in 1 2 3; do
    sed -i 's/^\[cluster\]$/journal_retain_bytes = 134217728\n\n[cluster]/' "$DIR/node$n/spoold.toml"
    rm -rf "$DIR/node$n/data"
done
start_local_cluster snap

metric() { # node, name filter (awk regex): the sum over matching lines
    curl -s -m 2 "127.0.0.1:748$1/metrics" | awk -v m="$2" '$0 ~ m && /queue="snap"/ {s += $NF} END {print s + 0}'
}
applied() { metric "$1" '^spool_partition_applied_index'; }
min_first() {
    curl -s -m 2 "127.0.0.1:748$1/metrics" \
        | awk '/^spool_partition_first_index/ && /queue="snap"/ {if (m == "" || $NF < m) m = $NF} END {print m + 0}'
}
installed_bytes() {
    curl -s -m 2 "127.0.0.1:748$1/metrics" \
        | awk '/^spool_snapshot_bytes_total/ && /outcome="installed"/ {s += $NF} END {print s + 0}'
}

echo "load before: $(load)"
"$BIN/spool-bench" throughput --addr 127.0.0.1:7410 --queue snap --producers 2 --consumers 0 \
    --msg-bytes 1600 --seconds "$SECONDS_OF_PRODUCE" --warmup-ms 0 > "$DIR/produce.json"
python3 - "$DIR/produce.json" <<'PY'
import json, sys
j = json.loads(open(sys.argv[1]).read().strip().splitlines()[-1])
print('produced: %.0f msgs/s, %d messages kept (never claimed)' % (j['enqueue']['msgs_per_s'], j['enqueue']['count']))
PY
for t in $(seq 60); do
    ok=1
    for n in 1 2 3; do [ "$(min_first "$n")" -gt 1 ] || ok=0; done
    [ "$ok" = 1 ] && break
    sleep 1
done
if [ "$ok" != 1 ]; then
    echo "the logs were not released in 60 s (first indexes $(min_first 1) $(min_first 2)" \
        "$(min_first 3)): produce longer, past journal_retain_bytes" >&2
    exit 1
fi
echo "logs released after ${t}s: first indexes $(min_first 1) $(min_first 2) $(min_first 3)"

kill -KILL "${PIDS[3]}"; wait "${PIDS[3]}" 2> /dev/null || true
rm -rf "$DIR/node3/data"
TARGET=$(applied 1)
sleep 2
start_node 3
BEGIN=$(date +%s.%N); AT3=0
for _ in $(seq 600); do
    sleep 0.2
    AT3=$(applied 3)
    [ "${AT3:-0}" -ge "$TARGET" ] && break
done
END=$(date +%s.%N)
BYTES=$(installed_bytes 3)
FIO=$(fio --name=ref --filename="$DIR/fio.tmp" --size=1G --bs=1m --rw=write --direct=1 \
    --runtime=5 --time_based --output-format=json 2> /dev/null \
    | python3 -c 'import json,sys; print(json.load(sys.stdin)["jobs"][0]["write"]["bw_bytes"])')
rm -f "$DIR/fio.tmp"
python3 - "$BEGIN" "$END" "$TARGET" "$AT3" "$BYTES" "$FIO" <<'PY'
import sys
begin, end, target, at3, installed, fio = map(float, sys.argv[1:])
secs = end - begin
print('node 3 (wiped): applied %.0f of %.0f entries %.1f s after its start' % (at3, target, secs))
print('installed %.1f MiB: %.1f MiB/s; fio 1 MiB O_DIRECT write %.1f MiB/s; ratio %.2f' % (
    installed / 2**20, installed / 2**20 / secs, fio / 2**20, (installed / secs) / fio if fio else 0))
PY
echo "load after: $(load)"
