package controlplane

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/berthmq/berth/controlplane/ctlapi"
	"github.com/berthmq/berth/controlplane/ctlclient"
	"github.com/berthmq/berth/internal/testutil"
)

func quietLogger() *slog.Logger {
	if os.Getenv("CONTROLPLANE_LOG") != "" {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return slog.New(slog.NewTextHandler(io.Discard, nil))
}

// checkFor polls f until it returns nil or total passes.
// The poll interval is testutil.WaitFor's (1 ms growing to 20 ms); sleep
// is kept for the callers that name the pace they expect.
func checkFor(t testing.TB, total, _ time.Duration, f func() error) {
	t.Helper()
	testutil.WaitFor(t, total, f)
}

type testCluster struct {
	t      testing.TB
	dir    string
	addrs  map[uint64]string
	nodes  map[uint64]*Node
	faults *Faults
	tweak  func(*Config)
}

func newTestCluster(t testing.TB, size int, tweak func(*Config)) *testCluster {
	t.Helper()
	c := &testCluster{t: t, dir: t.TempDir(), addrs: map[uint64]string{}, nodes: map[uint64]*Node{},
		faults: NewFaults(), tweak: tweak}
	lns := map[uint64]net.Listener{}
	for id := uint64(1); id <= uint64(size); id++ {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		lns[id] = ln
		c.addrs[id] = ln.Addr().String()
	}
	for id := uint64(1); id <= uint64(size); id++ {
		c.start(id, lns[id])
	}
	t.Cleanup(c.stopAll)
	return c
}

func (c *testCluster) config(id uint64, ln net.Listener) Config {
	cfg := Config{ID: id, Peers: c.addrs, Dir: filepath.Join(c.dir, fmt.Sprint(id)), Listener: ln,
		Faults: c.faults, Logger: quietLogger(), TickInterval: 10 * time.Millisecond}
	if c.tweak != nil {
		c.tweak(&cfg)
	}
	return cfg
}

func (c *testCluster) start(id uint64, ln net.Listener) {
	c.t.Helper()
	var err error
	if ln == nil {
		// The old port is free again after Stop; retry briefly in case
		// the kernel has not released it yet.
		checkFor(c.t, 5*time.Second, 20*time.Millisecond, func() error {
			ln, err = net.Listen("tcp", c.addrs[id])
			return err
		})
	}
	n, err := Start(c.config(id, ln))
	if err != nil {
		c.t.Fatalf("start node %d: %v", id, err)
	}
	c.nodes[id] = n
}

func (c *testCluster) stop(id uint64) {
	if n := c.nodes[id]; n != nil {
		n.Stop()
		delete(c.nodes, id)
	}
}

func (c *testCluster) stopAll() {
	for id := range c.nodes {
		c.stop(id)
	}
}

func (c *testCluster) addrList() []string {
	var out []string
	for id := uint64(1); id <= uint64(len(c.addrs)); id++ {
		out = append(out, c.addrs[id])
	}
	return out
}

// leader waits for a leader that every running node agrees on.
func (c *testCluster) leader() *Node {
	c.t.Helper()
	var l *Node
	checkFor(c.t, 10*time.Second, 10*time.Millisecond, func() error {
		l = nil
		for _, n := range c.nodes {
			if n.IsLeader() {
				l = n
			}
		}
		if l == nil {
			return errors.New("no leader")
		}
		for _, n := range c.nodes {
			if n.Leader() != l.ID() {
				return fmt.Errorf("node %d follows %d, not %d", n.ID(), n.Leader(), l.ID())
			}
		}
		return nil
	})
	return l
}

func ctxT(t testing.TB, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

func TestSingleNode(t *testing.T) {
	dir := t.TempDir()
	n, err := StartSingle(dir, "127.0.0.1:0", quietLogger())
	if err != nil {
		t.Fatal(err)
	}
	ctx := ctxT(t, 10*time.Second)
	lc := n.LocalClient()
	if err := lc.DeclareExchange(ctx, "orders", "topic", true); err != nil {
		t.Fatal(err)
	}
	if err := lc.DeclareQueue(ctx, "q1", ctlapi.QueueOptions{Durable: true, MaxLength: 100}); err != nil {
		t.Fatal(err)
	}
	if err := lc.Bind(ctx, "orders", "q1", "eu.*"); err != nil {
		t.Fatal(err)
	}
	var re *ctlapi.ResultError
	if err := lc.Bind(ctx, "orders", "missing", "k"); !errors.As(err, &re) || re.Code != ctlapi.CodeNotFound {
		t.Fatalf("bind to missing queue: %v", err)
	}
	// The TCP service sees the same state.
	tc := ctlclient.NewClient([]string{n.Addr()})
	defer tc.Close()
	// A long poll returns once a change applies past the index it knew.
	idx, err := tc.WaitChange(ctx, 0)
	if err != nil || idx == 0 {
		t.Fatalf("wait change: %d %v", idx, err)
	}
	changed := make(chan uint64, 1)
	go func() {
		v, _ := tc.WaitChange(ctx, idx)
		changed <- v
	}()
	if err := lc.DeclareQueue(ctx, "q2", ctlapi.QueueOptions{}); err != nil {
		t.Fatal(err)
	}
	if v := <-changed; v <= idx {
		t.Fatalf("long poll returned %d, not past %d", v, idx)
	}
	if err := lc.DeleteQueue(ctx, "q2"); err != nil {
		t.Fatal(err)
	}
	w, err := tc.GetWiring(ctx, ctlapi.ReadConsistent)
	if err != nil {
		t.Fatal(err)
	}
	if len(w.Queues) != 1 || len(w.Bindings) != 1 || w.Bindings[0].Key != "eu.*" {
		t.Fatalf("wiring %+v", w)
	}
	n.Stop()
	// Restart replays the log.
	n, err = StartSingle(dir, "127.0.0.1:0", quietLogger())
	if err != nil {
		t.Fatal(err)
	}
	defer n.Stop()
	w, err = n.LocalClient().GetWiring(ctx, ctlapi.ReadConsistent)
	if err != nil || len(w.Queues) != 1 || len(w.Exchanges) != 1 {
		t.Fatalf("after restart: %+v %v", w, err)
	}
}

func TestThreeNodeBasic(t *testing.T) {
	c := newTestCluster(t, 3, nil)
	c.leader()
	cl := ctlclient.NewClient(c.addrList())
	defer cl.Close()
	ctx := ctxT(t, 20*time.Second)
	for i := 0; i < 20; i++ {
		if err := cl.SetAttribute(ctx, "k", fmt.Sprint(i)); err != nil {
			t.Fatal(err)
		}
	}
	for _, mode := range []ctlapi.ReadMode{ctlapi.ReadConsistent, ctlapi.ReadFollower, ctlapi.ReadUnsafe} {
		v, ok, err := cl.GetAttribute(ctx, mode, "k")
		if err != nil || !ok || v != "19" {
			t.Fatalf("mode %d: %q %v %v", mode, v, ok, err)
		}
	}
	// Every follower serves a follower read after catching up.
	for _, n := range c.nodes {
		fc := ctlclient.NewClient([]string{n.Addr()})
		v, _, err := fc.GetAttribute(ctx, ctlapi.ReadFollower, "k")
		fc.Close()
		if err != nil || v != "19" {
			t.Fatalf("follower read at %d: %q %v", n.ID(), v, err)
		}
	}
	// Kill the leader: a new one takes over and keeps the data.
	old := c.leader()
	c.stop(old.ID())
	// The client's connection to the dead leader may make the first try
	// ambiguous; the write is idempotent, so retry it.
	checkFor(t, 10*time.Second, 10*time.Millisecond, func() error {
		return cl.SetAttribute(ctx, "k", "after")
	})
	c.start(old.ID(), nil)
	checkFor(t, 10*time.Second, 10*time.Millisecond, func() error {
		var got string
		err := c.nodes[old.ID()].Read(ctx, ctlapi.ReadFollower, func(s *State) { got, _ = s.Attribute("k") })
		if err != nil || got != "after" {
			return fmt.Errorf("restarted node reads %q, %v", got, err)
		}
		return nil
	})
}

// TestFatalErrorStopsNode: a fatal error (what a failed log write raises)
// stops the node; Done closes and Err tells why, while Stop alone leaves
// Err nil.
func TestFatalErrorStopsNode(t *testing.T) {
	n, err := StartSingle(t.TempDir(), "127.0.0.1:0", quietLogger())
	if err != nil {
		t.Fatal(err)
	}
	boom := errors.New("disk on fire")
	n.fail(boom)
	select {
	case <-n.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("node did not stop on a fatal error")
	}
	if !errors.Is(n.Err(), boom) {
		t.Fatalf("Err() = %v, want %v", n.Err(), boom)
	}
	n.Stop()

	m, err := StartSingle(t.TempDir(), "127.0.0.1:0", quietLogger())
	if err != nil {
		t.Fatal(err)
	}
	m.Stop()
	<-m.Done()
	if m.Err() != nil {
		t.Fatalf("Err() after Stop = %v", m.Err())
	}
}

// TestLeaderChanged: a member's LeaderChanged channel closes when the
// leader it knows changes, and not before.
func TestLeaderChanged(t *testing.T) {
	c := newTestCluster(t, 3, nil)
	l := c.leader()
	var f *Node
	for _, n := range c.nodes {
		if n != l {
			f = n
			break
		}
	}
	moved := f.LeaderChanged()
	select {
	case <-moved:
		t.Fatalf("closed while node %d still follows %d", f.ID(), f.Leader())
	case <-time.After(100 * time.Millisecond):
	}
	old := l.ID()
	c.stop(old)
	select {
	case <-moved:
	case <-time.After(10 * time.Second):
		t.Fatalf("not closed 10s after leader %d stopped; node %d sees %d", old, f.ID(), f.Leader())
	}
	if f.Leader() == old {
		t.Fatalf("closed, but node %d still names %d", f.ID(), old)
	}
	nl := c.leader()
	if f.Leader() != nl.ID() {
		t.Fatalf("node %d follows %d, the leader is %d", f.ID(), f.Leader(), nl.ID())
	}
}
