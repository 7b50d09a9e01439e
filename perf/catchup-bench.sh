#!/bin/bash
# catchup-bench.sh BIN MODE: a broker that lost its data rejoins a 3-broker
# cluster holding a backlog, under a steady load.
#
# Three berthd on loopback (clients 127.0.0.1:276N0, peers 276N1, admin
# 276N5, controller 276N2), 12 groups. BACKLOG (default 200k) 1 KiB
# persistent messages go to 12 queues; then one broker is killed -9 and its
# journals (groups/, shard-*/) are deleted, keeping its id and controller
# member. RATE (default 5k) msgs/s of 128 B persistent messages are then
# published and consumed for 25 s. MODE rejoin: 6 s in, the broker restarts
# empty and catches up; the script prints how long until every group's
# SyncStateSet holds the 3 brokers again. MODE base: it stays down. Both
# print berth-bench's publish failures and latencies.
set -u
B=$1; MODE=$2
D=$(mktemp -d "${TMPDIR:-/tmp}/berth-catchup.XXXX")
peers="1=127.0.0.1:27602,2=127.0.0.1:27612,3=127.0.0.1:27622"
CTL="--controller 127.0.0.1:27602,127.0.0.1:27612,127.0.0.1:27622"
start() { # start N: broker N (1..3)
	local i=$(($1 - 1))
	# In a subshell, so that this shell does not report its kill -9.
	("$B/berthd" -data "$D/berthd-$1" -listen 127.0.0.1:276${i}0 -peer 127.0.0.1:276${i}1 -admin 127.0.0.1:276${i}5 \
		-controller-id "$1" -controller-peers "$peers" >>"$D/berthd-$1.log" 2>&1 &
	echo $! >"$D/pid-$1")
}
stop() { for n in 1 2 3; do [ -f "$D/pid-$n" ] && kill "$(cat "$D/pid-$n")" 2>/dev/null; done; sleep 1; rm -rf "$D"; }
trap stop EXIT
for n in 1 2 3; do start $n; done
for _ in $(seq 100); do "$B/berthctl" $CTL cluster init --groups 12 >/dev/null 2>&1 && break; sleep 0.3; done
insync() { "$B/berthctl" $CTL groups 2>/dev/null | awk '$1 ~ /^[0-9]+$/ && NF >= 6 {a++; if ($4=="[1" && $5=="2" && $6=="3]") o++} END {print o+0, a+0}'; }
for _ in $(seq 100); do read -r o a < <(insync); [ "$a" -gt 0 ] && [ "$o" = "$a" ] && break; sleep 0.3; done
"$B/berth-bench" -addr 127.0.0.1:27600 -queue-prefix backlog -queues 12 -consumers 0 -persistent -size 1KiB -count "${BACKLOG:-200k}" -keep -quiet >/dev/null
kill -9 "$(cat "$D/pid-2")"; rm -f "$D/pid-2"; rm -rf "$D"/berthd-2/groups "$D"/berthd-2/shard-*
sleep 6
"$B/berth-bench" -addr 127.0.0.1:27600 -queue-prefix live -queues 12 -consumers 12 -persistent -size 128 -rate "${RATE:-5k}" -duration 25s -warmup 1s -quiet >"$D/bench.out" 2>&1 &
bp=$!
if [ "$MODE" = rejoin ]; then
	sleep 6
	t0=$(date +%s.%N)
	start 2
	for _ in $(seq 1200); do read -r o a < <(insync); [ "$a" -gt 0 ] && [ "$o" = "$a" ] && break; sleep 0.1; done
	echo "rejoined: every SyncStateSet full $(echo "$(date +%s.%N) - $t0" | bc) s after the restart ($o/$a groups)"
fi
wait $bp
grep -E "failed|first failed|publish->complete" "$D/bench.out" | tr -s ' '
