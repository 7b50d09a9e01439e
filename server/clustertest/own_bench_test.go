package clustertest

import (
	"context"
	"encoding/binary"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/berthmq/berth/client"
)

// BenchmarkConsumeOwned compares, on clusters of three real brokers
// (fsync always, every broker a replica of every group), ways to consume
// one replicated queue: b.N persistent 128-byte messages are published
// first (not timed), then the consumers (1,000 credit each,
// BERTH_BENCH_CREDIT) take them all and accept them in batches of 64;
// the figure is messages accepted per second, over all consumers.
//
//   - flag=off/at=master: today's default, one consumer at the master;
//
//   - flag=off/at=follower: one consumer at a follower, proxied to the
//     master;
//
//   - flag=on/at=master: -consume-at-replicas, one consumer at the
//     master, which keeps the queue (it stays put);
//
//   - flag=on/at=follower: one consumer at a follower, which takes the
//     queue's ownership and acquires through the master;
//
//   - flag=on/at=spread: one consumer on each broker, taking the queue
//     in turns.
//
//     go test ./server/clustertest -run '^$' -bench ConsumeOwned -benchtime 20000x
func BenchmarkConsumeOwned(b *testing.B) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	for _, flag := range []string{"off", "on"} {
		queue := "bench-owned-" + flag
		c, mnode, fnode, mconn := ownedBenchCluster(b, ctx, flag, queue)
		rows := []struct {
			name  string
			nodes []*node
		}{{"master", []*node{mnode}}, {"follower", []*node{fnode}}}
		if flag == "on" {
			rows = append(rows, struct {
				name  string
				nodes []*node
			}{"spread", c.nodes})
		}
		for _, row := range rows {
			b.Run("flag="+flag+"/at="+row.name, func(b *testing.B) {
				publishPersistent(b, ctx, mconn, queue, b.N, 128)
				b.ResetTimer()
				elapsed := consumeAll(b, ctx, queue, row.nodes, b.N)
				b.StopTimer()
				b.ReportMetric(float64(b.N)/elapsed.Seconds(), "msgs/s")
			})
		}
	}
}

