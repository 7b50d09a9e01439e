package shards

import (
	"testing"
)

// TestReplEnqueueKeepsClock: a committed enqueue pushed onto the ring
// (TryApplyEnqueue) carries no time, so the shard's clock stays where it
// was, whatever the producer's sequence number.
func TestReplEnqueueKeepsClock(t *testing.T) {
	br := New(Config{Shards: 1})
	s := br.shards[0]
	q := NewQueue("q", QueueOptions{}, 0, &s.pool)
	s.queues.add(q)
	before := s.now
	c := applyEnqueueCmd(q, 1, NewBody(nil, []byte("q"), nil, []byte("m"), false), 0, 7, 1<<62, 0)
	s.handle(&c)
	if q.Depth() != 1 {
		t.Fatalf("depth %d after the enqueue, want 1", q.Depth())
	}
	if s.now != before {
		t.Fatalf("the shard's clock moved from %d to %d on an enqueue that carries no time", before, s.now)
	}
}
