#!/usr/bin/env bash
# Counts a spoold's heap allocation calls during a fixed `spool-bench
# throughput` run, with uprobes on mimalloc's entry points (the broker's
# global allocator calls mi_malloc_aligned / mi_zalloc_aligned /
# mi_realloc_aligned for every allocation). Needs perf (Debian: linux-perf)
# and root. Prints the enqueued and acked counts, the calls per probe and
# allocation calls per enqueued message.
#
#   bench/scripts/alloc-count.sh SPOOLD SPOOL_BENCH OUT_DIR [PORT]
set -euo pipefail
spoold=$(realpath "$1"); bench=$(realpath "$2"); out=$3; port=${4:-7700}
rm -rf "$out"; mkdir -p "$out"
perf probe -d 'probe_spoold:*' >/dev/null 2>&1 || true
for symbol in mi_malloc_aligned mi_zalloc_aligned mi_realloc_aligned; do
  perf probe -q -x "$spoold" --add "$symbol"
done
perf stat -e 'probe_spoold:*' -o "$out/stat.txt" -- \
  "$spoold" --data-dir "$out/data" --listen "127.0.0.1:$port" --admin-listen off --cores 2 \
  > "$out/spoold.log" 2>&1 &
perf_pid=$!
for _ in $(seq 1 100); do
  (exec 3<>"/dev/tcp/127.0.0.1/$((port + 1))") 2>/dev/null && break
  sleep 0.05
done
"$bench" throughput --addr "127.0.0.1:$port" --shards 2 --msg-bytes 1024 --rate 5000 \
  --seconds 4 --warmup-ms 500 --linger-us 0 > "$out/bench.out"
pkill -TERM -f "^$spoold --data-dir $out/data" || true
wait "$perf_pid" || true
perf probe -d 'probe_spoold:*' >/dev/null 2>&1 || true
python3 - "$out" <<'PY'
import json, re, sys
out = sys.argv[1]
run = json.loads(open(out + "/bench.out").read().strip().splitlines()[-1])
stat = open(out + "/stat.txt").read()
calls = {m.group(2): int(m.group(1).replace(",", ""))
         for m in re.finditer(r"([\d,]+)\s+probe_spoold:(\w+)", stat)}
enqueued = run["enqueue"]["count"]
print(f"enqueued {enqueued} acked {run['claim_ack']['acked']} "
      f"claim requests {run['claim_ack']['claim_requests']} calls {calls} "
      f"allocations/message {sum(calls.values()) / enqueued:.1f}")
PY
