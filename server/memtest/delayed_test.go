package memtest

import (
	"context"
	"encoding/binary"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/berthmq/berth/client"
	"github.com/berthmq/berth/internal/testutil"
)

// TestDelayedLateness measures, and only reports, how late delayed
// messages reach a consumer of a real berthd, and what they cost in
// memory. It runs only with BERTH_DELAY_BENCH=1 (make bench-delayed):
//
//	BERTH_DELAY_BENCH=1 go test ./server/memtest -run DelayedLateness -v -timeout 10m
//
// BERTH_DELAY_N sets the number of delayed messages (default 1,000,000),
// BERTH_DELAY_LIMIT berthd's -memory-limit (default 256MiB; two shards).
//
//  1. N transient 16-byte messages go to queue "bulk", due at times spread
//     evenly over a 20 s window that opens 45 s after the start. The RSS of
//     berthd and the memory counts of /v1/status are read before and after.
//  2. With the N messages pending, 2,000 probes go to queue "probe", due
//     spread over the next 2 to 12 s: their lateness is what an idle
//     broker holding N delayed messages does.
//  3. Then the N come due, 50,000 a second at N = 1M: their lateness is
//     that of a broker busy delivering them.
//
// Lateness is the consumer's receive time minus the deliver-at time the
// payload carries (unix ms, the wire's resolution), on the same clock.
func TestDelayedLateness(t *testing.T) {
	if os.Getenv("BERTH_DELAY_BENCH") == "" {
		t.Skip("a measurement: set BERTH_DELAY_BENCH=1")
	}
	n := 1_000_000
	if v := os.Getenv("BERTH_DELAY_N"); v != "" {
		n, _ = strconv.Atoi(v)
	}
	limit := "256MiB"
	if v := os.Getenv("BERTH_DELAY_LIMIT"); v != "" {
		limit = v
	}
	const probes = 2000
	dir := t.TempDir()
	addr, admin := testutil.FreeAddr(t), testutil.FreeAddr(t)
	p := testutil.StartBerthd(t, filepath.Join(dir, "berthd.log"), "-listen", addr, "-admin", admin,
		"-data", filepath.Join(dir, "data"), "-controller", "", "-shards", "2", "-loops", "2",
		"-memory-limit", limit, "-fsync", "never")
	defer p.Stop(t, os.Interrupt, 30*time.Second)
	testutil.WaitReady(t, admin, 60*time.Second)
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	c, err := client.Dial(ctx, addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	for _, q := range []string{"bulk", "probe"} {
		if err := c.DeclareQueue(ctx, q, client.QueueOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	// Consumers first, so that nothing waits on a subscribe when the
	// messages come due.
	type result struct {
		lateness []time.Duration
		early    int
	}
	// Each consumer has a connection of its own: a connection whose
	// publishes wait on a throttled shard stops being read, its CREDIT
	// frames too (shards/memory.go).
	consume := func(queue string, want int, out *result, done *sync.WaitGroup) {
		defer done.Done()
		cc, err := client.Dial(ctx, addr)
		if err != nil {
			t.Error(err)
			return
		}
		defer cc.Close()
		sub, err := cc.Subscribe(ctx, queue, client.SubscribeOptions{Credit: 4096, AckMode: client.AckNone, AutoCredit: true})
		if err != nil {
			t.Error(err)
			return
		}
		cctx, stop := context.WithCancel(ctx)
		defer stop()
		out.lateness = make([]time.Duration, 0, want)
		_ = sub.Consume(cctx, func(d *client.Delivery) error {
			now := time.Now()
			at := time.UnixMilli(int64(binary.BigEndian.Uint64(d.Payload)))
			if now.Before(at) {
				out.early++
			}
			out.lateness = append(out.lateness, now.Sub(at))
			if len(out.lateness) == want {
				stop()
			}
			return nil
		})
	}
	var bulkRes, probeRes result
	var consumers sync.WaitGroup
	consumers.Add(2)
	go consume("bulk", n, &bulkRes, &consumers)
	go consume("probe", probes, &probeRes, &consumers)

	rss0, _ := rssBytes(p.Pid())
	st0 := status(t, admin)
	start := time.Now()
	windowStart := start.Add(45 * time.Second)
	const window = 20 * time.Second
	payload := make([]byte, 16)
	var completed sync.WaitGroup
	completed.Add(n)
	var failed atomic.Int64
	done := func(err error) {
		if err != nil {
			failed.Add(1)
		}
		completed.Done()
	}
	for i := 0; i < n; i++ {
		at := windowStart.Add(time.Duration(int64(window) * int64(i) / int64(n))).Truncate(time.Millisecond)
		binary.BigEndian.PutUint64(payload, uint64(at.UnixMilli()))
		if err := c.PublishAsync(ctx, "", "bulk", payload, client.PublishOptions{DeliverAt: at}, done); err != nil {
			t.Fatal(err)
		}
	}
	completed.Wait()
	if f := failed.Load(); f > 0 {
		t.Fatalf("%d publishes failed", f)
	}
	pubTook := time.Since(start)
	time.Sleep(2 * time.Second) // let the shards settle before reading RSS
	rss1, _ := rssBytes(p.Pid())
	st1 := status(t, admin)
	t.Logf("-memory-limit %s: %d delayed messages published in %v (%.0f msgs/s); berthd RSS %d -> %d MiB (%.0f bytes per message); counted %d -> %d bytes (%.0f per message), %d paged",
		limit, n, pubTook.Round(time.Millisecond), float64(n)/pubTook.Seconds(), rss0>>20, rss1>>20, float64(rss1-rss0)/float64(n),
		st0.UsedBytes, st1.UsedBytes, float64(st1.UsedBytes-st0.UsedBytes)/float64(n), st1.PagedMessages)
	if time.Now().After(windowStart.Add(-15 * time.Second)) {
		t.Fatalf("publishing took %v: too close to the window for the idle probes", pubTook)
	}
	probeStart := time.Now().Add(2 * time.Second)
	for i := 0; i < probes; i++ {
		at := probeStart.Add(time.Duration(int64(10*time.Second) * int64(i) / probes)).Truncate(time.Millisecond)
		binary.BigEndian.PutUint64(payload, uint64(at.UnixMilli()))
		if err := c.PublishAsync(ctx, "", "probe", payload, client.PublishOptions{DeliverAt: at}, nil); err != nil {
			t.Fatal(err)
		}
	}
	consumers.Wait()
	report := func(what string, r result) {
		l := r.lateness
		if len(l) == 0 {
			t.Errorf("%s: nothing received", what)
			return
		}
		slices.Sort(l)
		q := func(f float64) time.Duration { return l[int(f*float64(len(l)-1))].Round(10 * time.Microsecond) }
		t.Logf("%s: %d messages, lateness p50 %v p99 %v p99.9 %v max %v; %d early", what, len(l), q(0.5), q(0.99), q(0.999), l[len(l)-1].Round(10*time.Microsecond), r.early)
		if r.early > 0 {
			t.Errorf("%s: %d delivered before their time", what, r.early)
		}
	}
	report("probes with the delayed messages pending (idle broker)", probeRes)
	report("the delayed messages firing over 20 s", bulkRes)
}
