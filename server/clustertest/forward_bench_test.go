package clustertest

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/berthmq/berth/client"
	"github.com/berthmq/berth/internal/testutil"
)

// BenchmarkPublishForwarded compares, in one run on one cluster of three
// real brokers (fsync always, 3 replicas per group, one shard each),
// persistent publishes to a replicated queue made at the group's master
// with the same publishes made at a follower, which forwards each to the
// master. Four connections keep up to 256 publishes each in flight; the
// figures are completed publishes per second and the publish latency's
// p50 and p99 as the client sees them, and the CPU the three brokers
// spent a message, summed; a single broker (no cluster, fsync always)
// runs the same publishes beside them for the single-node figure.
//
//	make bench-forward
//	go test ./server/clustertest -run '^$' -bench PublishForwarded -benchtime 20000x
//
// BERTH_BENCH_PROFILE=DIR takes a CPU profile of each broker during each
// run (benchProfiles).
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
	// One broker alone beside them, as make run starts it (but on one
	// shard and loop, as the cluster's are), for the single-node CPU a
	// message.
	dir := b.TempDir()
	single := &node{name: "single", client: testutil.FreeAddr(b), logPath: filepath.Join(dir, "single.log"),
		args: []string{"-data", filepath.Join(dir, "single"), "-admin", "", "-shards", "1", "-loops", "1", "-log-level", "warn"}}
	single.args = append(single.args, "-listen", single.client)
	single.start(b)
	defer single.kill()
	single.waitUp(b, 20*time.Second)
	sconn := dial(b, ctx, single.client)
	if err := sconn.DeclareQueue(ctx, queue, client.QueueOptions{Durable: true}); err != nil {
		b.Fatal(err)
	}
	sconn.Close()
	for _, size := range []int{128, 1024} {
		for _, via := range []struct {
			name  string
			n     *node
			cpuOf []*node
		}{{"master", mnode, c.nodes}, {"follower", fnode, c.nodes}, {"single", single, []*node{single}}} {
			b.Run(fmt.Sprintf("size=%d/via=%s", size, via.name), func(b *testing.B) {
				benchPublish(b, ctx, via.n.client, queue, size, via.cpuOf...)
			})
		}
	}
}

