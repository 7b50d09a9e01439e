package controlplane

import (
	"bytes"
	"errors"
	"fmt"
	"reflect"
	"testing"
	"time"

	"github.com/berthmq/berth/controlplane/ctlapi"
	"github.com/berthmq/berth/controlplane/ctlclient"
)

func pAlive(id uint32, data uint64) ctlapi.PrimaryCandidate {
	return ctlapi.PrimaryCandidate{Broker: id, Alive: true, Data: data}
}

func pDead(id uint32) ctlapi.PrimaryCandidate { return ctlapi.PrimaryCandidate{Broker: id} }

// applyCodec applies ev after a trip through the codec, as through the log.
func applyCodec(t *testing.T, s *State, ev ctlapi.Event) ctlapi.Result {
	t.Helper()
	dec, err := ctlapi.DecodeEvent(ctlapi.EncodeEvent(nil, ev))
	if err != nil {
		t.Fatalf("codec %T: %v", ev, err)
	}
	if !reflect.DeepEqual(dec, ev) {
		t.Fatalf("codec round trip: %#v != %#v", dec, ev)
	}
	return s.Apply(dec)
}

// newActivePassive returns 4 registered brokers in an active-passive
// cluster whose primary is broker 2 at epoch 1.
func newActivePassive(t *testing.T) *State {
	t.Helper()
	s := newCluster(t, 4, 4)
	mustOK(t, s, &ctlapi.SetClusterConfig{Groups: 4, Mode: ctlapi.ModeActivePassive})
	if p, e := s.Primary(); p != 0 || e != 0 {
		t.Fatalf("primary before any election: %d/%d", p, e)
	}
	// Broker 2 and 3 tie on data; the lower id wins. Broker 4 has more but
	// is dead; 9 has most but is not registered.
	r := mustOK(t, s, &ctlapi.ElectPrimary{Epoch: 0, Candidates: []ctlapi.PrimaryCandidate{
		pAlive(1, 10), pAlive(3, 30), pAlive(2, 30), pDead(4), pAlive(9, 99)}})
	if p, e := s.Primary(); p != 2 || e != 1 || r.Value != 1 {
		t.Fatalf("first election: primary %d epoch %d value %d, want 2/1/1", p, e, r.Value)
	}
	return s
}

func TestElectPrimary(t *testing.T) {
	tests := []struct {
		name        string
		ev          ctlapi.ElectPrimary
		wantCode    uint8
		wantPrimary uint32
		wantEpoch   uint32
		wantValue   uint64
	}{
		{"live primary keeps the role", ctlapi.ElectPrimary{Epoch: 1, Candidates: []ctlapi.PrimaryCandidate{
			pAlive(2, 0), pAlive(3, 100)}}, ctlapi.CodeOK, 2, 1, 0},
		{"dead primary: most data wins", ctlapi.ElectPrimary{Epoch: 1, Candidates: []ctlapi.PrimaryCandidate{pDead(2), pAlive(1, 5), pAlive(3, 7)}}, ctlapi.CodeOK, 3, 2, 1},
		{"dead primary: tie to lowest id", ctlapi.ElectPrimary{Epoch: 1, Candidates: []ctlapi.PrimaryCandidate{pAlive(4, 5), pDead(2), pAlive(3, 5)}}, ctlapi.CodeOK, 3, 2, 1},
		{"primary missing from snapshot counts as dead", ctlapi.ElectPrimary{Epoch: 1, Candidates: []ctlapi.PrimaryCandidate{
			pAlive(4, 5)}}, ctlapi.CodeOK, 4, 2, 1},
		{"unregistered candidate ignored", ctlapi.ElectPrimary{Epoch: 1, Candidates: []ctlapi.PrimaryCandidate{pDead(2), pAlive(77, 1000), pAlive(1, 1)}}, ctlapi.CodeOK, 1, 2, 1},
		{"nobody alive clears under a new epoch", ctlapi.ElectPrimary{Epoch: 1, Candidates: []ctlapi.PrimaryCandidate{
			pDead(2), pDead(1)}}, ctlapi.CodeOK, 0, 2, 1},
		{"stale epoch refused", ctlapi.ElectPrimary{Epoch: 0, Candidates: []ctlapi.PrimaryCandidate{
			pDead(2), pAlive(3, 1)}}, ctlapi.CodeStaleEpoch, 2, 1, 0},
		{"future epoch refused", ctlapi.ElectPrimary{Epoch: 5, Candidates: []ctlapi.PrimaryCandidate{
			pDead(2), pAlive(3, 1)}}, ctlapi.CodeStaleEpoch, 2, 1, 0},
		{"preferred hands over from a live primary", ctlapi.ElectPrimary{Epoch: 1, Preferred: 1, Candidates: []ctlapi.PrimaryCandidate{
			pAlive(2, 100), pAlive(1, 0)}}, ctlapi.CodeOK, 1, 2, 1},
		{"preferred absent from snapshot is not vetoed", ctlapi.ElectPrimary{Epoch: 1, Preferred: 4}, ctlapi.CodeOK, 4, 2, 1},
		{"preferred already primary changes nothing", ctlapi.ElectPrimary{Epoch: 1, Preferred: 2}, ctlapi.CodeOK, 2, 1, 0},
		{"preferred reported dead refused", ctlapi.ElectPrimary{Epoch: 1, Preferred: 3, Candidates: []ctlapi.PrimaryCandidate{
			pAlive(2, 1), pDead(3)}}, ctlapi.CodeInvalid, 2, 1, 0},
		{"preferred unregistered refused", ctlapi.ElectPrimary{Epoch: 1, Preferred: 9}, ctlapi.CodeNotFound, 2, 1, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := newActivePassive(t)
			r := applyCodec(t, s, &tt.ev)
			p, e := s.Primary()
			if r.Code != tt.wantCode || p != tt.wantPrimary || e != tt.wantEpoch || r.Value != tt.wantValue {
				t.Fatalf("got code %d (%s) primary %d epoch %d value %d; want %d %d %d %d",
					r.Code, r.Msg, p, e, r.Value, tt.wantCode, tt.wantPrimary, tt.wantEpoch, tt.wantValue)
			}
		})
	}
}

