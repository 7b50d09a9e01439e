package main

import (
	"maps"
	"strings"
	"testing"
	"time"
)

func TestControllerFlags(t *testing.T) {
	ok := []struct {
		id, peers string
		wantID    uint64
		want      map[uint64]string
	}{
		{"", "", 0, nil},
		{"2", "1=127.0.0.1:7402,2=127.0.0.1:7412,3=127.0.0.1:7422", 2,
			map[uint64]string{1: "127.0.0.1:7402", 2: "127.0.0.1:7412", 3: "127.0.0.1:7422"}},
		{" 1 ", " 1 = 10.0.0.1:7402 , 3=10.0.0.3:7402,2=10.0.0.2:7402", 1,
			map[uint64]string{1: "10.0.0.1:7402", 2: "10.0.0.2:7402", 3: "10.0.0.3:7402"}},
		{"7", "7=localhost:7402", 7, map[uint64]string{7: "localhost:7402"}},
		{"5", "1=h1:1,2=h2:1,3=h3:1,4=h4:1,5=[::1]:7402", 5,
			map[uint64]string{1: "h1:1", 2: "h2:1", 3: "h3:1", 4: "h4:1", 5: "[::1]:7402"}},
	}
	for _, c := range ok {
		id, peers, err := controllerFlags(c.id, c.peers, false)
		if err != nil {
			t.Errorf("controllerFlags(%q, %q): %v", c.id, c.peers, err)
			continue
		}
		if id != c.wantID || !maps.Equal(peers, c.want) {
			t.Errorf("controllerFlags(%q, %q) = %d %v, want %d %v", c.id, c.peers, id, peers, c.wantID, c.want)
		}
	}

	bad := []struct{ id, peers, msg string }{
		{"1", "", "needs -controller-peers"},
		{"", "1=127.0.0.1:7402,2=127.0.0.1:7412,3=127.0.0.1:7422", "needs -controller-id"},
		{"4", "1=127.0.0.1:7402,2=127.0.0.1:7412,3=127.0.0.1:7422", "not in -controller-peers"},
		{"x", "1=127.0.0.1:7402", "positive integer"},
		{"0", "1=127.0.0.1:7402", "positive integer"},
		{"-1", "1=127.0.0.1:7402", "positive integer"},
		{"1", "1=127.0.0.1:7402,2=127.0.0.1:7412", "1, 3 or 5 members, not 2"},
		{"1", "1=a:1,2=b:1,3=c:1,4=d:1", "not 4"},
		{"1", "1=a:1,2=b:1,3=c:1,4=d:1,5=e:1,6=f:1", "not 6"},
		{"1", "1=127.0.0.1:7402,1=127.0.0.1:7412,3=127.0.0.1:7422", "appears twice"},
		{"1", "1=127.0.0.1:7402,2=127.0.0.1:7402,3=127.0.0.1:7422", "share the address"},
		{"1", "1=127.0.0.1:7402,,3=127.0.0.1:7422", "want id=host:port"},
		{"1", "127.0.0.1:7402", "want id=host:port"},
		{"1", "0=127.0.0.1:7402", "positive integer"},
		{"1", "a=127.0.0.1:7402", "positive integer"},
		{"1", "1=", "host:port"},
		{"1", "1=127.0.0.1", "host:port"},
		{"1", "1=:7402", "host:port"},
		{"1", "1=127.0.0.1:0", "port must be"},
		{"1", "1=127.0.0.1:70000", "port must be"},
		{"1", "1=127.0.0.1:http", "port must be"},
	}
	for _, c := range bad {
		_, _, err := controllerFlags(c.id, c.peers, false)
		if err == nil || !strings.Contains(err.Error(), c.msg) {
			t.Errorf("controllerFlags(%q, %q) = %v, want an error with %q", c.id, c.peers, err, c.msg)
		}
	}
}

// TestArgs checks that bad controller settings, by flag or by environment,
// make run exit with 2, and that good ones reach the server config.
func TestArgs(t *testing.T) {
	dir := t.TempDir()
	peers := "1=127.0.0.1:7402,2=127.0.0.1:7412,3=127.0.0.1:7422"
	cases := []struct {
		args []string
		env  map[string]string
	}{
		{args: []string{"-controller-peers", peers}},
		{args: []string{"-controller-peers", peers, "-controller-id", "9"}},
		{args: []string{"-controller-peers", "1=127.0.0.1:7402,2=127.0.0.1:7412", "-controller-id", "1"}},
		{args: []string{"-role", "gateway"}},
		{args: []string{"-role", "controller", "-controller", ""}},
		{args: []string{"-controller-peers", peers, "-controller-id", "1", "-data", ""}},
		{args: []string{"-data", dir, "stray"}},
		{env: map[string]string{"BERTH_CONTROLLER_PEERS": peers, "BERTH_CONTROLLER_ID": "one"}},
		{env: map[string]string{"BERTH_CONTROLLER_PEERS": "1=127.0.0.1:7402,3", "BERTH_CONTROLLER_ID": "1"}},
		{env: map[string]string{"BERTH_ROLE": "both"}},
		{args: []string{"-advertise", "no-port"}},
		{args: []string{"-controller-heartbeat-ms", "0"}},
	}
	for _, c := range cases {
		for k, v := range c.env {
			t.Setenv(k, v)
		}
		args := append([]string{"-data", dir, "-admin", "", "-listen", "127.0.0.1:0"}, c.args...)
		if _, err := parseArgs(args); err == nil {
			t.Errorf("parseArgs(%q) with env %v passed", c.args, c.env)
		} else if code := run(args); code != 2 {
			t.Errorf("run(%q) with env %v = %d, want 2", c.args, c.env, code)
		}
		for k := range c.env {
			t.Setenv(k, "")
		}
	}
}

