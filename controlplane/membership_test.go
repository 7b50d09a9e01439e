package controlplane

import (
	"fmt"
	"net"
	"slices"
	"testing"
	"time"
)

// TestMembershipJointConsensus replaces a member of a 3-controller group
// and grows it to 5 in one joint-consensus change, then removes the old
// leader, while writes keep flowing; in both storage modes.
func TestMembershipJointConsensus(t *testing.T) {
	for _, async := range []bool{false, true} {
		t.Run(fmt.Sprintf("async=%v", async), func(t *testing.T) { testMembership(t, async) })
	}
}

func testMembership(t *testing.T, async bool) {
	c := newTestCluster(t, 3, func(cfg *Config) { cfg.AsyncStorageWrites = async })
	leader := c.leader()
	cl := NewClient(c.addrList())
	defer cl.Close()
	writeN(t, cl, "before", 50)

	// Start two joining members on fresh ports.
	lns := map[uint64]net.Listener{}
	for _, id := range []uint64{4, 5} {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		lns[id] = ln
		c.addrs[id] = ln.Addr().String()
	}
	for _, id := range []uint64{4, 5} {
		cfg := c.config(id, lns[id])
		cfg.Join = true
		cfg.AsyncStorageWrites = async
		n, err := Start(cfg)
		if err != nil {
			t.Fatal(err)
		}
		c.nodes[id] = n
	}
	// Replace a follower by 4 and add 5: {1,2,3} -> {leader, other, 4, 5}.
	var gone uint64
	for id := uint64(1); id <= 3; id++ {
		if id != leader.ID() {
			gone = id
			break
		}
	}
	ctx := ctxT(t, 20*time.Second)
	if err := leader.ChangeMembership(ctx, map[uint64]string{4: c.addrs[4], 5: c.addrs[5]}, []uint64{gone}); err != nil {
		t.Fatal(err)
	}
	want := []uint64{1, 2, 3, 4, 5}
	want = slices.DeleteFunc(want, func(id uint64) bool { return id == gone })
	if got := leader.Members(); !slices.Equal(got, want) {
		t.Fatalf("members %v, want %v", got, want)
	}
	// Each member snapshots right after the change; its latest snapshot
	// must record the configuration in force at the snapshot's index,
	// which once the joint configuration is left is the new one.
	checkFor(t, 15*time.Second, 20*time.Millisecond, func() error {
		for _, id := range want {
			snap, _ := c.nodes[id].storage.Snapshot()
			cs := snap.GetMetadata().GetConfState()
			if !slices.Equal(slices.Sorted(slices.Values(cs.GetVoters())), want) || len(cs.GetVotersOutgoing()) > 0 {
				return fmt.Errorf("member %d's snapshot at %d records voters %v (outgoing %v)", id,
					snap.GetMetadata().GetIndex(), cs.GetVoters(), cs.GetVotersOutgoing())
			}
		}
		return nil
	})
	c.stop(gone)
	writeN(t, cl, "after", 50)
	checkFor(t, 15*time.Second, 20*time.Millisecond, func() error {
		for _, id := range []uint64{4, 5} {
			var n int
			c.nodes[id].mu.RLock()
			n = len(c.nodes[id].state.Wiring().Queues)
			c.nodes[id].mu.RUnlock()
			if n != 100 {
				return fmt.Errorf("new member %d holds %d queues", id, n)
			}
			if m := c.nodes[id].Members(); !slices.Equal(m, want) {
				return fmt.Errorf("new member %d sees members %v", id, m)
			}
		}
		return nil
	})

	// Now remove the leader itself; the other four elect a new one.
	if err := leader.ChangeMembership(ctx, nil, []uint64{leader.ID()}); err != nil {
		t.Fatal(err)
	}
	old := leader.ID()
	c.stop(old)
	newLeader := c.leader()
	if newLeader.ID() == old {
		t.Fatal("removed leader still leads")
	}
	writeN(t, cl, "last", 10)
	c.converged()

	// A restarted new member finds its peers from its own log.
	c.stop(5)
	c.start(5, nil)
	checkFor(t, 15*time.Second, 20*time.Millisecond, func() error {
		var n int
		if err := c.nodes[5].Read(ctx, ReadFollower, func(s *State) { n = len(s.Wiring().Queues) }); err != nil {
			return err
		}
		if n != 110 {
			return fmt.Errorf("restarted member holds %d queues", n)
		}
		return nil
	})
}