// ownedBenchCluster starts three brokers with -consume-at-replicas on or
// off (flag; BERTH_BENCH_OWN_SLICE sets -own-slice when on), declares
// queue and waits until every broker runs its replica of the queue's
// group; it returns the cluster, the group's master, a follower, and a
// connection to the master.
func ownedBenchCluster(b *testing.B, ctx context.Context, flag, queue string) (*rcluster, *node, *node, *client.Conn) {
	extra := []string{"-consume-at-replicas=false"}
	if flag == "on" {
		extra = []string{"-consume-at-replicas"}
		if sl := os.Getenv("BERTH_BENCH_OWN_SLICE"); sl != "" {
			extra = append(extra, "-own-slice", sl)
		}
	}
	c := startReplicatedWith(b, ctx, 3, 3, 3, extra...)
	g, _, mnode, mconn := c.declare(queue, 3)
	c.declareEverywhere(queue)
	var fnode *node
	for _, n := range c.nodes {
		if n != mnode {
			fnode = n
			break
		}
	}
	for _, n := range c.nodes {
		for {
			if role, _, err := c.role(n, g); err == nil && role != "" {
				break
			}
			if ctx.Err() != nil {
				b.Fatalf("%s never ran its replica of group %d", n.name, g)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	return c, mnode, fnode, mconn
}

// consumeAll subscribes one consumer on each of nodes to queue and
// accepts, over all of them, n messages; it returns the time from the
// subscribes to the last accept's completion.
func consumeAll(b *testing.B, ctx context.Context, queue string, nodes []*node, n int) time.Duration {
	var taken atomic.Int64
	var failed atomic.Value
	var done sync.WaitGroup
	start := time.Now()
	for _, nd := range nodes {
		conn := dial(b, ctx, nd.client)
		defer conn.Close()
		con, err := conn.Subscribe(ctx, queue, client.SubscribeOptions{Credit: benchCredit(), AutoCredit: true})
		if err != nil {
			b.Fatal(err)
		}
		done.Add(1)
		go func() {
			defer done.Done()
			defer func() { _ = con.Cancel(ctx) }()
			var accepted sync.WaitGroup
			defer accepted.Wait()
			tags := make([]uint64, 0, 64)
			flush := func() {
				accepted.Add(1)
				if err := con.AcceptAsync(ctx, tags, func(err error) {
					if err != nil {
						failed.Store(err)
					}
					accepted.Done()
				}); err != nil {
					failed.Store(err)
					accepted.Done()
				}
				tags = tags[:0]
			}
			for taken.Load() < int64(n) {
				dctx, dcancel := context.WithTimeout(ctx, 200*time.Millisecond)
				d, err := con.Next(dctx)
				dcancel()
				if err != nil {
					if ctx.Err() != nil {
						failed.Store(err)
						return
					}
					if len(tags) > 0 {
						flush()
					}
					continue
				}
				taken.Add(1)
				if tags = append(tags, d.Tag); len(tags) == cap(tags) {
					flush()
				}
			}
			if len(tags) > 0 {
				flush()
			}
		}()
	}
	done.Wait()
	if err, _ := failed.Load().(error); err != nil {
		b.Fatal(err)
	}
	if got := taken.Load(); got != int64(n) {
		b.Fatalf("%d of %d messages taken", got, n)
	}
	return time.Since(start)
}

// BenchmarkConsumeOwnedLatency measures end-to-end latency, publish to
// delivery, of one replicated queue under a steady load: a publisher at
// the master sends 2,000 persistent 128-byte messages a second for
// b.N/2,000 seconds (at most 30 s), each carrying its send time, while
// the consumers take and accept them; rows as in BenchmarkConsumeOwned
// (one consumer at the master, one at a follower proxied to it, and,
// with -consume-at-replicas, one on each broker). It reports the p50 and
// p99 in microseconds. BERTH_BENCH_OWN_SLICE sets -own-slice.
//
//	go test ./server/clustertest -run '^$' -bench ConsumeOwnedLatency -benchtime 10000x
func BenchmarkConsumeOwnedLatency(b *testing.B) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	for _, flag := range []string{"off", "on"} {
		queue := "bench-latency-" + flag
		c, mnode, fnode, mconn := ownedBenchCluster(b, ctx, flag, queue)
		rows := map[string][]*node{"master": {mnode}, "follower": {fnode}}
		order := []string{"master", "follower"}
		if flag == "on" {
			rows, order = map[string][]*node{"spread": c.nodes}, []string{"spread"}
		}
		for _, name := range order {
			b.Run("flag="+flag+"/at="+name, func(b *testing.B) {
				n := min(b.N, 60000)
				lat := make(chan time.Duration, n)
				stop := make(chan struct{})
				var wg sync.WaitGroup
				for _, nd := range rows[name] {
					conn := dial(b, ctx, nd.client)
					defer conn.Close()
					con, err := conn.Subscribe(ctx, queue, client.SubscribeOptions{Credit: 1000, AutoCredit: true})
					if err != nil {
						b.Fatal(err)
					}
					wg.Add(1)
					go func() {
						defer wg.Done()
						for {
							dctx, dcancel := context.WithTimeout(ctx, 200*time.Millisecond)
							d, err := con.Next(dctx)
							dcancel()
							if err != nil {
								select {
								case <-stop:
									return
								default:
									continue
								}
							}
							sent := int64(binary.BigEndian.Uint64(d.Payload))
							lat <- time.Duration(time.Now().UnixNano() - sent)
							_ = con.AcceptAsync(ctx, []uint64{d.Tag}, func(error) {})
						}
					}()
				}
				b.ResetTimer()
				payload := make([]byte, 128)
				tick := time.NewTicker(time.Millisecond)
				defer tick.Stop()
				for sent := 0; sent < n; {
					<-tick.C
					for range 2 {
						binary.BigEndian.PutUint64(payload, uint64(time.Now().UnixNano()))
						if err := mconn.PublishAsync(ctx, "", queue, payload, client.PublishOptions{Persistent: true}, func(error) {}); err != nil {
							b.Fatal(err)
						}
						sent++
					}
				}
				var all []time.Duration
				deadline := time.After(30 * time.Second)
				for len(all) < n {
					select {
					case d := <-lat:
						all = append(all, d)
					case <-deadline:
						b.Fatalf("%d of %d delivered", len(all), n)
					}
				}
				b.StopTimer()
				close(stop)
				wg.Wait()
				slices.Sort(all)
				b.ReportMetric(float64(all[len(all)/2].Microseconds()), "p50-us")
				b.ReportMetric(float64(all[len(all)*99/100].Microseconds()), "p99-us")
			})
		}
	}
}
