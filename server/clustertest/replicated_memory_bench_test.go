package clustertest

import (
	"bytes"
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/berthmq/berth/client"
)

// BenchmarkReplicatedBacklog: three brokers (one shard each) and a
// replicated queue; b.N persistent 2 KiB messages are published
// (untimed), then consumed from the master with ack mode none (timed).
// mode=memory runs without a memory budget, so every broker holds the
// whole backlog in memory; mode=paged runs with -memory-limit 16MiB, so
// a backlog above it is paged out on every broker and read back from
// the group journal on delivery. Reported: the consume rate, the
// brokers' largest RSS while the backlog was built and drained (master
// and followers), and the messages paged on the master.
//
//	go test ./server/clustertest -run '^$' -bench ReplicatedBacklog -benchtime 50000x
func BenchmarkReplicatedBacklog(b *testing.B) {
	const payloadSize = 2048
	for _, mode := range []struct {
		name  string
		extra []string
	}{{"memory", nil}, {"paged", []string{"-memory-limit", "16MiB"}}} {
		b.Run("mode="+mode.name, func(b *testing.B) {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
			defer cancel()
			c := startReplicatedWith(b, ctx, 3, 3, 0, append([]string{"-shards", "1"}, mode.extra...)...)
			queue := "backlog-" + mode.name
			_, _, mnode, conn := c.declare(queue, 3)

			var maxRSS [3]atomic.Int64
			stop := make(chan struct{})
			var sampling sync.WaitGroup
			sampling.Add(1)
			go func() {
				defer sampling.Done()
				for {
					for i, nd := range c.nodes {
						if rss, err := rssOf(nd.proc.Pid()); err == nil && rss > maxRSS[i].Load() {
							maxRSS[i].Store(rss)
						}
					}
					select {
					case <-stop:
						return
					case <-time.After(20 * time.Millisecond):
					}
				}
			}()

			var done, failed atomic.Int64
			for i := range b.N {
				if err := conn.PublishAsync(ctx, "", queue, budgetPayload(i, payloadSize), client.PublishOptions{Persistent: true}, func(err error) {
					if err != nil {
						failed.Add(1)
					}
					done.Add(1)
				}); err != nil {
					b.Fatal(err)
				}
			}
			for done.Load() < int64(b.N) {
				if ctx.Err() != nil {
					b.Fatal(ctx.Err())
				}
				time.Sleep(5 * time.Millisecond)
			}
			if failed.Load() != 0 {
				b.Fatalf("%d publishes failed", failed.Load())
			}
			c.waitReady(queue, b.N)
			var st budgetStatus
			if err := c.getJSON(mnode, "/v1/status", &st); err != nil {
				b.Fatal(err)
			}

			sub := dial(b, ctx, mnode.client)
			con, err := sub.Subscribe(ctx, queue, client.SubscribeOptions{Credit: 1000, AutoCredit: true, AckMode: client.AckNone})
			if err != nil {
				b.Fatal(err)
			}
			b.SetBytes(payloadSize)
			b.ResetTimer()
			start := time.Now()
			for i := range b.N {
				d, err := con.Next(ctx)
				if err != nil {
					b.Fatal(err)
				}
				if want := fmt.Sprintf("%08d:", i); !bytes.HasPrefix(d.Payload, []byte(want)) {
					b.Fatalf("delivery %d: %.9q", i, d.Payload)
				}
			}
			el := time.Since(start)
			b.StopTimer()
			close(stop)
			sampling.Wait()
			var master, follower int64
			for i, nd := range c.nodes {
				if nd == mnode {
					master = maxRSS[i].Load()
				} else {
					follower = max(follower, maxRSS[i].Load())
				}
			}
			b.ReportMetric(float64(b.N)/el.Seconds(), "msgs/s")
			b.ReportMetric(float64(master>>20), "master-rss-MiB")
			b.ReportMetric(float64(follower>>20), "follower-rss-MiB")
			b.ReportMetric(float64(st.Memory.PagedMessages), "paged")
		})
	}
}
