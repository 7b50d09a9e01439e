package journal

import (
	"fmt"
	"math/rand/v2"
	"runtime"
	"testing"
	"time"
	"unsafe"
)

// checkIndex compares the index with a model map, entry by entry, both
// through get and through all.
func checkIndex(t *testing.T, x *index, model map[Pos]entry, step int) {
	t.Helper()
	if x.len() != len(model) {
		t.Fatalf("step %d: len %d, model %d", step, x.len(), len(model))
	}
	for pos, want := range model {
		got := x.get(pos)
		if got == nil || *got != want {
			t.Fatalf("step %d: get(%d) = %v, want %v", step, pos, got, want)
		}
	}
	seen := 0
	for pos, e := range x.all() {
		if want, ok := model[pos]; !ok || *e != want {
			t.Fatalf("step %d: all yields %d=%v, model has %v (%v)", step, pos, *e, want, ok)
		}
		seen++
	}
	if seen != len(model) {
		t.Fatalf("step %d: all yields %d entries, model %d", step, seen, len(model))
	}
	if len(x.ring) < indexRingMin || len(x.ring) > indexRingMax || len(x.ring)&(len(x.ring)-1) != 0 {
		t.Fatalf("step %d: ring of %d slots", step, len(x.ring))
	}
}

// TestIndexModel drives the index with the shapes the journal produces
// (increasing inserts with gaps, deletes mostly in order, long-lived
// survivors, entries changed in place, jumps after recovery) and checks it
// against a map after every step.
func TestIndexModel(t *testing.T) {
	for seed := range uint64(20) {
		rng := rand.New(rand.NewPCG(seed, 7))
		x := newIndex(nil)
		model := map[Pos]entry{}
		var live []Pos // insertion order
		next := Pos(1 + rng.IntN(3))
		for step := range 4000 {
			switch r := rng.IntN(100); {
			case r < 50:
				if rng.IntN(50) == 0 {
					next += Pos(rng.IntN(5000)) // a gap, as after recovery
				}
				e := entry{seg: uint32(rng.IntN(9)), off: uint32(step), size: uint32(1 + rng.IntN(200)), ref: Pos(step)}
				x.insert(next, e)
				model[next] = e
				live = append(live, next)
				next += Pos(1 + rng.IntN(2))
			case r < 85 && len(live) > 0:
				// Mostly the oldest, sometimes any: records die roughly in
				// order, a few live on.
				i := 0
				if rng.IntN(4) == 0 {
					i = rng.IntN(len(live))
				}
				if rng.IntN(10) == 0 {
					i = len(live) - 1 - i/2
				}
				pos := live[i]
				live = append(live[:i], live[i+1:]...)
				x.del(pos)
				delete(model, pos)
				x.del(pos) // twice does nothing
			case r < 95 && len(live) > 0:
				pos := live[rng.IntN(len(live))]
				e := x.get(pos)
				e.setFlags(e.flags() ^ flagFreed)
				// Behind pos (in link) or ahead of it (in farNext).
				x.setNext(pos, e, Pos(step))
				if got := x.next(pos, e); got != Pos(step) || e.flags()&flagFreed != model[pos].flags()&flagFreed^flagFreed {
					t.Fatalf("seed %d step %d: next of %d is %d, want %d", seed, step, pos, got, step)
				}
				model[pos] = *e
			default:
				// Positions never inserted, or gone, are absent.
				pos := Pos(rng.IntN(int(next) + 10))
				if _, ok := model[pos]; !ok && x.get(pos) != nil {
					t.Fatalf("seed %d step %d: get(%d) found a deleted entry", seed, step, pos)
				}
				x.del(pos)
				if _, ok := model[pos]; !ok && x.len() != len(model) {
					t.Fatalf("seed %d step %d: del of absent %d changed len", seed, step, pos)
				}
				if _, ok := model[pos]; ok {
					delete(model, pos)
					for i, p := range live {
						if p == pos {
							live = append(live[:i], live[i+1:]...)
							break
						}
					}
				}
			}
			checkIndex(t, &x, model, step)
			for pos := range x.farNext {
				if _, ok := model[pos]; !ok {
					t.Fatalf("seed %d step %d: a far next kept for %d, not in the index", seed, step, pos)
				}
			}
		}
	}
}

// TestEntryLink: an entry is 24 bytes; its flags and the next ref on
// its target's list share link, a next too far back or ahead going to
// the index's map, and neither disturbs the other.
func TestEntryLink(t *testing.T) {
	if n := unsafe.Sizeof(entry{}); n != 24 {
		t.Fatalf("an index entry is %d bytes, want 24", n)
	}
	x := newIndex(nil)
	pos := Pos(3 << 30)
	for _, next := range []Pos{0, 1, pos - 1, pos - linkFar + 1, pos - linkFar, pos + 5} {
		for _, f := range []uint32{0, flagRef, flagFreed, flagRef | flagFreed} {
			e := entry{size: 1}
			e.setFlags(f)
			x.setNext(pos, &e, next)
			x.insert(pos, e)
			if got := x.next(pos, x.get(pos)); got != next || x.get(pos).flags() != f {
				t.Fatalf("next %d, flags %d: read back next %d, flags %d", next, f, got, x.get(pos).flags())
			}
			x.setNext(pos, x.get(pos), 0)
			x.del(pos)
			if len(x.farNext) != 0 {
				t.Fatalf("next %d: %d far nexts left after the entry went", next, len(x.farNext))
			}
		}
	}
}

