package groups

import (
	"context"
	"flag"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// BenchmarkGroupReplication measures one group replicated to three
// in-process brokers over loopback TCP, each journal fsyncing every batch:
// 256 proposers (-proposers) each wait for their entry's commit before the next, so
// the figure is committed entries per second with 256 in flight.
//
//	go test ./replication/groups -run '^$' -bench GroupReplication -benchtime 20000x
func BenchmarkGroupReplication(b *testing.B) {
	for _, size := range []int{128, 1024} {
		b.Run(fmt.Sprintf("size=%d", size), func(b *testing.B) {
			c := newTestCluster(b)
			c.elect(1, c.ids)
			data := make([]byte, size)
			proposers := benchProposers
			var next atomic.Int64
			var wg sync.WaitGroup
			var failed atomic.Int64
			b.SetBytes(int64(size))
			b.ResetTimer()
			start := time.Now()
			for range proposers {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for next.Add(1) <= int64(b.N) {
						ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
						if err := c.brokers[1].n.Propose(ctx, testGroup, data); err != nil {
							failed.Add(1)
						}
						cancel()
					}
				}()
			}
			wg.Wait()
			b.StopTimer()
			if n := failed.Load(); n > 0 {
				b.Fatalf("%d proposals failed", n)
			}
			b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "commits/s")
		})
	}
}

// benchProposers is how many proposals BenchmarkGroupReplication keeps in
// flight; -proposers overrides it.
var benchProposers = 256

func init() {
	flag.IntVar(&benchProposers, "proposers", benchProposers, "proposals BenchmarkGroupReplication keeps in flight")
}

// countWaiter counts outcomes; a pointer, so passing it allocates nothing.
type countWaiter struct {
	done, failed atomic.Int64
}

func (w *countWaiter) Committed(_ uint64, err error) {
	if err != nil {
		w.failed.Add(1)
	}
	w.done.Add(1)
}

// BenchmarkProposeAsync is the replicated publish's path through the
// node: one group on three in-process brokers over loopback TCP, each
// journal fsyncing every batch, with up to 4096 proposals in flight told
// to a Waiter. Its allocs/op are the node's, the journal's and the
// transport's per committed entry (the entry's data is made once, outside
// the loop, as the caller owns it).
//
//	go test ./replication/groups -run '^$' -bench ProposeAsync -benchmem -benchtime 200000x
func BenchmarkProposeAsync(b *testing.B) {
	c := newTestCluster(b)
	c.discard.Store(true)
	c.elect(1, c.ids)
	n := c.brokers[1].n
	data := make([]byte, 128)
	var w countWaiter
	b.ReportAllocs()
	b.SetBytes(int64(len(data)))
	b.ResetTimer()
	for i := range b.N {
		for int64(i)-w.done.Load() >= 4096 {
			time.Sleep(50 * time.Microsecond)
		}
		for n.ProposeAsync(testGroup, data, &w, uint64(i)) != nil {
			time.Sleep(50 * time.Microsecond)
		}
	}
	deadline := time.Now().Add(30 * time.Second)
	for w.done.Load() < int64(b.N) && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	b.StopTimer()
	if d, f := w.done.Load(), w.failed.Load(); d != int64(b.N) || f > 0 {
		b.Fatalf("%d of %d proposals told, %d failed", d, b.N, f)
	}
}
