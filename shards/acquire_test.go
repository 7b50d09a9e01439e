package shards

import (
	"reflect"
	"testing"

	"github.com/berthmq/berth/wire"
)

// TestReplicatedDeliveryWaitsForAcquires drives a shard that is master
// of a replicated queue's group, with the acquires events held by the
// test: a delivery goes out only once the acquires event that records it
// commits; one whose event failed goes back to the queue with its
// delivery count unchanged and its credit returned (and its followers
// are told, unseen), and is handed out again under a new event; a
// cancelled consumer's held deliveries go
// back and never go out; an auto-ack consumer's message leaves the queue
// (and its removal is proposed) only once its acquires event committed.
func TestReplicatedDeliveryWaitsForAcquires(t *testing.T) {
	s, q, _ := replicatedShard(t, 0)
	r := &roleReplicator{journalReplicator: journalReplicator{sh: s, holdAcquires: true}, master: true}
	s.broker.SetReplicator(r)
	groupMastered(q.group)(s)
	w := &captureWriter{}
	sess := &Session{ID: 1, Version: wire.Current, FrameMax: wire.FrameSizeDefault, Out: w}
	s.handleCmd(Subscribe{Sess: sess, CmdID: 1, Queue: q, ConsumerID: 1, Credit: 2}.Command())
	body := func(p string) *Body { return NewBody(nil, []byte("rq"), nil, []byte(p), true) }
	batch := func(f func()) []wire.DeliverMessage {
		f()
		s.dispatchDirty()
		s.flushRemoves()
		s.flush()
		return w.take(t)
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
	payloads := func(ds []wire.DeliverMessage) []string {
		var out []string
		for _, d := range ds {
			out = append(out, string(d.Payload))
		}
		return out
	}

	if got := batch(func() { s.ApplyEnqueue(q, 1, body("a"), 0, 0, 0, 0); s.ApplyEnqueue(q, 2, body("b"), 0, 0, 0, 0) }); len(got) != 0 {
		t.Fatalf("delivered %v before their acquires event committed", payloads(got))
	}
	if want := [][]uint64{{1, 2}}; !reflect.DeepEqual(r.acquires, want) {
		t.Fatalf("acquires proposed %v, want %v", r.acquires, want)
	}
	if got := batch(func() { commit(nil) }); !reflect.DeepEqual(payloads(got), []string{"a", "b"}) {
		t.Fatalf("after the commit: delivered %v, want a, b", payloads(got))
	}

	// Credit for one more; its event fails, then a second one commits.
	s.handleCmd(Credit{Sess: sess, ConsumerID: 1, Credit: 1}.Command())
	if got := batch(func() { s.ApplyEnqueue(q, 3, body("c"), 0, 0, 0, 0) }); len(got) != 0 {
		t.Fatalf("delivered %v before its acquires event committed", payloads(got))
	}
	if got := batch(func() { commit(Errorf(wire.CodeUnavailable, "lost by the test")) }); len(got) != 0 {
		t.Fatalf("delivered %v whose acquires event failed", payloads(got))
	}
	if q.Acquired(3) != nil {
		// The batch dispatched it again at once (the credit came back),
		// under a new event.
		if want := [][]uint64{{1, 2}, {3}, {3}}; !reflect.DeepEqual(r.acquires, want) {
			t.Fatalf("acquires proposed %v, want %v", r.acquires, want)
		}
	} else {
		t.Fatal("the message whose acquires event failed was not handed out again")
	}
	got := batch(func() { commit(nil) })
	if !reflect.DeepEqual(payloads(got), []string{"c"}) || got[0].DeliveryCount != 0 || got[0].Flags&wire.MsgRedelivered != 0 {
		t.Fatalf("after the second event: %+v, want c with no count and no flag", got)
	}

	// A cancel while a delivery is held: it goes back, and never out.
	s.handleCmd(Credit{Sess: sess, ConsumerID: 1, Credit: 1}.Command())
	batch(func() { s.ApplyEnqueue(q, 4, body("d"), 0, 0, 0, 0) })
	s.handleCmd(Cancel{Sess: sess, ConsumerID: 1}.Command())
	if got := batch(func() { commit(nil) }); len(got) != 0 {
		t.Fatalf("delivered %v to a cancelled consumer", payloads(got))
	}
	if q.Ready() != 1 || q.Acquired(4) != nil {
		t.Fatalf("after the cancel: %d ready, acquired %v; want d ready", q.Ready(), q.Acquired(4) != nil)
	}
	// Its followers put it back too, unseen; and the one whose event
	// failed before (it may have committed).
	if want := []releaseEvent{{[]uint64{3}, true}, {[]uint64{4}, true}}; !reflect.DeepEqual(r.releases, want) {
		t.Fatalf("releases proposed %v, want %v", r.releases, want)
	}

	// An auto-ack consumer: the message stays (acquired) until its event
	// commits, then leaves, and its removal is proposed.
	r.removes = nil
	s.handleCmd(Subscribe{Sess: sess, CmdID: 2, Queue: q, ConsumerID: 2, Credit: 5, AckMode: wire.AckNone}.Command())
	batch(func() {})
	if q.Acquired(4) == nil || len(r.removes) != 0 {
		t.Fatalf("an auto-ack delivery before its event committed: acquired %v, removes %v; want acquired, none", q.Acquired(4) != nil, r.removes)
	}
	got = batch(func() { commit(nil) })
	if !reflect.DeepEqual(payloads(got), []string{"d"}) || q.Acquired(4) != nil || q.Depth() != 3 {
		t.Fatalf("after the commit: delivered %v, depth %d; want d, and a, b, c left unsettled", payloads(got), q.Depth())
	}
	if want := [][]uint64{{4}}; !reflect.DeepEqual(r.removes, want) {
		t.Fatalf("removes proposed %v, want %v", r.removes, want)
	}
	if st := s.stats; st.AcquiresEvents != uint64(len(r.acquires)) || st.ReleasesEvents != uint64(len(r.releases)) {
		t.Fatalf("counted %d acquires and %d releases events; %d and %d were proposed", st.AcquiresEvents, st.ReleasesEvents, len(r.acquires), len(r.releases))
	}
}
