#!/usr/bin/env bash
# make cluster: three brokers, each with a member of a 3-member controller
# and the replication groups' transport, on loopback. Data under
# CLUSTER_DIR (default ./cluster), kept between runs. Ctrl-C stops them.
#
#   broker N (1..3): clients 127.0.0.1:74N0, peer 74N1, controller 74N2,
#                    admin 748N
set -euo pipefail
BIN=${BIN:-bin}
DIR=${CLUSTER_DIR:-cluster}
GROUPS_N=${CLUSTER_GROUPS:-12}
mkdir -p "$DIR"
peers="1=127.0.0.1:7402,2=127.0.0.1:7412,3=127.0.0.1:7422"
pids=()
stop() {
	trap - INT TERM EXIT
	echo "stopping the cluster"
	kill -TERM "${pids[@]}" 2>/dev/null || true
	wait "${pids[@]}" 2>/dev/null || true
}
trap stop INT TERM EXIT
for n in 1 2 3; do
	i=$((n - 1))
	"$BIN/berthd" -data "$DIR/berthd-$n" \
		-listen "127.0.0.1:74${i}0" -peer "127.0.0.1:74${i}1" -admin "127.0.0.1:748$i" \
		-controller-id "$n" -controller-peers "$peers" \
		>"$DIR/berthd-$n.log" 2>&1 &
	pids+=($!)
done
for n in 1 2 3; do
	i=$((n - 1))
	for _ in $(seq 200); do
		if curl -sf "http://127.0.0.1:748$i/readyz" >/dev/null 2>&1; then break; fi
		if ! kill -0 "${pids[$i]}" 2>/dev/null; then
			echo "berthd-$n exited; its log:"; tail -20 "$DIR/berthd-$n.log"; exit 1
		fi
		sleep 0.1
	done
done
ctl=(--controller 127.0.0.1:7402,127.0.0.1:7412,127.0.0.1:7422)
if "$BIN/berthctl" "${ctl[@]}" cluster | grep -q "^groups 0,"; then
	"$BIN/berthctl" "${ctl[@]}" cluster init --groups "$GROUPS_N"
fi
echo
echo "Berth cluster of 3 brokers (logs and data in $DIR/):"
for n in 1 2 3; do
	i=$((n - 1))
	echo "  berthd-$n  clients 127.0.0.1:74${i}0  peer 127.0.0.1:74${i}1  controller 127.0.0.1:74${i}2  admin http://127.0.0.1:748$i/ui/"
done
echo
echo "  bin/berthctl ${ctl[*]} groups     # masters, epochs, SyncStateSets"
echo "Ctrl-C stops the cluster."
wait "${pids[@]}"
