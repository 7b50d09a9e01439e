package shards

import (
	"github.com/berthmq/berth/replication/event"
	"reflect"
	"testing"

	"github.com/berthmq/berth/wire"
)

// TestNewMasterDeliversOnlyWhatItInherited drives one shard as the node
// feeds a broker that was just elected master of a replicated queue's
// group: the node's view (the Replicator's IsMaster and Delivering)
// already says master, while the shard's ring still holds the entries
// the new master inherited: an enqueue, then the removal of that message
// (a consumer's accept that completed under the old master), then
// an enqueue the old master handed out (its acquires event) and nobody
// settled, an enqueue nobody was handed, then GroupMastered. The shard
// takes them a batch at a time and dispatches after each. It must
// deliver nothing before it took GroupMastered, so the accepted message
// is never handed out again. After that, the message the old master
// handed out comes back flagged redelivered with a delivery count of
// one, and the one nobody was handed is delivered unflagged (acquire.go:
// acquisitions are in the log). Before, a shard dispatched on the node's
// view alone: the first batch handed the accepted message out again,
// unflagged (the long chaos run's "delivered again without the
// redelivered flag, after its accept completed"). Before acquires
// events, every inherited message was flagged, seen or not.
func TestNewMasterDeliversOnlyWhatItInherited(t *testing.T) {
	s, q, _ := replicatedShard(t, 0)
	r := &roleReplicator{journalReplicator: journalReplicator{sh: s}, master: true} // the node's view: master, holding its lease
	s.broker.SetReplicator(r)
	w := &captureWriter{}
	sess := &Session{ID: 1, Version: wire.Current, FrameMax: wire.FrameSizeDefault, Out: w}
	s.handleCmd(Subscribe{Sess: sess, CmdID: 1, Queue: q, ConsumerID: 1, Credit: 10}.Command())
	body := func(p string) *Body { return NewBody(nil, []byte("rq"), nil, []byte(p), true) }
	batch := func(f func()) []wire.DeliverMessage {
		f()
		s.dispatchDirty()
		s.flushRemoves()
		s.flush()
		return w.take(t)
	}

	if got := batch(func() { s.ApplyEnqueue(q, 1, body("accepted under the old master"), 0, 0, 0, 0) }); len(got) != 0 {
		t.Fatalf("delivered %q before the shard applied what its master inherited", got[0].Payload)
	}
	if got := batch(func() { s.ApplyAcquires(q, []uint64{1}, 0, event.Stamp{}); s.ApplyRemove(q, 1) }); len(got) != 0 {
		t.Fatalf("delivered %q before the shard applied what its master inherited", got[0].Payload)
	}
	if got := batch(func() {
		s.ApplyEnqueue(q, 2, body("handed out"), 0, 0, 0, 0)
		s.ApplyAcquires(q, []uint64{2}, 0, event.Stamp{})
	}); len(got) != 0 {
		t.Fatalf("delivered %q before the shard applied what its master inherited", got[0].Payload)
	}
	if got := batch(func() { s.ApplyEnqueue(q, 3, body("never handed out"), 0, 0, 0, 0) }); len(got) != 0 {
		t.Fatalf("delivered %q before the shard applied what its master inherited", got[0].Payload)
	}
	// Broker.GroupMastered's call, as the shard runs it from its ring.
	got := batch(func() { groupMastered(q.group)(s) })
	if len(got) != 2 || string(got[0].Payload) != "handed out" || string(got[1].Payload) != "never handed out" {
		t.Fatalf("after GroupMastered: %d deliveries, want the two messages left in order", len(got))
	}
	if got[0].Flags&wire.MsgRedelivered == 0 || got[0].DeliveryCount != 1 {
		t.Fatalf("a message the old master handed out: flags %#x, delivery count %d; want redelivered, 1", got[0].Flags, got[0].DeliveryCount)
	}
	if got[1].Flags&wire.MsgRedelivered != 0 || got[1].DeliveryCount != 0 {
		t.Fatalf("a message nobody was handed: flags %#x, delivery count %d; want not redelivered, 0", got[1].Flags, got[1].DeliveryCount)
	}
	if s.stats.Inherited != 1 {
		t.Fatalf("counted %d inherited redeliveries, want 1", s.stats.Inherited)
	}
	if got := batch(func() { s.ApplyEnqueue(q, 4, body("new"), 0, 0, 0, 0) }); len(got) != 1 || got[0].Flags&wire.MsgRedelivered != 0 {
		t.Fatalf("a message enqueued after the election: %d deliveries (want 1), flags %v (want not redelivered)", len(got), got)
	}
	if want := [][]uint64{{2, 3}, {4}}; !reflect.DeepEqual(r.acquires, want) {
		t.Fatalf("the new master proposed acquires %v, want %v", r.acquires, want)
	}

	// A step-down (Broker.ResetGroup) clears it again: the node's view
	// saying master is not enough until the next GroupMastered.
	resetGroup(q.group)(s)
	if got := batch(func() { s.ApplyEnqueue(q, 5, body("after the step-down"), 0, 0, 0, 0) }); len(got) != 0 {
		t.Fatalf("delivered %q after a step-down, before the next GroupMastered", got[0].Payload)
	}
}
