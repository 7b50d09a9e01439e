package group

import "testing"

// TestLease: a master delivers only once the fence after its election has
// passed and while the controller's last confirmation of its epoch holds;
// a confirmation of an older epoch, or none, lets it deliver nothing.
func TestLease(t *testing.T) {
	m := New(Config{ID: 1, Replicas: []MemberID{1}, Lease: 10}, Base{}, nil, 0)
	m.SetTime(100)
	m.BecomeMaster(1, []MemberID{1})
	m.Ready()
	if !m.Serving() {
		t.Fatal("not serving")
	}
	m.Granted(1, 100)
	for _, c := range []struct {
		now  int64
		want bool
	}{{105, false}, {109, false}, {110, false}} {
		m.SetTime(c.now)
		if got := m.Delivering(); got != c.want {
			t.Fatalf("at %d: delivering %v, want %v", c.now, got, c.want)
		}
	}
	m.Granted(1, 108) // until 118
	for _, c := range []struct {
		now  int64
		want bool
	}{{110, true}, {117, true}, {118, false}} {
		m.SetTime(c.now)
		if got := m.Delivering(); got != c.want {
			t.Fatalf("at %d: delivering %v, want %v", c.now, got, c.want)
		}
	}
	m.Granted(1, 118)
	m.SetTime(120)
	if !m.Delivering() {
		t.Fatal("a renewed lease does not deliver")
	}
	m.Revoked()
	if m.Delivering() {
		t.Fatal("delivering after the controller did not confirm the epoch")
	}
	m.Granted(1, 120)
	m.SetTime(125)
	m.BecomeMaster(2, []MemberID{1}) // elected again: fenced anew, and the lease of epoch 1 does not count
	m.Ready()
	m.SetTime(129)
	if m.Delivering() {
		t.Fatal("delivering under the lease of an older epoch")
	}
	m.Granted(2, 129)
	m.SetTime(134)
	if m.Delivering() {
		t.Fatal("delivering before the fence after the election passed")
	}
	m.SetTime(135)
	if !m.Delivering() {
		t.Fatal("not delivering after the fence, with a lease")
	}
	// Without a lease configured, Serving is enough.
	n := New(Config{ID: 1, Replicas: []MemberID{1}}, Base{}, nil, 0)
	n.BecomeMaster(1, []MemberID{1})
	n.Ready()
	if !n.Delivering() {
		t.Fatal("without a lease, a serving master does not deliver")
	}
}
