package journal

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/berthmq/berth/internal/testutil"
)

func quietLogger() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

type replayed struct {
	pos, ref Pos
	data     string
}

func openT(t testing.TB, opts Options) (*Journal, []replayed) {
	t.Helper()
	if opts.Logger == nil {
		opts.Logger = quietLogger()
	}
	var got []replayed
	j, err := Open(opts, func(pos, ref Pos, data []byte) error {
		got = append(got, replayed{pos, ref, string(data)})
		return nil
	})
	if err != nil {
		t.Fatalf("open: %v", err)
	}
	return j, got
}

// recorder collects completions and checks they arrive in order.
type recorder struct {
	mu      sync.Mutex
	t       testing.TB
	last    Pos
	results map[Pos]error
	cond    *sync.Cond
	n       int
}

func newRecorder(t testing.TB) *recorder {
	r := &recorder{t: t, results: make(map[Pos]error)}
	r.cond = sync.NewCond(&r.mu)
	return r
}

func (r *recorder) done(pos Pos, err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if pos <= r.last {
		r.t.Errorf("completion %d after %d: out of order", pos, r.last)
	}
	if _, dup := r.results[pos]; dup {
		r.t.Errorf("completion %d twice", pos)
	}
	r.last = pos
	r.results[pos] = err
	r.n++
	r.cond.Broadcast()
}

func (r *recorder) wait(n int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	deadline := time.Now().Add(30 * time.Second)
	for r.n < n {
		if time.Now().After(deadline) {
			r.t.Fatalf("only %d of %d completions after 30s", r.n, n)
		}
		r.mu.Unlock()
		time.Sleep(time.Millisecond)
		r.mu.Lock()
	}
}

func (r *recorder) err(pos Pos) (error, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	err, ok := r.results[pos]
	return err, ok
}

func payload(i int) []byte { return []byte(fmt.Sprintf("record-%06d", i)) }

func TestAppendCompleteReadReplay(t *testing.T) {
	for _, policy := range []FsyncPolicy{FsyncAlways, FsyncNever} {
		t.Run(fmt.Sprintf("fsync=%d", policy), func(t *testing.T) {
			dir := t.TempDir()
			j, got := openT(t, Options{Dir: dir, Fsync: policy, SegmentBytes: 8 << 10})
			if len(got) != 0 {
				t.Fatalf("fresh journal replayed %d records", len(got))
			}
			rec := newRecorder(t)
			const n = 1000
			var positions []Pos
			for i := range n {
				positions = append(positions, j.Append(payload(i), rec.done))
			}
			for i, p := range positions {
				if p != Pos(i+1) {
					t.Fatalf("append %d got position %d, want %d", i, p, i+1)
				}
			}
			// Read back before and after durability.
			buf, err := j.Read(positions[n-1], nil)
			if err != nil || string(buf) != string(payload(n-1)) {
				t.Fatalf("read pending: %q, %v", buf, err)
			}
			rec.wait(n)
			for _, p := range positions {
				if err, _ := rec.err(p); err != nil {
					t.Fatalf("completion %d: %v", p, err)
				}
			}
			prefix := []byte("x")
			for i, p := range positions {
				buf, err := j.Read(p, prefix[:1:1])
				if err != nil || string(buf) != "x"+string(payload(i)) {
					t.Fatalf("read %d: %q, %v", p, buf, err)
				}
			}
			if st := j.Stats(); st.Segments < 2 {
				t.Fatalf("expected several segments with 8 KiB segments, got %d", st.Segments)
			}
			if err := j.Close(); err != nil {
				t.Fatal(err)
			}
			j, got = openT(t, Options{Dir: dir, Fsync: policy, SegmentBytes: 8 << 10})
			defer j.Close()
			if len(got) != n {
				t.Fatalf("replayed %d records, want %d", len(got), n)
			}
			for i, r := range got {
				if r.pos != Pos(i+1) || r.ref != 0 || r.data != string(payload(i)) {
					t.Fatalf("replay %d: %+v", i, r)
				}
			}
			if p := j.Append([]byte("after"), rec.done); p != n+1 {
				t.Fatalf("position after reopen %d, want %d", p, n+1)
			}
		})
	}
}

