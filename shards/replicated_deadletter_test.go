package shards

import (
	"slices"
	"testing"

	"github.com/berthmq/berth/wire"
)

// roleReplicator is a journalReplicator whose broker is the group's
// master or not, as the test says, and that records the removals it
// takes.
type roleReplicator struct {
	journalReplicator
	master  bool
	removes [][]uint64
}

func (r *roleReplicator) IsMaster(uint32) bool { return r.master }

// Delivering: the master holds its lease throughout.
func (r *roleReplicator) Delivering(uint32) bool { return r.master }

func (r *roleReplicator) ProposeRemoves(_ *Queue, seqs []uint64, done func(error)) error {
	r.removes = append(r.removes, slices.Clone(seqs))
	if done != nil {
		done(nil)
	}
	return nil
}

// TestReplicatedDeadLettersOnlyAtMaster: a replicated queue with a
// dead-letter exchange, on a follower and then on the master of its
// group. A follower's tick does not expire its copy of a message whose
// TTL ran out, and a follower that drops a message applying the log (a
// drop-head) does not dead-letter it: only the master dead-letters, and
// proposes the removal, so the group dead-letters each message once.
// Before, every member expired its copy on its own tick and dead-lettered
// it, and a replicated dead-letter queue got up to one copy per member.
func TestReplicatedDeadLettersOnlyAtMaster(t *testing.T) {
	s, q, _ := replicatedShard(t, 0)
	r := &roleReplicator{journalReplicator: journalReplicator{sh: s}}
	s.broker.SetReplicator(r)
	dlq := NewQueue("dlq", QueueOptions{}, 0, &s.pool)
	s.queues.add(dlq)
	s.broker.SetHooks(Hooks{Router: &dlxRouter{dlq}})
	q.Options.DeadLetterExchange = "dlx"
	body := func(p string) *Body { return NewBody(nil, []byte("rq"), nil, []byte(p), true) }

	// A follower: the message expires, and stays.
	s.ApplyEnqueue(q, 1, body("expires"), s.now+1, 0, 0, 0)
	s.ApplyEnqueue(q, 2, body("stays"), 0, 0, 0, 0)
	s.now += 2
	s.tick()
	s.dispatchDirty()
	s.flushRemoves()
	if q.Ready() != 2 || dlq.Ready() != 0 || len(r.removes) != 0 {
		t.Fatalf("follower's tick: source %d ready (want 2), %d dead letters (want 0), %d removals proposed (want 0)", q.Ready(), dlq.Ready(), len(r.removes))
	}

	// It becomes master (Broker.GroupMastered tells the shard, in ring
	// order, and marks the queue): the expired message is dead-lettered
	// once, and its removal proposed.
	r.master = true
	s.setMastered(q.group, true)
	s.markDirty(q)
	s.dispatchDirty()
	s.tick()
	s.flushRemoves()
	if q.Ready() != 1 || dlq.Ready() != 1 || !slices.Equal(slices.Concat(r.removes...), []uint64{1}) {
		t.Fatalf("master: source %d ready (want 1), %d dead letters (want 1), removals %v (want [1])", q.Ready(), dlq.Ready(), r.removes)
	}

	// A drop-head applied from the log: on a follower the dropped
	// message is not dead-lettered, on the master it is.
	q.Options.MaxLength, q.Options.Overflow = 1, wire.OverflowDropHead
	r.master, r.removes = false, nil
	s.setMastered(q.group, false)
	s.ApplyEnqueue(q, 3, body("drops 2"), 0, 0, 0, 0)
	if q.Ready() != 1 || dlq.Ready() != 1 {
		t.Fatalf("follower's drop-head: source %d ready (want 1), %d dead letters (want 1)", q.Ready(), dlq.Ready())
	}
	r.master = true
	s.setMastered(q.group, true)
	s.ApplyEnqueue(q, 4, body("drops 3"), 0, 0, 0, 0)
	s.flushRemoves()
	if q.Ready() != 1 || dlq.Ready() != 2 || !slices.Equal(slices.Concat(r.removes...), []uint64{3}) {
		t.Fatalf("master's drop-head: source %d ready (want 1), %d dead letters (want 2), removals %v (want [3])", q.Ready(), dlq.Ready(), r.removes)
	}
}
