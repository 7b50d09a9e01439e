# Berth build, run and test targets. Everything the project needs is
# installed by these targets; nothing is expected on the machine but Go.

GO        ?= go
BIN       := bin
PKGS      := ./...
# Packages with concurrency run under the race detector in `make test`.
# Not server/memtest, server/crashtest, server/clustertest,
# server/hostiletest and server/console: they drive berthd processes,
# built without -race, so their tests skip there (testutil.StartBerthd;
# hostiletest is built only without -race); leaving them out saves
# building them. They run
# once, in test-plain. Two tests of clustertest did run under -race: a
# linearizability checker's self-test, and TestNoMajority (a broker
# started in-process without a controller majority), which loses its
# -race run.
RACE_PKGS := ./ring/... ./shards/... ./server ./replication/... ./server/wiring \
	./client/... ./journal/... ./controlplane/... ./perf/... ./tools/... ./internal/...

.PHONY: cluster certs all build run check test test-race test-plain test-berthd test-race-procs bench bench-forward bench-ctl-scale test-overlap bench-delayed bench-backlog bench-restart fuzz hostile vet crash soak chaos clean release deb

# Version stamping (internal/version). VERSION is the latest vX.Y.Z tag as
# git describe gives it, without the v (1.2.0; 1.2.0-3-gabc1234 three
# commits later; -dirty with uncommitted changes), or 0.0.0-dev without a
# tag. COMMIT is the commit hash, -dirty with uncommitted changes.
VERSION ?= $(shell git describe --tags --match 'v[0-9]*' --dirty 2>/dev/null | sed 's/^v//')
VERSION := $(or $(VERSION),0.0.0-dev)
COMMIT  ?= $(shell c=$$(git rev-parse HEAD 2>/dev/null) && { git diff --quiet HEAD -- 2>/dev/null || c=$$c-dirty; echo $$c; })
COMMIT  := $(COMMIT)
LDFLAGS := -X github.com/berthmq/berth/internal/version.Version=$(VERSION) -X github.com/berthmq/berth/internal/version.Commit=$(COMMIT)

all: build

build:
	$(GO) build -ldflags '$(LDFLAGS)' -o $(BIN)/ ./cmd/... ./tools/berthctl

run: build
	./$(BIN)/berthd

# Three brokers with a 3-member controller and replication groups on
# loopback; data under ./cluster (CLUSTER_DIR), Ctrl-C stops them.
# CLUSTER_TLS=1 runs TLS on every port, with the credentials of
# CERTS_DIR (made by `make certs` if missing; docs/SECURITY.md).
# CLUSTER_ARGS gives each berthd more flags ("-shards 1 -loops 1" when
# the three share a small machine). CLUSTER_PORT_BASE (default 7400)
# moves every port: broker i (0..2) listens on BASE+10i (clients),
# +1 (peer), +2 (controller), +3 (TLS), admin BASE+80+i. It prints each
# berthd's broker id, which berthctl's tables name brokers by.
cluster: build
	BIN=$(BIN) CERTS_DIR=$(CERTS_DIR) bash tools/cluster.sh

# A cluster CA, certificates for three nodes and berthctl, a cluster
# secret and an admin token, for 127.0.0.1 and localhost, in CERTS_DIR.
CERTS_DIR ?= certs
certs: build
	./$(BIN)/berthctl certs init $(CERTS_DIR)

# The tiers (docs/TESTING.md): check for the edit loop, test the gate
# (CI's command), test-race-procs the process tests against a berthd
# built with -race; soak, chaos, crash, hostile and the benchmarks below.
#
# The plain pass and the race pass run one after the other. Run at once
# (the race pass under nice -n 19 and ionice -c 3) they took 6 min 25 s
# to 8 min 8 s, but three of six such runs failed a timing-bound test:
# TestOwnerFrozenIsFenced (a defect, fixed), TestDelayedShard (widened)
# and TestReplacedMasterDeliversNothing (an accepted message delivered
# again by a replaced master; 5 of 5 passed alone), so the gate keeps
# the passes apart until that last one is understood (docs/TESTING.md).
# `make test-overlap` runs them at once.
test: vet test-plain test-race test-python

test-overlap: vet test-berthd
	$(MAKE) --no-print-directory -j2 -Oline test-plain test-race RACE_NICE='$(RACE_NICE_GATE)'
	$(MAKE) --no-print-directory test-python

RACE_NICE_GATE := nice -n 19 ionice -c 3

# The edit loop: vet and the tests under -short, with go's test cache on
# (a package whose inputs did not change since its last pass is not run
# again). The process tests see berthd's changes through TEST_BERTHD:
# they stat it, so a rebuilt binary makes their cached results stale.
# Under -short the longest process tests skip (testutil.Long; make test
# runs them), and four packages run at once, the slowest first.
check: vet test-berthd
	$(TEST_ENV) $(GO) test -short -p 4 -timeout 8m $(FIRST_PKGS) $(PKGS)

