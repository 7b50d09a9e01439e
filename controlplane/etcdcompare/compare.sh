#!/bin/sh
# Side-by-side run on one machine: etcd v3.6 (3 members, separate
# processes), then Berth's controllers as 3 controller-only berthd
# processes driven by ctl-bench (the same load as etcd's loadgen), then the
# in-process controller benchmarks, then etcd again to bracket the
# machine's load. Both load generators first put 10,000 values unmeasured
# (connections, leader discovery, the first disk writes); every measured
# phase is then 100,000 operations.
# Run from the repository root (or `make controller-compare`):
#   sh controlplane/etcdcompare/compare.sh
set -e
root=$(pwd)
bin=$(mktemp -d)
trap 'rm -rf "$bin"' EXIT
(cd "$root/controlplane/etcdcompare" && go build -o "$bin/" ./etcd ./loadgen)
(cd "$root" && go build -o "$bin/" ./cmd/berthd ./perf/cmd/ctl-bench)
echo "== etcd (before)"; BIN=$bin sh "$root/controlplane/etcdcompare/run.sh" -ops 100000
echo "== berth (3 controller processes)"; BIN=$bin sh "$root/controlplane/etcdcompare/run-berth.sh" -ops 100000
echo "== berth (3 controllers in one process)"
go test ./controlplane -run '^$' -bench 'BenchmarkWrite/batching=true|BenchmarkRead/mode=(readindex|lease)' -benchtime 100000x | grep Benchmark
echo "== etcd (after)"; BIN=$bin sh "$root/controlplane/etcdcompare/run.sh" -ops 100000