func TestArgsGood(t *testing.T) {
	peers := "1=127.0.0.1:7402,2=127.0.0.1:7412,3=127.0.0.1:7422"
	o, err := parseArgs([]string{"-data", "d", "-controller-peers", peers, "-controller-id", "3", "-role", "controller"})
	if err != nil {
		t.Fatal(err)
	}
	if o.cfg.ControllerID != 3 || len(o.cfg.ControllerPeers) != 3 || o.cfg.Role != "controller" || o.cfg.ControllerPeers[3] != "127.0.0.1:7422" {
		t.Fatalf("config %+v", o.cfg)
	}
	t.Setenv("BERTH_CONTROLLER_PEERS", peers)
	t.Setenv("BERTH_CONTROLLER_ID", "2")
	o, err = parseArgs([]string{"-data", "d"})
	if err != nil {
		t.Fatal(err)
	}
	if o.cfg.ControllerID != 2 || len(o.cfg.ControllerPeers) != 3 || o.cfg.Role != "broker" {
		t.Fatalf("config from env %+v", o.cfg)
	}
	// The default stays the one-member controller on -controller.
	t.Setenv("BERTH_CONTROLLER_PEERS", "")
	t.Setenv("BERTH_CONTROLLER_ID", "")
	o, err = parseArgs(nil)
	if err != nil {
		t.Fatal(err)
	}
	if o.cfg.ControllerAddr != "127.0.0.1:7402" || o.cfg.ControllerPeers != nil || o.cfg.ControllerID != 0 {
		t.Fatalf("default config %+v", o.cfg)
	}
	o, err = parseArgs([]string{"-advertise", "broker1.example:7400", "-controller-heartbeat-ms", "500", "-controller-lease-read"})
	if err != nil {
		t.Fatal(err)
	}
	if o.cfg.AdvertiseAddr != "broker1.example:7400" || o.cfg.ControllerHeartbeat != 500*time.Millisecond || !o.cfg.ControllerLeaseRead {
		t.Fatalf("advertise/heartbeat config %+v", o.cfg)
	}
}

// TestControllerJoinArgs checks -controller-join and BERTH_CONTROLLER_JOIN:
// a joining member lists itself and the members it knows (2 to 6 entries),
// which a member of a fixed group may not.
func TestControllerJoinArgs(t *testing.T) {
	four := "1=127.0.0.1:7402,2=127.0.0.1:7412,3=127.0.0.1:7422,4=127.0.0.1:7432"
	id, peers, err := controllerFlags("4", four, true)
	if err != nil || id != 4 || len(peers) != 4 || peers[4] != "127.0.0.1:7432" {
		t.Fatalf("join with four entries: %d %v %v", id, peers, err)
	}
	if _, _, err := controllerFlags("4", "1=127.0.0.1:7402,4=127.0.0.1:7432", true); err != nil {
		t.Fatalf("join knowing one member: %v", err)
	}
	for _, c := range []struct{ id, peers, msg string }{
		{"4", "4=127.0.0.1:7432", "at least one running member"},
		{"7", "1=a:1,2=b:1,3=c:1,4=d:1,5=e:1,6=f:1,7=g:1", "at most 5 members, not 7"},
		{"9", four, "not in -controller-peers"},
		{"4", "1=127.0.0.1:7402,4=127.0.0.1:7402", "share the address"},
	} {
		_, _, err := controllerFlags(c.id, c.peers, true)
		if err == nil || !strings.Contains(err.Error(), c.msg) {
			t.Errorf("controllerFlags(%q, %q, join) = %v, want an error with %q", c.id, c.peers, err, c.msg)
		}
	}
	if _, _, err := controllerFlags("", "", true); err == nil || !strings.Contains(err.Error(), "-controller-join needs") {
		t.Errorf("join without peers: %v", err)
	}
	// Four entries are refused without -controller-join.
	if _, err := parseArgs([]string{"-data", "d", "-controller-peers", four, "-controller-id", "4"}); err == nil {
		t.Error("four peers without -controller-join passed")
	}
	o, err := parseArgs([]string{"-data", "d", "-controller-peers", four, "-controller-id", "4", "-controller-join", "-role", "controller"})
	if err != nil {
		t.Fatal(err)
	}
	if !o.cfg.ControllerJoin || o.cfg.ControllerID != 4 || len(o.cfg.ControllerPeers) != 4 {
		t.Fatalf("join config %+v", o.cfg)
	}
	t.Setenv("BERTH_CONTROLLER_JOIN", "true")
	o, err = parseArgs([]string{"-data", "d", "-controller-peers", four, "-controller-id", "4"})
	if err != nil || !o.cfg.ControllerJoin {
		t.Fatalf("join from env: %+v %v", o.cfg, err)
	}
	// The flag overrides the environment.
	if _, err := parseArgs([]string{"-data", "d", "-controller-peers", four, "-controller-id", "4", "-controller-join=false"}); err == nil {
		t.Error("-controller-join=false with four peers passed")
	}
	t.Setenv("BERTH_CONTROLLER_JOIN", "perhaps")
	if _, err := parseArgs([]string{"-data", "d"}); err == nil || !strings.Contains(err.Error(), "BERTH_CONTROLLER_JOIN") {
		t.Errorf("BERTH_CONTROLLER_JOIN=perhaps: %v", err)
	}
	t.Setenv("BERTH_CONTROLLER_JOIN", "")
	if o, err := parseArgs([]string{"-data", "d"}); err != nil || o.cfg.ControllerJoin {
		t.Errorf("empty BERTH_CONTROLLER_JOIN: %+v %v", o.cfg.ControllerJoin, err)
	}
}
