package controlplane

import (
	"errors"
	"fmt"
	"maps"
	"net"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/berthmq/berth/controlplane/ctlapi"
	"github.com/berthmq/berth/controlplane/ctlclient"
	"github.com/berthmq/berth/wire"
)

// TestMembershipJointConsensus replaces a member of a 3-controller group
// and grows it to 5 in one joint-consensus change, then removes the old
// leader, while writes keep flowing.
func TestMembershipJointConsensus(t *testing.T) {
	c := newTestCluster(t, 3, nil)
	leader := c.leader()
	cl := ctlclient.NewClient(c.addrList())
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
		if err := c.nodes[5].Read(ctx, ctlapi.ReadFollower, func(s *State) { n = len(s.Wiring().Queues) }); err != nil {
			return err
		}
		if n != 110 {
			return fmt.Errorf("restarted member holds %d queues", n)
		}
		return nil
	})
}

// TestMembershipOverService grows a 3-member group by a joining member and
// removes an old one through the TCP service with a Client, as berthctl
// does, checks the member list each time and that writes still commit and
// reach the new member; then sends bad requests, which are refused with a
// message and change nothing.
func TestMembershipOverService(t *testing.T) {
	c := newTestCluster(t, 3, nil)
	leader := c.leader()
	cl := ctlclient.NewClient(c.addrList())
	defer cl.Close()
	ctx := ctxT(t, 30*time.Second)
	writeN(t, cl, "before", 20)

	members, lead, err := cl.MemberList(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if !maps.Equal(members, map[uint64]string{1: c.addrs[1], 2: c.addrs[2], 3: c.addrs[3]}) || lead != leader.ID() {
		t.Fatalf("members %v led by %d, want the three started, led by %d", members, lead, leader.ID())
	}

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	c.addrs[4] = ln.Addr().String()
	cfg := c.config(4, ln)
	cfg.Join = true
	n4, err := Start(cfg)
	if err != nil {
		t.Fatal(err)
	}
	c.nodes[4] = n4
	if err := cl.ChangeMembership(ctx, map[uint64]string{4: c.addrs[4]}, nil); err != nil {
		t.Fatal(err)
	}
	want := maps.Clone(c.addrs)
	if got, err := cl.Members(ctx); err != nil || !maps.Equal(got, want) {
		t.Fatalf("members after adding 4: %v %v, want %v", got, err, want)
	}
	// Repeating a change that took effect (a retry after a lost reply)
	// succeeds without another entry.
	if err := cl.ChangeMembership(ctx, map[uint64]string{4: c.addrs[4]}, nil); err != nil {
		t.Fatalf("repeated add: %v", err)
	}

	// Remove a follower of the original three.
	var gone uint64
	for id := uint64(1); id <= 3; id++ {
		if id != c.leader().ID() {
			gone = id
			break
		}
	}
	if err := cl.ChangeMembership(ctx, nil, []uint64{gone}); err != nil {
		t.Fatal(err)
	}
	delete(want, gone)
	if got, err := cl.Members(ctx); err != nil || !maps.Equal(got, want) {
		t.Fatalf("members after removing %d: %v %v, want %v", gone, got, err, want)
	}
	c.stop(gone)
	writeN(t, cl, "after", 20)
	checkFor(t, 10*time.Second, 20*time.Millisecond, func() error {
		var q int
		if err := n4.Read(ctx, ctlapi.ReadFollower, func(s *State) { q = len(s.Wiring().Queues) }); err != nil {
			return err
		}
		if q != 40 {
			return fmt.Errorf("member 4 holds %d queues, want 40", q)
		}
		if m := n4.Members(); !slices.Equal(m, slices.Sorted(maps.Keys(want))) {
			return fmt.Errorf("member 4 sees members %v", m)
		}
		return nil
	})

	// Refusals by the leader, through the client: each names its reason.
	free := "127.0.0.1:1"
	for _, bad := range []struct {
		add    map[uint64]string
		remove []uint64
		msg    string
	}{
		{map[uint64]string{4: free}, nil, "already a member"},
		{map[uint64]string{6: free}, []uint64{9}, "not a member"},
		{map[uint64]string{6: c.addrs[4]}, nil, "already has the address"},
		{map[uint64]string{6: "127.0.0.1:2", 7: "127.0.0.1:3", 8: "127.0.0.1:4"}, nil, "at most 5 members"},
		{map[uint64]string{6: free}, []uint64{6}, "both added and removed"},
		{nil, slices.Sorted(maps.Keys(want)), "at least one controller"},
	} {
		err := cl.ChangeMembership(ctx, bad.add, bad.remove)
		if !errors.Is(err, ctlapi.ErrBadRequest) || !strings.Contains(err.Error(), bad.msg) {
			t.Errorf("change +%v -%v: %v, want a bad request saying %q", bad.add, bad.remove, err, bad.msg)
		}
	}
	// Refused by the client before sending.
	for _, bad := range []struct {
		add    map[uint64]string
		remove []uint64
	}{
		{nil, nil},
		{map[uint64]string{0: free}, nil},
		{map[uint64]string{6: ""}, nil},
		{map[uint64]string{6: "no-port"}, nil},
		{map[uint64]string{6: "127.0.0.1:0"}, nil},
		{map[uint64]string{6: "127.0.0.1:7402" + strings.Repeat("x", 300)}, nil},
		{nil, []uint64{0}},
		{nil, []uint64{1, 2, 3, 4, 5, 6}},
	} {
		if err := cl.ChangeMembership(ctx, bad.add, bad.remove); err == nil {
			t.Errorf("change +%v -%v accepted", bad.add, bad.remove)
		}
	}
	// Malformed bodies on the wire, past the client's checks.
	leaderAddr := c.leader().Addr()
	raw := dialRaw(t, leaderAddr)
	u32, u64, str := wire.AppendU32, wire.AppendU64, wire.AppendStr
	sixAdds := u32(nil, 6)
	for id := uint64(10); id < 16; id++ {
		sixAdds = str(u64(sixAdds, id), fmt.Sprintf("127.0.0.1:%d", id))
	}
	for name, body := range map[string][]byte{
		"empty":         nil,
		"truncated":     u64(u32(nil, 1), 6),
		"huge count":    u32(nil, 1<<30),
		"six adds":      u32(sixAdds, 0),
		"duplicate add": u32(str(u64(str(u64(u32(nil, 2), 6), free), 6), free), 0),
		"trailing":      wire.AppendU8(u64(u32(u32(nil, 0), 1), gone), 0),
		"id 0":          u32(str(u64(u32(nil, 1), 0), free), 0),
		"empty address": u32(str(u64(u32(nil, 1), 6), ""), 0),
		"remove 0":      u64(u32(u32(nil, 0), 1), 0),
	} {
		resp, err := raw.do(ctx, ctlapi.OpChangeMembers, body)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if resp.Status != ctlapi.StatusBadRequest || len(resp.Body) == 0 {
			t.Errorf("%s: status %d %q, want a bad request with a message", name, resp.Status, resp.Body)
		}
	}
	if resp, err := raw.do(ctx, ctlapi.OpMembers, []byte{1}); err != nil || resp.Status != ctlapi.StatusBadRequest {
		t.Errorf("members with a body: %+v %v", resp, err)
	}
	if got, err := cl.Members(ctx); err != nil || !maps.Equal(got, want) {
		t.Fatalf("members after the refusals: %v %v, want %v", got, err, want)
	}
	writeN(t, cl, "last", 5)
}

// TestJoinerLearnsLeaderAddress starts a joining member that knows only
// itself and one follower, not the leader. The leader's connection hello
// tells it where to answer; without it the joiner never acknowledged
// anything and never got its snapshot.
func TestJoinerLearnsLeaderAddress(t *testing.T) {
	c := newTestCluster(t, 3, nil)
	leader := c.leader()
	cl := ctlclient.NewClient(c.addrList())
	defer cl.Close()
	writeN(t, cl, "a", 20)
	var follower uint64
	for id := uint64(1); id <= 3; id++ {
		if id != leader.ID() {
			follower = id
			break
		}
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	c.addrs[4] = ln.Addr().String()
	cfg := c.config(4, ln)
	cfg.Join = true
	cfg.Peers = map[uint64]string{4: c.addrs[4], follower: c.addrs[follower]}
	n, err := Start(cfg)
	if err != nil {
		t.Fatal(err)
	}
	c.nodes[4] = n
	if err := leader.ChangeMembership(ctxT(t, 20*time.Second), map[uint64]string{4: c.addrs[4]}, nil); err != nil {
		t.Fatal(err)
	}
	checkFor(t, 15*time.Second, 20*time.Millisecond, func() error {
		var q int
		n.mu.RLock()
		q = len(n.state.Wiring().Queues)
		n.mu.RUnlock()
		if q != 20 {
			return fmt.Errorf("joiner holds %d queues, want 20", q)
		}
		return nil
	})
}
