package server_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/berthmq/berth/controlplane/ctlapi"
	"github.com/berthmq/berth/controlplane/ctlclient"
	"github.com/berthmq/berth/server"
)

// registeredAddrs reads the controller's broker list through its service
// port and returns each broker's addresses by id.
func registeredAddrs(t *testing.T, ctlAddr string) map[uint32][]string {
	t.Helper()
	cl := ctlclient.NewClient([]string{ctlAddr})
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	bs, err := cl.GetBrokers(ctx, ctlapi.ReadConsistent)
	if err != nil {
		t.Fatal(err)
	}
	out := map[uint32][]string{}
	for _, b := range bs {
		out[b.ID] = b.Addrs
	}
	return out
}

// TestBrokerRegistersAndKeepsItsID starts a broker with its one-member
// controller: it gets an id, persists it, registers its client address,
// reports the id in /v1/status, and keeps the id across a restart on the
// same data directory (registering the new address).
func TestBrokerRegistersAndKeepsItsID(t *testing.T) {
	dir := t.TempDir()
	withCtl := func(c *server.Config) {
		c.DataDir = dir
		c.ControllerAddr = "127.0.0.1:0"
		c.AdminAddr = "127.0.0.1:0"
	}
	s := startServer(t, withCtl)
	id := s.BrokerID()
	if id == 0 {
		t.Fatal("broker has no id")
	}
	if !s.BrokerRegistered() {
		t.Fatal("broker not registered after Start")
	}
	b, err := os.ReadFile(filepath.Join(dir, "broker.id"))
	if err != nil || strings.TrimSpace(string(b)) != fmt.Sprint(id) {
		t.Fatalf("broker.id holds %q (%v), want %d", b, err, id)
	}
	got := registeredAddrs(t, s.ControllerAddr())
	if len(got) != 1 || len(got[id]) != 1 || got[id][0] != s.ClientAddr() {
		t.Fatalf("controller brokers %v, want %d at %s", got, id, s.ClientAddr())
	}

	resp, err := http.Get("http://" + s.AdminAddr() + "/v1/status")
	if err != nil {
		t.Fatal(err)
	}
	var st struct {
		BrokerID   uint32 `json:"broker_id"`
		Registered bool   `json:"broker_registered"`
		Controller struct {
			ID       uint64 `json:"id"`
			IsLeader bool   `json:"is_leader"`
			Applied  uint64 `json:"applied"`
		} `json:"controller"`
	}
	err = json.NewDecoder(resp.Body).Decode(&st)
	resp.Body.Close()
	if err != nil || st.BrokerID != id || !st.Registered {
		t.Fatalf("status %+v %v, want broker id %d registered", st, err, id)
	}
	if st.Controller.ID != 1 || !st.Controller.IsLeader || st.Controller.Applied == 0 {
		t.Fatalf("status shows controller %+v, want the embedded one-member leader", st.Controller)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}

	s2 := startServer(t, withCtl)
	if s2.BrokerID() != id {
		t.Fatalf("after restart broker id %d, want %d", s2.BrokerID(), id)
	}
	got = registeredAddrs(t, s2.ControllerAddr())
	if len(got) != 1 || len(got[id]) != 1 || got[id][0] != s2.ClientAddr() {
		t.Fatalf("after restart controller brokers %v, want %d at %s", got, id, s2.ClientAddr())
	}
}

// TestBrokerRegistersAdvertisedAddress: with AdvertiseAddr set, that is
// the address the controller records, not the bound one.
func TestBrokerRegistersAdvertisedAddress(t *testing.T) {
	s := startServer(t, func(c *server.Config) {
		c.ControllerAddr = "127.0.0.1:0"
		c.AdvertiseAddr = "broker7.internal:7400"
	})
	got := registeredAddrs(t, s.ControllerAddr())
	if a := got[s.BrokerID()]; len(a) != 1 || a[0] != "broker7.internal:7400" {
		t.Fatalf("controller records %v for broker %d, want the advertised address", got, s.BrokerID())
	}
}

// TestBrokerWithoutControllerHasNoID: no controller, no id, no file.
func TestBrokerWithoutControllerHasNoID(t *testing.T) {
	dir := t.TempDir()
	s := startServer(t, func(c *server.Config) { c.DataDir = dir })
	if s.BrokerID() != 0 || s.BrokerRegistered() {
		t.Fatalf("broker id %d registered %v without a controller", s.BrokerID(), s.BrokerRegistered())
	}
	if _, err := os.Stat(filepath.Join(dir, "broker.id")); !os.IsNotExist(err) {
		t.Fatalf("broker.id written without a controller: %v", err)
	}
}

// TestCorruptBrokerIDFailsStart: an id file that does not hold a valid id
// stops Start with an error naming the file.
func TestCorruptBrokerIDFailsStart(t *testing.T) {
	for _, content := range []string{"", "abc\n", "0\n", "4294967295\n", "-3\n", "12 13\n", strings.Repeat("1", 100)} {
		dir := t.TempDir()
		path := filepath.Join(dir, "broker.id")
		if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
		cfg := server.DefaultConfig()
		cfg.ClientAddr, cfg.AdminAddr, cfg.DataDir = "127.0.0.1:0", "", dir
		cfg.ControllerAddr = "127.0.0.1:0"
		cfg.Shards, cfg.Loops, cfg.Logger = 1, 1, testLogger(t)
		s, err := server.Start(cfg)
		if err == nil {
			_ = s.Close()
			t.Fatalf("Start accepted broker.id %q", content)
		}
		if !strings.Contains(err.Error(), "corrupt") || !strings.Contains(err.Error(), path) {
			t.Fatalf("broker.id %q: unclear error %v", content, err)
		}
	}
}

// TestBrokerHeartbeatsMakeItPrimary: in active-passive mode the
// controller elects as primary only a broker it hears heartbeats from, so
// the broker becoming primary shows its heartbeats arrive.
func TestBrokerHeartbeatsMakeItPrimary(t *testing.T) {
	s := startServer(t, func(c *server.Config) {
		c.ControllerAddr = "127.0.0.1:0"
		c.ControllerHeartbeat = 100 * time.Millisecond
	})
	cl := ctlclient.NewClient([]string{s.ControllerAddr()})
	defer cl.Close()
	ctx := ctxT(t)
	info, err := cl.GetClusterInfo(ctx, ctlapi.ReadConsistent)
	if err != nil {
		t.Fatal(err)
	}
	cfg := info.Config
	if cfg.Groups == 0 {
		cfg.Groups = 1
	}
	cfg.Mode = ctlapi.ModeActivePassive
	if err := cl.SetClusterConfig(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	checkFor(t, 10*time.Second, func() error {
		p, _, addrs, err := cl.GetPrimary(ctx, ctlapi.ReadConsistent)
		if err != nil {
			return err
		}
		if p != s.BrokerID() || len(addrs) != 1 || addrs[0] != s.ClientAddr() {
			return fmt.Errorf("primary %d at %v, want %d at %s", p, addrs, s.BrokerID(), s.ClientAddr())
		}
		return nil
	})
}
