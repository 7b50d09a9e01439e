package groups

import (
	"math/rand/v2"
	"runtime"
	"slices"
	"testing"

	"github.com/berthmq/berth/journal"
)

// TestPositionsModel runs random pushes (some after gaps past 4 billion
// records), truncations and drops of a prefix against a plain slice,
// and checks both ends and a sample of the positions after each step,
// every position every 50 steps.
func TestPositionsModel(t *testing.T) {
	for seed := uint64(1); seed <= 20; seed++ {
		rng := rand.New(rand.NewPCG(seed, 0))
		var p positions
		first := uint64(1 + rng.IntN(100))
		p.reset(first)
		var model []journal.Pos
		next := journal.Pos(1)
		for step := range 3000 {
			switch r := rng.IntN(100); {
			case r < 80:
				for range 1 + rng.IntN(300) {
					next += journal.Pos(1 + rng.IntN(5))
					if rng.IntN(500) == 0 {
						next += 1 << 33
					}
					p.push(next)
					model = append(model, next)
				}
			case r < 90:
				end := first + uint64(rng.IntN(len(model)+1))
				p.truncate(end)
				model = model[:end-first]
			case r < 99:
				k := uint64(rng.IntN(len(model) + 1))
				if rng.IntN(10) == 0 {
					k += uint64(rng.IntN(100)) // past the end
				}
				p.dropBefore(first + k)
				model = model[min(k, uint64(len(model))):]
				first += k
			default:
				first += uint64(rng.IntN(1000))
				p.reset(first)
				model = nil
			}
			if p.first != first || p.end() != first+uint64(len(model)) {
				t.Fatalf("seed %d step %d: holds [%d, %d), want [%d, %d)", seed, step, p.first, p.end(), first, first+uint64(len(model)))
			}
			check := func(i int) {
				if got, ok := p.at(first + uint64(i)); !ok || got != model[i] {
					t.Fatalf("seed %d step %d: entry %d at %d (%v), want %d", seed, step, first+uint64(i), got, ok, model[i])
				}
			}
			if step%50 == 0 {
				for i := range model {
					check(i)
				}
			} else if len(model) > 0 {
				// Both ends and a sample: every step checking every
				// entry took 12 s under -race.
				check(0)
				check(len(model) - 1)
				for range 16 {
					check(rng.IntN(len(model)))
				}
			}
			if _, ok := p.at(p.end()); ok {
				t.Fatalf("seed %d step %d: a position past the end", seed, step)
			}
			if step%50 == 0 {
				if got := p.appendRange(nil, 0, p.end()); !slices.Equal(got, model) && len(model) > 0 {
					t.Fatalf("seed %d step %d: appendRange differs from the model", seed, step)
				}
			}
			if len(p.chunks) > (p.head+p.n+posChunkLen-1)/posChunkLen {
				t.Fatalf("seed %d step %d: %d chunks for %d entries from %d", seed, step, len(p.chunks), p.n, p.head)
			}
		}
	}
}

// TestPositionBytes: a million positions cost at most PositionBytes and
// a little an entry on the heap after GC (they were a []journal.Pos, 8
// bytes an entry and up to twice that while it grew).
func TestPositionBytes(t *testing.T) {
	const n = 1_000_000
	before := heapAfterGC()
	var p positions
	p.reset(1)
	for i := range n {
		p.push(journal.Pos(3 * i))
	}
	per := float64(heapAfterGC()-before) / n
	runtime.KeepAlive(&p)
	t.Logf("%.2f bytes a position", per)
	// 0.5 bytes of slack (500 KB) for what other goroutines allocate
	// meanwhile; 1,024-offset chunks took 4.76 bytes, a []journal.Pos 8.
	if per > PositionBytes+0.5 {
		t.Fatalf("a position costs %.2f bytes, want at most %.1f", per, PositionBytes+0.5)
	}
}

func heapAfterGC() int64 {
	runtime.GC()
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return int64(ms.HeapAlloc)
}
