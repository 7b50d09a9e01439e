package server_test

import (
	"errors"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/berthmq/berth/journal"
	"github.com/berthmq/berth/server"
)

// TestConfigValidate: DefaultConfig and the zero Config pass; each setting
// Start cannot run with is refused by Validate as a *ConfigError naming
// its keys, and Start refuses it the same way before it listens.
func TestConfigValidate(t *testing.T) {
	for name, c := range map[string]server.Config{"default": server.DefaultConfig(), "zero": {}} {
		if err := c.Validate(); err != nil {
			t.Errorf("%s config: %v", name, err)
		}
	}
	peers := map[uint64]string{1: "127.0.0.1:7402", 2: "127.0.0.1:7412", 3: "127.0.0.1:7422"}
	cases := []struct {
		name   string
		mutate func(*server.Config)
		keys   []string
		want   string
	}{
		{"heartbeat negative", func(c *server.Config) { c.Heartbeat = -5 * time.Millisecond }, []string{"heartbeat-ms"}, "-heartbeat-ms -5: want 0 (the default)"},
		{"heartbeat under 1ms", func(c *server.Config) { c.Heartbeat = 500 * time.Microsecond }, []string{"heartbeat-ms"}, "-heartbeat-ms 500µs"},
		{"heartbeat past the wire", func(c *server.Config) { c.Heartbeat = (1 << 32) * time.Millisecond }, []string{"heartbeat-ms"}, "at most 4294967295 ms"},
		{"fsync", func(c *server.Config) { c.Fsync = 9 }, []string{"fsync"}, "-fsync FsyncPolicy(9): want always or never"},
		{"role", func(c *server.Config) { c.Role = "gateway" }, []string{"role"}, `role "gateway": want broker or controller`},
		{"controller id without peers", func(c *server.Config) { c.ControllerID = 2 }, []string{"controller-id", "controller-peers"}, "given without controller peers"},
		{"controller id not a peer", func(c *server.Config) { c.ControllerPeers, c.ControllerID = peers, 4 }, []string{"controller-id", "controller-peers"}, "is not one of the peers"},
		{"controller without data", func(c *server.Config) { c.ControllerPeers, c.ControllerID, c.DataDir = peers, 1, "" }, []string{"data", "role", "controller-peers"}, "a controller needs a data directory"},
		{"advertise", func(c *server.Config) { c.AdvertiseAddr = "no-port" }, []string{"advertise"}, "want host:port"},
		{"tls without key", func(c *server.Config) { c.TLSAddr, c.TLSCert = "127.0.0.1:0", "c.pem" }, []string{"listen-tls", "tls-cert", "tls-key"}, "needs -tls-cert and -tls-key"},
		{"checkpoint records", func(c *server.Config) { c.JournalCheckpointRecords = -1 }, []string{"journal-checkpoint-records"}, "want 0 or more"},
		{"peer without data", func(c *server.Config) { c.PeerAddr, c.DataDir = "127.0.0.1:0", "" }, []string{"peer", "data"}, "-peer needs -data"},
		{"peer advertise", func(c *server.Config) { c.PeerAdvertise = "nowhere" }, []string{"peer-advertise"}, "want host:port"},
		{"group lag", func(c *server.Config) { c.GroupLag = 10 * time.Millisecond }, []string{"group-lag"}, "-group-lag 10ms: want 20ms to 1h"},
		{"group lease", func(c *server.Config) { c.GroupLease = 100 * time.Millisecond }, []string{"group-lease", "controller-heartbeat-ms"}, "-group-lease 100ms"},
		{"leader grace", func(c *server.Config) { c.ControllerLeaderGrace = time.Second }, []string{"controller-leader-grace", "controller-broker-timeout"}, "up to -controller-broker-timeout 800ms"},
		{"heartbeat not under the timeout", func(c *server.Config) { c.ControllerHeartbeat = 800 * time.Millisecond }, []string{"controller-heartbeat-ms", "controller-broker-timeout"}, "-controller-heartbeat-ms 800 is not under -controller-broker-timeout 800ms"},
		{"controller off loopback", func(c *server.Config) { c.ControllerAddr = "0.0.0.0:7402" }, []string{"controller"}, "-controller 0.0.0.0:7402 is not a loopback address"},
		{"admin token", func(c *server.Config) { c.AdminToken = "short" }, []string{"admin-token"}, "want at least 16"},
	}
	for _, tc := range cases {
		cfg := server.DefaultConfig()
		cfg.ClientAddr, cfg.AdminAddr, cfg.DataDir = "127.0.0.1:0", "127.0.0.1:0", t.TempDir()
		tc.mutate(&cfg)
		before := cfg
		err := cfg.Validate()
		var ce *server.ConfigError
		if !errors.As(err, &ce) || !slices.Equal(ce.Keys, tc.keys) || !strings.HasPrefix(err.Error(), "server: ") || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v (keys %v), want a ConfigError about %v saying %q", tc.name, err, keysOf(ce), tc.keys, tc.want)
			continue
		}
		if !reflect.DeepEqual(cfg, before) {
			t.Errorf("%s: Validate changed the config", tc.name)
		}
		cfg.Logger = testLogger(t)
		if s, err := server.Start(cfg); err == nil {
			s.Close()
			t.Errorf("%s: Start accepted it", tc.name)
		} else if !errors.As(err, &ce) {
			t.Errorf("%s: Start: %v, want a ConfigError", tc.name, err)
		}
	}
	// The cause of a refusal is kept.
	cfg := server.DefaultConfig()
	cfg.ControllerPeers, cfg.ControllerID = map[uint64]string{1: "127.0.0.1:0"}, 1
	if err := cfg.Validate(); err == nil || errors.Unwrap(err) == nil {
		t.Errorf("a controller address with port 0: %v, want a refusal wrapping the address check's", err)
	}
	if p := server.DefaultConfig().Fsync; p != journal.FsyncAlways {
		t.Errorf("default fsync policy %v", p)
	}
}

func keysOf(ce *server.ConfigError) []string {
	if ce == nil {
		return nil
	}
	return ce.Keys
}

// TestConfigEnsureDefaults: EnsureDefaults fills the zero settings, keeps
// the others, and a second call changes nothing.
func TestConfigEnsureDefaults(t *testing.T) {
	var c server.Config
	c.OutboundMax, c.MetricsQueueLimit, c.FrameSizeMax = -1, -1, 1
	c.EnsureDefaults()
	d := server.DefaultConfig()
	if c.Heartbeat != d.Heartbeat || c.OutboundTimeout != d.OutboundTimeout || c.Role != server.RoleBroker || c.Logger == nil ||
		c.ControllerHeartbeat != server.ControllerHeartbeatDefault || c.ControllerBrokerTimeout != server.ControllerBrokerTimeoutDefault ||
		c.Shards <= 0 || c.Loops <= 0 || c.ClientAddr != "127.0.0.1:0" {
		t.Fatalf("defaults not filled: %+v", c)
	}
	if c.OutboundMax != -1 || c.MetricsQueueLimit != -1 || c.FrameSizeMax == 1 {
		t.Fatalf("no cap, no limit and the frame size floor: %+v", c)
	}
	again := c
	again.EnsureDefaults()
	if !reflect.DeepEqual(again, c) {
		t.Fatalf("a second EnsureDefaults changed\n  %+v\nto\n  %+v", c, again)
	}
}
