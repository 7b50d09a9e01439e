#!/usr/bin/env bash
# Profiles berthd under each headline workload and renders the CPU profile
# as an SVG flame graph in flamegraphs/. Run through `make flamegraph`,
# which builds the binaries and installs the renderer first.
set -euo pipefail

BIN=${BIN:-bin}
GO=${GO:-go}
FLAMEGRAPH_BIN=${FLAMEGRAPH_BIN:?set by make flamegraph}
OUT=${FLAMEGRAPH_OUT:-flamegraphs}
DURATION=${FLAMEGRAPH_DURATION:-15s}

work=$(mktemp -d)
berthd_pid=""
cleanup() {
	if [ -n "$berthd_pid" ]; then
		kill "$berthd_pid" 2>/dev/null || true
		wait "$berthd_pid" 2>/dev/null || true
	fi
	rm -rf "$work"
}
trap cleanup EXIT INT TERM

# A random high port nobody answers on.
free_port() {
	local p
	while :; do
		p=$((20000 + RANDOM % 40000))
		if ! (echo >"/dev/tcp/127.0.0.1/$p") 2>/dev/null; then
			echo "$p"
			return
		fi
	done
}

# name | berthd fsync policy | berth-bench workload flags
workloads=(
	"async-transient|always|--producers 2 --consumers 2 --size 1KiB --mode async:256 --credit 256"
	"async-durable|always|--producers 2 --consumers 2 --size 1KiB --mode async:256 --credit 256 --persistent"
)

for w in "${workloads[@]}"; do
	IFS='|' read -r name fsync flags <<<"$w"
	port=$(free_port)
	admin=$(free_port)
	data="$work/$name-data"
	fsync_flag=()
	if "$BIN/berthd" -h 2>&1 | grep -q -- '-fsync'; then
		fsync_flag=(-fsync "$fsync")
	fi
	"$BIN/berthd" -listen "127.0.0.1:$port" -admin "127.0.0.1:$admin" -data "$data" -log-level warn "${fsync_flag[@]}" &
	berthd_pid=$!
	for _ in $(seq 100); do
		(echo >"/dev/tcp/127.0.0.1/$port") 2>/dev/null && break
		sleep 0.1
	done
	prof="$work/$name-prof"
	# shellcheck disable=SC2086
	"$BIN/berth-bench" --addr "127.0.0.1:$port" --admin "127.0.0.1:$admin" --profile "$prof" \
		--warmup 2s --duration "$DURATION" --quiet --json "$OUT/$name.json" $flags
	kill "$berthd_pid"
	wait "$berthd_pid" || true
	berthd_pid=""
	"$GO" tool pprof -traces "$prof/cpu.pprof" 2>/dev/null | "$BIN/pprof2cpuprofile" >"$work/$name.cpuprofile"
	"$FLAMEGRAPH_BIN" -t cpuprofile --countname ms \
		--titletext "berthd CPU: $name ($flags, fsync $fsync)" <"$work/$name.cpuprofile" >"$OUT/$name.svg"
	echo "flamegraph: wrote $OUT/$name.svg"
done
