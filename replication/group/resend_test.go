package group

import (
	"slices"
	"testing"
)

// TestSlowFollowerNotFlooded: a follower whose acknowledgements come
// slower than the ticks (a catch-up batch behind a busy disk) gets each
// entry about once, not the master's whole window again at every tick;
// and one that acknowledges gets the next batches at once rather than a
// tick later. The follower is not in the SyncStateSet (it is catching up;
// MinSync 1), so its acknowledgements move no commit index, whose news
// would also carry entries.
func TestSlowFollowerNotFlooded(t *testing.T) {
	cfg := func(id MemberID) Config {
		return Config{ID: id, Replicas: []MemberID{1, 2, 3}, LagTicks: 1000, MaxBatch: 8, MaxUncommitted: 100000, MinSync: 1}
	}
	m := New(cfg(1), Base{}, nil, 0)
	f := New(cfg(2), Base{}, nil, 0)
	m.BecomeMaster(1, []MemberID{1})
	f.BecomeFollower(1, 1)
	const n = 2000
	for i := range n {
		if _, err := m.Propose([]byte{byte(i)}); err != nil {
			t.Fatal(err)
		}
	}
	m.Persisted(m.LastIndex())
	sent := 0
	var inbox []Message // to the follower, not yet delivered
	collect := func() {
		for _, msg := range m.Ready().Messages {
			if msg.To == 2 {
				sent += len(msg.Entries)
				inbox = append(inbox, msg)
			}
		}
	}
	collect()
	// The follower is slow: 20 ticks pass before it reads anything.
	for range 20 {
		m.Tick()
		collect()
	}
	// Resent after 5 ticks without an answer, then 10: three windows.
	window := (inflightBatches + 1) * 8 // sending stops one batch past the window
	if sent > 3*window {
		t.Errorf("%d entries sent to a follower that acknowledged nothing over 20 ticks, want at most %d (a window resent every tick)", sent, 3*window)
	}
	// Now it answers everything that came; each answer should bring the
	// next batches without waiting for ticks.
	for round := 0; round < 1000 && f.LastIndex() < n; round++ {
		msgs := inbox
		inbox = nil
		for _, msg := range msgs {
			f.Step(msg)
		}
		rd := f.Ready()
		if len(rd.Persist) > 0 {
			f.Persisted(rd.Persist[len(rd.Persist)-1].Index)
		}
		for _, r := range append(rd.Messages, f.Ready().Messages...) {
			m.Step(r)
		}
		collect()
	}
	if f.LastIndex() != n {
		t.Fatalf("the follower holds %d of %d entries without any tick", f.LastIndex(), n)
	}
	if sent > n+3*window {
		t.Errorf("%d entries sent for %d", sent, n)
	}
}

// TestStaleSetDoesNotShrink: the controller's restatement of a set read
// before the master's grow was granted ([1 3]) arrives after the grant
// ([1 2 3]). The master must keep committing with member 2, which the
// controller may elect; it used to take the stale set and commit with 1
// and 3 only. Its own granted shrink still shrinks.
func TestStaleSetDoesNotShrink(t *testing.T) {
	cfg := Config{ID: 1, Replicas: []MemberID{1, 2, 3}, LagTicks: 1000}
	m := New(cfg, Base{}, nil, 0)
	m.BecomeMaster(1, []MemberID{1, 3})
	m.Ready()
	// Member 2 acknowledges everything (nothing yet): the master asks to
	// grow the set.
	m.Step(Message{Group: 0, Kind: MsgAppendResp, From: 2, To: 1, Epoch: 1, OK: true})
	rd := m.Ready()
	if rd.AlterSet == nil || !slices.Equal(rd.AlterSet.Set, []MemberID{1, 2, 3}) {
		t.Fatalf("no request to grow the set: %+v", rd.AlterSet)
	}
	m.AlterGranted(1, []MemberID{1, 2, 3}) // granted
	m.SetSyncStateSet(1, []MemberID{1, 3}) // stale restatement
	if got := m.SyncStateSet(); !slices.Equal(got, []MemberID{1, 2, 3}) {
		t.Fatalf("set after a stale restatement = %v, want [1 2 3]", got)
	}
	if _, err := m.Propose([]byte("x")); err != nil {
		t.Fatal(err)
	}
	m.Persisted(m.LastIndex())
	m.Step(Message{Group: 0, Kind: MsgAppendResp, From: 3, To: 1, Epoch: 1, OK: true, Match: 1, Last: 1})
	if m.Commit() != 0 {
		t.Fatalf("committed %d without member 2", m.Commit())
	}
	// Member 2 goes silent: the master asks to drop it, and the grant
	// shrinks the set.
	for range cfg.LagTicks + 2 {
		m.Tick()
		m.Step(Message{Group: 0, Kind: MsgAppendResp, From: 3, To: 1, Epoch: 1, OK: true, Match: 1, Last: 1})
	}
	rd = m.Ready()
	if rd.AlterSet == nil || !slices.Equal(rd.AlterSet.Set, []MemberID{1, 3}) || !slices.Equal(rd.AlterSet.From, []MemberID{1, 3}) {
		t.Fatalf("no request to drop the silent member from the set last heard: %+v", rd.AlterSet)
	}
	// A restatement of that set does not shrink it; the grant does.
	m.SetSyncStateSet(1, []MemberID{1, 3})
	if got := m.SyncStateSet(); !slices.Equal(got, []MemberID{1, 2, 3}) {
		t.Fatalf("set after a restatement = %v, want [1 2 3] until the grant", got)
	}
	m.AlterGranted(1, []MemberID{1, 3})
	if got := m.SyncStateSet(); !slices.Equal(got, []MemberID{1, 3}) {
		t.Fatalf("set after its own shrink was granted = %v, want [1 3]", got)
	}
}
