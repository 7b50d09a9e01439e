package controlplane

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/berthmq/berth/controlplane/ctlapi"
	"github.com/berthmq/berth/controlplane/ctlclient"
	"github.com/berthmq/berth/wire"
)

func stateBytes(n *Node) []byte {
	n.mu.RLock()
	defer n.mu.RUnlock()
	return n.state.Encode()
}

// converged waits until every running node has applied the same index and
// holds byte-identical state.
func (c *testCluster) converged() {
	c.t.Helper()
	checkFor(c.t, 15*time.Second, 20*time.Millisecond, func() error {
		var ref []byte
		var refApplied uint64
		for id, n := range c.nodes {
			b, a := stateBytes(n), n.Applied()
			if ref == nil {
				ref, refApplied = b, a
				continue
			}
			if a != refApplied || !bytes.Equal(b, ref) {
				return fmt.Errorf("node %d at %d differs from %d", id, a, refApplied)
			}
		}
		return nil
	})
}

func writeN(t *testing.T, cl *ctlclient.Client, prefix string, n int) {
	writeConc(t, cl, prefix, n, 32)
}

// writeConc declares n queues with at most conc writes in flight; conc 1
// gives one log entry per write.
func writeConc(t *testing.T, cl *ctlclient.Client, prefix string, n, conc int) {
	t.Helper()
	ctx := ctxT(t, 30*time.Second)
	var wg sync.WaitGroup
	errs := make(chan error, n)
	sem := make(chan struct{}, conc)
	for i := 0; i < n; i++ {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer func() { <-sem; wg.Done() }()
			// Declares are idempotent, so an ambiguous outcome (a stale
			// connection to a restarted node) is retried.
			err := cl.DeclareQueue(ctx, fmt.Sprintf("%s-%d", prefix, i), ctlapi.QueueOptions{Durable: true})
			for try := 0; try < 20 && errors.Is(err, ctlapi.ErrLeaderChanged); try++ {
				err = cl.DeclareQueue(ctx, fmt.Sprintf("%s-%d", prefix, i), ctlapi.QueueOptions{Durable: true})
			}
			if err != nil {
				errs <- err
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
}

func TestSnapshotsCompactAndInstallOnWipedFollower(t *testing.T) { testSnapshots(t) }

func testSnapshots(t *testing.T) {
	c := newTestCluster(t, 3, func(cfg *Config) {
		cfg.SnapshotEntries = 10
		cfg.SnapshotTrailing = 3
	})
	leader := c.leader()
	cl := ctlclient.NewClient(c.addrList())
	defer cl.Close()
	writeN(t, cl, "a", 300)
	c.converged()
	for id, n := range c.nodes {
		st := n.Status()
		if st.SnapshotIndex < 10 || st.FirstIndex <= 2 {
			t.Fatalf("node %d did not snapshot and compact: %+v", id, st)
		}
	}

	// Wipe a follower and write past the leader's retained log.
	var victim uint64
	for id := range c.nodes {
		if id != leader.ID() {
			victim = id
			break
		}
	}
	c.stop(victim)
	if err := os.RemoveAll(filepath.Join(c.dir, fmt.Sprint(victim))); err != nil {
		t.Fatal(err)
	}
	writeN(t, cl, "b", 200)
	if first := c.leader().Status().FirstIndex; first <= 2 {
		t.Fatalf("leader kept its log from %d; the follower would not need a snapshot", first)
	}
	c.start(victim, nil)
	c.converged()
	st := c.nodes[victim].Status()
	if st.SnapshotIndex <= 1 {
		t.Fatalf("wiped follower did not install a snapshot: %+v", st)
	}
	var queues int
	c.nodes[victim].Read(ctxT(t, 5*time.Second), ctlapi.ReadFollower, func(s *State) { queues = len(s.Wiring().Queues) })
	if queues != 500 {
		t.Fatalf("wiped follower holds %d queues, want 500", queues)
	}

	// A full restart loads each node's snapshot and replays its tail.
	before := stateBytes(c.leader())
	c.stopAll()
	for id := uint64(1); id <= 3; id++ {
		c.start(id, nil)
	}
	c.leader()
	for id, n := range c.nodes {
		if n.Status().SnapshotIndex == 0 {
			t.Fatalf("node %d restarted without its snapshot", id)
		}
	}
	writeN(t, cl, "c", 1)
	c.converged()
	after := stateBytes(c.leader())
	s1, _ := DecodeState(before)
	s2, _ := DecodeState(after)
	if len(s2.Wiring().Queues) != len(s1.Wiring().Queues)+1 {
		t.Fatalf("restart lost state: %d queues before, %d after", len(s1.Wiring().Queues), len(s2.Wiring().Queues))
	}
}

func TestFollowerReadRedirectsWhenLagging(t *testing.T) {
	c := newTestCluster(t, 3, func(cfg *Config) { cfg.FollowerLagMax = 20 })
	leader := c.leader()
	var follower *Node
	for _, n := range c.nodes {
		if n != leader {
			follower = n
			break
		}
	}
	cl := ctlclient.NewClient(c.addrList())
	defer cl.Close()
	writeN(t, cl, "warm", 5)
	c.converged()
	c.faults.BlockAppends(follower.ID(), true)
	writeConc(t, cl, "lag", 100, 1)

	fc := ctlclient.NewClient([]string{follower.Addr()})
	defer fc.Close()
	_, err := follower.ReadIndex(ctxT(t, 5*time.Second), true)
	var lag *ctlapi.LaggingError
	if !errors.As(err, &lag) || lag.Leader != leader.Addr() || lag.Behind < 100 {
		t.Fatalf("lagging follower answered %v, want a redirect to %s", err, leader.Addr())
	}
	// Through the client the redirect is followed and the read succeeds.
	w, err := fc.GetWiring(ctxT(t, 5*time.Second), ctlapi.ReadFollower)
	if err != nil || len(w.Queues) != 105 {
		t.Fatalf("redirected follower read: %d queues, %v", len(w.Queues), err)
	}
	c.faults.BlockAppends(follower.ID(), false)
	checkFor(t, 10*time.Second, 10*time.Millisecond, func() error {
		_, err := follower.ReadIndex(ctxT(t, 5*time.Second), true)
		return err
	})
}

// TestWipedFollowerCatchesUpWhileLeaderHoldsItsLog wipes a follower whose
// acknowledged entries the leader still holds. Raft never lowers a
// follower's match, so without help the leader probes at the old match
// forever; the leader must notice the loss and send a snapshot.
func TestWipedFollowerCatchesUpWhileLeaderHoldsItsLog(t *testing.T) {
	for _, tc := range []struct {
		name  string
		after int // writes after the wipe
	}{{"idle", 0}, {"writes", 5}} {
		t.Run(tc.name, func(t *testing.T) {
			c := newTestCluster(t, 3, func(cfg *Config) {
				cfg.SnapshotEntries = 100000 // no snapshot of its own during the test
			})
			leader := c.leader()
			cl := ctlclient.NewClient(c.addrList())
			defer cl.Close()
			writeConc(t, cl, "a", 40, 1)
			c.converged()
			var victim uint64
			for id := range c.nodes {
				if id != leader.ID() {
					victim = id
					break
				}
			}
			c.stop(victim)
			if err := os.RemoveAll(filepath.Join(c.dir, fmt.Sprint(victim))); err != nil {
				t.Fatal(err)
			}
			writeConc(t, cl, "b", tc.after, 1)
			c.start(victim, nil)
			c.converged()
			var queues int
			if err := c.nodes[victim].Read(ctxT(t, 5*time.Second), ctlapi.ReadFollower, func(s *State) { queues = len(s.Wiring().Queues) }); err != nil {
				t.Fatal(err)
			}
			if queues != 40+tc.after {
				t.Fatalf("wiped follower holds %d queues, want %d", queues, 40+tc.after)
			}
		})
	}
}

// TestSnapshotInChunks installs a snapshot on a wiped follower with the
// chunk size cut to 512 bytes, so the snapshot crosses in many
// TypeRaftChunk frames.
func TestSnapshotInChunks(t *testing.T) {
	old := snapChunkBytes
	snapChunkBytes = 512
	// Registered before the cluster's own cleanup, so it runs after the
	// controllers (and their transports) stopped.
	t.Cleanup(func() { snapChunkBytes = old })
	testSnapshots(t)
}

func TestChunkAssembler(t *testing.T) {
	msg := make([]byte, 1000)
	for i := range msg {
		msg[i] = byte(i)
	}
	frames := func(size int) [][]byte {
		var out [][]byte
		for off := 0; off < len(msg); off += size {
			part := msg[off:min(off+size, len(msg))]
			f := wire.AppendRaftChunk(nil, uint64(len(msg)), uint64(off), part)
			out = append(out, f[wire.HeaderSize:])
		}
		return out
	}
	var a chunkAssembler
	fs := frames(300)
	for i, f := range fs {
		got, err := a.add(f)
		if err != nil {
			t.Fatal(err)
		}
		if (got != nil) != (i == len(fs)-1) {
			t.Fatalf("chunk %d: message complete = %v", i, got != nil)
		}
		if got != nil && !bytes.Equal(got, msg) {
			t.Fatal("reassembled message differs")
		}
	}
	// Out of order, a changed total, a short body and a claim past the
	// bound are refused.
	if _, err := a.add(fs[1]); err == nil {
		t.Fatal("chunk without its start accepted")
	}
	a = chunkAssembler{}
	a.add(fs[0])
	if _, err := a.add(fs[2]); err == nil {
		t.Fatal("chunk out of order accepted")
	}
	a = chunkAssembler{}
	a.add(fs[0])
	if _, err := a.add(wire.AppendRaftChunk(nil, 2000, 300, msg[300:600])[wire.HeaderSize:]); err == nil {
		t.Fatal("chunk with another total accepted")
	}
	if _, err := a.add([]byte{1, 2, 3}); err == nil {
		t.Fatal("short chunk accepted")
	}
	if _, err := a.add(wire.AppendRaftChunk(nil, raftMessageMax+1, 0, msg)[wire.HeaderSize:]); err == nil {
		t.Fatal("chunk of an oversized message accepted")
	}
	if _, err := a.add(wire.AppendRaftChunk(nil, 10, 5, msg[:6])[wire.HeaderSize:]); err == nil {
		t.Fatal("chunk running past its total accepted")
	}
}
