package group

import "testing"

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
