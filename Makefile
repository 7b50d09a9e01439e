# Berth build, run and test targets. Everything the project needs is
# installed by these targets; nothing is expected on the machine but Go.

GO        ?= go
BIN       := bin
PKGS      := ./...
# Packages with concurrency run under the race detector in `make test`.
RACE_PKGS := ./ring/... ./shards/... ./server/... ./client/... ./journal/... ./controlplane/... ./perf/... ./tools/... ./internal/...

.PHONY: all build run test test-race test-plain bench fuzz vet crash soak clean

all: build

build:
	$(GO) build -o $(BIN)/ ./cmd/... ./tools/berthctl

run: build
	./$(BIN)/berthd

test: vet test-plain test-race

# vet also fails when go.mod or go.sum is not as `go mod tidy` leaves it.
vet:
	$(GO) vet $(PKGS)
	@$(GO) mod tidy -diff || { echo 'go.mod/go.sum are not tidy: run go mod tidy'; exit 1; }

test-plain:
	$(GO) test -count=1 -timeout 8m $(PKGS)

test-race:
	$(GO) test -count=1 -race -timeout 8m $(RACE_PKGS)

bench:
	$(GO) test -run '^$$' -bench . -benchmem -timeout 30m $(PKGS)

# The long form of the kill -9 crash test.
CRASH_ROUNDS ?= 20
crash:
	BERTH_CRASH_ROUNDS=$(CRASH_ROUNDS) $(GO) test -count=1 -v -timeout 60m ./server/crashtest

# Long forms: 1M-record journal compaction, 20 journal kill rounds, and
# the broker kill -9 test.
# Long runs: 20 kill -9 rounds of the broker, the journal's long mode, and
# the controller's linearizability checks for a minute each (in-process
# with cut links, and three real processes killed and frozen).
SOAK ?= 60s
soak: crash
	BERTH_JOURNAL_LONG=1 $(GO) test -count=1 -timeout 30m ./journal
	CONTROLPLANE_SOAK=$(SOAK) $(GO) test -count=1 -timeout 30m -run Linearizable ./controlplane
	BERTH_CLUSTER_SOAK=$(SOAK) $(GO) test -count=1 -timeout 30m -run LinearizableWithProcessKills ./server/clustertest

FUZZTIME ?= 30s
fuzz:
	$(GO) test ./wire -run '^$$' -fuzz FuzzDecode -fuzztime $(FUZZTIME)

clean:
	rm -rf $(BIN)

# Perf tooling targets (berth-bench, bench-compare, flamegraph) live with
# the perf package.
-include perf/perf.mk
