package shards

import (
	"context"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/berthmq/berth/wire"
)

// TestExpiredWhileDownIsNotDelivered: a persistent message whose TTL runs
// out while the broker is stopped is not handed to a consumer that
// subscribes after the restart, even before the shard's first tick (the
// ticks are an hour apart here).
func TestExpiredWhileDownIsNotDelivered(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	cfg := Config{Shards: 1, TickInterval: time.Hour,
		Journal: &JournalConfig{Dir: t.TempDir()}, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}
	b := New(cfg)
	q, err := startWith(b, "ttl")
	if err != nil {
		t.Fatal(err)
	}
	sess := &Session{ID: 1, Version: wire.Current, FrameMax: wire.FrameSizeDefault, Out: &discardWriter{}}
	for i, ttl := range []time.Duration{time.Millisecond, time.Hour} {
		c := Command{Op: OpPublish, Sess: sess, CmdID: uint64(i + 1), Queue: q, TTLNanos: int64(ttl),
			Body: NewBody(nil, []byte("ttl"), nil, []byte("m"), true), Now: time.Now().UnixNano()}
		if err := b.shards[0].Push(ctx, c); err != nil {
			t.Fatal(err)
		}
	}
	// Stop waits for the journal; the short TTL has run out by the restart.
	time.Sleep(5 * time.Millisecond)
	b.Stop()
	time.Sleep(5 * time.Millisecond)

	b = New(cfg)
	if q, err = startWith(b, "ttl"); err != nil {
		t.Fatal(err)
	}
	defer b.Stop()
	sh := b.shards[0]
	sess = &Session{ID: 2, Version: wire.Current, FrameMax: wire.FrameSizeDefault, Out: &discardWriter{}}
	if err := sh.Push(ctx, Command{Op: OpSubscribe, Sess: sess, CmdID: 1, Queue: q, ConsumerID: 1, Credit: 10, AckMode: wire.AckExplicit}); err != nil {
		t.Fatal(err)
	}
	var ready, unacked int
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(time.Millisecond) {
		if err := b.Call(sh, func(*Shard) { ready, unacked = q.Ready(), q.Unacked() }); err != nil {
			t.Fatal(err)
		}
		if ready == 0 && unacked > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("ready %d unacked %d after 10 s", ready, unacked)
		}
	}
	if unacked != 1 {
		t.Fatalf("%d messages delivered after the restart, want 1: the one that expired while the broker was down was delivered", unacked)
	}
}

// startWith starts b with one durable queue, added before the journal
// replay as the wiring layer adds the restored queues.
func startWith(b *Broker, name string) (*Queue, error) {
	if err := b.Start(); err != nil {
		return nil, err
	}
	q, err := b.AddQueue(name, QueueOptions{Durable: true}, nil)
	if err != nil {
		return nil, err
	}
	return q, b.Recover()
}