// benchPublish publishes b.N messages to queue at addr and reports the
// rate, the latency's p50 and p99, and the CPU the brokers in cpuOf
// spent per message, summed (their user and system time from /proc,
// read before and after: at 10 ms a tick, it wants b.N in the tens of
// thousands).
func benchPublish(b *testing.B, ctx context.Context, addr, queue string, size int, cpuOf ...*node) {
	const conns, window = 4, 256
	payload := make([]byte, size)
	lat := make([]time.Duration, b.N)
	var failed error
	var mu sync.Mutex
	var wg sync.WaitGroup
	b.SetBytes(int64(size))
	b.ReportAllocs()
	conns0 := make([]*client.Conn, conns)
	for c := range conns {
		conns0[c] = dial(b, ctx, addr)
	}
	cpu0 := cpuTime(b, cpuOf)
	profiled := benchProfiles(b, cpuOf)
	defer profiled()
	b.ResetTimer()
	start := time.Now()
	for c := range conns {
		conn := conns0[c]
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
	cpu := cpuTime(b, cpuOf) - cpu0
	if failed != nil {
		b.Fatal(failed)
	}
	if len(cpuOf) > 0 {
		b.ReportMetric(float64(cpu.Microseconds())/float64(b.N), "cpu-us/msg")
	}
	slices.Sort(lat)
	b.ReportMetric(float64(b.N)/elapsed.Seconds(), "msgs/s")
	b.ReportMetric(float64(lat[b.N/2].Microseconds()), "p50-us")
	b.ReportMetric(float64(lat[b.N*99/100].Microseconds()), "p99-us")
}

// BenchmarkConsumeProxied compares, in one run on one cluster of three
// real brokers (fsync always), consuming a replicated queue at its
// group's master with consuming it through a follower that proxies the
// consumer to the master: b.N persistent 128-byte messages are published
// first (not timed), then one consumer with 1,000 credit
// (BERTH_BENCH_CREDIT) takes them and
// accepts them in batches of 64 without waiting; the figure is messages
// delivered and accepted (completed) per second.
//
//	make bench-forward
//	go test ./server/clustertest -run '^$' -bench ConsumeProxied -benchtime 20000x
func BenchmarkConsumeProxied(b *testing.B) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	c := startReplicatedN(b, ctx, 3, 3, 3)
	const queue = "bench-proxied"
	_, _, mnode, mconn := c.declare(queue, 3)
	c.declareEverywhere(queue)
	var fnode *node
	for _, n := range c.nodes {
		if n != mnode {
			fnode = n
			break
		}
	}
	for _, via := range []struct {
		name string
		n    *node
	}{{"master", mnode}, {"follower", fnode}} {
		b.Run("size=128/via="+via.name, func(b *testing.B) {
			publishPersistent(b, ctx, mconn, queue, b.N, 128)
			conn := dial(b, ctx, via.n.client)
			b.ReportAllocs()
			b.ResetTimer()
			start := time.Now()
			con, err := conn.Subscribe(ctx, queue, client.SubscribeOptions{Credit: benchCredit(), AutoCredit: true})
			if err != nil {
				b.Fatal(err)
			}
			var accepted sync.WaitGroup
			var failed error
			var mu sync.Mutex
			tags := make([]uint64, 0, 64)
			flush := func() {
				accepted.Add(1)
				if err := con.AcceptAsync(ctx, tags, func(err error) {
					if err != nil {
						mu.Lock()
						failed = err
						mu.Unlock()
					}
					accepted.Done()
				}); err != nil {
					b.Fatal(err)
				}
				tags = tags[:0]
			}
			for range b.N {
				d, err := con.Next(ctx)
				if err != nil {
					b.Fatal(err)
				}
				if tags = append(tags, d.Tag); len(tags) == cap(tags) {
					flush()
				}
			}
			if len(tags) > 0 {
				flush()
			}
			accepted.Wait()
			elapsed := time.Since(start)
			b.StopTimer()
			if failed != nil {
				b.Fatal(failed)
			}
			_ = con.Cancel(ctx)
			conn.Close()
			b.ReportMetric(float64(b.N)/elapsed.Seconds(), "msgs/s")
		})
	}
}

// cpuTime is the user and system time the nodes' processes have spent,
// summed, from /proc/PID/stat.
func cpuTime(b *testing.B, nodes []*node) time.Duration {
	var total time.Duration
	for _, n := range nodes {
		raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", n.proc.Pid()))
		if err != nil {
			b.Fatal(err)
		}
		// The command name, in parentheses, may hold spaces: the fields
		// are counted after its closing one (utime and stime are the
		// 14th and 15th fields of the line).
		f := strings.Fields(string(raw[bytes.LastIndexByte(raw, ')')+1:]))
		for _, k := range []int{11, 12} {
			ticks, err := strconv.ParseInt(f[k], 10, 64)
			if err != nil {
				b.Fatal(err)
			}
			total += time.Duration(ticks) * time.Second / clockTicks
		}
	}
	return total
}

// clockTicks is the kernel's USER_HZ, the unit of /proc's times: 100 on
// Linux everywhere this runs.
const clockTicks = 100

// benchCredit is the consumer's credit in BenchmarkConsumeProxied: 1,000,
// or BERTH_BENCH_CREDIT.
func benchCredit() uint32 {
	if s := os.Getenv("BERTH_BENCH_CREDIT"); s != "" {
		if n, err := strconv.Atoi(s); err == nil && n > 0 {
			return uint32(n)
		}
	}
	return 1000
}

// publishPersistent publishes n persistent messages of size bytes to
// queue through conn, all in flight at once, and waits for every
// completion (a failed one fails b).
func publishPersistent(b *testing.B, ctx context.Context, conn *client.Conn, queue string, n, size int) {
	b.Helper()
	payload := make([]byte, size)
	var wg sync.WaitGroup
	wg.Add(n)
	for range n {
		if err := conn.PublishAsync(ctx, "", queue, payload, client.PublishOptions{Persistent: true}, func(err error) {
			if err != nil {
				b.Error(err)
			}
			wg.Done()
		}); err != nil {
			b.Fatal(err)
		}
	}
	wg.Wait()
}