func TestElectPrimaryModes(t *testing.T) {
	s := newCluster(t, 3, 4)
	r := applyCodec(t, s, &ctlapi.ElectPrimary{Candidates: []ctlapi.PrimaryCandidate{pAlive(1, 0)}})
	if r.Code != ctlapi.CodeWrongMode || r.Msg == "" {
		t.Fatalf("election in active-active: %+v", r)
	}
	if p, e := s.Primary(); p != 0 || e != 0 {
		t.Fatalf("active-active got a primary: %d/%d", p, e)
	}
	// Nobody alive and no primary: nothing changes, not even the epoch.
	mustOK(t, s, &ctlapi.SetClusterConfig{Groups: 4, Mode: ctlapi.ModeActivePassive})
	if r := mustOK(t, s, &ctlapi.ElectPrimary{Candidates: []ctlapi.PrimaryCandidate{pDead(1)}}); r.Value != 0 {
		t.Fatalf("election with nobody alive changed something: %+v", r)
	}
	mustOK(t, s, &ctlapi.ElectPrimary{Candidates: []ctlapi.PrimaryCandidate{pAlive(1, 0)}})
	// Updating other settings keeps the primary.
	mustOK(t, s, &ctlapi.SetClusterConfig{Groups: 4, Mode: ctlapi.ModeActivePassive, UncleanElection: true})
	if p, e := s.Primary(); p != 1 || e != 1 {
		t.Fatalf("primary after a config update: %d/%d", p, e)
	}
	// Back to active-active: cleared under a new epoch.
	mustOK(t, s, &ctlapi.SetClusterConfig{Groups: 4})
	if p, e := s.Primary(); p != 0 || e != 2 {
		t.Fatalf("primary after switching to active-active: %d/%d, want 0/2", p, e)
	}
	// The epoch keeps counting after switching back.
	mustOK(t, s, &ctlapi.SetClusterConfig{Groups: 4, Mode: ctlapi.ModeActivePassive})
	if r := applyCodec(t, s, &ctlapi.ElectPrimary{Epoch: 0, Candidates: []ctlapi.PrimaryCandidate{pAlive(3, 0)}}); r.Code != ctlapi.CodeStaleEpoch {
		t.Fatalf("election from before the switch: %+v", r)
	}
	mustOK(t, s, &ctlapi.ElectPrimary{Epoch: 2, Candidates: []ctlapi.PrimaryCandidate{pAlive(3, 0)}})
	if p, e := s.Primary(); p != 3 || e != 3 {
		t.Fatalf("primary after re-election: %d/%d, want 3/3", p, e)
	}
	// Removing the primary's broker clears it under a new epoch.
	mustOK(t, s, &ctlapi.CleanBrokerData{ID: 3})
	if p, e := s.Primary(); p != 0 || e != 4 {
		t.Fatalf("primary after cleaning its broker: %d/%d, want 0/4", p, e)
	}
	mustOK(t, s, &ctlapi.CleanBrokerData{ID: 2}) // not the primary: no new epoch
	if _, e := s.Primary(); e != 4 {
		t.Fatalf("cleaning another broker moved the epoch to %d", e)
	}
}

