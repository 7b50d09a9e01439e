package shards

import "testing"

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
