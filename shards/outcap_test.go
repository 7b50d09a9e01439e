package shards

import (
	"testing"

	"github.com/berthmq/berth/wire"
)

// TestOutMaxHoldsBackAndResumes drives one shard by hand: a session whose
// connection holds more than its OutMax gets nothing while another
// consumer of the queue gets every message; OnStall runs once for the
// stall; after the server clears the stall and sends OpResume, the held
// session is served again.
func TestOutMaxHoldsBackAndResumes(t *testing.T) {
	br := New(Config{Shards: 1})
	s := br.shards[0]
	q := NewQueue("q", QueueOptions{}, 0, &s.pool)
	s.queues.add(q)
	slowW, fastW := &discardWriter{}, &discardWriter{}
	stalls := 0
	slow := &Session{ID: 1, Version: wire.Current, FrameMax: wire.FrameSizeDefault, Out: slowW, OutMax: 4096,
		OnStall: func() { stalls++ }}
	fast := &Session{ID: 2, Version: wire.Current, FrameMax: wire.FrameSizeDefault, Out: fastW} // no cap
	s.handleCmd(Subscribe{Sess: slow, CmdID: 1, Queue: q, ConsumerID: 1, Credit: 1000, AckMode: wire.AckNone}.Command())
	s.handleCmd(Subscribe{Sess: fast, CmdID: 1, Queue: q, ConsumerID: 1, Credit: 1000, AckMode: wire.AckNone}.Command())
	publish := func(n int) {
		for i := 0; i < n; i++ {
			body := NewBody(nil, []byte("q"), nil, make([]byte, 100), false)
			s.handleCmd(Publish{Queue: q, Body: body, Now: 1}.Command())
		}
		s.dispatchDirty()
		s.flush()
	}
	slowCon, fastCon := s.consumers[consumerKey{slow, 1}], s.consumers[consumerKey{fast, 1}]

	// Under the cap, round robin.
	publish(10)
	if slowCon.credit != 995 || fastCon.credit != 995 {
		t.Fatalf("under the cap: credits %d and %d, want 995 each", slowCon.credit, fastCon.credit)
	}
	// The slow connection holds more than its cap: it gets nothing.
	slow.OutBuffered.Store(5000)
	publish(100)
	if slowCon.credit != 995 || fastCon.credit != 895 {
		t.Fatalf("over the cap: credits %d and %d, want 995 and 895", slowCon.credit, fastCon.credit)
	}
	if stalls != 1 || slow.StalledSince() == 0 {
		t.Fatalf("OnStall ran %d times, stalled since %d", stalls, slow.StalledSince())
	}
	// Alone on the queue, its messages wait for it.
	s.handleCmd(Cancel{Sess: fast, CmdID: 2, ConsumerID: 1}.Command())
	publish(20)
	if q.Ready() != 20 || slowCon.credit != 995 {
		t.Fatalf("held: %d ready, credit %d", q.Ready(), slowCon.credit)
	}
	// Drained: the server clears the stall and resumes the session.
	slow.OutBuffered.Store(0)
	slow.ClearStalled()
	s.handleCmd(Resume{Sess: slow}.Command())
	s.dispatchDirty()
	s.flush()
	if q.Ready() != 0 || slowCon.credit != 975 {
		t.Fatalf("resumed: %d ready, credit %d", q.Ready(), slowCon.credit)
	}
	// The cap counts what a cycle gathers too: one cycle hands a session
	// at most the cap and one message more.
	publish(100)
	if got := 975 - int(slowCon.credit); got < 1 || got*100 > 4096+200 {
		t.Fatalf("one cycle under a 4096-byte cap handed %d messages of 100 bytes", got)
	}
}
