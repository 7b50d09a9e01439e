package main

import (
	"io"
	"log/slog"
	"testing"

	"github.com/berthmq/berth/controlplane"
)

// TestRunAgainstController drives a one-member controller on loopback
// through every phase, and checks bad flags are refused.
func TestRunAgainstController(t *testing.T) {
	n, err := controlplane.StartSingle(t.TempDir(), "127.0.0.1:0", slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	defer n.Stop()
	if rc := run([]string{"-endpoints", n.Addr(), "-ops", "300", "-warmup", "100", "-clients", "8", "-conns", "2"}); rc != 0 {
		t.Fatalf("run returned %d", rc)
	}
	if rc := run([]string{"-endpoints", n.Addr(), "-phases", "nope"}); rc != 2 {
		t.Fatalf("unknown phase: run returned %d, want 2", rc)
	}
	if rc := run([]string{"-clients", "0"}); rc != 2 {
		t.Fatalf("zero clients: run returned %d, want 2", rc)
	}
}
