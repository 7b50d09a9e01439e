package journal

import (
	"errors"
	"fmt"
	"os"
	"testing"
)

// checkInvariants recomputes the live bytes of every segment from the
// index and compares them with the running counts, and checks that every
// ref is on its target's list.
func checkInvariants(t testing.TB, j *Journal) {
	t.Helper()
	j.mu.Lock()
	defer j.mu.Unlock()
	live := make(map[uint32]int64)
	onList := make(map[Pos]bool)
	for pos, e := range j.mu.index.all() {
		if _, ok := j.mu.segs[e.seg]; !ok {
			t.Fatalf("pos %d points at missing segment %d", pos, e.seg)
		}
		if j.countedLocked(*e) {
			live[e.seg] += int64(e.size)
		}
		if e.flags()&flagRef == 0 {
			for r := e.ref; r != 0; r = j.mu.index.next(r, j.mu.index.get(r)) {
				re := j.mu.index.get(r)
				if re == nil || re.ref != pos {
					t.Fatalf("ref list of %d broken at %d", pos, r)
				}
				onList[r] = true
			}
		}
	}
	for pos, e := range j.mu.index.all() {
		if e.flags()&flagRef != 0 && !onList[pos] {
			t.Fatalf("ref %d (target %d) is not on its target's list", pos, e.ref)
		}
	}
	for id, s := range j.mu.segs {
		if s.live != live[id] {
			t.Fatalf("segment %d: live %d, recomputed %d", id, s.live, live[id])
		}
	}
}

func TestRefsLifetime(t *testing.T) {
	dir := t.TempDir()
	opts := Options{Dir: dir, SegmentBytes: 4 << 10, CompactLiveRatio: 0.9}
	j, _ := openT(t, opts)
	rec := newRecorder(t)
	// Messages 1..50; refs to each (a delivery-count update and, for even
	// ones, a dequeue); even messages are freed once their dequeue is
	// durable.
	msgs := map[Pos]int{}
	for i := range 50 {
		msgs[j.Append(payload(i), rec.done)] = i
	}
	var refs []Pos
	for p := range Pos(50) {
		refs = append(refs, j.AppendRef([]byte(fmt.Sprintf("dc-%d", p+1)), p+1, rec.done))
	}
	for p := Pos(2); p <= 50; p += 2 {
		refs = append(refs, j.AppendRef([]byte(fmt.Sprintf("deq-%d", p)), p, rec.done))
	}
	total := 50 + len(refs)
	rec.wait(total)
	for p := Pos(2); p <= 50; p += 2 {
		j.Free(p)
	}
	checkInvariants(t, j)
	// A freed record is not readable; its refs stay until it is gone.
	if _, err := j.Read(2, nil); !errors.Is(err, ErrNotFound) {
		t.Fatalf("read freed: %v", err)
	}
	if err := j.Close(); err != nil {
		t.Fatal(err)
	}

	// Frees are not journaled: everything is replayed, each ref after its
	// target.
	j, got := openT(t, opts)
	if len(got) != total {
		t.Fatalf("replayed %d, want %d", len(got), total)
	}
	seen := map[Pos]bool{}
	for _, r := range got {
		if r.ref != 0 && !seen[r.ref] {
			t.Fatalf("ref %d replayed before target %d", r.pos, r.ref)
		}
		seen[r.pos] = true
	}
	checkInvariants(t, j)
	// The owner frees the dead messages again; compaction may now drop
	// them and their refs, but never a ref without its target.
	for p := Pos(2); p <= 50; p += 2 {
		j.Free(p)
	}
	// Push the old segments out of the active one so compaction runs.
	rec2 := newRecorder(t)
	var fillers []Pos
	for i := range 200 {
		fillers = append(fillers, j.Append(payload(1000+i), rec2.done))
	}
	rec2.wait(200)
	for _, p := range fillers {
		j.Free(p)
	}
	waitFor(t, func() error {
		st := j.Stats()
		if st.Compactions+st.SegmentsReclaimed == 0 {
			return fmt.Errorf("no compaction yet: %+v", st)
		}
		return nil
	})
	checkInvariants(t, j)
	j.Close()

	j, got = openT(t, opts)
	defer j.Close()
	checkInvariants(t, j)
	present := map[Pos]bool{}
	refsOf := map[Pos]int{}
	for _, r := range got {
		present[r.pos] = true
		if r.ref != 0 {
			if !present[r.ref] {
				t.Fatalf("ref %d replayed without target %d", r.pos, r.ref)
			}
			refsOf[r.ref]++
		}
	}
	for p := Pos(1); p <= 50; p++ {
		if p%2 == 1 {
			if !present[p] || refsOf[p] != 1 {
				t.Fatalf("live message %d: present %v with %d refs, want 1", p, present[p], refsOf[p])
			}
		} else if present[p] && refsOf[p] != 2 {
			// A dead message may still be on disk, but then with its
			// dequeue: the message must not resurrect.
			t.Fatalf("dead message %d replayed with %d refs, want 2", p, refsOf[p])
		}
	}
}

