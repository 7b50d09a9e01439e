package bench

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/berthmq/berth/client"
	"github.com/berthmq/berth/perf/driver"
	"github.com/berthmq/berth/server"
	"github.com/berthmq/berth/wire"
)

func startServer(t *testing.T) *server.Server {
	t.Helper()
	cfg := server.DefaultConfig()
	cfg.ClientAddr = "127.0.0.1:0"
	cfg.AdminAddr = "127.0.0.1:0"
	cfg.DataDir = t.TempDir()
	cfg.Shards, cfg.Loops = 2, 2
	cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	srv, err := server.Start(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Close() })
	return srv
}

// A bounded run through the berth driver against a real in-process
// server: every message published must complete and be delivered once.
func TestRunBerthEndToEnd(t *testing.T) {
	srv := startServer(t)
	for _, tc := range []struct {
		name string
		mod  func(*Workload)
	}{
		{"async-explicit", func(w *Workload) {}},
		{"sync-none-2queues", func(w *Workload) { w.Mode, w.Ack, w.Queues, w.Count = ModeSync, driver.AckNone, 2, 500 }},
		{"batch-persistent-rate", func(w *Workload) { w.Mode, w.Persistent, w.Rate, w.Count = ModeBatch, true, 20000, 1000 }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := DefaultWorkload()
			w.QueuePrefix = "e2e-" + tc.name
			w.Count, w.Duration, w.Warmup = 3000, 20*time.Second, 0
			w.Producers, w.Consumers, w.Window, w.Batch, w.Credit = 3, 2, 64, 16, 32
			tc.mod(&w)
			addrs := []string{srv.ClientAddr()}
			d, err := driver.New("berth", driver.Options{Addrs: addrs, Persistent: w.Persistent, Window: w.InFlight()})
			if err != nil {
				t.Fatal(err)
			}
			defer d.Close()
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			res, err := Run(ctx, w, Options{DriverName: "berth", Driver: d, Addrs: addrs, Interval: 100 * time.Millisecond})
			if err != nil {
				t.Fatal(err)
			}
			if res.Published != w.Count || res.Completed != w.Count || res.Failed != 0 {
				t.Fatalf("published %d completed %d failed %d, want %d/%d/0", res.Published, res.Completed, res.Failed, w.Count, w.Count)
			}
			if res.Consumed != w.Count || res.Lost != 0 {
				t.Fatalf("consumed %d lost %d, want %d/0", res.Consumed, res.Lost, w.Count)
			}
			if res.Publish.Count != w.Count || res.EndToEnd.Count != w.Count {
				t.Fatalf("latency counts %d/%d, want %d", res.Publish.Count, res.EndToEnd.Count, w.Count)
			}
			if res.PublishRate <= 0 || res.ConsumeRate <= 0 || res.Publish.P50 <= 0 || res.Publish.Max < res.Publish.P99 {
				t.Fatalf("implausible figures: %+v", res)
			}
			if w.Rate > 0 {
				// 1000 messages at 20k/s take 50 ms at the least.
				if res.ElapsedSec < 0.045 {
					t.Fatalf("open loop at %v/s finished in %.3fs", w.Rate, res.ElapsedSec)
				}
			}
		})
	}
}

// Warm-up traffic is delivered but not counted.
func TestRunWarmupExcluded(t *testing.T) {
	srv := startServer(t)
	w := DefaultWorkload()
	w.QueuePrefix = "warm"
	w.Producers, w.Consumers, w.Count, w.Duration, w.Warmup = 1, 1, 200, 10*time.Second, 300*time.Millisecond
	w.Rate = 1000 // about 300 warm-up messages
	addrs := []string{srv.ClientAddr()}
	d, _ := driver.New("berth", driver.Options{Addrs: addrs, Window: w.InFlight()})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	res, err := Run(ctx, w, Options{DriverName: "berth", Driver: d, Addrs: addrs})
	if err != nil {
		t.Fatal(err)
	}
	if res.Published != 200 || res.Consumed != 200 || res.Publish.Count != 200 {
		t.Fatalf("published %d consumed %d latencies %d, want 200 each", res.Published, res.Consumed, res.Publish.Count)
	}
}

