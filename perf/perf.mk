# Perf tooling: berth-bench, bench-compare, flame graphs. Included by the
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

PERF_TOOLS := $(BIN)/berth-bench $(BIN)/bench-compare $(BIN)/pprof2cpuprofile

.PHONY: perf-build bench-compare controller-compare flamegraph nats-server flamegraph-renderer perf-test

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

flamegraph-renderer:
	@if [ ! -x "$(FLAMEGRAPH_BIN)" ]; then \
		mkdir -p "$(PERF_CACHE)/npm" && \
		npm install --prefix "$(PERF_CACHE)/npm" --no-audit --no-fund --loglevel=error $(FLAMEGRAPH_NPM); \
	fi

# Renders the CPU profile of each headline workload (see
# flamegraphs/README.md) into flamegraphs/<name>.svg.
flamegraph: build flamegraph-renderer
	GO="$(GO)" BIN="$(BIN)" FLAMEGRAPH_BIN="$(FLAMEGRAPH_BIN)" perf/flamegraph.sh
