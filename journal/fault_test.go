package journal

import (
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
)

// workload publishes n messages and consumes all but every keepEvery-th:
// a dequeue ref per consumed message, and Free once the dequeue completed
// without error. It reports which publishes and dequeues completed
// successfully.
type workload struct {
	published map[Pos]int  // completed publishes: pos -> message index
	dequeued  map[Pos]bool // targets whose dequeue completed
}

func runWorkload(t *testing.T, j *Journal, n, keepEvery, round int) workload {
	t.Helper()
	w := workload{published: map[Pos]int{}, dequeued: map[Pos]bool{}}
	rec := newRecorder(t)
	completions := 0
	for base := 0; base < n; base += round {
		var ps []Pos
		for i := base; i < min(n, base+round); i++ {
			ps = append(ps, j.Append(payload(i), rec.done))
		}
		completions += len(ps)
		rec.wait(completions)
		refs := map[Pos]Pos{}
		for k, p := range ps {
			if err, _ := rec.err(p); err != nil {
				continue
			}
			w.published[p] = base + k
			if keepEvery > 0 && (base+k)%keepEvery == 0 {
				continue
			}
			refs[j.AppendRef([]byte("dequeue"), p, rec.done)] = p
		}
		completions += len(refs)
		rec.wait(completions)
		for r, p := range refs {
			if err, _ := rec.err(r); err == nil {
				w.dequeued[p] = true
				j.Free(p)
			}
		}
		// Read back the messages still live while compaction moves them.
		if j.Stats().Err == nil {
			var buf []byte
			for p, i := range w.published {
				if w.dequeued[p] || (p+Pos(base))%7 != 0 {
					continue
				}
				var err error
				buf, err = j.Read(p, buf[:0])
				if err != nil || string(buf) != string(payload(i)) {
					t.Fatalf("read %d: %q, %v", p, buf, err)
				}
			}
		}
	}
	return w
}

// verify checks a replay against what was acknowledged: every completed
// publish whose dequeue did not complete is there exactly once and not
// dequeued; no completed dequeue is lost while its message is replayed;
// no ref comes without its target; positions are increasing.
func (w workload) verify(t *testing.T, got []replayed) {
	t.Helper()
	present := map[Pos]bool{}
	dequeued := map[Pos]bool{}
	var last Pos
	for _, r := range got {
		if r.pos <= last {
			t.Fatalf("replay position %d after %d", r.pos, last)
		}
		last = r.pos
		present[r.pos] = true
		if r.ref != 0 {
			if !present[r.ref] {
				t.Fatalf("ref %d replayed without its target %d", r.pos, r.ref)
			}
			dequeued[r.ref] = true
			continue
		}
		if i, ok := w.published[r.pos]; ok && r.data != string(payload(i)) {
			t.Fatalf("record %d: %q, want %q", r.pos, r.data, payload(i))
		}
	}
	for p := range w.published {
		switch {
		case w.dequeued[p] && present[p] && !dequeued[p]:
			t.Fatalf("message %d resurrected: its dequeue completed but was not replayed", p)
		case !w.dequeued[p] && !present[p]:
			t.Fatalf("completed publish %d lost", p)
		case !w.dequeued[p] && dequeued[p]:
			// Possible only for a dequeue that completed with an error.
		}
	}
}

func TestFsyncFailureFailsJournal(t *testing.T) {
	ffs := NewFaultFS(nil)
	dir := t.TempDir()
	j, _ := openT(t, Options{Dir: dir, FS: ffs})
	rec := newRecorder(t)
	var before []Pos
	for i := range 50 {
		before = append(before, j.Append(payload(i), rec.done))
	}
	rec.wait(50)
	// Hold the writer in a completion so the next appends pile up into one
	// batch, then fail that batch's fsync.
	gate := make(chan struct{})
	held := make(chan struct{})
	var gateOnce sync.Once
	j.Append([]byte("gate"), func(pos Pos, err error) {
		close(held)
		<-gate
		rec.done(pos, err)
	})
	<-held
	ffs.FailNth(OpSync, 1)
	var batch []Pos
	for i := range 100 {
		batch = append(batch, j.Append(payload(100+i), rec.done))
	}
	gateOnce.Do(func() { close(gate) })
	rec.wait(151)
	var after []Pos
	for i := range 100 {
		after = append(after, j.Append(payload(200+i), rec.done))
	}
	rec.wait(251)
	for _, p := range before {
		if err, _ := rec.err(p); err != nil {
			t.Fatalf("record %d before the fault: %v", p, err)
		}
	}
	for _, p := range batch {
		if err, _ := rec.err(p); !errors.Is(err, ErrInjected) || errors.Is(err, ErrFailed) {
			t.Fatalf("record %d in the failed batch: %v, want the injected fsync error", p, err)
		}
	}
	for _, p := range after {
		if err, _ := rec.err(p); !errors.Is(err, ErrFailed) || !errors.Is(err, ErrInjected) {
			t.Fatalf("record %d after the fault: %v, want ErrFailed", p, err)
		}
	}
	if err := j.Sync(); err == nil {
		t.Fatal("Sync succeeded on a failed journal")
	}
	if st := j.Stats(); !errors.Is(st.Err, ErrInjected) {
		t.Fatalf("stats error %v", st.Err)
	}
	if err := j.Close(); !errors.Is(err, ErrInjected) {
		t.Fatalf("close: %v", err)
	}
	// A restart recovers at least everything that was completed.
	j2, got := openT(t, Options{Dir: dir})
	defer j2.Close()
	if len(got) < 50 {
		t.Fatalf("replayed %d records, want the 50 completed ones at least", len(got))
	}
	for i := range 50 {
		if got[i].data != string(payload(i)) {
			t.Fatalf("record %d: %q", i, got[i].data)
		}
	}
}

