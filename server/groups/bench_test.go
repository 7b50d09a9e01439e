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
//	go test ./server/groups -run '^$' -bench GroupReplication -benchtime 20000x
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
