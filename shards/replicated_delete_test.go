package shards

import (
	"slices"
	"testing"
	"time"

	"github.com/berthmq/berth/wire"
)

// skipRecorder is a refusingReplicator that records the enqueues the
// shard reports as having no effect (Skipped).
type skipRecorder struct {
	refusingReplicator
	skipped []uint64
}

func (r *skipRecorder) Skipped(_ *Queue, seq uint64) { r.skipped = append(r.skipped, seq) }

// TestDeletedReplicatedQueueReleasesLog: what a deleted replicated
// queue's group log entries need to be forgotten, so that compaction
// passes them, at the shard. The master's removals of the messages it
// dropped, which the group did not take at once, are proposed again
// like any others (before, a deleted queue's were dropped, and the
// master's log kept their enqueues); an enqueue that commits after the
// master dropped the queue is reported as having no effect (before, it
// was dropped without a word); and a follower's copy, dropped when the
// deletion commits, tells the Seqs of the messages it still held, ready
// and delayed.
func TestDeletedReplicatedQueueReleasesLog(t *testing.T) {
	s, q, _ := replicatedShard(t, 0)
	r := &skipRecorder{refusingReplicator: refusingReplicator{journalReplicator: journalReplicator{sh: s}, refuse: 1, code: wire.CodeUnavailable}}
	s.broker.SetReplicator(r)
	s.setMastered(q.group, true) // this broker masters q's group (Broker.GroupMastered)
	body := func() *Body { return NewBody(nil, []byte("rq"), nil, []byte("m"), true) }
	for seq := uint64(1); seq <= 3; seq++ {
		s.ApplyEnqueue(q, seq, body(), 0, 0, 0, 0)
	}
	s.dropQueue(q) // proposes the removals: refused for now
	if len(r.taken) != 0 {
		t.Fatalf("removals taken while refused: %v", r.taken)
	}
	s.flushRemoves()
	if got := slices.Concat(r.taken...); !slices.Equal(got, []uint64{1, 2, 3}) {
		t.Fatalf("removals of the deleted queue's messages proposed again: %v, want [1 2 3]", got)
	}
	if len(s.removing) != 0 {
		t.Fatalf("%d queues still listed with removals", len(s.removing))
	}
	s.ApplyEnqueue(q, 4, body(), 0, 0, 0, 0)
	if !slices.Equal(r.skipped, []uint64{4}) || q.Depth() != 0 {
		t.Fatalf("an enqueue committed after the deletion: skipped %v (want [4]), depth %d", r.skipped, q.Depth())
	}

	// A follower's copy.
	f := NewQueue("rf", QueueOptions{Durable: true}, 0, &s.pool)
	f.replicated, f.group = true, 1
	s.queues.add(f)
	s.ApplyEnqueue(f, 5, body(), 0, 0, 0, 0)
	delayed := body()
	delayed.DeliverAt = s.now + int64(time.Hour)
	s.ApplyEnqueue(f, 6, delayed, 0, 0, 0, 0)
	s.ApplyEnqueue(f, 7, body(), 0, 0, 0, 0)
	var seqs []uint64
	s.dropQueueSeqs(f, &seqs)
	slices.Sort(seqs)
	if !slices.Equal(seqs, []uint64{5, 6, 7}) {
		t.Fatalf("the dropped copy's messages: %v, want [5 6 7]", seqs)
	}
}
