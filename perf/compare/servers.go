package compare

import (
	"fmt"
	"strconv"
	"strings"
)

// Durability settings. In "durable" every broker fsyncs a message before
// it acknowledges it; in "nofsync" none does.
const (
	SettingDurable = "durable"
	SettingNoFsync = "nofsync"
)

// natsNoFsyncInterval is longer than any comparison run, so NATS writes to
// the page cache and never reaches its periodic fsync while measured.
const natsNoFsyncInterval = "10m"

// NATSConfig is a nats-server configuration listening on 127.0.0.1:port
// with JetStream storing in storeDir: sync_interval always (fsync before
// each PubAck) when durable, otherwise an interval no run lasts.
func NATSConfig(port int, storeDir string, durable bool) string {
	sync := natsNoFsyncInterval
	if durable {
		sync = "always"
	}
	return fmt.Sprintf("listen: 127.0.0.1:%d\njetstream {\n  store_dir: %s\n  sync_interval: %s\n}\n",
		port, strconv.Quote(storeDir), strconv.Quote(sync))
}

// NATSClusterConfig is the configuration of member name of a JetStream
// cluster on 127.0.0.1: clients on port, cluster routes on clusterPort,
// routes to every member's cluster port (its own included, which NATS
// skips), JetStream storing in storeDir with the sync of NATSConfig.
func NATSClusterConfig(name string, port, clusterPort int, routePorts []int, storeDir string, durable bool) string {
	sync := natsNoFsyncInterval
	if durable {
		sync = "always"
	}
	var routes []string
	for _, p := range routePorts {
		routes = append(routes, fmt.Sprintf("nats-route://127.0.0.1:%d", p))
	}
	return fmt.Sprintf("server_name: %s\nlisten: 127.0.0.1:%d\njetstream {\n  store_dir: %s\n  sync_interval: %s\n}\n"+
		"cluster {\n  name: berth-bench\n  listen: 127.0.0.1:%d\n  routes: [%s]\n}\n",
		strconv.Quote(name), port, strconv.Quote(storeDir), strconv.Quote(sync), clusterPort, strings.Join(routes, ", "))
}

// BerthArgs are berthd's flags for a setting. hasFsyncFlag is false for a
// berthd built before the -fsync flag existed: it then runs with its
// default, and the caller notes that the nofsync setting is not honoured.
func BerthArgs(port, adminPort int, dataDir string, durable, hasFsyncFlag bool) []string {
	args := []string{
		"-listen", fmt.Sprintf("127.0.0.1:%d", port),
		"-admin", fmt.Sprintf("127.0.0.1:%d", adminPort),
		"-data", dataDir,
		"-log-level", "warn",
	}
	if hasFsyncFlag {
		policy := "never"
		if durable {
			policy = "always"
		}
		args = append(args, "-fsync", policy)
	}
	return args
}
