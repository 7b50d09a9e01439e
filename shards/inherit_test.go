package shards

import (
	"testing"

	"github.com/berthmq/berth/wire"
)

// TestNewMasterDeliversOnlyWhatItInherited drives one shard as the node
// feeds a broker that was just elected master of a replicated queue's
// group: the node's view (the Replicator's IsMaster and Delivering)
// already says master, while the shard's ring still holds the entries
// the new master inherited: an enqueue, then the removal of that message
// (a consumer's accept that completed under the old master), then
// another enqueue, then GroupMastered. The shard takes them a batch at a
// time and dispatches after each. It must deliver nothing before it took
// GroupMastered, so the accepted message is never handed out again; what
// it delivers after that is flagged redelivered, since the old master may
// have delivered it. Before, a shard dispatched on the node's view alone:
// the first batch handed the accepted message out again, unflagged
// (the long chaos run's "delivered again without the redelivered flag,
// after its accept completed").
func TestNewMasterDeliversOnlyWhatItInherited(t *testing.T) {
	s, q, _ := replicatedShard(t, 0)
	r := &roleReplicator{master: true} // the node's view: master, holding its lease
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
	if got := batch(func() { s.ApplyRemove(q, 1) }); len(got) != 0 {
		t.Fatalf("delivered %q before the shard applied what its master inherited", got[0].Payload)
	}
	if got := batch(func() { s.ApplyEnqueue(q, 2, body("inherited"), 0, 0, 0, 0) }); len(got) != 0 {
		t.Fatalf("delivered %q before the shard applied what its master inherited", got[0].Payload)
	}
	// Broker.GroupMastered's call, as the shard runs it from its ring.
	got := batch(func() { groupMastered(q.group)(s) })
	if len(got) != 1 || string(got[0].Payload) != "inherited" {
		t.Fatalf("after GroupMastered: %d deliveries, want the one message left", len(got))
	}
	if got[0].Flags&wire.MsgRedelivered == 0 {
		t.Fatal("an inherited message was delivered without the redelivered flag")
	}
	if got := batch(func() { s.ApplyEnqueue(q, 3, body("new"), 0, 0, 0, 0) }); len(got) != 1 || got[0].Flags&wire.MsgRedelivered != 0 {
		t.Fatalf("a message enqueued after the election: %d deliveries (want 1), flags %v (want not redelivered)", len(got), got)
	}

	// A step-down (Broker.ResetGroup) clears it again: the node's view
	// saying master is not enough until the next GroupMastered.
	resetGroup(q.group)(s)
	if got := batch(func() { s.ApplyEnqueue(q, 4, body("after the step-down"), 0, 0, 0, 0) }); len(got) != 0 {
		t.Fatalf("delivered %q after a step-down, before the next GroupMastered", got[0].Payload)
	}
}