func TestWriteFailureTornRecord(t *testing.T) {
	ffs := NewFaultFS(nil)
	dir := t.TempDir()
	j, _ := openT(t, Options{Dir: dir, FS: ffs})
	rec := newRecorder(t)
	for i := range 20 {
		j.Append(payload(i), rec.done)
	}
	rec.wait(20)
	ffs.FailNth(OpWrite, 1) // writes half the batch, then fails
	for i := range 20 {
		j.Append(payload(20+i), rec.done)
	}
	rec.wait(40)
	ok := 0
	for p := Pos(1); p <= 40; p++ {
		err, _ := rec.err(p)
		if err == nil {
			ok++
		} else if p <= 20 {
			t.Fatalf("record %d: %v", p, err)
		}
	}
	if ok != 20 {
		t.Fatalf("%d records succeeded, want only the 20 before the fault", ok)
	}
	j.Close()
	j2, got := openT(t, Options{Dir: dir})
	defer j2.Close()
	if len(got) < 20 || j2.Stats().DroppedBytes == 0 && len(got) == 20 {
		t.Fatalf("replayed %d records, dropped %d: want the 20 completed ones and a torn tail cut", len(got), j2.Stats().DroppedBytes)
	}
}

// TestCrashDuringCompaction fails one compaction step (a write of the new
// segment, its fsync, the rename, a removal of a source, or the directory
// sync after it), which fails the journal like a crash would stop it,
// then reopens on the real file system and checks that no completed record
// is lost, none is replayed twice, and no completed dequeue is lost.
func TestCrashDuringCompaction(t *testing.T) {
	type state struct {
		mu      sync.Mutex
		renamed bool
		n       int
	}
	cases := map[string]func(s *state, op Op, name string) bool{
		"write-tmp": func(s *state, op Op, name string) bool {
			if op == OpWrite && strings.HasSuffix(name, ".tmp") {
				s.n++
				return s.n == 2
			}
			return false
		},
		"fsync-tmp": func(s *state, op Op, name string) bool {
			return op == OpSync && strings.HasSuffix(name, ".tmp")
		},
		"rename": func(s *state, op Op, name string) bool { return op == OpRename },
		"remove-source": func(s *state, op Op, name string) bool {
			if op == OpRename {
				s.renamed = true
			}
			return op == OpRemove && s.renamed
		},
		"syncdir-after-remove": func(s *state, op Op, name string) bool {
			if op == OpRemove {
				s.renamed = true
				return false
			}
			return op == OpSyncDir && s.renamed
		},
	}
	for name, pick := range cases {
		t.Run(name, func(t *testing.T) {
			ffs := NewFaultFS(nil)
			st := &state{}
			fired := false
			ffs.SetRule(func(op Op, path string, _ int) error {
				st.mu.Lock()
				defer st.mu.Unlock()
				if !fired && pick(st, op, path) {
					fired = true
					return ErrInjected
				}
				return nil
			})
			dir := t.TempDir()
			opts := Options{Dir: dir, SegmentBytes: 8 << 10}
			j, _ := openT(t, opts)
			j.Close()
			opts.FS = ffs
			j, _ = openT(t, opts)
			w := runWorkload(t, j, 3000, 10, 500)
			waitFor(t, func() error {
				if j.Stats().Err == nil {
					return fmt.Errorf("fault not hit yet")
				}
				return nil
			})
			j.Close()
			opts.FS = nil
			j, got := openT(t, opts)
			defer j.Close()
			w.verify(t, got)
			checkInvariants(t, j)
			if finished := j.Stats().SourcesFinished; (name == "remove-source") != (finished > 0) {
				t.Fatalf("recovery finished %d rewrite sources", finished)
			}
			if len(w.published) == 0 {
				t.Fatal("nothing was published before the fault")
			}
			t.Logf("published %d, dequeued %d, replayed %d", len(w.published), len(w.dequeued), len(got))
		})
	}
}

