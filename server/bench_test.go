package server_test

import (
	"context"
	"encoding/binary"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/HdrHistogram/hdrhistogram-go"

	"github.com/berthmq/berth/client"
	"github.com/berthmq/berth/controlplane/ctlapi"
	"github.com/berthmq/berth/internal/testutil"
	"github.com/berthmq/berth/journal"
	"github.com/berthmq/berth/server"
)

// BenchmarkPublishConsume publishes b.N 128-byte messages through the
// client over loopback and consumes them on a second connection. It reports
// msgs/s and publish-to-completion latency percentiles.
//
//	go test ./server -run '^$' -bench PublishConsume -benchtime 2000000x
func BenchmarkPublishConsume(b *testing.B) {
	modes := []struct {
		name    string
		durable bool
		fsync   journal.FsyncPolicy
	}{
		{"memory", false, journal.FsyncAlways},
		{"durable-fsync=always", true, journal.FsyncAlways},
		{"durable-fsync=never", true, journal.FsyncNever},
	}
	for _, m := range modes {
		b.Run("mode="+m.name, func(b *testing.B) {
			benchPublishConsume(b, m.durable, m.fsync, 1, false)
		})
	}
	// The publisher logs in as a user whose write pattern is not ".*", so
	// every message goes through the session's permission cache; compare
	// with mode=memory.
	b.Run("mode=memory/auth=user", func(b *testing.B) {
		benchPublishConsume(b, false, journal.FsyncAlways, 1, true)
	})
}

func benchPublishConsume(b *testing.B, durable bool, fsync journal.FsyncPolicy, queues int, asUser bool) {
	s := startServer(b, func(c *server.Config) {
		c.Fsync = fsync
		if asUser {
			c.ControllerAddr = testutil.FreeAddr(b)
		}
	})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	var pub, sub *client.Conn
	if asUser {
		perms := ctlapi.Permissions{Configure: "bench.*", Write: "bench[0-9]+|other", Read: "bench.*"}
		testutil.AddUser(b, s.ControllerAddr(), "bench", "bench-pw", perms)
		cfg := client.Config{User: "bench", Password: "bench-pw"}
		testutil.WaitFor(b, 10*time.Second, func() error {
			c, err := client.DialConfig(ctx, cfg, s.ClientAddr())
			pub = c
			return err
		})
		b.Cleanup(func() { _ = pub.Close() })
		sub = dialUser(b, s, cfg)
	} else {
		pub = dial(b, s)
		sub = dial(b, s)
	}
	names := make([]string, queues)
	for i := range names {
		names[i] = fmt.Sprint("bench", i)
		if err := pub.DeclareQueue(ctx, names[i], client.QueueOptions{Durable: durable}); err != nil {
			b.Fatal(err)
		}
	}
	const size = 128
	n := b.N
	hist := hdrhistogram.New(1, int64(10*time.Second/time.Microsecond), 3)
	e2e := hdrhistogram.New(1, int64(10*time.Second/time.Microsecond), 3)
	// Completions of one queue come in publish order, so a ring of send
	// times indexed by sequence gives each message's latency.
	const ringSize = 1 << 17
	sent := make([]int64, ringSize)
	var completed atomic.Int64
	var failed atomic.Int64
	var histMu sync.Mutex
	done := func(err error) {
		k := completed.Add(1) - 1
		if err != nil {
			failed.Add(1)
			return
		}
		lat := (time.Now().UnixNano() - sent[k%ringSize]) / 1000
		histMu.Lock()
		_ = hist.RecordValue(max(lat, 1))
		histMu.Unlock()
	}
	var consumed sync.WaitGroup
	consumed.Add(queues)
	for _, name := range names {
		con, err := sub.Subscribe(ctx, name, client.SubscribeOptions{Credit: 4096, AutoCredit: true})
		if err != nil {
			b.Fatal(err)
		}
		go func() {
			defer consumed.Done()
			tags := make([]uint64, 0, 256)
			for i := 0; i < n/queues; i++ {
				d, err := con.Next(ctx)
				if err != nil {
					b.Error(err)
					return
				}
				if i%64 == 0 {
					e2e.RecordValue(max((time.Now().UnixNano()-int64(binary.BigEndian.Uint64(d.Payload)))/1000, 1))
				}
				tags = append(tags, d.Tag)
				if len(tags) == cap(tags) || i == n/queues-1 {
					if err := con.AcceptAsync(ctx, tags, nil); err != nil {
						b.Error(err)
						return
					}
					tags = tags[:0]
				}
			}
		}()
	}
	payload := make([]byte, size)
	opts := client.PublishOptions{Persistent: durable}
	b.SetBytes(size)
	b.ReportAllocs()
	b.ResetTimer()
	start := time.Now()
	for i := 0; i < n; i++ {
		now := time.Now().UnixNano()
		sent[i%ringSize] = now
		binary.BigEndian.PutUint64(payload, uint64(now))
		if err := pub.PublishAsync(ctx, "", names[i%queues], payload, opts, done); err != nil {
			b.Fatal(err)
		}
	}
	if err := pub.Flush(ctx); err != nil {
		b.Fatal(err)
	}
	consumed.Wait()
	elapsed := time.Since(start)
	b.StopTimer()
	if f := failed.Load(); f > 0 {
		b.Fatalf("%d publishes failed", f)
	}
	b.ReportMetric(float64(n)/elapsed.Seconds(), "msgs/s")
	b.ReportMetric(float64(hist.ValueAtQuantile(50)), "p50-us")
	b.ReportMetric(float64(hist.ValueAtQuantile(99)), "p99-us")
	b.ReportMetric(float64(e2e.ValueAtQuantile(50)), "e2e-p50-us")
	b.ReportMetric(float64(e2e.ValueAtQuantile(99)), "e2e-p99-us")
}

