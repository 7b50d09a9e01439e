#!/bin/sh
# Side-by-side run on one machine: etcd v3.6 (3 members, separate
# processes), then Berth's controllers (3 members, one process), then etcd
# again to bracket the machine's load. Run from the repository root:
#   sh controlplane/etcdcompare/compare.sh
set -e
root=$(pwd)
bin=$(mktemp -d)
trap 'rm -rf "$bin"' EXIT
(cd "$root/controlplane/etcdcompare" && go build -o "$bin/" ./etcd ./loadgen)
echo "== etcd (before)"; BIN=$bin sh "$root/controlplane/etcdcompare/run.sh" -ops 30000
echo "== berth"
go test ./controlplane -run '^$' -bench 'BenchmarkWrite/batching=true|BenchmarkRead/mode=(readindex|lease)' -benchtime 30000x | grep Benchmark
echo "== etcd (after)"; BIN=$bin sh "$root/controlplane/etcdcompare/run.sh" -ops 30000
