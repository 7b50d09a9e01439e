#!/bin/sh
# Starts a 3-member etcd on 127.0.0.1, runs the load generator, stops etcd.
set -e
here=$(cd "$(dirname "$0")" && pwd)
bin=${BIN:?set BIN to the directory holding etcd and loadgen}
work=$(mktemp -d)
cluster="e1=http://127.0.0.1:23801,e2=http://127.0.0.1:23802,e3=http://127.0.0.1:23803"
pids=""
for i in 1 2 3; do
  "$bin/etcd" --name e$i --data-dir "$work/e$i" \
    --listen-client-urls http://127.0.0.1:2379$i --advertise-client-urls http://127.0.0.1:2379$i \
    --listen-peer-urls http://127.0.0.1:2380$i --initial-advertise-peer-urls http://127.0.0.1:2380$i \
    --initial-cluster "$cluster" --initial-cluster-state new --log-level error \
    > "$work/e$i.log" 2>&1 &
  pids="$pids $!"
done
trap 'kill $pids 2>/dev/null; wait 2>/dev/null; rm -rf "$work"' EXIT
sleep 3
"$bin/loadgen" "$@"
