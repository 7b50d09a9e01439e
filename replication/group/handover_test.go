package group

import (
	"errors"
	"testing"
)

// TestHandoverPause: while a master hands its group over it refuses
// proposals with ErrHandover; HandoverReady holds once the target has
// acknowledged the whole log durably and it is committed; the pause ends
// with EndHandover, with its tick bound, and with a step-down; and only a
// member of the SyncStateSet can be the target.
func TestHandoverPause(t *testing.T) {
	cfg := func(id MemberID) Config {
		return Config{ID: id, Replicas: []MemberID{1, 2, 3}, LagTicks: 1000, MaxBatch: 64, MaxUncommitted: 1000}
	}
	m := New(cfg(1), Base{}, nil, 0)
	f := New(cfg(2), Base{}, nil, 0)
	m.BecomeMaster(1, []MemberID{1, 2})
	f.BecomeFollower(1, 1)
	// exchange runs master and follower to quiescence: persisted at once,
	// every message delivered. A Ready's slices are reused by the next
	// call but one, so each is copied before the next Ready.
	exchange := func() {
		for range 100 {
			moved := false
			rd := m.Ready()
			if len(rd.Persist) > 0 {
				m.Persisted(rd.Persist[len(rd.Persist)-1].Index)
				moved = true
			}
			msgs := append([]Message(nil), rd.Messages...)
			msgs = append(msgs, m.Ready().Messages...)
			for _, msg := range msgs {
				if msg.To == 2 {
					f.Step(msg)
					moved = true
				}
			}
			frd := f.Ready()
			if len(frd.Persist) > 0 {
				f.Persisted(frd.Persist[len(frd.Persist)-1].Index)
			}
			fmsgs := append([]Message(nil), frd.Messages...)
			for _, msg := range append(fmsgs, f.Ready().Messages...) {
				m.Step(msg)
				moved = true
			}
			if !moved {
				return
			}
		}
	}
	for i := range 10 {
		if _, err := m.Propose([]byte{byte(i)}); err != nil {
			t.Fatal(err)
		}
	}
	if err := m.BeginHandover(3, 10); err == nil {
		t.Fatal("a handover to member 3, outside the SyncStateSet, was begun")
	}
	if err := m.BeginHandover(1, 10); err == nil {
		t.Fatal("a handover to the master itself was begun")
	}
	if err := f.BeginHandover(1, 10); !errors.Is(err, ErrNotMaster) {
		t.Fatalf("a follower began a handover: %v", err)
	}
	if err := m.BeginHandover(2, 10); err != nil {
		t.Fatal(err)
	}
	if _, err := m.Propose([]byte("x")); !errors.Is(err, ErrHandover) {
		t.Fatalf("a proposal during the handover: %v, want ErrHandover", err)
	}
	if ok, _, _ := m.HandoverReady(); ok {
		t.Fatal("ready before the follower acknowledged anything")
	}
	exchange()
	ok, epoch, index := m.HandoverReady()
	if !ok || epoch != 1 || index != 10 || f.Durable() != 10 {
		t.Fatalf("after the exchange: ready %v at %d/%d, follower durable to %d; want ready at 1/10 with 10", ok, epoch, index, f.Durable())
	}
	m.EndHandover()
	if _, err := m.Propose([]byte("y")); err != nil {
		t.Fatalf("a proposal after EndHandover: %v", err)
	}
	// The bound: 5 ticks.
	if err := m.BeginHandover(2, 5); err != nil {
		t.Fatal(err)
	}
	for range 4 {
		m.Tick()
	}
	if !m.HandingOver() {
		t.Fatal("the pause ended before its bound")
	}
	m.Tick()
	if m.HandingOver() {
		t.Fatal("the pause outlived its bound")
	}
	if _, err := m.Propose([]byte("z")); err != nil {
		t.Fatalf("a proposal after the pause's bound: %v", err)
	}
	// With HandoverHolds, only what it names is held back.
	m.cfg.HandoverHolds = func(data []byte) bool { return len(data) > 0 && data[0] == 'e' }
	if err := m.BeginHandover(2, 100); err != nil {
		t.Fatal(err)
	}
	if _, err := m.Propose([]byte("e1")); !errors.Is(err, ErrHandover) {
		t.Fatalf("an enqueue during the handover: %v, want ErrHandover", err)
	}
	if _, err := m.Propose([]byte("r1")); err != nil {
		t.Fatalf("a removal during the handover: %v, want it taken", err)
	}
	m.EndHandover()
	m.cfg.HandoverHolds = nil
	// A step-down ends it too, and a later mastership starts unpaused.
	if err := m.BeginHandover(2, 100); err != nil {
		t.Fatal(err)
	}
	m.BecomeFollower(2, 2)
	if m.HandingOver() {
		t.Fatal("a member that stepped down is still handing over")
	}
	m.BecomeMaster(3, []MemberID{1, 2})
	if _, err := m.Propose([]byte("w")); err != nil {
		t.Fatalf("a proposal of the next mastership: %v", err)
	}
}