func compactionCount(short bool) int {
	if short || os.Getenv("BERTH_JOURNAL_LONG") == "" {
		return 200_000
	}
	return 1_000_000
}

// TestCompactionReclaims: append many small records, free them all, and
// disk use returns to one active segment; with 1% never freed, disk use
// stays well below what was written, and a replay yields exactly the live
// records. BERTH_JOURNAL_LONG=1 runs 1,000,000 records.
func TestCompactionReclaims(t *testing.T) {
	for _, keepEvery := range []int{0, 100} {
		t.Run(fmt.Sprintf("keep-every=%d", keepEvery), func(t *testing.T) {
			n := compactionCount(testing.Short())
			dir := t.TempDir()
			const segBytes = 1 << 20
			opts := Options{Dir: dir, SegmentBytes: segBytes, Fsync: FsyncNever}
			j, _ := openT(t, opts)
			rec := newRecorder(t)
			data := make([]byte, 64)
			var written int64
			kept := map[Pos]int{}
			// Consume as a queue would: a dequeue ref per message, and the
			// message is freed once its dequeue is durable.
			const round = 10_000
			completions := 0
			for base := 0; base < n; base += round {
				var ps []Pos
				for i := base; i < min(n, base+round); i++ {
					copy(data, payload(i))
					ps = append(ps, j.Append(data, rec.done))
					written += int64(recordHeaderSize + len(data))
				}
				completions += len(ps)
				rec.wait(completions)
				var dead []Pos
				for k, p := range ps {
					if keepEvery > 0 && (base+k)%keepEvery == 0 {
						kept[p] = base + k
						continue
					}
					j.AppendRef([]byte("dequeue"), p, rec.done)
					written += recordHeaderSize + 7
					dead = append(dead, p)
				}
				completions += len(dead)
				rec.wait(completions)
				for _, p := range dead {
					j.Free(p)
				}
			}
			if err := j.Sync(); err != nil {
				t.Fatal(err)
			}
			liveBytes := int64(len(kept)) * int64(recordHeaderSize+len(data))
			// Bound: the live data at the ratio-limited density, plus the
			// active segment and one segment of slack.
			bound := int64(float64(liveBytes)/compactRatioDefault) + 2*segBytes
			if keepEvery == 0 {
				bound = segBytes
			}
			waitFor(t, func() error {
				st := j.Stats()
				if keepEvery == 0 && st.Segments != 1 {
					return fmt.Errorf("%d segments, live %d", st.Segments, st.LiveBytes)
				}
				if got := dirBytes(t, dir); got > bound {
					return fmt.Errorf("disk %d bytes in %d segments, bound %d (written %d, live %d)", got, st.Segments, bound, written, liveBytes)
				}
				return nil
			})
			checkInvariants(t, j)
			st := j.Stats()
			t.Logf("written %d bytes, on disk %d in %d segments, live %d, compactions %d, reclaimed %d, relocated %d",
				written, dirBytes(t, dir), st.Segments, st.LiveBytes, st.Compactions, st.SegmentsReclaimed, st.BytesRelocated)
			if keepEvery == 0 && st.Segments != 1 {
				t.Fatalf("%d segments left, want the active one", st.Segments)
			}
			// Relocated records read back by their old positions.
			var buf []byte
			for p, i := range kept {
				var err error
				buf, err = j.Read(p, buf[:0])
				if err != nil || string(buf[:13]) != string(payload(i)) {
					t.Fatalf("read kept %d: %q, %v", p, buf, err)
				}
			}
			if err := j.Close(); err != nil {
				t.Fatal(err)
			}
			j, got := openT(t, opts)
			defer j.Close()
			// The owner's view: a message is live unless its dequeue was
			// replayed; no ref may come without its target.
			present := map[Pos]bool{}
			dequeued := map[Pos]bool{}
			for _, r := range got {
				present[r.pos] = true
				if r.ref != 0 {
					if !present[r.ref] {
						t.Fatalf("ref %d replayed without target %d", r.pos, r.ref)
					}
					dequeued[r.ref] = true
					continue
				}
				if i, ok := kept[r.pos]; ok && r.data[:13] != string(payload(i)) {
					t.Fatalf("record %d data %q, want %q", r.pos, r.data, payload(i))
				}
			}
			liveSeen := 0
			for p := range present {
				if e := j.mu.index.get(p); !dequeued[p] && (e == nil || e.flags()&flagRef == 0) {
					if _, ok := kept[p]; !ok {
						t.Fatalf("consumed record %d resurrected", p)
					}
					liveSeen++
				}
			}
			if liveSeen != len(kept) {
				t.Fatalf("replayed %d live records, want exactly %d", liveSeen, len(kept))
			}
			t.Logf("replayed %d records (%d live)", len(got), liveSeen)
		})
	}
}