// TestCompletionAfterSync counts fsyncs through the fault FS: no record may
// be completed before an fsync that began after it was written.
func TestCompletionAfterSync(t *testing.T) {
	ffs := NewFaultFS(nil)
	dir := t.TempDir()
	j, _ := openT(t, Options{Dir: dir, FS: ffs})
	defer j.Close()
	var mu sync.Mutex
	var violations []string
	syncsAtAppend := make(map[Pos]int)
	writesAtAppend := make(map[Pos]int)
	rec := newRecorder(t)
	const n = 500
	for i := range n {
		mu.Lock()
		before := ffs.Count(OpSync)
		writesBefore := ffs.Count(OpWrite)
		pos := j.Append(payload(i), func(pos Pos, err error) {
			mu.Lock()
			// The covering fsync starts after the write of the record, and
			// the record was appended when the sync count was before.
			if ffs.Count(OpSync) <= syncsAtAppend[pos] {
				violations = append(violations, fmt.Sprintf("pos %d completed with no fsync since its append", pos))
			}
			if ffs.Count(OpWrite) <= writesAtAppend[pos] {
				violations = append(violations, fmt.Sprintf("pos %d completed with no write since its append", pos))
			}
			mu.Unlock()
			rec.done(pos, err)
		})
		syncsAtAppend[pos] = before
		writesAtAppend[pos] = writesBefore
		mu.Unlock()
	}
	rec.wait(n)
	mu.Lock()
	defer mu.Unlock()
	if len(violations) > 0 {
		t.Fatalf("%d violations, first: %s", len(violations), violations[0])
	}
	st := j.Stats()
	if st.Fsyncs == 0 || st.RecordsSynced != n {
		t.Fatalf("stats: fsyncs %d records synced %d, want %d", st.Fsyncs, st.RecordsSynced, n)
	}
}

// TestLoneAppendNotDelayed: at low load a record goes out at once. The
// bound is generous (no timer exists to wait for); it catches a fixed
// batching delay, not slowness.
func TestLoneAppendNotDelayed(t *testing.T) {
	j, _ := openT(t, Options{Dir: t.TempDir()})
	defer j.Close()
	done := make(chan error, 1)
	j.Append([]byte("lone"), func(_ Pos, err error) { done <- err })
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("a lone append was never completed")
	}
	if st := j.Stats(); st.Fsyncs != 1 || st.RecordsSynced != 1 {
		t.Fatalf("want one fsync covering one record, got %+v", st)
	}
}

func TestBadInput(t *testing.T) {
	j, _ := openT(t, Options{Dir: t.TempDir(), SegmentBytes: 8 << 10})
	defer j.Close()
	rec := newRecorder(t)
	big := j.Append(make([]byte, 9<<10), rec.done)
	badRef := j.AppendRef([]byte("r"), 12345, rec.done)
	ok := j.Append([]byte("fine"), rec.done)
	refToRef := j.AppendRef([]byte("r"), ok, rec.done)
	refToRefToRef := j.AppendRef([]byte("r"), refToRef, rec.done)
	rec.wait(5)
	for pos, want := range map[Pos]error{big: ErrTooLarge, badRef: ErrBadTarget, ok: nil, refToRef: nil, refToRefToRef: ErrBadTarget} {
		err, _ := rec.err(pos)
		if !errors.Is(err, want) {
			t.Errorf("pos %d: err %v, want %v", pos, err, want)
		}
	}
	if _, err := j.Read(big, nil); !errors.Is(err, ErrNotFound) {
		t.Errorf("read of a rejected record: %v", err)
	}
	if _, err := Open(Options{Dir: t.TempDir(), SegmentBytes: 10}, nil); err == nil {
		t.Error("tiny SegmentBytes accepted")
	}
	if _, err := Open(Options{}, nil); err == nil {
		t.Error("empty Dir accepted")
	}
}

func TestCloseRejectsAppends(t *testing.T) {
	j, _ := openT(t, Options{Dir: t.TempDir()})
	if err := j.Close(); err != nil {
		t.Fatal(err)
	}
	var got error
	j.Append([]byte("late"), func(_ Pos, err error) { got = err })
	if !errors.Is(got, ErrClosed) {
		t.Fatalf("append after close: %v", got)
	}
}