// TestIndexSurvivorsDoNotPinRing: a queue consumed in order with one
// message in a hundred never consumed. The survivors must end up in the
// map, and the ring must stay near the size of the recent window instead
// of spanning every position since the first survivor.
func TestIndexSurvivorsDoNotPinRing(t *testing.T) {
	const (
		total = 1_000_000
		lag   = 1000 // records die this far behind the head
	)
	x := newIndex(nil)
	survivors := 0
	for pos := Pos(1); pos <= total; pos++ {
		x.insert(pos, entry{size: 100, off: uint32(pos)})
		if pos > lag {
			old := pos - lag
			if old%100 == 0 {
				survivors++
				continue
			}
			x.del(old)
		}
	}
	if want := survivors + lag; x.len() != want {
		t.Fatalf("len %d, want %d", x.len(), want)
	}
	if len(x.ring) > 8*lag {
		t.Fatalf("ring holds %d slots for a window of %d records", len(x.ring), lag)
	}
	if len(x.old) < survivors-2*lag {
		t.Fatalf("only %d of %d survivors left the ring", len(x.old), survivors)
	}
	for pos := Pos(100); pos <= total-lag; pos += 100 {
		if e := x.get(pos); e == nil || e.off != uint32(pos) {
			t.Fatalf("survivor %d: %v", pos, e)
		}
	}
	// Once the survivors go too, the map empties; and once a trickle of
	// records has gone through a window that small for as many records as
	// the ring has slots, the ring shrinks back.
	for pos := Pos(1); pos <= total; pos++ {
		x.del(pos)
	}
	if x.len() != 0 || len(x.old) != 0 {
		t.Fatalf("after deleting all: len %d, map %d", x.len(), len(x.old))
	}
	for pos := Pos(total + 1); pos <= total+8*lag; pos++ {
		x.insert(pos, entry{size: 100})
		x.del(pos)
	}
	if len(x.ring) != indexRingMin {
		t.Fatalf("after a trickle: ring %d slots, want %d", len(x.ring), indexRingMin)
	}
}

// TestIndexBulkFreesKeepRing: a group log's records are all live until a
// compaction frees its prefix at once, every few thousand records. The
// ring must grow to span that once, and then neither be reallocated at
// each compaction nor spill the live records to the map.
func TestIndexBulkFreesKeepRing(t *testing.T) {
	const every = 4096
	x := newIndex(nil)
	resizes, last := 0, len(x.ring)
	dead := Pos(1)
	for pos := Pos(1); pos <= 200*every; pos++ {
		x.insert(pos, entry{size: 100})
		if pos%every == 0 {
			// Compaction: everything but the last 300 records goes.
			for ; dead <= pos-300; dead++ {
				x.del(dead)
			}
		}
		if len(x.ring) != last {
			resizes++
			last = len(x.ring)
		}
	}
	if resizes > 10 || len(x.old) != 0 {
		t.Fatalf("ring resized %d times (now %d slots), %d records spilled to the map", resizes, len(x.ring), len(x.old))
	}
}

// TestIndexQueueWithSurvivors runs a queue through the journal in which
// one message in a hundred is never consumed, so compaction relocates the
// survivors while everything around them is reclaimed. The index must
// stay consistent, the survivors readable and replayed, and the ring must
// not span every position since the first survivor.
func TestIndexQueueWithSurvivors(t *testing.T) {
	const (
		rounds   = 200
		perRound = 100
	)
	opts := Options{Dir: t.TempDir(), SegmentBytes: 16 << 10, Fsync: FsyncNever}
	j, _ := openT(t, opts)
	rec := newRecorder(t)
	survivors := map[Pos]int{}
	want := 0
	for round := range rounds {
		msgs := make([]Pos, perRound)
		for i := range msgs {
			msgs[i] = j.Append(payload(round*perRound+i), rec.done)
		}
		want += perRound
		for i, p := range msgs {
			if i == 0 {
				survivors[p] = round * perRound
				continue
			}
			j.AppendRef([]byte("deq"), p, rec.done)
			want++
		}
		rec.wait(want)
		for _, p := range msgs[1:] {
			j.Free(p)
		}
	}
	for pos, err := range rec.results {
		if err != nil {
			t.Fatalf("record %d: %v", pos, err)
		}
	}
	waitFor(t, func() error {
		if s := j.Stats(); s.Segments > 8 {
			return fmt.Errorf("%d segments left", s.Segments)
		}
		return nil
	})
	checkInvariants(t, j)
	j.mu.Lock()
	ring, old, span := len(j.mu.index.ring), len(j.mu.index.old), int(j.mu.nextPos)
	j.mu.Unlock()
	// Survivors spill to the map. (How far the ring grew depends on how
	// far the frees lag the appends, which a loaded machine stretches: a
	// bound on it failed there.)
	if old == 0 {
		t.Fatalf("ring of %d slots, %d entries in the map, for %d positions", ring, old, span)
	}
	for pos, i := range survivors {
		got, err := j.Read(pos, nil)
		if err != nil || string(got) != string(payload(i)) {
			t.Fatalf("survivor %d: %q, %v", pos, got, err)
		}
	}
	if err := j.Close(); err != nil {
		t.Fatal(err)
	}
	j, got := openT(t, opts)
	defer j.Close()
	seen := 0
	for _, r := range got {
		if i, ok := survivors[r.pos]; ok {
			if r.data != string(payload(i)) {
				t.Fatalf("survivor %d replayed as %q", r.pos, r.data)
			}
			seen++
		}
	}
	if seen != len(survivors) {
		t.Fatalf("replayed %d of %d survivors", seen, len(survivors))
	}
	checkInvariants(t, j)
}

