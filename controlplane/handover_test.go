package controlplane

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/berthmq/berth/controlplane/ctlapi"
	"github.com/berthmq/berth/controlplane/ctlclient"
)

// TestHandover: a group's master hands it over to a member of its
// SyncStateSet whose heartbeats still show it behind (the master vouches
// for its log end); requests from a broker that is not the master, for a
// stale epoch, to a broker outside the set or to a dead one are refused
// with nothing elected, and a repeated request is fenced by the epoch.
func TestHandover(t *testing.T) {
	c := newTestCluster(t, 1, func(cfg *Config) { cfg.BrokerTimeout, cfg.LeaderGrace = 500*time.Millisecond, 500*time.Millisecond })
	l := c.leader()
	cl := ctlclient.NewClient(c.addrList())
	defer cl.Close()
	setupBrokers(t, cl, 3, 1)
	// Broker 1 is ahead in the heartbeats, so it is elected first.
	var hbs []*heartbeater
	for b := uint32(1); b <= 3; b++ {
		idx := uint64(0)
		if b == 1 {
			idx = 10
		}
		hbs = append(hbs, startHeartbeats(cl, b, 1, idx, 50*time.Millisecond))
	}
	defer func() {
		for _, h := range hbs {
			if h != nil {
				h.halt()
			}
		}
	}()
	checkFor(t, 10*time.Second, 10*time.Millisecond, func() error {
		for b := uint32(1); b <= 3; b++ {
			if !l.hb.candidate(b, 0, time.Now()).Alive {
				return fmt.Errorf("broker %d not seen yet", b)
			}
		}
		return nil
	})
	if _, err := cl.ElectMaster(ctxT(t, 5*time.Second), []uint32{0}, 0); err != nil {
		t.Fatal(err)
	}
	group := func() ctlapi.Group {
		t.Helper()
		g, err := cl.GetReplicaInfo(ctxT(t, 5*time.Second), ctlapi.ReadConsistent, 0)
		if err != nil {
			t.Fatal(err)
		}
		return g
	}
	g := group()
	if g.Master != 1 {
		t.Fatalf("first election: %+v, want master 1", g)
	}
	if err := cl.AlterSyncStateSet(ctxT(t, 5*time.Second), 0, 1, g.Epoch, []uint32{1, 2}); err != nil {
		t.Fatal(err)
	}
	end := ctlapi.LogEnd{Epoch: g.Epoch, Index: 10}
	refused := []struct {
		why string
		h   ctlapi.Handover
	}{
		{"from a broker that is not the master", ctlapi.Handover{Group: 0, Epoch: g.Epoch, From: 2, To: 1, LogEnd: end}},
		{"for a stale epoch", ctlapi.Handover{Group: 0, Epoch: g.Epoch - 1, From: 1, To: 2, LogEnd: end}},
		{"to a broker outside the set", ctlapi.Handover{Group: 0, Epoch: g.Epoch, From: 1, To: 3, LogEnd: end}},
		{"to the master itself", ctlapi.Handover{Group: 0, Epoch: g.Epoch, From: 1, To: 1, LogEnd: end}},
		{"of a group that does not exist", ctlapi.Handover{Group: 7, Epoch: g.Epoch, From: 1, To: 2, LogEnd: end}},
	}
	for _, r := range refused {
		moved, err := cl.Handover(ctxT(t, 5*time.Second), r.h)
		var re *ctlapi.ResultError
		if moved || !errors.As(err, &re) {
			t.Errorf("a handover %s: moved %v, err %v; want a refusal", r.why, moved, err)
		}
	}
	if now := group(); now.Master != 1 || now.Epoch != g.Epoch {
		t.Fatalf("the refused handovers moved the group: %+v", now)
	}
	// Broker 2's heartbeats say index 0, the master's 10: an election
	// from the heartbeats would keep broker 1. The handover elects 2.
	h := ctlapi.Handover{Group: 0, Epoch: g.Epoch, From: 1, To: 2, LogEnd: end}
	moved, err := cl.Handover(ctxT(t, 5*time.Second), h)
	if err != nil || !moved {
		t.Fatalf("handover: moved %v, err %v", moved, err)
	}
	after := group()
	if after.Master != 2 || after.Epoch != g.Epoch+1 || after.ElectedLogEnd != end {
		t.Fatalf("after the handover: %+v, want master 2 at epoch %d elected at %+v", after, g.Epoch+1, end)
	}
	if moved, err := cl.Handover(ctxT(t, 5*time.Second), h); moved || err == nil {
		t.Fatalf("the same handover again: moved %v, err %v; want a stale-epoch refusal", moved, err)
	}
	// The leader reports the replicas' log ends from its heartbeats
	// (berthctl groups shows the lag from them); no group 7, no ends.
	ends, err := cl.LogEnds(ctxT(t, 5*time.Second), []uint32{0, 7})
	if err != nil || len(ends) != 2 || len(ends[0]) != 3 || len(ends[1]) != 0 {
		t.Fatalf("log ends of groups 0 and 7: %+v, %v; want 3 and none", ends, err)
	}
	for _, c := range ends[0] {
		if want := map[uint32]uint64{1: 10, 2: 0, 3: 0}[c.Broker]; !c.Alive || c.LogEnd.Index != want {
			t.Fatalf("broker %d in group 0: %+v, want alive at index %d", c.Broker, c, want)
		}
	}
	// A dead target is refused: broker 1 stops heartbeating.
	hbs[0].halt()
	hbs[0] = nil
	checkFor(t, 10*time.Second, 20*time.Millisecond, func() error {
		if l.hb.candidate(1, 0, time.Now()).Alive {
			return errors.New("broker 1 still alive")
		}
		return nil
	})
	moved, err = cl.Handover(ctxT(t, 5*time.Second), ctlapi.Handover{Group: 0, Epoch: after.Epoch, From: 2, To: 1, LogEnd: ctlapi.LogEnd{Epoch: after.Epoch, Index: 10}})
	var re *ctlapi.ResultError
	if moved || !errors.As(err, &re) {
		t.Fatalf("a handover to a dead broker: moved %v, err %v; want a refusal", moved, err)
	}
}