func dialUser(b *testing.B, s *server.Server, cfg client.Config) *client.Conn {
	c, err := client.DialConfig(context.Background(), cfg, s.ClientAddr())
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = c.Close() })
	return c
}

// BenchmarkRecovery measures how long a broker takes to start on a data
// directory holding 1,000,000 persistent 128-byte messages in one durable
// queue (journal replay, checksums, queue rebuild).
//
//	go test ./server -run '^$' -bench Recovery -benchtime 1x
func BenchmarkRecovery(b *testing.B) {
	const n = 1_000_000
	dir := b.TempDir()
	s := startServer(b, func(c *server.Config) { c.DataDir = dir; c.Fsync = journal.FsyncNever })
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	c := dial(b, s)
	if err := c.DeclareQueue(ctx, "deep", client.QueueOptions{Durable: true}); err != nil {
		b.Fatal(err)
	}
	payload := make([]byte, 128)
	for i := 0; i < n; i++ {
		if err := c.PublishAsync(ctx, "", "deep", payload, client.PublishOptions{Persistent: true}, nil); err != nil {
			b.Fatal(err)
		}
	}
	if err := c.Flush(ctx); err != nil {
		b.Fatal(err)
	}
	_ = c.Close()
	if err := s.Close(); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		start := time.Now()
		s2, err := server.Start(func() server.Config {
			cfg := server.DefaultConfig()
			cfg.ClientAddr, cfg.AdminAddr, cfg.DataDir, cfg.Shards, cfg.Loops = "127.0.0.1:0", "", dir, 2, 2
			cfg.Logger = testLogger(b)
			return cfg
		}())
		if err != nil {
			b.Fatal(err)
		}
		took := time.Since(start)
		b.StopTimer()
		depth := 0
		for _, q := range s2.Broker().Queues() {
			depth += q.Ready
		}
		if depth != n {
			b.Fatalf("recovered %d messages, want %d", depth, n)
		}
		_ = s2.Close()
		b.ReportMetric(took.Seconds(), "recovery-s")
		b.ReportMetric(float64(n)/took.Seconds(), "msgs/s-replayed")
		b.StartTimer()
	}
}
