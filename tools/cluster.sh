#!/usr/bin/env bash
# make cluster: three brokers, each with a member of a 3-member controller
# and the replication groups' transport, on loopback. Data under
# CLUSTER_DIR (default ./cluster), kept between runs. Ctrl-C stops them.
#
#   broker N (1..3), i = N-1: clients 127.0.0.1:74i0, peer 74i1,
#                    controller 74i2, admin 748i
#
# CLUSTER_PORT_BASE (default 7400) moves every port: broker N's client
# port is BASE+10*i, its peer, controller and TLS ports the next three,
# its admin port BASE+80+i (CLUSTER_PORT_BASE=9400: clients 9400, 9410,
# 9420, admin 9480-9482), so that two clusters, or a cluster and a
# broker on the default ports, can run side by side.
#
# CLUSTER_TLS=1: TLS everywhere, with the credentials in CERTS_DIR
# (default ./certs; made by "berthctl certs init" when missing):
#   clients  TLS on 74i3 (mutual TLS: berthctl's client.pem logs in as
#            "admin" with EXTERNAL once that user exists), beside plaintext
#            74i0 on loopback;
#   peer and controller ports: mutual TLS with the cluster CA, and the
#            cluster secret;
#   admin    HTTPS, the admin token needed.
#
# CLUSTER_ARGS: more berthd flags, given to each of the three, e.g.
# CLUSTER_ARGS="-shards 1 -loops 1" when the three share a small machine.
set -euo pipefail
BIN=${BIN:-bin}
DIR=${CLUSTER_DIR:-cluster}
GROUPS_N=${CLUSTER_GROUPS:-12}
TLS=${CLUSTER_TLS:-}
read -r -a extra <<<"${CLUSTER_ARGS:-}"
CERTS=${CERTS_DIR:-certs}
BASE=${CLUSTER_PORT_BASE:-7400}
if ! [[ "$BASE" =~ ^[0-9]+$ ]] || [ "$BASE" -lt 1024 ] || [ "$BASE" -gt 65450 ]; then
	echo "CLUSTER_PORT_BASE=$BASE: want a port from 1024 to 65450 (the cluster takes BASE to BASE+82)" >&2
	exit 2
fi
# port I K: broker I's (0..2) port K (0 clients, 1 peer, 2 controller,
# 3 TLS); admin I: its admin port.
port() { echo $((BASE + 10 * $1 + $2)); }
admin() { echo $((BASE + 80 + $1)); }
mkdir -p "$DIR"
peers="1=127.0.0.1:$(port 0 2),2=127.0.0.1:$(port 1 2),3=127.0.0.1:$(port 2 2)"
scheme=http
curl_tls=()
ctl=(--controller "127.0.0.1:$(port 0 2),127.0.0.1:$(port 1 2),127.0.0.1:$(port 2 2)")
if [ -n "$TLS" ]; then
	if [ ! -f "$CERTS/ca.pem" ]; then
		"$BIN/berthctl" certs init "$CERTS" --nodes 3
	fi
	scheme=https
	token=$(cat "$CERTS/admin-token")
	curl_tls=(--cacert "$CERTS/ca.pem")
	ctl+=(--tls-ca "$CERTS/ca.pem" --cluster-ca "$CERTS/ca.pem" --cluster-cert "$CERTS/client.pem"
		--cluster-key "$CERTS/client-key.pem" --cluster-secret-file "$CERTS/cluster-secret")
	export BERTH_ADMIN_TOKEN=$token
fi
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
	sec=()
	if [ -n "$TLS" ]; then
		sec=(-listen-tls "127.0.0.1:$(port "$i" 3)" -tls-cert "$CERTS/node-$n.pem" -tls-key "$CERTS/node-$n-key.pem"
			-tls-client-ca "$CERTS/ca.pem"
			-cluster-ca "$CERTS/ca.pem" -cluster-cert "$CERTS/node-$n.pem" -cluster-key "$CERTS/node-$n-key.pem"
			-cluster-secret-file "$CERTS/cluster-secret"
			-admin-tls-cert "$CERTS/node-$n.pem" -admin-tls-key "$CERTS/node-$n-key.pem")
	fi
	"$BIN/berthd" -data "$DIR/berthd-$n" \
		-listen "127.0.0.1:$(port "$i" 0)" -peer "127.0.0.1:$(port "$i" 1)" -admin "127.0.0.1:$(admin "$i")" \
		-controller-id "$n" -controller-peers "$peers" "${sec[@]}" "${extra[@]}" \
		>"$DIR/berthd-$n.log" 2>&1 &
	pids+=($!)
done
for n in 1 2 3; do
	i=$((n - 1))
	for _ in $(seq 200); do
		if curl -sf "${curl_tls[@]}" "$scheme://127.0.0.1:$(admin "$i")/readyz" >/dev/null 2>&1; then break; fi
		if ! kill -0 "${pids[$i]}" 2>/dev/null; then
			echo "berthd-$n exited; its log:"; tail -20 "$DIR/berthd-$n.log"; exit 1
		fi
		sleep 0.1
	done
done
if "$BIN/berthctl" "${ctl[@]}" cluster | grep -q "^groups 0,"; then
	"$BIN/berthctl" "${ctl[@]}" cluster init --groups "$GROUPS_N"
fi
echo
echo "Berth cluster of 3 brokers (logs and data in $DIR/):"
for n in 1 2 3; do
	i=$((n - 1))
	# The broker id the controller gave it (berthctl groups and queues
	# name brokers by it), which need not be n.
	id=$(curl -sf "${curl_tls[@]}" "$scheme://127.0.0.1:$(admin "$i")/v1/status" 2>/dev/null | sed -n 's/^ *"broker_id": *\([0-9]*\).*/\1/p')
	line="  berthd-$n  broker ${id:-?}  clients 127.0.0.1:$(port "$i" 0)"
	if [ -n "$TLS" ]; then line+="  tls 127.0.0.1:$(port "$i" 3)"; fi
	echo "$line  peer 127.0.0.1:$(port "$i" 1)  controller 127.0.0.1:$(port "$i" 2)  admin $scheme://127.0.0.1:$(admin "$i")/ui/"
done
echo
echo "  bin/berthctl ${ctl[*]} groups     # masters, epochs, SyncStateSets"
if [ -n "$TLS" ]; then
	echo "  (the admin HTTP wants the token: export BERTH_ADMIN_TOKEN=\$(cat $CERTS/admin-token))"
fi
echo "Ctrl-C stops the cluster."
wait "${pids[@]}"