# berthd for every package of process tests and the Python client's
# tests, built once (internal/testutil.BerthdEnv, and BERTHD for
# clients/python), not stamped, like the one testutil builds when
# BERTH_TEST_BERTHD is unset. It is replaced only when the new build
# differs, so that its time changes only then (go's test cache keys the
# process tests' results on it).
TEST_BERTHD := $(CURDIR)/$(BIN)/test/berthd
TEST_ENV    := BERTH_TEST_BERTHD=$(TEST_BERTHD) BERTHD=$(TEST_BERTHD)
test-berthd:
	$(GO) build -o $(TEST_BERTHD).new ./cmd/berthd
	@if cmp -s $(TEST_BERTHD).new $(TEST_BERTHD); then rm $(TEST_BERTHD).new; else mv $(TEST_BERTHD).new $(TEST_BERTHD); fi

# test-plain runs TEST_P test binaries at once (go test's default is the
# core count, 2 here). 4 took make test to 9 min 18 s, but in the one
# full run after it the hostile suite's non-reading consumer missed its
# 2 s bound: timed process tests do not take four at once on two cores,
# so it stays 2 until they do (docs/TESTING.md). The packages
# that take longest are named first, so that they start first and the
# short ones fill in around them (docs/TESTING.md has the times).
TEST_P     ?= 2
FIRST_PKGS := ./server/clustertest ./server ./client ./replication/group ./tools/berthctl ./packaging ./server/crashtest

# vet also fails when go.mod or go.sum is not as `go mod tidy` leaves it.
vet:
	$(GO) vet $(PKGS)
	@$(GO) mod tidy -diff || { echo 'go.mod/go.sum are not tidy: run go mod tidy'; exit 1; }

test-plain: test-berthd
	$(TEST_ENV) $(GO) test -count=1 -p $(TEST_P) -timeout 8m $(FIRST_PKGS) $(PKGS)

# Under -short: the race detector watches the same code with fewer
# seeds and records (the group and delivery simulations, the disk-use
# and compaction volumes), which the plain pass runs in full. It saved
# about 40 s of make test's 10 min 20 s (docs/TESTING.md).
# RACE_NICE runs it under nice and ionice (make test sets it).
RACE_NICE ?=
test-race:
	$(RACE_NICE) $(GO) test -count=1 -race -short -timeout 8m $(RACE_PKGS)

# The Python client (clients/python) against a real berthd; the script
# installs Debian's python3-pytest when pytest is missing.
PYTHON ?= python3
test-python: test-berthd
	$(TEST_ENV) GO=$(GO) $(PYTHON) clients/python/run_tests.py

# The process tests against a berthd built with -race, so that the
# detector watches the broker itself (make test's berthd is built
# without it, and its race pass skips the process tests). The test
# binaries are built without -race: the brokers are what is checked.
# A race report in a broker's log fails the test that started it
# (testutil.StartBerthd); checks that bound memory or time are left out
# (testutil.RaceBerthd), since a race-built broker is several times
# larger and slower. Not in make
# test: it took 3 min 41 s on 2 cores (docs/TESTING.md).
RACE_BERTHD    := $(CURDIR)/$(BIN)/test-race/berthd
RACE_PROC_PKGS := ./server/clustertest ./server/crashtest ./server/hostiletest
test-race-procs:
	$(GO) build -race -o $(RACE_BERTHD) ./cmd/berthd
	BERTH_TEST_BERTHD=$(RACE_BERTHD) BERTH_TEST_BERTHD_RACE=1 $(GO) test -count=1 -timeout 30m $(RACE_PROC_PKGS)

bench:
	$(GO) test -run '^$$' -bench . -benchmem -timeout 30m $(PKGS)

# Publishes and consumers through a follower (forwarded and proxied to the
# group's master) against the same at the master: three real brokers, one run.
FORWARD_BENCHTIME ?= 20000x
bench-forward:
	$(GO) test -count=1 -run '^$$' -bench 'PublishForwarded|ConsumeProxied' -benchtime $(FORWARD_BENCHTIME) -timeout 10m ./server/clustertest

# One 3-member controller (controller-only berthd processes) serving
# CTL_BROKERS brokers played by perf/hbload: heartbeats held, their
# latency, failover after a broker's death, controller CPU.
CTL_BROKERS ?= 1000
bench-ctl-scale:
	BERTH_BENCH_BROKERS=$(CTL_BROKERS) $(GO) test -count=1 -run '^$$' -bench ControllerManyBrokers -benchtime 1x -timeout 10m -v ./server/clustertest

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

# Faults on a replicated cluster (in make test for 6 s): three berthd,
# a reconnecting producer and consumer per queue, kill -9 and SIGSTOP of
# one broker at a time for CHAOS, then the checks (nothing completed
# lost, nothing accepted back, nothing twice, order kept, the copies
# and the controller's SyncStateSets agree). CHAOS_SEED replays a fault
# schedule; CHAOS_DOUBLE=1 makes a quarter of the faults hit two brokers
# at once.
CHAOS ?= 5m
CHAOS_SEED ?=
CHAOS_DOUBLE ?=
chaos:
	BERTH_CHAOS=$(CHAOS) BERTH_CHAOS_SEED=$(CHAOS_SEED) BERTH_CHAOS_DOUBLE=$(CHAOS_DOUBLE) BERTH_CHAOS_ARGS="$(CHAOS_ARGS)" $(GO) test -count=1 -v -timeout 60m -run TestClusterChaos ./server/clustertest

