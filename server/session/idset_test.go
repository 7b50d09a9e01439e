package session

import (
	"math/rand/v2"
	"testing"
)

// TestIDSetModel checks idSet against a plain map over random ids near
// each other (so runs join and split) and at the ends of the range, and
// that its runs stay sorted, disjoint and non-adjacent.
func TestIDSetModel(t *testing.T) {
	for seed := uint64(1); seed <= 200; seed++ {
		r := rand.New(rand.NewPCG(seed, 0))
		var s idSet
		ref := map[uint32]bool{}
		for step := 0; step < 500; step++ {
			var id uint32
			switch r.IntN(4) {
			case 0:
				id = uint32(r.IntN(3))
			case 1:
				id = ^uint32(0) - uint32(r.IntN(3))
			default:
				id = uint32(r.IntN(200))
			}
			if got := s.has(id); got != ref[id] {
				t.Fatalf("seed %d step %d: has(%d) = %v, want %v", seed, step, id, got, ref[id])
			}
			if !ref[id] {
				if !s.add(id) {
					t.Fatalf("seed %d: add(%d) refused with %d runs", seed, id, len(s.runs))
				}
				ref[id] = true
			}
			for i, run := range s.runs {
				if run.first > run.last || (i > 0 && uint64(s.runs[i-1].last)+1 >= uint64(run.first)) {
					t.Fatalf("seed %d step %d: runs %v not sorted, disjoint and apart", seed, step, s.runs)
				}
			}
		}
		n := 0
		for _, run := range s.runs {
			n += int(run.last-run.first) + 1
		}
		if n != len(ref) {
			t.Fatalf("seed %d: runs hold %d ids, want %d", seed, n, len(ref))
		}
	}
}

// TestIDSetBounded: upward ids stay one run; scattered ids are refused
// past idRangesMax runs, and the refusal records nothing.
func TestIDSetBounded(t *testing.T) {
	var s idSet
	for id := uint32(1); id <= 100000; id++ {
		if !s.add(id) {
			t.Fatalf("add(%d) refused", id)
		}
	}
	if len(s.runs) != 1 {
		t.Fatalf("100,000 upward ids in %d runs, want 1", len(s.runs))
	}
	var sc idSet
	for i := uint32(0); i < idRangesMax; i++ {
		if !sc.add(i * 2) {
			t.Fatalf("add(%d) refused at %d runs", i*2, len(sc.runs))
		}
	}
	if sc.add(idRangesMax*2 + 10) {
		t.Fatalf("a run past %d accepted", idRangesMax)
	}
	if sc.has(idRangesMax*2 + 10) {
		t.Fatal("a refused id was recorded")
	}
	if !sc.add(1) || len(sc.runs) != idRangesMax-1 {
		t.Fatalf("an id joining two runs: %d runs, want %d", len(sc.runs), idRangesMax-1)
	}
}
