package journal

import (
	"strings"
	"testing"
	"time"
)

// TestFsyncHistograms checks the two fsync histograms against a file
// system whose segment fsyncs take at least 2 ms and can be held: five
// lone appends are five fsyncs of one record each, and eight appends made
// while an fsync is held go out as one fsync of eight.
func TestFsyncHistograms(t *testing.T) {
	const slow = 2 * time.Millisecond
	ffs := NewFaultFS(nil)
	held := make(chan struct{})    // closed by the test to let a held fsync finish
	entered := make(chan struct{}) // the writer is inside the held fsync
	var hold bool
	ffs.SetRule(func(op Op, name string, n int) error {
		if op != OpSync || !strings.HasSuffix(name, ".seg") {
			return nil
		}
		time.Sleep(slow)
		if hold {
			hold = false
			close(entered)
			<-held
		}
		return nil
	})
	j, _ := openT(t, Options{Dir: t.TempDir(), FS: ffs})
	defer j.Close()
	rec := newRecorder(t)
	for i := 0; i < 5; i++ {
		j.Append(payload(i), rec.done)
		rec.wait(i + 1)
	}
	st := j.Stats()
	if st.Fsyncs != 5 || st.RecordsSynced != 5 || st.BatchHistogram[0] != 5 {
		t.Fatalf("after 5 lone appends: fsyncs %d, records %d, batch histogram %v", st.Fsyncs, st.RecordsSynced, st.BatchHistogram)
	}
	checkFsyncHistogram(t, st, slow)

	// The rule runs under the FaultFS lock; hold is set through it too.
	ffs.mu.Lock()
	hold = true
	ffs.mu.Unlock()
	j.Append(payload(5), rec.done)
	<-entered
	for i := 6; i < 14; i++ {
		j.Append(payload(i), rec.done)
	}
	close(held)
	rec.wait(14)
	st = j.Stats()
	if st.Fsyncs != 7 || st.RecordsSynced != 14 {
		t.Fatalf("fsyncs %d records %d, want 7 and 14", st.Fsyncs, st.RecordsSynced)
	}
	// 6 fsyncs of one record, one of eight: bucket [8, 16).
	if st.BatchHistogram[0] != 6 || st.BatchHistogram[3] != 1 {
		t.Fatalf("batch histogram %v, want 6 in bucket 0 and 1 in bucket 3", st.BatchHistogram)
	}
	checkFsyncHistogram(t, st, slow)
}

// checkFsyncHistogram: the latency histogram counts every fsync that
// covered records, none faster than the file system's floor.
func checkFsyncHistogram(t *testing.T, st Stats, floor time.Duration) {
	t.Helper()
	var total uint64
	for _, n := range st.FsyncHistogram {
		total += n
	}
	if total != st.Fsyncs {
		t.Fatalf("fsync latency histogram counts %d, fsyncs %d: %v", total, st.Fsyncs, st.FsyncHistogram)
	}
	low := fsyncBucket(floor)
	for i := 0; i < low; i++ {
		if st.FsyncHistogram[i] != 0 {
			t.Fatalf("fsyncs of at least %v counted in bucket %d: %v", floor, i, st.FsyncHistogram)
		}
	}
	if st.FsyncNanos < st.Fsyncs*uint64(floor) {
		t.Fatalf("fsync time %v for %d fsyncs of at least %v", time.Duration(st.FsyncNanos), st.Fsyncs, floor)
	}
}

func TestFsyncBucket(t *testing.T) {
	for _, c := range []struct {
		d    time.Duration
		want int
	}{
		{0, 0}, {999 * time.Nanosecond, 0}, {time.Microsecond, 0}, {2 * time.Microsecond, 1}, {3 * time.Microsecond, 1},
		{1024 * time.Microsecond, 10}, {2 * time.Millisecond, 10}, {2048 * time.Microsecond, 11},
		{time.Hour, FsyncHistogramBuckets - 1}, {-time.Second, 0},
	} {
		if got := fsyncBucket(c.d); got != c.want {
			t.Errorf("fsyncBucket(%v) = %d, want %d", c.d, got, c.want)
		}
	}
}