# The hostile-client suite (in make test too) and its long form: RSS with
# 20 consumers that never read, with and without -outbound-max.
hostile:
	BERTH_HOSTILE_LONG=1 $(GO) test -count=1 -v -timeout 10m ./server/hostiletest

# Delayed delivery: lateness of delayed messages with 1M pending and as
# 1M fire, and their memory cost, on a real berthd (about 70 s); and the
# shard's cost per message for plain, priority and delayed queues.
bench-delayed:
	BERTH_DELAY_BENCH=1 $(GO) test -count=1 -v -timeout 10m -run DelayedLateness ./server/memtest
	$(GO) test -run '^$$' -bench QueueKinds -benchmem -count 5 ./shards

# A backlog deeper than memory (issue 12): BACKLOG_MIB MiB of 1 KiB
# messages, half persistent and half transient, published to a real
# berthd under -memory-limit 2GiB with no consumer, then consumed in
# order; RSS, the budget's count and the rates every second, in
# BACKLOG_CSV when set.
BACKLOG_MIB ?= 10240
bench-backlog:
	BERTH_BIG_BENCH=1 BERTH_BIG_MIB=$(BACKLOG_MIB) BERTH_BIG_CSV=$(BACKLOG_CSV) $(GO) test -count=1 -v -timeout 60m -run TenGiB ./server/memtest

# Restart of deep queues (issue 12): a real berthd filled with
# RESTART_COUNT persistent 128-byte messages over 100 durable queues, stopped
# with SIGTERM and then, filled again, with SIGKILL; each time started again
# and timed to /readyz and to a consumer's first message, with its RSS.
# Needs about 200 bytes of disk a message under $(TMPDIR) (2 GB at 10M).
RESTART_COUNT ?= 1000000
bench-restart:
	$(GO) build -o $(CURDIR)/berthd-restart-bench ./cmd/berthd
	$(GO) run ./perf/cmd/restart-bench -berthd $(CURDIR)/berthd-restart-bench -count $(RESTART_COUNT) -restarts 2
	$(GO) run ./perf/cmd/restart-bench -berthd $(CURDIR)/berthd-restart-bench -count $(RESTART_COUNT) -restarts 2 -kill
	rm -f $(CURDIR)/berthd-restart-bench

# Every fuzz target, FUZZTIME each: the client codec, the peer codecs
# (raft, controller service, replication groups) and the controller's
# events, request bodies, frame handling and snapshots. Seeds live in each
# package's testdata/fuzz; a crasher found is kept there as a regression.

FUZZTIME ?= 30s
FUZZ_TARGETS := ./wire:FuzzDecode ./wire:FuzzPeerDecode \
	./controlplane/ctlapi:FuzzDecodeEvent ./controlplane/ctlapi:FuzzRequestBodies \
	./controlplane:FuzzControllerFrames ./controlplane:FuzzDecodeState \
	./replication/event:FuzzDecode
fuzz:
	@for t in $(FUZZ_TARGETS); do \
		echo "fuzz $${t#*:} ($${t%%:*}, $(FUZZTIME))"; \
		$(GO) test $${t%%:*} -run '^$$' -fuzz "^$${t#*:}\$$" -fuzztime $(FUZZTIME) || exit 1; \
	done

clean:
	rm -rf $(BIN) $(DIST)

# Release binaries: static (no cgo), linux/amd64 and linux/arm64, into
# dist/linux-ARCH/, with dist/SHA256SUMS. `make deb` packages them.
DIST           ?= dist
RELEASE_ARCHES ?= amd64 arm64
DEB_MAINTAINER ?= Berth maintainers <maintainers@berthmq.invalid>
# File times inside the .deb: the commit's, so a rebuild is identical.
SOURCE_DATE_EPOCH ?= $(shell git log -1 --format=%ct 2>/dev/null)
SHA256SUM      ?= sha256sum

release:
	rm -rf $(DIST)/linux-* $(DIST)/SHA256SUMS
	for arch in $(RELEASE_ARCHES); do \
		CGO_ENABLED=0 GOOS=linux GOARCH=$$arch $(GO) build -trimpath -ldflags '$(LDFLAGS)' \
			-o $(DIST)/linux-$$arch/ ./cmd/berthd ./tools/berthctl || exit 1; \
	done
	cd $(DIST) && $(SHA256SUM) linux-*/* > SHA256SUMS

deb: release
	rm -f $(DIST)/*.deb
	cd packaging/mkdeb && SOURCE_DATE_EPOCH=$(SOURCE_DATE_EPOCH) $(GO) run . -version '$(VERSION)' \
		-root ../.. -dist $(abspath $(DIST)) -arch '$(RELEASE_ARCHES)' -maintainer '$(DEB_MAINTAINER)'
	cd $(DIST) && $(SHA256SUM) linux-*/* *.deb > SHA256SUMS

# Perf tooling targets (berth-bench, bench-compare, flamegraph) live with
# the perf package.
-include perf/perf.mk
