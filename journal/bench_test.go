package journal

import (
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/HdrHistogram/hdrhistogram-go"
	"github.com/tidwall/wal"
	"golang.org/x/sys/unix"
)

// benchLiveMax: the append benchmark frees records this far behind the
// head, so the index, the segments and the disk stay in steady state.
const benchLiveMax = 100_000

// BenchmarkAppend measures append-to-completion with one appender: the
// records/s, the records one fsync covered, and the p99 latency from Append
// to its completion.
func BenchmarkAppend(b *testing.B) {
	for _, policy := range []struct {
		name string
		p    FsyncPolicy
	}{{"always", FsyncAlways}, {"never", FsyncNever}} {
		// inflight bounds the records awaiting completion, as a producer
		// window would; 0 leaves only the journal's PendingBytesMax, so
		// latency then measures a full queue.
		for _, inflight := range []int{0, 4096} {
			b.Run(fmt.Sprintf("fsync=%s/bytes=128/inflight=%d", policy.name, inflight), func(b *testing.B) {
				j, err := Open(Options{Dir: b.TempDir(), Fsync: policy.p, Logger: quietLogger()}, nil)
				if err != nil {
					b.Fatal(err)
				}
				defer j.Close()
				// Completions run on the writer goroutine, which alone touches
				// the histogram until Sync has returned.
				hist := hdrhistogram.New(1, 10_000_000, 3)
				const ringSize = 1 << 20 // > the records PendingBytesMax can hold twice
				starts := make([]int64, ringSize)
				var failures atomic.Int64
				window := make(chan struct{}, max(inflight, 1))
				done := func(pos Pos, err error) {
					if err != nil {
						failures.Add(1)
					}
					hist.RecordValue((time.Now().UnixNano() - starts[pos%ringSize]) / 1000)
					if inflight > 0 {
						<-window
					}
				}
				data := make([]byte, 128)
				next := Pos(1)
				b.SetBytes(int64(len(data)))
				b.ReportAllocs()
				b.ResetTimer()
				began := time.Now()
				for range b.N {
					if inflight > 0 {
						window <- struct{}{}
					}
					starts[next%ringSize] = time.Now().UnixNano()
					pos := j.Append(data, done)
					if pos != next {
						b.Fatalf("position %d, want %d", pos, next)
					}
					next++
					if pos > benchLiveMax {
						j.Free(pos - benchLiveMax)
					}
				}
				if err := j.Sync(); err != nil {
					b.Fatal(err)
				}
				elapsed := time.Since(began)
				b.StopTimer()
				if failures.Load() > 0 {
					b.Fatalf("%d failed completions", failures.Load())
				}
				st := j.Stats()
				b.ReportMetric(float64(b.N)/elapsed.Seconds(), "records/s")
				b.ReportMetric(st.RecordsPerFsync(), "records/fsync")
				b.ReportMetric(float64(hist.ValueAtQuantile(50)), "p50-µs")
				b.ReportMetric(float64(hist.ValueAtQuantile(99)), "p99-µs")
				b.Logf("N=%d p90=%dµs p99.9=%dµs max=%dµs segments=%d reclaimed=%d", b.N, hist.ValueAtQuantile(90), hist.ValueAtQuantile(99.9), hist.Max(), st.Segments, st.SegmentsReclaimed)
				b.ReportMetric(float64(st.Appends)/float64(max(st.Batches, 1)), "records/batch")
			})
		}
	}
}

var recoverDirs struct {
	sync.Mutex
	byCount map[int]string
}

// recoverDir builds, once per process, a journal of n 128-byte records.
func recoverDir(b *testing.B, n int) string {
	recoverDirs.Lock()
	defer recoverDirs.Unlock()
	if dir, ok := recoverDirs.byCount[n]; ok {
		return dir
	}
	dir, err := os.MkdirTemp("", "journal-recover-bench-")
	if err != nil {
		b.Fatal(err)
	}
	j, err := Open(Options{Dir: dir, Fsync: FsyncNever, Logger: quietLogger()}, nil)
	if err != nil {
		b.Fatal(err)
	}
	data := make([]byte, 128)
	noop := func(Pos, error) {}
	for range n {
		j.Append(data, noop)
	}
	if err := j.Close(); err != nil {
		b.Fatal(err)
	}
	if recoverDirs.byCount == nil {
		recoverDirs.byCount = map[int]string{}
	}
	recoverDirs.byCount[n] = dir
	return dir
}

func TestMain(m *testing.M) {
	if dir := os.Getenv(childDirEnv); dir != "" {
		killChild(dir)
		os.Exit(0)
	}
	code := m.Run()
	for _, dir := range recoverDirs.byCount {
		os.RemoveAll(dir)
	}
	os.Exit(code)
}

// BenchmarkRecover measures Open on a journal of 128-byte records: scan,
// CRC check, index build and replay (the file pages are warm in memory).
func BenchmarkRecover(b *testing.B) {
	for _, n := range []int{100_000, 1_000_000} {
		b.Run(fmt.Sprintf("records=%d", n), func(b *testing.B) {
			dir := recoverDir(b, n)
			b.ReportAllocs()
			b.ResetTimer()
			for b.Loop() {
				count := 0
				j, err := Open(Options{Dir: dir, Logger: quietLogger()}, func(Pos, Pos, []byte) error {
					count++
					return nil
				})
				if err != nil {
					b.Fatal(err)
				}
				j.Close()
				if count != n {
					b.Fatalf("replayed %d, want %d", count, n)
				}
			}
			b.ReportMetric(float64(n)*float64(b.N)/b.Elapsed().Seconds(), "records/s")
		})
	}
}

