package shards

import (
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"log/slog"
	"os"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/berthmq/berth/wire"
)

// stampWriter records, for every delivered message, the time the shard
// handed its DELIVER to the connection minus the deliver-at time its
// payload carries (unix nanoseconds).
type stampWriter struct {
	mu       sync.Mutex
	lateness []time.Duration
}

func (w *stampWriter) WriteAsync(bufs [][]byte, done func()) error {
	now := time.Now().UnixNano()
	var all []byte
	for _, b := range bufs {
		all = append(all, b...)
	}
	w.mu.Lock()
	for len(all) > 0 {
		h, body, n, err := wire.Next(all, wire.FrameSizeMax)
		if err != nil || n == 0 {
			break
		}
		all = all[n:]
		if h.Type != wire.TypeDeliver {
			continue
		}
		var d wire.Deliver
		if wire.DecodeDeliver(body, &d) != nil {
			continue
		}
		var m wire.DeliverMessage
		for d.Next(&m) {
			w.lateness = append(w.lateness, time.Duration(now-int64(binary.BigEndian.Uint64(m.Payload))))
		}
	}
	w.mu.Unlock()
	done()
	return nil
}

// TestDelayedFiringLateness measures, and only reports, how late a shard
// hands delayed messages to their connection, with none and with
// BERTH_DELAY_N (default 1,000,000) other delayed messages pending on the
// same shard, due an hour later. No network and no client: what it shows
// is the timer heap, the wake-up timer and the shard's scheduling. It runs
// only with BERTH_DELAY_BENCH=1:
//
//	BERTH_DELAY_BENCH=1 go test ./shards -run DelayedFiringLateness -v
func TestDelayedFiringLateness(t *testing.T) {
	if os.Getenv("BERTH_DELAY_BENCH") == "" {
		t.Skip("a measurement: set BERTH_DELAY_BENCH=1")
	}
	n := 1_000_000
	if v := os.Getenv("BERTH_DELAY_N"); v != "" {
		fmt.Sscan(v, &n)
	}
	for _, pending := range []int{0, n, 0, n} {
		l := firingLateness(t, pending)
		slices.Sort(l)
		q := func(f float64) time.Duration { return l[int(f*float64(len(l)-1))].Round(time.Microsecond) }
		t.Logf("%d pending: %d probes, lateness p50 %v p99 %v max %v", pending, len(l), q(0.5), q(0.99), l[len(l)-1].Round(time.Microsecond))
		if l[0] < 0 {
			t.Errorf("a probe was handed out %v early", -l[0])
		}
	}
}

func firingLateness(t *testing.T, pending int) []time.Duration {
	const probes = 1000
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	b := New(Config{Shards: 1, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err := b.Start(); err != nil {
		t.Fatal(err)
	}
	defer b.Stop()
	sh := b.shards[0]
	bulk, _ := b.AddQueue("bulk", QueueOptions{}, nil, Placement{})
	probe, _ := b.AddQueue("probe", QueueOptions{}, nil, Placement{})
	sess := &Session{ID: 1, Version: wire.Current, FrameMax: wire.FrameSizeDefault, Out: &discardWriter{}}
	payload := make([]byte, 16)
	far := time.Now().Add(time.Hour).UnixNano()
	for i := 0; i < pending; i++ {
		binary.BigEndian.PutUint64(payload, uint64(far))
		body := NewBody(nil, []byte("bulk"), nil, payload, false)
		body.DeliverAt = far + int64(i)
		if err := sh.Push(ctx, Publish{Queue: bulk, Body: body, Now: time.Now().UnixNano()}.Command()); err != nil {
			t.Fatal(err)
		}
	}
	w := &stampWriter{}
	csess := &Session{ID: 2, Version: wire.Current, FrameMax: wire.FrameSizeDefault, Out: w}
	if err := sh.Push(ctx, Subscribe{Sess: csess, CmdID: 1, Queue: probe, ConsumerID: 1, Credit: probes}.Command()); err != nil {
		t.Fatal(err)
	}
	_ = b.Call(sh, func(*Shard) {}) // the bulk is in
	start := time.Now().Add(500 * time.Millisecond).UnixNano()
	for i := 0; i < probes; i++ {
		at := start + int64(5*time.Second)*int64(i)/probes
		binary.BigEndian.PutUint64(payload, uint64(at))
		body := NewBody(nil, []byte("probe"), nil, payload, false)
		body.DeliverAt = at
		if err := sh.Push(ctx, Publish{Sess: sess, Queue: probe, Body: body, Now: time.Now().UnixNano()}.Command()); err != nil {
			t.Fatal(err)
		}
	}
	for {
		w.mu.Lock()
		got := len(w.lateness)
		w.mu.Unlock()
		if got == probes {
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("%d of %d probes delivered", got, probes)
		}
		time.Sleep(10 * time.Millisecond)
	}
	var delayed int
	_ = b.Call(sh, func(*Shard) { delayed = bulk.Delayed() })
	if delayed != pending {
		t.Fatalf("%d of the %d pending messages still delayed", delayed, pending)
	}
	return w.lateness
}