// TestIndexBytes: IndexBytes follows the index's memory as records come
// and go: a ring of a power of two 24-byte slots for 100,000 records
// (3 MiB) and 8 bytes a record in the segments' position lists, close to
// what the heap grew by, and less once they are
// freed and compaction deleted their segments.
func TestIndexBytes(t *testing.T) {
	const n = 100_000
	j, _ := openT(t, Options{Dir: t.TempDir(), Fsync: FsyncNever, SegmentBytes: 64 << 10})
	defer j.Close()
	if idle := j.IndexBytes(); idle < indexRingMin*indexSlotBytes {
		t.Fatalf("an empty journal's index counts %d bytes, want at least %d", idle, indexRingMin*indexSlotBytes)
	}
	before := liveHeap()
	pos := make([]Pos, n)
	for i := range pos {
		pos[i] = j.Append([]byte("r"), func(Pos, error) {})
		if i%1000 == 999 {
			// Small batches: a batch's arrays keep the capacity of the
			// largest one, which is not the index.
			if err := j.Sync(); err != nil {
				t.Fatal(err)
			}
		}
	}
	grew := liveHeap() - before - int64(n*8) // pos itself
	got := j.IndexBytes()
	if ring, want := j.indexBytes.Load(), int64(1<<17)*indexSlotBytes; ring != want {
		t.Fatalf("%d records: the index's ring counts %d bytes, want %d", n, ring, want)
	}
	if lists := j.segPosBytes.Load(); lists < n*8 || lists > 2*n*8 {
		t.Fatalf("%d records: the segments' position lists count %d bytes, want %d to %d", n, lists, n*8, 2*n*8)
	}
	if float64(grew) < 0.8*float64(got) || float64(grew) > 1.25*float64(got) {
		t.Fatalf("the heap grew by %d bytes, the index counts %d", grew, got)
	}
	for _, p := range pos {
		j.Free(p)
	}
	// Freed records stay in the index until compaction deletes their
	// segments (all but the active one).
	j.Append([]byte("r"), func(Pos, error) {})
	if err := j.Sync(); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(20 * time.Second)
	for j.IndexBytes() >= got && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if after := j.IndexBytes(); after >= got {
		t.Fatalf("every record freed and its segment deleted: the index counts %d bytes, as before", after)
	}
}

func liveHeap() int64 {
	runtime.GC()
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return int64(ms.HeapAlloc)
}

// TestIndexSteadyWindowDoesNotResize: records that live a while and die
// roughly in order, with the number alive swinging between a few hundred
// and a couple of thousand as bursts come and go (a broker under steady
// load), must not make the ring grow and shrink again and again: every
// resize allocates and copies the ring.
func TestIndexSteadyWindowDoesNotResize(t *testing.T) {
	x := newIndex(nil)
	resizes := 0
	last := len(x.ring)
	pos, dead := Pos(1), Pos(1)
	for round := range 2000 {
		// A burst raises the window to ~2,000 records, then consumers
		// bring it down to ~100.
		hi, lo := 1500+round%7*100, 100+round%5*20
		for ; pos-dead < Pos(hi); pos++ {
			x.insert(pos, entry{size: 100, off: uint32(pos)})
			if len(x.ring) != last {
				resizes++
				last = len(x.ring)
			}
		}
		for ; pos-dead > Pos(lo); dead++ {
			x.del(dead)
			if len(x.ring) != last {
				resizes++
				last = len(x.ring)
			}
		}
	}
	// Growing to fit the burst takes a couple of resizes; shrinking back
	// every round would take thousands.
	if resizes > 10 {
		t.Fatalf("the ring was resized %d times in 2000 rounds (now %d slots)", resizes, len(x.ring))
	}
}
