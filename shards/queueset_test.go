package shards

import (
	"math/rand/v2"
	"testing"
)

// TestQueueSetModel runs random adds and removes against a Go map, through
// growth and shrinking, and compares membership, the count and what all
// yields after every step.
func TestQueueSetModel(t *testing.T) {
	seed := rand.Uint64()
	rng := rand.New(rand.NewPCG(seed, 0))
	pool := make([]*Queue, 3000)
	for i := range pool {
		pool[i] = &Queue{}
	}
	var s queueSet
	ref := map[*Queue]bool{}
	for step := range 60_000 {
		// Phases that grow the set, then drain it, so the table doubles
		// and halves several times.
		grow := step/10_000%2 == 0
		q := pool[rng.IntN(len(pool))]
		switch r := rng.IntN(10); {
		case r < 6 == grow:
			s.add(q)
			ref[q] = true
		default:
			s.remove(q)
			delete(ref, q)
		}
		if s.len() != len(ref) {
			t.Fatalf("seed %d step %d: len %d, want %d", seed, step, s.len(), len(ref))
		}
		probe := pool[rng.IntN(len(pool))]
		if s.has(probe) != ref[probe] {
			t.Fatalf("seed %d step %d: has %v, want %v", seed, step, s.has(probe), ref[probe])
		}
		if step%997 == 0 {
			seen := map[*Queue]bool{}
			for q := range s.all() {
				if !ref[q] || seen[q] {
					t.Fatalf("seed %d step %d: all yields a queue twice or one not in the set", seed, step)
				}
				seen[q] = true
			}
			if len(seen) != len(ref) {
				t.Fatalf("seed %d step %d: all yields %d queues, want %d", seed, step, len(seen), len(ref))
			}
			for _, q := range pool {
				if s.has(q) != ref[q] {
					t.Fatalf("seed %d step %d: has disagrees with the model", seed, step)
				}
			}
		}
	}
	if len(s.slots) > 8*queueSetMinSlots && s.n*8 < len(s.slots) {
		t.Fatalf("%d queues in %d slots: the set did not shrink", s.n, len(s.slots))
	}
}