// The profiler fetches every profile from the server's admin endpoint.
func TestRunProfile(t *testing.T) {
	srv := startServer(t)
	dir := t.TempDir()
	p, err := NewProfiler(srv.AdminAddr(), dir)
	if err != nil {
		t.Fatal(err)
	}
	w := DefaultWorkload()
	w.QueuePrefix = "prof"
	w.Duration, w.Warmup, w.Count = time.Second, 0, 0
	addrs := []string{srv.ClientAddr()}
	d, _ := driver.New("berth", driver.Options{Addrs: addrs, Window: w.InFlight()})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	res, err := Run(ctx, w, Options{DriverName: "berth", Driver: d, Addrs: addrs, Profiler: p})
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"cpu", "heap", "allocs", "mutex", "block"} {
		st, err := os.Stat(filepath.Join(dir, name+".pprof"))
		if err != nil || st.Size() == 0 {
			t.Errorf("%s profile missing or empty: %v", name, err)
		}
	}
	t.Logf("notes: %v", res.Notes)
	if _, err := NewProfiler("", dir); err == nil {
		t.Fatal("NewProfiler accepted no admin address")
	}
}

func TestRunRejects(t *testing.T) {
	w := DefaultWorkload()
	w.Consumers, w.Queues = 1, 2
	d, _ := driver.New("berth", driver.Options{Addrs: []string{"127.0.0.1:1"}})
	if _, err := Run(context.Background(), w, Options{Driver: d}); err == nil {
		t.Fatal("ran with fewer consumers than queues")
	}
	w = DefaultWorkload()
	w.Size = 1
	if _, err := Run(context.Background(), w, Options{Driver: d}); err == nil {
		t.Fatal("ran an invalid workload")
	}
	if _, err := driver.New("kafka", driver.Options{Addrs: []string{"x"}}); err == nil {
		t.Fatal("unknown driver accepted")
	}
}

// Cancelling the context stops a long run and still returns what was
// measured.
func TestRunCancel(t *testing.T) {
	srv := startServer(t)
	w := DefaultWorkload()
	w.QueuePrefix = "cancel"
	w.Duration, w.Warmup = time.Minute, 0
	addrs := []string{srv.ClientAddr()}
	d, _ := driver.New("berth", driver.Options{Addrs: addrs, Window: w.InFlight()})
	ctx, cancel := context.WithCancel(context.Background())
	time.AfterFunc(300*time.Millisecond, cancel)
	res, err := Run(ctx, w, Options{DriverName: "berth", Driver: d, Addrs: addrs})
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("err = %v, want context.Canceled", err)
	}
	if res == nil || res.Published == 0 || res.Completed+res.Failed != res.Published {
		t.Fatalf("result after cancel: %+v", res)
	}
	// An interrupted run still deletes the queue it declared.
	cctx, ccancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer ccancel()
	c, err := client.Dial(cctx, srv.ClientAddr())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if err := c.DeclareQueue(cctx, "cancel-0", client.QueueOptions{Passive: true}); client.Code(err) != wire.CodeNotFound {
		t.Fatalf("queue cancel-0 after the interrupted run: %v, want not-found", err)
	}
}

// With Options.Route the berth driver sends each queue's declare,
// publishes and consumer to the address the route names: here two
// single-node servers, one queue on each.
func TestRunRouted(t *testing.T) {
	a, b := startServer(t), startServer(t)
	route := map[string]string{"routed-0": a.ClientAddr(), "routed-1": b.ClientAddr()}
	w := DefaultWorkload()
	w.QueuePrefix, w.Queues = "routed", 2
	w.Count, w.Duration, w.Warmup = 2000, 20*time.Second, 0
	w.Producers, w.Consumers, w.Window, w.Credit = 2, 2, 64, 32
	addrs := []string{a.ClientAddr()}
	d, err := driver.New("berth", driver.Options{Addrs: addrs, Window: w.InFlight(),
		Route: func(_ context.Context, q string) (string, error) {
			if r, ok := route[q]; ok {
				return r, nil
			}
			return "", errors.New("no route for " + q)
		}})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	res, err := Run(ctx, w, Options{DriverName: "berth", Driver: d, Addrs: addrs, Keep: true})
	if err != nil {
		t.Fatal(err)
	}
	if res.Completed != w.Count || res.Consumed != w.Count || res.Failed != 0 {
		t.Fatalf("completed %d consumed %d failed %d, want %d/%d/0", res.Completed, res.Consumed, res.Failed, w.Count, w.Count)
	}
	for q, at := range route {
		for _, srv := range []*server.Server{a, b} {
			c, err := client.Dial(ctx, srv.ClientAddr())
			if err != nil {
				t.Fatal(err)
			}
			err = c.DeclareQueue(ctx, q, client.QueueOptions{Passive: true})
			c.Close()
			if want := srv.ClientAddr() == at; (err == nil) != want {
				t.Errorf("queue %s at %s: passive declare %v; routed to %s", q, srv.ClientAddr(), err, at)
			}
		}
	}
}