// TestOldSegmentWithFewLiveRecordsIsRewritten: a record written first
// and never freed (a group log's epoch record) shares its segment with
// thousands that die soon after. Once the writer has moved a few
// segments on and every later segment has died and gone, that segment
// must still be rewritten: the compactor used to rank "the newest sealed
// segments", which it leaves alone, among the segments left, so the old
// one stayed newest for good, its bytes on disk and its records in the
// index.
func TestOldSegmentWithFewLiveRecordsIsRewritten(t *testing.T) {
	const segBytes = 1 << 20
	opts := Options{Dir: t.TempDir(), SegmentBytes: segBytes, Fsync: FsyncNever}
	j, _ := openT(t, opts)
	defer j.Close()
	rec := newRecorder(t)
	keep := j.Append([]byte("epoch record"), rec.done)
	data := make([]byte, 200)
	completions := 1
	// Ten segments' worth, each batch freed once durable.
	for written := 0; written < 10*segBytes; {
		var ps []Pos
		for range 1000 {
			ps = append(ps, j.Append(data, rec.done))
			written += recordHeaderSize + len(data)
		}
		completions += len(ps)
		rec.wait(completions)
		for _, p := range ps {
			j.Free(p)
		}
	}
	if err := j.Sync(); err != nil {
		t.Fatal(err)
	}
	first := j.path(0)
	waitFor(t, func() error {
		if _, err := os.Stat(first); err == nil {
			st := j.Stats()
			return fmt.Errorf("the first segment is still there: %d segments (live %d bytes, compactions %d)", st.Segments, st.LiveBytes, st.Compactions)
		}
		return nil
	})
	st := j.Stats()
	t.Logf("segments %d, compactions %d, reclaimed %d", st.Segments, st.Compactions, st.SegmentsReclaimed)
	if b, err := j.Read(keep, nil); err != nil || string(b) != "epoch record" {
		t.Fatalf("the kept record after its segment's rewrite: %q, %v", b, err)
	}
}
