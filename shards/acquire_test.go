package shards

import (
	"reflect"
	"testing"

	"github.com/berthmq/berth/wire"
)

// TestReplicatedDeliveryWaitsForAcquires drives a shard that is master
// of a replicated queue's group, with the acquires events held by the
// test. A new master's first deliveries go out only once the acquires
// event that records them commits; that event declares a window (what
// the consumers may hold), within which later deliveries go out at once,
// recorded by the next event, and beyond which they are held again. A
// delivery sent at once whose event failed is proposed again at the next
// tick; one held whose event failed goes back to the queue, its credit
// returned. An auto-ack delivery sent at once leaves the queue at once.
// Two ticks with nothing sent shrink the window to 0 by an empty event.
func TestReplicatedDeliveryWaitsForAcquires(t *testing.T) {
	s, q, _ := replicatedShard(t, 0)
	r := &roleReplicator{journalReplicator: journalReplicator{sh: s, holdAcquires: true}, master: true}
	s.broker.SetReplicator(r)
	groupMastered(q.group)(s)
	w := &captureWriter{}
	sess := &Session{ID: 1, Version: wire.Current, FrameMax: wire.FrameSizeDefault, Out: w}
	s.handleCmd(Subscribe{Sess: sess, CmdID: 1, Queue: q, ConsumerID: 1, Credit: 2}.Command())
	body := func(p string) *Body { return NewBody(nil, []byte("rq"), nil, []byte(p), true) }
	batch := func(f func()) []string {
		f()
		s.dispatchDirty()
		s.flushRemoves()
		s.flush()
		var out []string
		for _, d := range w.take(t) {
			out = append(out, string(d.Payload))
		}
		return out
	}
	commit := func(err error) {
		t.Helper()
		if len(r.acqTags) == 0 {
			t.Fatal("no acquires event waits")
		}
		tag := r.acqTags[0]
		r.acqTags = r.acqTags[1:]
		s.acquired(tag, err)
	}
	check := func(what string, got, want []string) {
		t.Helper()
		if !reflect.DeepEqual(got, want) {
			t.Fatalf("%s: delivered %v, want %v", what, got, want)
		}
	}
	enqueue := func(seq uint64, p string) func() { return func() { s.ApplyEnqueue(q, seq, body(p), 0, 0, 0, 0) } }

	// A new master holds: its window is 0 until its first event commits.
	check("before the first event committed", batch(func() { enqueue(1, "a")(); enqueue(2, "b")() }), nil)
	check("after it committed", batch(func() { commit(nil) }), []string{"a", "b"})
	if want := [][]uint64{{1, 2}}; !reflect.DeepEqual(r.acquires, want) || r.windows[0] != 2 {
		t.Fatalf("acquires proposed %v with windows %v; want %v, the first with window 2 (2 unsettled, no credit)", r.acquires, r.windows, want)
	}

	// Within the window: at once. Its event fails: it went out, so its
	// acquisition is proposed again at the next tick.
	s.handleCmd(Credit{Sess: sess, ConsumerID: 1, Credit: 1}.Command())
	check("within the window", batch(enqueue(3, "c")), []string{"c"})
	check("its event failed", batch(func() { commit(Errorf(wire.CodeUnavailable, "lost by the test")) }), nil)
	if q.Acquired(3) == nil {
		t.Fatal("a message sent at once went back to the queue when its event failed")
	}
	batch(s.tick)
	if want := [][]uint64{{1, 2}, {3}, {3}}; !reflect.DeepEqual(r.acquires, want) {
		t.Fatalf("acquires proposed %v, want %v", r.acquires, want)
	}
	check("proposed again, committed", batch(func() { commit(nil) }), nil)

	// Beyond the window (3 now: 3 unsettled, no credit): held, and held
	// ones keep later ones from going at once.
	s.handleCmd(Credit{Sess: sess, ConsumerID: 1, Credit: 4}.Command())
	check("three within the window, one beyond", batch(func() { enqueue(4, "d")(); enqueue(5, "e")(); enqueue(6, "f")(); enqueue(7, "g")() }), []string{"d", "e", "f"})
	check("after their event committed", batch(func() { commit(nil) }), []string{"g"})

	// A held delivery whose event failed goes back with its credit, and
	// is handed out again.
	s.handleCmd(Credit{Sess: sess, ConsumerID: 1, Credit: 1}.Command())
	r.windows = r.windows[:0]
	for range 2 {
		batch(s.tick) // the window shrinks to 0 (the empty event commits)
	}
	check("the shrink's event", batch(func() { commit(nil) }), nil)
	if n := len(r.acquires); len(r.acquires[n-1]) != 0 || r.windows[len(r.windows)-1] != 0 {
		t.Fatalf("after two idle ticks: last acquires %v with window %v; want an empty one with window 0", r.acquires[n-1], r.windows)
	}
	check("held (window 0)", batch(enqueue(8, "h")), nil)
	check("its event failed", batch(func() { commit(Errorf(wire.CodeUnavailable, "lost by the test")) }), nil)
	// The credit came back, so the batch handed it out again, held
	// under a new event.
	if q.Acquired(8) == nil {
		t.Fatal("the held delivery whose event failed was not handed out again")
	}
	check("handed out again", batch(func() { commit(nil) }), []string{"h"})

	// An auto-ack consumer within the window: the message leaves the
	// queue at once, its removal proposed in the same batch.
	r.removes = nil
	s.handleCmd(Subscribe{Sess: sess, CmdID: 2, Queue: q, ConsumerID: 2, Credit: 5, AckMode: wire.AckNone}.Command())
	check("auto-ack", batch(enqueue(9, "i")), []string{"i"})
	if q.Acquired(9) != nil || len(r.removes) != 1 || r.removes[0][0] != 9 {
		t.Fatalf("an auto-ack delivery sent at once: acquired %v, removes %v; want gone, [[9]]", q.Acquired(9) != nil, r.removes)
	}
	if st := s.stats; st.AcquiresEvents != uint64(len(r.acquires)) || st.ReleasesEvents != uint64(len(r.releases)) {
		t.Fatalf("counted %d acquires and %d releases events; %d and %d were proposed", st.AcquiresEvents, st.ReleasesEvents, len(r.acquires), len(r.releases))
	}
}