// segmentFiles lists the segment files in dir, oldest first.
func segmentFiles(t testing.TB, dir string) []string {
	t.Helper()
	m, err := filepath.Glob(filepath.Join(dir, "*.seg"))
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func dirBytes(t testing.TB, dir string) int64 {
	t.Helper()
	var n int64
	for _, f := range segmentFiles(t, dir) {
		st, err := os.Stat(f)
		if errors.Is(err, os.ErrNotExist) {
			continue // removed by compaction meanwhile
		}
		if err != nil {
			t.Fatal(err)
		}
		n += st.Size()
	}
	return n
}

// writeJournal appends n records and closes the journal.
func writeJournal(t testing.TB, dir string, n int) {
	t.Helper()
	j, _ := openT(t, Options{Dir: dir})
	rec := newRecorder(t)
	for i := range n {
		j.Append(payload(i), rec.done)
	}
	rec.wait(n)
	if err := j.Close(); err != nil {
		t.Fatal(err)
	}
}

func TestTornTail(t *testing.T) {
	const n = 100
	recLen := int64(recordHeaderSize + len(payload(0)))
	cases := []struct {
		name    string
		damage  func(path string, size int64) error
		dropped int64
	}{
		{"truncate-mid-record", func(path string, size int64) error {
			return os.Truncate(path, size-recLen/2)
		}, recLen - recLen/2},
		{"flip-byte-in-last", func(path string, size int64) error {
			return flipByte(path, size-3)
		}, recLen},
		{"flip-byte-in-last-header", func(path string, size int64) error {
			return flipByte(path, size-recLen+13)
		}, recLen},
		{"garbage-appended", func(path string, size int64) error {
			f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND, 0)
			if err != nil {
				return err
			}
			defer f.Close()
			_, err = f.Write(bytes.Repeat([]byte{0}, 10))
			return err
		}, 10},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			writeJournal(t, dir, n)
			files := segmentFiles(t, dir)
			last := files[len(files)-1]
			st, _ := os.Stat(last)
			if err := tc.damage(last, st.Size()); err != nil {
				t.Fatal(err)
			}
			var logs bytes.Buffer
			j, got := openT(t, Options{Dir: dir, Logger: slog.New(slog.NewTextHandler(&logs, nil))})
			defer j.Close()
			if !strings.Contains(logs.String(), fmt.Sprintf("bytes_dropped=%d", tc.dropped)) {
				t.Fatalf("recovery did not log the dropped bytes:\n%s", logs.String())
			}
			want := n - 1
			if tc.name == "garbage-appended" {
				want = n
			}
			if len(got) != want {
				t.Fatalf("replayed %d, want %d", len(got), want)
			}
			for i, r := range got {
				if r.data != string(payload(i)) {
					t.Fatalf("record %d: %q", i, r.data)
				}
			}
			if d := j.Stats().DroppedBytes; d != tc.dropped {
				t.Fatalf("dropped %d bytes, want %d", d, tc.dropped)
			}
			// New appends continue after the surviving records and survive
			// another reopen.
			rec := newRecorder(t)
			p := j.Append([]byte("new"), rec.done)
			rec.wait(1)
			if p != Pos(want+1) {
				t.Fatalf("next position %d, want %d", p, want+1)
			}
			j.Close()
			j2, got2 := openT(t, Options{Dir: dir})
			defer j2.Close()
			if len(got2) != want+1 || got2[want].data != "new" || j2.Stats().DroppedBytes != 0 {
				t.Fatalf("after second reopen: %d records, dropped %d", len(got2), j2.Stats().DroppedBytes)
			}
		})
	}
}

// TestCorruptMiddle documents the policy: a segment is read up to its first
// bad record and truncated there, so everything after it in that segment
// is dropped, while other segments are kept.
func TestCorruptMiddle(t *testing.T) {
	const n = 100
	dir := t.TempDir()
	writeJournal(t, dir, n)
	files := segmentFiles(t, dir)
	recLen := int64(recordHeaderSize + len(payload(0)))
	if err := flipByte(files[0], segmentHeaderSize+40*recLen+recordHeaderSize+2); err != nil {
		t.Fatal(err)
	}
	j, got := openT(t, Options{Dir: dir})
	defer j.Close()
	if len(got) != 40 {
		t.Fatalf("replayed %d records, want the 40 before the bad one", len(got))
	}
	if d := j.Stats().DroppedBytes; d != 60*recLen {
		t.Fatalf("dropped %d, want %d", d, 60*recLen)
	}
}

