package clustertest

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/berthmq/berth/client"
)

// BenchmarkPublishForwarded compares, in one run on one cluster of three
// real brokers (fsync always, 3 replicas per group, one shard each),
// persistent publishes to a replicated queue made at the group's master
// with the same publishes made at a follower, which forwards each to the
// master. Four connections keep up to 256 publishes each in flight; the
// figures are completed publishes per second and the publish latency's
// p50 and p99 as the client sees them.
//
//	make bench-forward
//	go test ./server/clustertest -run '^$' -bench PublishForwarded -benchtime 20000x
func BenchmarkPublishForwarded(b *testing.B) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	c := startReplicatedN(b, ctx, 3, 3, 3)
	const queue = "bench-forwarded"
	_, _, mnode, _ := c.declare(queue, 3)
	c.declareEverywhere(queue)
	var fnode *node
	for _, n := range c.nodes {
		if n != mnode {
			fnode = n
			break
		}
	}
	for _, size := range []int{128, 1024} {
		for _, via := range []struct {
			name string
			n    *node
		}{{"master", mnode}, {"follower", fnode}} {
			b.Run(fmt.Sprintf("size=%d/via=%s", size, via.name), func(b *testing.B) {
				benchPublish(b, ctx, via.n.client, queue, size)
			})
		}
	}
}

func benchPublish(b *testing.B, ctx context.Context, addr, queue string, size int) {
	const conns, window = 4, 256
	payload := make([]byte, size)
	lat := make([]time.Duration, b.N)
	var failed error
	var mu sync.Mutex
	var wg sync.WaitGroup
	b.SetBytes(int64(size))
	b.ReportAllocs()
	b.ResetTimer()
	start := time.Now()
	for c := range conns {
		conn := dial(b, ctx, addr)
		wg.Add(1)
		go func() {
			defer wg.Done()
			slots := make(chan struct{}, window)
			for i := c; i < b.N; i += conns {
				slots <- struct{}{}
				sent := time.Now()
				err := conn.PublishAsync(ctx, "", queue, payload, client.PublishOptions{Persistent: true}, func(err error) {
					lat[i] = time.Since(sent)
					if err != nil {
						mu.Lock()
						failed = err
						mu.Unlock()
					}
					<-slots
				})
				if err != nil {
					mu.Lock()
					failed = err
					mu.Unlock()
					return
				}
			}
			for range window {
				slots <- struct{}{}
			}
		}()
	}
	wg.Wait()
	elapsed := time.Since(start)
	b.StopTimer()
	if failed != nil {
		b.Fatal(failed)
	}
	slices.Sort(lat)
	b.ReportMetric(float64(b.N)/elapsed.Seconds(), "msgs/s")
	b.ReportMetric(float64(lat[b.N/2].Microseconds()), "p50-us")
	b.ReportMetric(float64(lat[b.N*99/100].Microseconds()), "p99-us")
}
