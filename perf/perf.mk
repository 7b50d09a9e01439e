# Perf tooling: berth-bench, bench-compare, the cluster benchmarks, flame graphs. Included by the
# top Makefile. Tools this needs beyond Go are installed on first use into
# PERF_CACHE: nats-server from the Go module proxy, the flame graph renderer
# from npm (node and npm must be installed).

PERF_CACHE      ?= $(HOME)/.cache/berth-perf
NATS_VERSION    ?= v2.15.2
NATS_SERVER     ?= $(PERF_CACHE)/bin/nats-server
FLAMEGRAPH_NPM  ?= flamegraph@1.3.0
FLAMEGRAPH_BIN  := $(PERF_CACHE)/npm/node_modules/.bin/flamegraph
# Where bench-compare leaves each run's JSON and SVG plot.
BENCH_OUT       ?= $(PERF_CACHE)/compare
# Extra berth-bench workload flags for bench-compare, e.g.
# BENCH_COMPARE_FLAGS="--duration 20s --producers 4".
BENCH_COMPARE_FLAGS ?=

# Extra flags for bench-compare-cluster and failover-bench, e.g.
# BENCH_CLUSTER_FLAGS="--sizes 128 --duration 20s",
# FAILOVER_BENCH_FLAGS="--kills 5 --berthd-flags '-controller-heartbeat-ms 200'".
BENCH_CLUSTER_FLAGS ?=
FAILOVER_BENCH_FLAGS ?=
# Shard counts per broker of bench-cluster-scaling.
SCALING_SHARDS ?= 1 2 4

PERF_TOOLS := $(BIN)/berth-bench $(BIN)/bench-compare $(BIN)/bench-compare-cluster $(BIN)/failover-bench $(BIN)/pprof2cpuprofile

.PHONY: perf-build bench-compare bench-compare-cluster failover-bench failover-bench-leader catchup-bench bench-cluster-scaling controller-compare flamegraph nats-server flamegraph-renderer perf-test

# `make build` builds the perf tools too.
build: perf-build

perf-build:
	$(GO) build -o $(BIN)/ ./perf/cmd/...

perf-test:
	$(GO) test -count=1 -timeout 2m ./perf/...

# Installs nats-server $(NATS_VERSION) unless a v2.15.x is already there.
nats-server:
	@if ! "$(NATS_SERVER)" --version 2>/dev/null | grep -q 'v2\.15\.'; then \
		echo "installing nats-server $(NATS_VERSION) into $(PERF_CACHE)/bin"; \
		mkdir -p "$(PERF_CACHE)/bin" && \
		GOBIN="$(PERF_CACHE)/bin" $(GO) install github.com/nats-io/nats-server/v2@$(NATS_VERSION); \
	fi
	@"$(NATS_SERVER)" --version

# Berth's controllers against etcd v3.6, 3 members each, same machine, same
# load (controlplane/etcdcompare).
controller-compare:
	sh controlplane/etcdcompare/compare.sh

bench-compare: build nats-server
	$(BIN)/bench-compare --berthd $(BIN)/berthd --nats-server "$(NATS_SERVER)" --out "$(BENCH_OUT)" $(BENCH_COMPARE_FLAGS)

# A replicated Berth cluster (3 brokers, fsync always) against a NATS
# JetStream cluster (3 servers, R3 streams), 128 B and 1 KiB; last line
# "ratio berth/nats r3 durable=<x> nofsync=<y>" (the 128 B run).
bench-compare-cluster: build nats-server
	$(BIN)/bench-compare-cluster --berthd $(BIN)/berthd --berthctl $(BIN)/berthctl --nats-server "$(NATS_SERVER)" --out "$(BENCH_OUT)/cluster" $(BENCH_CLUSTER_FLAGS)

# kill -9 of a replicated queue's group master, 20 times, and of a
# follower, 5 times, on a 3-broker cluster: time to the first publish on
# the new master, and the longest commit stall.
failover-bench: build
	$(BIN)/failover-bench --berthd $(BIN)/berthd --berthctl $(BIN)/berthctl $(FAILOVER_BENCH_FLAGS)

# failover-bench with every kill of a master that also leads the
# controller (the group's master is moved there before each kill), 10
# times, no follower kills.
failover-bench-leader: build
	$(BIN)/failover-bench --berthd $(BIN)/berthd --berthctl $(BIN)/berthctl --leader-master --kills 10 --follower-kills 0 $(FAILOVER_BENCH_FLAGS)

# A broker whose journals were deleted rejoins a 3-broker cluster holding
# 200,000 x 1 KiB while 5,000 msgs/s run: time until it is back in every
# SyncStateSet, and the publishes' failures and latencies; then the same
# load with the broker left down.
catchup-bench: build
	perf/catchup-bench.sh $(BIN) rejoin
	perf/catchup-bench.sh $(BIN) base

# Replicated throughput with $(SCALING_SHARDS) shards per broker, 3 queues
# per shard count (each broker masters one queue per shard), Berth alone.
bench-cluster-scaling: build
	@for s in $(SCALING_SHARDS); do \
		q=$$((3 * s)); g=$$((q > 12 ? q : 12)); \
		echo "== $$s shards per broker, $$q queues, $$g groups"; \
		$(BIN)/bench-compare-cluster --berthd $(BIN)/berthd --berthctl $(BIN)/berthctl --peers none --single=false \
			--shards $$s --queues $$q --consumers $$q --groups $$g $(BENCH_CLUSTER_FLAGS) || exit 1; \
	done

flamegraph-renderer:
	@if [ ! -x "$(FLAMEGRAPH_BIN)" ]; then \
		mkdir -p "$(PERF_CACHE)/npm" && \
		npm install --prefix "$(PERF_CACHE)/npm" --no-audit --no-fund --loglevel=error $(FLAMEGRAPH_NPM); \
	fi

# Renders the CPU profile of each headline workload (see
# flamegraphs/README.md) into flamegraphs/<name>.svg.
flamegraph: build flamegraph-renderer
	GO="$(GO)" BIN="$(BIN)" FLAMEGRAPH_BIN="$(FLAMEGRAPH_BIN)" perf/flamegraph.sh
