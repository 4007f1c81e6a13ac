#!/usr/bin/env bash
# usage: bench/scripts/references.sh [BINDIR] [ROUNDS]
#
# The consumer-path figures beside the machine's own references, in one run
# (nothing else should run meanwhile; the load average is printed):
#   - fio: 4 KiB write + fdatasync p50/p99 (the disk's sync), alone and
#     beside a 300 MB/s writer;
#   - sockperf: CPU per request of a bare TCP echo server on loopback at
#     25,000 and 5,000 requests/s (the machine's floor for a request that
#     wakes a server; needs `apt-get install sockperf`);
#   - spoold at --rate 25000 and 5000 (4 partitions, zero linger): broker
#     CPU (all threads, /proc/<pid>/stat) and its split by thread name;
#   - each side alone: producers fill a queue closed-loop, then consumers
#     drain it with no producer running; broker and client CPU per message;
#   - the closed loop (2 producers + 2 consumers in one bench process), with
#     the broker-side request durations from /metrics beside the client's.
# BINDIR holds spoold, spool-bench and spool (default target/release).
set -euo pipefail
BIN=${1:-$(cd "$(dirname "$0")/../.." && pwd)/target/release}
ROUNDS=${2:-3}
WORK=$(mktemp -d "${TMPDIR:-/tmp}/spool-refs.XXXX")
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$WORK"' EXIT
. "$(dirname "$0")/lib.sh"
bench() { "$BIN/spool-bench" throughput --addr "127.0.0.1:$PORT" --partitions 4 --warmup-ms 0 "$@"; }

fio_sync() {
    fio --name=ref --filename="$WORK/fio.tmp" --size=256M --bs=4k --rw=write \
        --ioengine=sync --fdatasync=1 --runtime=10 --time_based --output-format=json \
        > "$WORK/fio.json" 2> /dev/null
    python3 - "$WORK/fio.json" <<'PY'
import json, sys
j = json.load(open(sys.argv[1]))['jobs'][0]; s = j['sync']['lat_ns']['percentile']
print('fio 4 KiB write+fdatasync: sync p50 %.0f us, p99 %.0f us' % (s['50.000000'] / 1e3, s['99.000000'] / 1e3))
PY
    rm -f "$WORK/fio.tmp"
}

# The same 4 KiB sync beside a 300 MB/s O_DIRECT writer that syncs every
# MiB (what an ack's sync shares the disk with in a closed loop).
fio_sync_beside_writer() {
    fio --output-format=json \
        --name=writer --filename="$WORK/fio.w" --size=4G --bs=256k --rw=write --direct=1 \
        --ioengine=io_uring --iodepth=4 --rate=300m --fdatasync=4 --runtime=10 --time_based \
        --name=sync --filename="$WORK/fio.tmp" --size=256M --bs=4k --rw=write --direct=1 \
        --ioengine=sync --fdatasync=1 --runtime=10 --time_based > "$WORK/fio.json" 2> /dev/null
    python3 - "$WORK/fio.json" <<'PY'
import json, sys
jobs = {j['jobname']: j for j in json.load(open(sys.argv[1]))['jobs']}
s = jobs['sync']['sync']['lat_ns']['percentile']
print('fio 4 KiB write+fdatasync beside a %.0f MB/s writer: sync p50 %.0f us, p99 %.0f us' % (
    jobs['writer']['write']['bw'] / 1024, s['50.000000'] / 1e3, s['99.000000'] / 1e3))
PY
    rm -f "$WORK/fio.tmp" "$WORK/fio.w"
}

sockperf_echo() {
    local mps=$1 p; p=$(port)
    taskset -c 0 sockperf server --tcp -i 127.0.0.1 -p "$p" > /dev/null 2>&1 &
    local srv=$!; sleep 1
    local t0; t0=$(ticks $srv)
    taskset -c 1 sockperf under-load --tcp -i 127.0.0.1 -p "$p" --mps "$mps" -m 1100 -t 10 \
        --reply-every 1 > /dev/null 2>&1
    local t1; t1=$(ticks $srv)
    kill $srv; wait $srv 2>/dev/null || true
    python3 -c "t=$t1-$t0; print('sockperf echo server at $mps req/s: %.1f %% of a core, %.1f us of CPU per request' % (t*100/(10*$(getconf CLK_TCK)), t*1e6/$(getconf CLK_TCK)/($mps*10)))"
}

