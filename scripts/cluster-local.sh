#!/usr/bin/env bash
# Starts a three-node Spool cluster on 127.0.0.1 (one shard per node) and
# stops all three on Ctrl-C.
#
#   bash scripts/cluster-local.sh [DIR]     # DIR defaults to ./spool-cluster
#
# Builds the release spoold (unless SPOOLD names one), writes
# DIR/cluster.secret (32 random bytes, shared by the nodes) once, and per
# node DIR/nodeN/spoold.toml (a [cluster] table naming all three), its data
# in DIR/nodeN/data and its log in DIR/nodeN/spoold.log. Started again on
# the same DIR it reuses the secret and the data.
#
# Node N (1..3): clients on 127.0.0.1:74N0, peers on 127.0.0.1:75N0 (its
# controller on 75N1), admin port 127.0.0.1:748N. SPOOLD=path runs that
# spoold binary instead of building one.
set -euo pipefail

repo="$(cd "$(dirname "$0")/.." && pwd)"
dir="${1:-./spool-cluster}"
mkdir -p "$dir"
dir="$(cd "$dir" && pwd)"

if [[ -n "${SPOOLD:-}" ]]; then
    spoold="$SPOOLD"
else
    # A no-op when target/release/spoold is up to date with the sources.
    echo "building spoold (release; minutes on a fresh checkout) ..."
    (cd "$repo" && cargo build --release --quiet -p spool-broker --bin spoold)
    spoold="$repo/target/release/spoold"
fi

secret="$dir/cluster.secret"
if [[ ! -f "$secret" ]]; then
    head -c 32 /dev/urandom > "$secret"
    chmod 600 "$secret"
fi

client_addr() { echo "127.0.0.1:74${1}0"; }
peer_addr() { echo "127.0.0.1:75${1}0"; }
admin_addr() { echo "127.0.0.1:748${1}"; }

domains=(x a b c)
nodes_table=""
for n in 1 2 3; do
    nodes_table+="  { id = $n, client = \"$(client_addr "$n")\", peer = \"$(peer_addr "$n")\", failure_domain = \"${domains[$n]}\" },"$'\n'
done

pids=()
stopped=0
stop() {
    if ((stopped)); then return; fi
    stopped=1
    if ((${#pids[@]})); then
        echo
        echo "stopping ${pids[*]} ..."
        kill -TERM "${pids[@]}" 2>/dev/null || true
        wait "${pids[@]}" 2>/dev/null || true
    fi
    echo "stopped; data and logs are in $dir"
}
trap stop EXIT
trap 'stop; exit 130' INT TERM

for n in 1 2 3; do
    node_dir="$dir/node$n"
    mkdir -p "$node_dir/data"
    cat > "$node_dir/spoold.toml" <<EOF
listen = "$(client_addr "$n")"
admin_listen = "$(admin_addr "$n")"
data_dir = "$node_dir/data"
cores = 1

[cluster]
node_id = $n
replication_factor = 3
controller_voters = 3
secret_file = "$secret"
nodes = [
$nodes_table]
EOF
    "$spoold" --config "$node_dir/spoold.toml" >> "$node_dir/spoold.log" 2>&1 &
    pids+=("$!")
done

# Wait (at most 60 s) for every node's admin port to answer.
for n in 1 2 3; do
    for _ in $(seq 600); do
        if (exec 3<>"/dev/tcp/127.0.0.1/748$n") 2>/dev/null; then
            break
        fi
        if ! kill -0 "${pids[$((n - 1))]}" 2>/dev/null; then
            echo "node $n exited; its log ($dir/node$n/spoold.log):" >&2
            tail -n 30 "$dir/node$n/spoold.log" >&2
            exit 1
        fi
        sleep 0.1
    done
done

echo "three-node cluster running (data and logs in $dir):"
for n in 1 2 3; do
    echo "  node $n: clients $(client_addr "$n"), peers $(peer_addr "$n"), admin http://$(admin_addr "$n") (pid ${pids[$((n - 1))]})"
done
echo "try: spool --addr $(client_addr 2) queue create jobs --partitions 2"
echo "Ctrl-C stops all three."
wait -n "${pids[@]}" || true
echo "a node exited; see the logs in $dir" >&2
exit 1
