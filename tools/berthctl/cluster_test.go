package main

import (
	"strings"
	"testing"

	"github.com/berthmq/berth/server"
)

// TestClusterInit: cluster shows an uninitialised cluster, init sets the
// group count and mode, a second init with the same count is harmless, a
// different count or bad input is refused. The broker runs the groups'
// peer transport: cluster init refuses brokers without one
// (TestPeerlessClusterRefused).
func TestClusterInit(t *testing.T) {
	s := startBrokerWith(t, func(c *server.Config) { c.PeerAddr = "127.0.0.1:0" })
	if code, out, errOut := ctl(t, s, "cluster"); code != exitOK || !strings.Contains(out, "groups 0,") {
		t.Fatalf("cluster: %d %q %q", code, out, errOut)
	}
	// One broker registered: two replicas per group cannot be placed.
	if code, _, errOut := ctl(t, s, "cluster", "init", "--groups", "8", "--replicas", "2"); code != exitFail || !strings.Contains(errOut, "2 replicas per group asked, 1 brokers registered") {
		t.Fatalf("init with more replicas than brokers: %d %q", code, errOut)
	}
	if code, out, errOut := ctl(t, s, "cluster", "init", "--groups", "8", "--mode", "active-passive"); code != exitOK ||
		!strings.Contains(out, "groups 8, mode active-passive") {
		t.Fatalf("cluster init: %d %q %q", code, out, errOut)
	}
	if code, _, errOut := ctl(t, s, "cluster", "init", "--groups", "8"); code != exitOK {
		t.Fatalf("init again with the same count: %d %q", code, errOut)
	}
	if code, _, errOut := ctl(t, s, "cluster", "init", "--groups", "9"); code != exitFail || !strings.Contains(errOut, "cannot change") {
		t.Fatalf("init with another count: %d %q", code, errOut)
	}
	for _, args := range [][]string{{"cluster", "init"}, {"cluster", "init", "--groups", "4", "--mode", "both"}, {"cluster", "reset"}} {
		if code, _, errOut := ctl(t, s, args...); code != exitUsage {
			t.Fatalf("%v: %d %q, want usage", args, code, errOut)
		}
	}
	if code, out, _ := ctl(t, s, "--json", "cluster"); code != exitOK || !strings.Contains(out, `"groups": 8`) {
		t.Fatalf("cluster --json: %d %q", code, out)
	}
	// Every group was placed on the one broker registered.
	if code, out, errOut := ctl(t, s, "groups", "3"); code != exitOK || !strings.Contains(out, "REPLICAS") || !strings.Contains(out, "[1]") {
		t.Fatalf("groups 3: %d %q %q", code, out, errOut)
	}
}