func flipByte(path string, off int64) error {
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		return err
	}
	defer f.Close()
	var b [1]byte
	if _, err := f.ReadAt(b[:], off); err != nil {
		return err
	}
	b[0] ^= 0x40
	_, err = f.WriteAt(b[:], off)
	return err
}

func TestPositionsSurviveFullReclaim(t *testing.T) {
	dir := t.TempDir()
	opts := Options{Dir: dir, SegmentBytes: 4 << 10}
	j, _ := openT(t, opts)
	rec := newRecorder(t)
	var last Pos
	for i := range 200 {
		last = j.Append(payload(i), rec.done)
	}
	rec.wait(200)
	for p := Pos(1); p <= last; p++ {
		j.Free(p)
	}
	waitFor(t, func() error {
		if s := j.Stats(); s.Segments != 1 {
			return fmt.Errorf("%d segments", s.Segments)
		}
		return nil
	})
	j.Close()
	j, got := openT(t, opts)
	defer j.Close()
	rec2 := newRecorder(t)
	p := j.Append([]byte("x"), rec2.done)
	rec2.wait(1)
	if p <= last {
		t.Fatalf("position %d reused after reclaiming everything (last was %d); replayed %d", p, last, len(got))
	}
}

func waitFor(t testing.TB, cond func() error) {
	t.Helper()
	testutil.WaitFor(t, 60*time.Second, cond)
}

// TestBackpressure: with the writer held, Append parks once PendingBytesMax
// bytes wait, and resumes when the writer takes them.
func TestBackpressure(t *testing.T) {
	const pendingMax = 64 << 10
	j, _ := openT(t, Options{Dir: t.TempDir(), PendingBytesMax: pendingMax})
	defer j.Close()
	gate := make(chan struct{})
	held := make(chan struct{})
	rec := newRecorder(t)
	j.Append([]byte("gate"), func(pos Pos, err error) {
		close(held)
		<-gate
		rec.done(pos, err)
	})
	<-held
	data := make([]byte, 1000)
	const n = 1000
	var appended sync.WaitGroup
	var count atomicInt
	appended.Add(1)
	go func() {
		defer appended.Done()
		for range n {
			j.Append(data, rec.done)
			count.add(1)
		}
	}()
	// The appender runs into the bound, and must stop there.
	bound := pendingMax/(recordHeaderSize+len(data)) + 1
	waitFor(t, func() error {
		if c := count.get(); c < bound-1 {
			return fmt.Errorf("%d appends so far", c)
		}
		return nil
	})
	time.Sleep(100 * time.Millisecond)
	if c := count.get(); c > bound {
		t.Fatalf("%d appends returned while the writer was held, bound %d", c, bound)
	}
	close(gate)
	appended.Wait()
	rec.wait(n + 1)
}

type atomicInt struct {
	mu sync.Mutex
	n  int
}

func (a *atomicInt) add(d int) { a.mu.Lock(); a.n += d; a.mu.Unlock() }
func (a *atomicInt) get() int  { a.mu.Lock(); defer a.mu.Unlock(); return a.n }

// TestFsyncPolicyNames: every policy's name parses back to it, and any
// other name is an error naming it and the policies.
func TestFsyncPolicyNames(t *testing.T) {
	for _, p := range []FsyncPolicy{FsyncAlways, FsyncNever} {
		got, err := ParseFsyncPolicy(p.String())
		if err != nil || got != p {
			t.Errorf("ParseFsyncPolicy(%q) = %v, %v; want %v", p.String(), got, err, p)
		}
	}
	if n := FsyncPolicyNames(); len(n) != 2 || n[0] != "always" || n[1] != "never" {
		t.Errorf("FsyncPolicyNames() = %q", n)
	}
	for _, name := range []string{"", "sometimes", "Always", " never"} {
		_, err := ParseFsyncPolicy(name)
		if want := fmt.Sprintf("journal: fsync policy %q: want always or never", name); err == nil || err.Error() != want {
			t.Errorf("ParseFsyncPolicy(%q): %v, want %q", name, err, want)
		}
	}
	if p := FsyncPolicy(7); p.Valid() || p.String() != "FsyncPolicy(7)" {
		t.Errorf("FsyncPolicy(7): valid %v, %q", p.Valid(), p.String())
	}
}
