package client

import (
	"context"
	"io"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	"github.com/HdrHistogram/hdrhistogram-go"

	"github.com/berthmq/berth/server"
)

// Bounds of the benchmark load: how far the publisher may run ahead of
// the consumer (so the queue, and memory, stay small) and how long one
// run may take at most.
const (
	benchAheadMax   = 200_000
	benchRunTimeMax = 2 * time.Minute
	benchSampleMask = 63 // latency sampled on one message in 64
)

func benchServer(b *testing.B) *server.Server {
	return startServer(b, func(cfg *server.Config) {
		cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	})
}

// BenchmarkPublishConsume pushes 128-byte messages through the client into
// an in-memory queue of an in-process server on loopback and consumes them
// on a second connection. It reports end-to-end msgs/s and the latency
// from PublishAsync to its completion.
func BenchmarkPublishConsume(b *testing.B) {
	for _, v := range []struct {
		name   string
		mode   AckMode
		window int
	}{
		{"ack=none/window=1024", AckNone, 1024},
		{"ack=explicit/window=1024", AckExplicit, 1024},
		// The window trades publish latency for throughput.
		{"ack=none/window=64", AckNone, 64},
		{"ack=none/window=8192", AckNone, 8192},
	} {
		b.Run(v.name, func(b *testing.B) { benchPublishConsume(b, v.mode, v.window, nil) })
	}
}

// BenchmarkPublishProducerID is BenchmarkPublishConsume (ack=none, window
// 1024) side by side: a plain Conn, a reconnecting one without producer
// ids (it keeps each message for a resend) and one with them (the
// PUBLISH frames carry the producer id and each queue checks it).
func BenchmarkPublishProducerID(b *testing.B) {
	for _, v := range []struct {
		name string
		rc   *ReconnectPolicy
	}{
		{"conn=plain", nil},
		{"conn=reconnect/producer=off", &ReconnectPolicy{NoProducerID: true}},
		{"conn=reconnect/producer=on", &ReconnectPolicy{}},
	} {
		b.Run(v.name, func(b *testing.B) { benchPublishConsume(b, AckNone, 1024, v.rc) })
	}
}

func benchPublishConsume(b *testing.B, mode AckMode, window int, rc *ReconnectPolicy) {
	s := benchServer(b)
	ctx, cancel := context.WithTimeout(context.Background(), benchRunTimeMax)
	defer cancel()
	pub, err := DialConfig(ctx, Config{Name: "bench-pub", Window: window, Reconnect: rc}, s.ClientAddr())
	if err != nil {
		b.Fatal(err)
	}
	if rc != nil && (pub.ProducerID() == 0) != rc.NoProducerID {
		b.Fatalf("producer id %x, NoProducerID %v", pub.ProducerID(), rc.NoProducerID)
	}
	defer pub.Close()
	con, err := DialConfig(ctx, Config{Name: "bench-con"}, s.ClientAddr())
	if err != nil {
		b.Fatal(err)
	}
	defer con.Close()
	if err := pub.DeclareQueue(ctx, "bench", QueueOptions{}); err != nil {
		b.Fatal(err)
	}
	sub, err := con.Subscribe(ctx, "bench", SubscribeOptions{Credit: 8192, AckMode: mode, AutoCredit: true})
	if err != nil {
		b.Fatal(err)
	}
	hist := hdrhistogram.New(1, int64(time.Minute/time.Microsecond), 3)
	var consumed atomic.Int64
	consumerErr := make(chan error, 1)
	n := b.N
	payload := make([]byte, 128)
	var failed atomic.Int64
	plain := func(err error) {
		if err != nil {
			failed.Add(1)
		}
	}

	b.ReportAllocs()
	b.SetBytes(int64(len(payload)))
	b.ResetTimer()
	start := time.Now()
	go func() {
		tags := make([]uint64, 0, 1024)
		for i := 0; i < n; i++ {
			d, err := sub.Next(ctx)
			if err != nil {
				consumerErr <- err
				return
			}
			consumed.Add(1)
			if mode == AckExplicit {
				tags = append(tags, d.Tag)
				if len(tags) == cap(tags) || sub.Buffered() == 0 {
					if err := sub.AcceptAsync(ctx, tags, nil); err != nil {
						consumerErr <- err
						return
					}
					tags = tags[:0]
				}
			}
		}
		consumerErr <- nil
	}()
	for i := 0; i < n; i++ {
		for int64(i)-consumed.Load() > benchAheadMax {
			time.Sleep(50 * time.Microsecond)
		}
		done := plain
		if i&benchSampleMask == 0 {
			t0 := time.Now()
			// Completions run on the reader goroutine, one at a time, so
			// the histogram needs no lock.
			done = func(err error) {
				plain(err)
				hist.RecordValue(int64(time.Since(t0) / time.Microsecond))
			}
		}
		if err := pub.PublishAsync(ctx, "", "bench", payload, PublishOptions{}, done); err != nil {
			b.Fatal(err)
		}
	}
	if err := <-consumerErr; err != nil {
		b.Fatal(err)
	}
	elapsed := time.Since(start)
	b.StopTimer()
	if err := pub.Flush(ctx); err != nil {
		b.Fatal(err)
	}
	if f := failed.Load(); f != 0 {
		b.Fatalf("%d publishes failed", f)
	}
	b.ReportMetric(float64(n)/elapsed.Seconds(), "msgs/s")
	b.ReportMetric(float64(hist.ValueAtQuantile(50)), "p50-µs")
	b.ReportMetric(float64(hist.ValueAtQuantile(99)), "p99-µs")
}

// BenchmarkPublishSync measures one blocking Publish at a time: the round
// trip the API costs a caller that waits.
func BenchmarkPublishSync(b *testing.B) {
	s := benchServer(b)
	ctx, cancel := context.WithTimeout(context.Background(), benchRunTimeMax)
	defer cancel()
	c, err := Dial(ctx, s.ClientAddr())
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	if err := c.DeclareQueue(ctx, "sync", QueueOptions{MaxLength: 10_000, Overflow: OverflowDropHead}); err != nil {
		b.Fatal(err)
	}
	payload := make([]byte, 128)
	hist := hdrhistogram.New(1, int64(time.Minute/time.Microsecond), 3)
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		t0 := time.Now()
		if err := c.Publish(ctx, "", "sync", payload, PublishOptions{}); err != nil {
			b.Fatal(err)
		}
		hist.RecordValue(int64(time.Since(t0) / time.Microsecond))
	}
	b.StopTimer()
	b.ReportMetric(float64(hist.ValueAtQuantile(50)), "p50-µs")
	b.ReportMetric(float64(hist.ValueAtQuantile(99)), "p99-µs")
}