// TestWorkloadSurvivesReopen runs the same workload without faults under
// each fsync policy and checks the replay in the same way.
func TestWorkloadSurvivesReopen(t *testing.T) {
	for _, policy := range []FsyncPolicy{FsyncAlways, FsyncNever} {
		t.Run(fmt.Sprintf("fsync=%d", policy), func(t *testing.T) {
			dir := t.TempDir()
			opts := Options{Dir: dir, SegmentBytes: 8 << 10, Fsync: policy}
			j, _ := openT(t, opts)
			w := runWorkload(t, j, 3000, 10, 500)
			if err := j.Close(); err != nil {
				t.Fatal(err)
			}
			j, got := openT(t, opts)
			defer j.Close()
			w.verify(t, got)
			checkInvariants(t, j)
		})
	}
}

// TestCompactionInterleaving lets go of the lock at every index entry the
// compactor visits, so frees and appends land between any two of its
// steps, and checks the replay after each run.
func TestCompactionInterleaving(t *testing.T) {
	saved := lockSliceItems
	lockSliceItems = 1
	defer func() { lockSliceItems = saved }()
	for run := range 4 {
		t.Run(fmt.Sprintf("run=%d", run), func(t *testing.T) {
			dir := t.TempDir()
			// Rounds of a few hundred publishes and their dequeues share
			// segments, so a segment is often sealed and rewritten while the
			// owner frees the messages in it.
			opts := Options{Dir: dir, SegmentBytes: 64 << 10, CompactLiveRatio: 0.9, Fsync: FsyncNever}
			j, _ := openT(t, opts)
			w := runWorkload(t, j, 20000, 7+run, 300+100*run)
			checkInvariants(t, j)
			if st := j.Stats(); st.SegmentsReclaimed == 0 || st.Compactions == 0 {
				t.Fatalf("compaction did not run: %+v", st)
			}
			if err := j.Close(); err != nil {
				t.Fatal(err)
			}
			j, got := openT(t, opts)
			defer j.Close()
			w.verify(t, got)
			checkInvariants(t, j)
		})
	}
}

// TestFreeWhileCompactorPicks frees a message after the compactor picked
// it for copying and before it looked at the message's dequeue in the same
// segment: the dequeue must be copied along, or the message would come
// back after a restart without it.
func TestFreeWhileCompactorPicks(t *testing.T) {
	savedItems, savedSkip := lockSliceItems, compactSkipNewest
	lockSliceItems, compactSkipNewest = 1, 0
	defer func() { lockSliceItems, compactSkipNewest = savedItems, savedSkip; compactYieldHook.Store(nil) }()
	dir := t.TempDir()
	opts := Options{Dir: dir, SegmentBytes: 4 << 10}
	j, _ := openT(t, opts)
	rec := newRecorder(t)
	msg := j.Append([]byte("message"), rec.done)
	deq := j.AppendRef([]byte("dequeue"), msg, rec.done)
	// A live record keeps the rewritten segment from being dropped whole.
	j.Append([]byte("kept"), rec.done)
	var fillers []Pos
	for i := range 150 {
		fillers = append(fillers, j.Append(payload(i), rec.done))
	}
	rec.wait(153)
	var calls atomic.Int64
	hook := func() {
		if calls.Add(1) == 2 { // the message was picked; its dequeue is next
			j.Free(msg)
		}
	}
	compactYieldHook.Store(&hook)
	for _, p := range fillers {
		j.Free(p)
	}
	waitFor(t, func() error {
		if st := j.Stats(); st.Compactions == 0 {
			return fmt.Errorf("no rewrite yet")
		}
		return nil
	})
	if n := calls.Load(); n < 2 {
		t.Fatalf("compactor yielded %d times", n)
	}
	checkInvariants(t, j)
	if err := j.Close(); err != nil {
		t.Fatal(err)
	}
	compactYieldHook.Store(nil)
	j, got := openT(t, opts)
	defer j.Close()
	var sawMsg, sawDeq bool
	for _, r := range got {
		sawMsg = sawMsg || r.pos == msg
		sawDeq = sawDeq || r.pos == deq
	}
	if sawMsg && !sawDeq {
		t.Fatal("message replayed without its dequeue: it resurrects")
	}
}
