package compare

import (
	"fmt"
	"strconv"
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