// TestPrimaryFormat2Snapshot: a snapshot written before the primary
// existed (format 2: no primary fields at the end) decodes as no primary.
func TestPrimaryFormat2Snapshot(t *testing.T) {
	s := newActivePassive(t)
	mustOK(t, s, &ctlapi.SetAttribute{Key: "a", Value: "b"})
	cur := s.Encode()
	// The primary fields, then (format 4) the groups' replica sets.
	tail := 8
	for g := range s.GroupCount() {
		gr, _ := s.Group(uint32(g))
		tail += 4 + 4*len(gr.Replicas)
	}
	old := append([]byte{2}, cur[1:len(cur)-tail]...)
	got, err := DecodeState(old)
	if err != nil {
		t.Fatal(err)
	}
	if p, e := got.Primary(); p != 0 || e != 0 {
		t.Fatalf("format 2 snapshot decoded with primary %d/%d", p, e)
	}
	if v, ok := got.Attribute("a"); !ok || v != "b" {
		t.Fatalf("format 2 snapshot lost attribute a: %q %v", v, ok)
	}
	// The same bytes claiming format 3 are short by the primary fields.
	if _, err := DecodeState(append([]byte{3}, cur[1:len(cur)-tail]...)); err == nil {
		t.Fatal("truncated format 3 snapshot decoded")
	}
	if _, err := DecodeState(append([]byte{9}, cur[1:]...)); err == nil {
		t.Fatal("unknown snapshot format decoded")
	}
}

func TestPrimarySnapshotRoundTrip(t *testing.T) {
	s := newActivePassive(t)
	mustOK(t, s, &ctlapi.ElectPrimary{Epoch: 1, Preferred: 4})
	mustOK(t, s, &ctlapi.SetAttribute{Key: "a", Value: "b"})
	raw := s.Encode()
	r, err := DecodeState(decompressMust(t, compressSnapshot(raw)))
	if err != nil {
		t.Fatal(err)
	}
	if p, e := r.Primary(); p != 4 || e != 2 {
		t.Fatalf("restored primary %d/%d, want 4/2", p, e)
	}
	if !bytes.Equal(r.Encode(), raw) {
		t.Fatal("restored state encodes differently")
	}
	// The restored state goes on deciding as the original does.
	ev := &ctlapi.ElectPrimary{Epoch: 2, Candidates: []ctlapi.PrimaryCandidate{pDead(4), pAlive(1, 3)}}
	if a, b := s.Apply(ev), r.Apply(ev); a != b || !bytes.Equal(s.Encode(), r.Encode()) {
		t.Fatalf("restored state diverged: %+v vs %+v", a, b)
	}
	// A state from before primaries existed decodes with none.
	old, err := DecodeState(newCluster(t, 2, 2).Encode())
	if err != nil {
		t.Fatal(err)
	}
	if p, e := old.Primary(); p != 0 || e != 0 {
		t.Fatalf("old snapshot primary %d/%d", p, e)
	}
}

