#!/bin/sh
# Starts three controller-only berthd processes on 127.0.0.1 (as run.sh
# starts etcd's three members), runs ctl-bench against them, stops them.
set -e
bin=${BIN:?set BIN to the directory holding berthd and ctl-bench}
work=$(mktemp -d)
peers="1=127.0.0.1:23811,2=127.0.0.1:23812,3=127.0.0.1:23813"
pids=""
for i in 1 2 3; do
  "$bin/berthd" -role controller -data "$work/b$i" -admin "" \
    -controller-id $i -controller-peers "$peers" -log-level warn \
    > "$work/b$i.log" 2>&1 &
  pids="$pids $!"
done
trap 'kill $pids 2>/dev/null; wait 2>/dev/null; rm -rf "$work"' EXIT
"$bin/ctl-bench" -endpoints 127.0.0.1:23811,127.0.0.1:23812,127.0.0.1:23813 "$@"