// BenchmarkStorageCompare compares, for 128-byte records written in
// batches followed by one sync: tidwall/wal (WriteBatch, which fsyncs),
// a bare segment file with write(2) and fdatasync, and this journal's
// Append path. One op is one batch.
func BenchmarkStorageCompare(b *testing.B) {
	data := make([]byte, 128)
	for _, batch := range []int{1, 64} {
		b.Run(fmt.Sprintf("store=tidwall-wal/batch=%d", batch), func(b *testing.B) {
			log, err := wal.Open(filepath.Join(b.TempDir(), "wal"), &wal.Options{LogFormat: wal.Binary, NoCopy: true})
			if err != nil {
				b.Fatal(err)
			}
			defer log.Close()
			var wb wal.Batch
			index := uint64(1)
			b.ReportAllocs()
			b.ResetTimer()
			for b.Loop() {
				for range batch {
					wb.Write(index, data)
					index++
				}
				if err := log.WriteBatch(&wb); err != nil {
					b.Fatal(err)
				}
				wb.Clear()
			}
			b.ReportMetric(float64(b.N*batch)/b.Elapsed().Seconds(), "records/s")
		})
		b.Run(fmt.Sprintf("store=segment-fdatasync/batch=%d", batch), func(b *testing.B) {
			f, err := os.OpenFile(filepath.Join(b.TempDir(), "seg"), os.O_RDWR|os.O_CREATE|os.O_APPEND, 0o644)
			if err != nil {
				b.Fatal(err)
			}
			defer f.Close()
			buf := make([]byte, 0, batch*(recordHeaderSize+len(data)))
			pos := Pos(1)
			b.ReportAllocs()
			b.ResetTimer()
			for b.Loop() {
				buf = buf[:0]
				for range batch {
					buf = appendRecord(buf, kindPlain, pos, 0, data)
					pos++
				}
				if _, err := f.Write(buf); err != nil {
					b.Fatal(err)
				}
				if err := unix.Fdatasync(int(f.Fd())); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(b.N*batch)/b.Elapsed().Seconds(), "records/s")
		})
		b.Run(fmt.Sprintf("store=journal/batch=%d", batch), func(b *testing.B) {
			b.ReportAllocs()
			benchJournalBatches(b, batch, data)
		})
	}
}

// BenchmarkGroupLogStores weighs the two ways to keep the replication
// groups' logs (replication/groups) for a broker with 12 groups that each get
// a batch of 16 records of 128 bytes per round, every record durable at
// the round's end: one tidwall/wal log per group (consecutive indexes,
// truncation at both ends: the model the card names for a group's log),
// written by one goroutine per group so their fsyncs overlap, or the one
// journal all groups share, which covers the round with one fsync. One op
// is one round.
func BenchmarkGroupLogStores(b *testing.B) {
	const groups, batch = 12, 16
	data := make([]byte, 128)
	b.Run("store=tidwall-wal-per-group", func(b *testing.B) {
		dir := b.TempDir()
		logs := make([]*wal.Log, groups)
		for g := range logs {
			l, err := wal.Open(filepath.Join(dir, fmt.Sprint(g)), &wal.Options{LogFormat: wal.Binary, NoCopy: true})
			if err != nil {
				b.Fatal(err)
			}
			defer l.Close()
			logs[g] = l
		}
		index := make([]uint64, groups)
		batches := make([]wal.Batch, groups)
		var wg sync.WaitGroup
		errs := make([]error, groups)
		b.ResetTimer()
		for b.Loop() {
			for g := range logs {
				wg.Add(1)
				go func() {
					defer wg.Done()
					wb := &batches[g]
					for range batch {
						index[g]++
						wb.Write(index[g], data)
					}
					errs[g] = logs[g].WriteBatch(wb)
					wb.Clear()
				}()
			}
			wg.Wait()
			for _, err := range errs {
				if err != nil {
					b.Fatal(err)
				}
			}
		}
		b.ReportMetric(float64(b.N*groups*batch)/b.Elapsed().Seconds(), "records/s")
	})
	b.Run("store=shared-journal", func(b *testing.B) { benchJournalBatches(b, groups*batch, data) })
}

// benchJournalBatches appends batches of n records of data to a fresh
// journal, each waited for, one batch an op, and reports records/s. It
// frees records benchLiveMax behind the head.
func benchJournalBatches(b *testing.B, n int, data []byte) {
	j, err := Open(Options{Dir: b.TempDir(), Logger: quietLogger()}, nil)
	if err != nil {
		b.Fatal(err)
	}
	defer j.Close()
	complete := make(chan error, 1)
	var remaining atomic.Int64
	done := func(_ Pos, err error) {
		if remaining.Add(-1) == 0 || err != nil {
			complete <- err
		}
	}
	b.ResetTimer()
	for b.Loop() {
		remaining.Store(int64(n))
		var last Pos
		for range n {
			last = j.Append(data, done)
		}
		if err := <-complete; err != nil {
			b.Fatal(err)
		}
		if last > benchLiveMax {
			for p := last - Pos(n) + 1; p <= last; p++ {
				j.Free(p - benchLiveMax)
			}
		}
	}
	b.ReportMetric(float64(b.N*n)/b.Elapsed().Seconds(), "records/s")
}
