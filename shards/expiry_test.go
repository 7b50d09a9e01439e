package shards

import (
	"context"
	"fmt"
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

// TestTickVisitsOnlyQueuesWithTTLs: the tick visits the queues that hold
// a message with a TTL, not every queue, and a queue leaves the set once
// empty; expiry still happens.
func TestTickVisitsOnlyQueuesWithTTLs(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	b := New(Config{Shards: 1, TickInterval: time.Hour, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err := b.Start(); err != nil {
		t.Fatal(err)
	}
	defer b.Stop()
	sh := b.shards[0]
	sess := &Session{ID: 1, Version: wire.Current, FrameMax: wire.FrameSizeDefault, Out: &discardWriter{}}
	var plain, ttl *Queue
	for i := range 1000 {
		q, err := b.AddQueue(fmt.Sprint("q", i), QueueOptions{}, nil)
		if err != nil {
			t.Fatal(err)
		}
		if i == 0 {
			plain = q
		}
		if i == 1 {
			ttl = q
		}
	}
	now := time.Now().UnixNano()
	push := func(c Command) {
		t.Helper()
		if err := sh.Push(ctx, c); err != nil {
			t.Fatal(err)
		}
	}
	push(Command{Op: OpPublish, Sess: sess, CmdID: 1, Queue: plain, Body: NewBody(nil, nil, nil, []byte("p"), false), Now: now})
	push(Command{Op: OpPublish, Sess: sess, CmdID: 2, Queue: ttl, TTLNanos: int64(time.Millisecond), Body: NewBody(nil, nil, nil, []byte("t"), false), Now: now})
	var n int
	if err := b.Call(sh, func(s *Shard) { n = len(s.expiring) }); err != nil {
		t.Fatal(err)
	}
	if n != 1 {
		t.Fatalf("%d queues to visit, want 1 (the one with a TTL)", n)
	}
	time.Sleep(5 * time.Millisecond)
	push(Command{Op: OpTick, Now: time.Now().UnixNano()})
	var ready, plainReady int
	if err := b.Call(sh, func(s *Shard) { ready, plainReady, n = ttl.Ready(), plain.Ready(), len(s.expiring) }); err != nil {
		t.Fatal(err)
	}
	if ready != 0 || plainReady != 1 {
		t.Fatalf("after the tick: ttl queue %d ready (want 0, expired), plain queue %d (want 1)", ready, plainReady)
	}
	push(Command{Op: OpTick, Now: time.Now().UnixNano()})
	if err := b.Call(sh, func(s *Shard) { n = len(s.expiring) }); err != nil {
		t.Fatal(err)
	}
	if n != 0 {
		t.Fatalf("%d queues still visited after the TTL queue emptied", n)
	}
}