func TestElectPrimaryCodecBounds(t *testing.T) {
	if _, err := ctlapi.DecodeEvent([]byte{byte(ctlapi.KindElectPrimary), 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 0xff, 0xff}); err == nil {
		t.Fatal("huge candidate count decoded")
	}
	raw := ctlapi.EncodeEvent(nil, &ctlapi.ElectPrimary{Epoch: 3, Candidates: []ctlapi.PrimaryCandidate{pAlive(1, 2)}})
	bad := bytes.Clone(raw)
	bad[len(bad)-9] = 2 // the Alive byte
	if _, err := ctlapi.DecodeEvent(bad); err == nil {
		t.Fatal("boolean 2 decoded")
	}
	big := &ctlapi.ElectPrimary{Candidates: make([]ctlapi.PrimaryCandidate, ctlapi.PrimaryCandidatesMax+1)}
	if err := ctlapi.ValidateEvent(big); err == nil {
		t.Fatal("oversized candidate list validated")
	}
}

func TestPrimaryHeartbeatView(t *testing.T) {
	h := newHeartbeats(time.Second, 0)
	t0 := time.Unix(1000, 0)
	h.beat(1, []ctlapi.GroupLogEnd{{Group: 0, LogEnd: ctlapi.LogEnd{Epoch: 1, Index: 5}}, {Group: 1, LogEnd: ctlapi.LogEnd{Epoch: 2, Index: 7}}}, t0)
	if c := h.primaryCandidate(1, t0); !c.Alive || c.Data != 12 {
		t.Fatalf("candidate %+v, want alive with data 12", c)
	}
	h.beat(1, nil, t0.Add(time.Millisecond)) // keeps the last reported data
	if c := h.primaryCandidate(1, t0); c.Data != 12 {
		t.Fatalf("data lost on a beat without log ends: %+v", c)
	}
	// An unknown broker is seeded and kept for one timeout, but is no
	// candidate until it heartbeats.
	if !h.primaryAlive(2, t0) {
		t.Fatal("unknown primary not given a timeout")
	}
	if c := h.primaryCandidate(2, t0); c.Alive {
		t.Fatalf("seeded broker is a candidate: %+v", c)
	}
	later := t0.Add(1500 * time.Millisecond)
	if h.primaryAlive(2, later) || h.primaryAlive(1, later) {
		t.Fatal("silent brokers still alive after the timeout")
	}
	if dead := h.expired(later); len(dead) != 2 {
		t.Fatalf("expired %v", dead)
	}
	if got := primaryData([]ctlapi.GroupLogEnd{{LogEnd: ctlapi.LogEnd{Index: ^uint64(0) - 1}}, {LogEnd: ctlapi.LogEnd{Index: 5}}}); got != ^uint64(0) {
		t.Fatalf("data sum did not saturate: %d", got)
	}
}