# Per-thread-name CPU ticks of spoold.
threads() {
    for t in /proc/"$SP"/task/*; do
        printf '%s %s\n' "$(tr ' ' _ < "$t/comm")" "$(awk '{print $14+$15}' "$t/stat")"
    done
}

rate_run() {
    local rate=$1
    start_spoold "$BIN/spoold"
    local t0 s0; t0=$(ticks "$SP"); s0=$(threads)
    bench --rate "$rate" --seconds 10 > "$WORK/rate.json" 2> /dev/null
    local t1 s1; t1=$(ticks "$SP"); s1=$(threads)
    stop_spoold
    python3 - "$WORK/rate.json" "$t0" "$t1" "$s0" "$s1" "$(getconf CLK_TCK)" <<'PY'
import collections, json, sys
r = json.load(open(sys.argv[1])); t = int(sys.argv[3]) - int(sys.argv[2]); hz = int(sys.argv[6])
def split(text):
    out = collections.Counter()
    for line in text.splitlines():
        name, v = line.rsplit(' ', 1); out[name.rstrip('0123456789-')] += int(v)
    return out
a, b = split(sys.argv[4]), split(sys.argv[5])
e = r['enqueue']; n = e['count']
x = r['e2e']['latency_us']
print('spoold at %.0f msgs/s: enqueue p50 %.2f ms p99 %.1f ms, end to end p99 %.1f ms, broker CPU %.0f %% of a core = %.1f us/msg; by thread %s' % (
    e['msgs_per_s'], e['latency_us']['p50'] / 1e3, e['latency_us']['p99'] / 1e3, x['p99'] / 1e3, t * 100 / (10 * hz),
    t / hz * 1e6 / n, {k: b[k] - a.get(k, 0) for k in b if b[k] - a.get(k, 0) > 0}))
PY
}

alone() {
    start_spoold "$BIN/spoold"
    "$BIN/spool" queue create q --addr "127.0.0.1:$PORT" --partitions 4 > /dev/null
    local t0 t1 t2
    t0=$(ticks "$SP")
    /usr/bin/time -f '%U %S' -o "$WORK/p.cpu" "$BIN/spool-bench" throughput --addr "127.0.0.1:$PORT" \
        --partitions 4 --queue q --seconds 4 --warmup-ms 0 --consumers 0 > "$WORK/p.json" 2> /dev/null
    t1=$(ticks "$SP")
    /usr/bin/time -f '%U %S' -o "$WORK/c.cpu" "$BIN/spool-bench" throughput --addr "127.0.0.1:$PORT" \
        --partitions 4 --queue q --seconds 4 --warmup-ms 0 --producers 1 --rate 1 > "$WORK/c.json" 2> /dev/null
    t2=$(ticks "$SP")
    stop_spoold
    python3 - "$WORK" "$t0" "$t1" "$t2" "$(getconf CLK_TCK)" <<'PY'
import json, sys
w = sys.argv[1]; t0, t1, t2, hz = map(int, sys.argv[2:6])
p = json.load(open(w + '/p.json')); c = json.load(open(w + '/c.json'))
pc = sum(map(float, open(w + '/p.cpu').read().split()[-2:])); cc = sum(map(float, open(w + '/c.cpu').read().split()[-2:]))
ne = p['enqueue']['count']; nd = c['claim_ack']['acked']
print('alone: enqueue %.0f/s (broker %.2f + client %.2f us/msg); drain claim+ack %.0f/s (broker %.2f + client %.2f us/msg)' % (
    p['enqueue']['msgs_per_s'], (t1 - t0) / hz * 1e6 / ne, pc * 1e6 / ne,
    c['claim_ack']['msgs_per_s'], (t2 - t1) / hz * 1e6 / nd, cc * 1e6 / nd))
PY
}

closed_loop() {
    start_spoold "$BIN/spoold"
    (sleep 9; curl -s "127.0.0.1:$APORT/metrics" > "$WORK/metrics") &
    local scrape=$!
    bench --seconds 10 > "$WORK/closed.json" 2> /dev/null
    wait $scrape
    stop_spoold
    python3 - "$WORK/closed.json" "$WORK/metrics" <<'PY'
import collections, json, sys
r = json.load(open(sys.argv[1])); e = r['enqueue']; c = r['claim_ack']
h = collections.defaultdict(lambda: collections.defaultdict(float))
for line in open(sys.argv[2]):
    if line.startswith('spool_request_duration_seconds_bucket{'):
        labels = dict(x.split('=', 1) for x in line[line.index('{') + 1:line.index('}')].split(','))
        h[labels['op'].strip('"')][labels['le'].strip('"')] += float(line.split()[-1])
def p50(op):
    items = sorted((float('inf') if k == '+Inf' else float(k), v) for k, v in h[op].items())
    return next((le for le, v in items if v >= items[-1][1] / 2), float('nan')) * 1e3
print('closed loop: enqueue %.0f/s, claim+ack %.0f/s; claim round trip p50 %.2f ms (broker-side p50 <= %.2f ms), ack p50 %.2f ms (broker-side <= %.2f ms)' % (
    e['msgs_per_s'], c['msgs_per_s'], c['claim_rtt_us']['p50'] / 1e3, p50('claim'), c['ack_rtt_us']['p50'] / 1e3, p50('ack')))
PY
}

echo "load $(cut -d' ' -f1-3 /proc/loadavg)"
fio_sync
fio_sync_beside_writer
for round in $(seq "$ROUNDS"); do
    echo "== round $round, load $(cut -d' ' -f1-3 /proc/loadavg)"
    sockperf_echo 25000
    sockperf_echo 5000
    rate_run 25000
    rate_run 5000
    alone
    closed_loop
done
echo "load $(cut -d' ' -f1-3 /proc/loadavg)"
