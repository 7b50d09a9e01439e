package shards

import (
	"io"
	"log/slog"
	"testing"
	"time"
)

func TestProducerTableSkipsRetries(t *testing.T) {
	var tb producerTable
	if tb.duplicate(7, 1) {
		t.Fatal("empty table calls a first publish a duplicate")
	}
	tb.note(7, 5)
	for seq, want := range map[uint64]bool{4: true, 5: true, 6: false} {
		if got := tb.duplicate(7, seq); got != want {
			t.Fatalf("producer 7 seq %d after 5: duplicate %v, want %v", seq, got, want)
		}
	}
	if tb.duplicate(8, 1) || tb.duplicate(0, 1) {
		t.Fatal("another producer, or none, taken for producer 7")
	}
	tb.note(0, 9) // no producer: nothing kept
	if len(tb.m) != 1 {
		t.Fatalf("%d producers kept, want 1", len(tb.m))
	}
	tb.note(7, 3) // never moves back
	if !tb.duplicate(7, 5) {
		t.Fatal("an older seq lowered the producer's mark")
	}
}

func TestProducerTableForgetsLeastRecentlyUsed(t *testing.T) {
	var tb producerTable
	for p := uint64(1); p <= ProducersPerQueueMax; p++ {
		tb.note(p, 10)
	}
	tb.note(1, 11) // producer 1 is now the most recent; 2 the oldest
	tb.note(ProducersPerQueueMax+1, 10)
	if len(tb.m) != ProducersPerQueueMax {
		t.Fatalf("%d producers kept, bound %d", len(tb.m), ProducersPerQueueMax)
	}
	if tb.duplicate(2, 10) {
		t.Fatal("the least recently used producer was kept")
	}
	if !tb.duplicate(1, 11) || !tb.duplicate(3, 10) || !tb.duplicate(ProducersPerQueueMax+1, 10) {
		t.Fatal("a recent producer was forgotten")
	}
}

// The check and the note of a known producer allocate nothing.
func TestProducerTableSteadyStateAllocs(t *testing.T) {
	var tb producerTable
	tb.note(42, 1)
	seq := uint64(1)
	allocs := testing.AllocsPerRun(1000, func() {
		seq++
		if !tb.duplicate(42, seq) {
			tb.note(42, seq)
		}
	})
	if allocs != 0 {
		t.Fatalf("%v allocations per publish", allocs)
	}
}

// ApplyEnqueue, the apply of a replicated queue's committed enqueue,
// skips a (producer, seq) it applied before, so every member that
// applies the same log keeps one copy.
func TestApplyEnqueueSkipsRetries(t *testing.T) {
	b := New(Config{Shards: 1, TickInterval: time.Hour, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err := b.Start(); err != nil {
		t.Fatal(err)
	}
	defer b.Stop()
	q, err := b.AddQueue("rq", QueueOptions{Durable: true}, nil, Placement{})
	if err != nil {
		t.Fatal(err)
	}
	var ready int
	err = b.Call(b.shards[0], func(sh *Shard) {
		index := uint64(1)
		for _, seq := range []uint64{5, 5, 4, 6, 6, 7} {
			sh.ApplyEnqueue(q, index, NewBody(nil, []byte("rq"), nil, []byte("m"), true), 0, 7, seq, 0)
			index++
		}
		// Another producer with the same numbers is its own.
		sh.ApplyEnqueue(q, index, NewBody(nil, []byte("rq"), nil, []byte("m"), true), 0, 8, 5, 0)
		ready = q.Ready()
	})
	if err != nil {
		t.Fatal(err)
	}
	if ready != 4 {
		t.Fatalf("%d messages ready, want 4 (seqs 5, 6, 7 of producer 7 and 5 of producer 8)", ready)
	}
	if d := b.Stats().Duplicates; d != 3 {
		t.Fatalf("%d duplicates counted, want 3", d)
	}
}