// TestPrimaryFailover: three controllers, three heartbeating brokers. In
// active-passive mode the failure detector elects a primary; when its
// heartbeats stop another broker takes over under a higher epoch, and again
// after the controller leader is killed.
func TestPrimaryFailover(t *testing.T) {
	c := newTestCluster(t, 3, func(cfg *Config) { cfg.BrokerTimeout = 400 * time.Millisecond })
	c.leader()
	cl := ctlclient.NewClient(c.addrList())
	defer cl.Close()
	const groups = 4
	setupBrokers(t, cl, 3, groups)
	hbs := map[uint32]*heartbeater{}
	for b := uint32(1); b <= 3; b++ {
		// Broker 3 holds the most data, then 2, then 1.
		hbs[b] = startHeartbeats(cl, b, groups, uint64(10*b), 50*time.Millisecond)
	}
	defer func() {
		for _, h := range hbs {
			h.halt()
		}
	}()
	ctx := ctxT(t, 20*time.Second)
	if p, e, _, err := cl.GetPrimary(ctx, ctlapi.ReadConsistent); err != nil || p != 0 || e != 0 {
		t.Fatalf("active-active primary: %d/%d %v", p, e, err)
	}
	if _, err := cl.ElectPrimary(ctx, 1); err == nil {
		t.Fatal("admin election in active-active accepted")
	} else if re := (*ctlapi.ResultError)(nil); !errors.As(err, &re) || re.Code != ctlapi.CodeWrongMode {
		t.Fatalf("admin election in active-active: %v", err)
	}
	// Wait until the leader heard all three, so the first election sees
	// everyone's data, then switch the mode.
	checkFor(t, 10*time.Second, 10*time.Millisecond, func() error {
		l := c.leader()
		for b := uint32(1); b <= 3; b++ {
			if !l.hb.primaryCandidate(b, time.Now()).Alive {
				return fmt.Errorf("broker %d not seen yet", b)
			}
		}
		return nil
	})
	if err := cl.SetClusterConfig(ctx, ctlapi.ClusterConfig{Groups: groups, Mode: ctlapi.ModeActivePassive}); err != nil {
		t.Fatal(err)
	}
	waitPrimary := func(not uint32, minEpoch uint32) (uint32, uint32) {
		t.Helper()
		var p, e uint32
		checkFor(t, 15*time.Second, 20*time.Millisecond, func() error {
			var addrs []string
			var err error
			p, e, addrs, err = cl.GetPrimary(ctxT(t, 5*time.Second), ctlapi.ReadConsistent)
			if err != nil {
				return err
			}
			if p == 0 || p == not || e < minEpoch {
				return fmt.Errorf("primary %d epoch %d", p, e)
			}
			if want := fmt.Sprintf("127.0.0.1:%d", 7400+p); len(addrs) != 1 || addrs[0] != want {
				return fmt.Errorf("primary %d addresses %v, want %s", p, addrs, want)
			}
			return nil
		})
		return p, e
	}
	p, e := waitPrimary(0, 1)
	if p != 3 || e != 1 {
		t.Fatalf("first primary %d epoch %d, want broker 3 (most data) at epoch 1", p, e)
	}
	// Broker 3 dies: broker 2, the next by data, takes over.
	hbs[3].halt()
	delete(hbs, 3)
	p, e = waitPrimary(3, 2)
	if p != 2 || e != 2 {
		t.Fatalf("second primary %d epoch %d, want 2/2", p, e)
	}
	// A handover is checked against the leader's heartbeat table, from a
	// client as in-process: broker 3 is known dead, so it is refused; with no preferred broker and a live
	// primary there is nothing to do.
	if _, err := cl.ElectPrimary(ctx, 3); err == nil {
		t.Fatal("client handover to a dead broker accepted")
	} else if re := (*ctlapi.ResultError)(nil); !errors.As(err, &re) || re.Code != ctlapi.CodeInvalid {
		t.Fatalf("client handover to a dead broker: %v", err)
	}
	if _, err := c.leader().ElectPrimaryNow(ctx, 3); err == nil {
		t.Fatal("handover to a dead broker accepted")
	} else if re := (*ctlapi.ResultError)(nil); !errors.As(err, &re) || re.Code != ctlapi.CodeInvalid {
		t.Fatalf("handover to a dead broker: %v", err)
	}
	if r, err := c.leader().ElectPrimaryNow(ctx, 0); err != nil || r.Value != 0 {
		t.Fatalf("election with a live primary: %+v %v", r, err)
	}
	// An admin handover to a live broker.
	if moved, err := cl.ElectPrimary(ctx, 1); err != nil || !moved {
		t.Fatalf("handover to broker 1: %v %v", moved, err)
	}
	p, e = waitPrimary(2, 3)
	if p != 1 || e != 3 {
		t.Fatalf("after handover %d epoch %d, want 1/3", p, e)
	}
	// The primary and the controller leader die together; the next leader
	// gives broker 1 one timeout, then moves the role to broker 2.
	hbs[1].halt()
	delete(hbs, 1)
	c.stop(c.leader().ID())
	p, e = waitPrimary(1, 4)
	if p != 2 {
		t.Fatalf("after leader loss primary %d epoch %d, want broker 2", p, e)
	}
	// Every controller holds the same primary.
	checkFor(t, 10*time.Second, 20*time.Millisecond, func() error {
		for id, n := range c.nodes {
			n.mu.RLock()
			np, ne := n.state.Primary()
			n.mu.RUnlock()
			if np != p || ne != e {
				return fmt.Errorf("controller %d holds primary %d/%d, leader says %d/%d", id, np, ne, p, e)
			}
		}
		return nil
	})
	// Back to active-active: no primary, a new epoch.
	if err := cl.SetClusterConfig(ctx, ctlapi.ClusterConfig{Groups: groups}); err != nil {
		t.Fatal(err)
	}
	if p2, e2, _, err := cl.GetPrimary(ctx, ctlapi.ReadConsistent); err != nil || p2 != 0 || e2 != e+1 {
		t.Fatalf("after switching to active-active: %d/%d %v, want 0/%d", p2, e2, err, e+1)
	}
}
