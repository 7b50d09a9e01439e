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
		c := Publish{Sess: sess, CmdID: uint64(i + 1), Queue: q, TTLNanos: int64(ttl),
			Body: NewBody(nil, []byte("ttl"), nil, []byte("m"), true), Now: time.Now().UnixNano()}.Command()
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
	if err := sh.Push(ctx, Subscribe{Sess: sess, CmdID: 1, Queue: q, ConsumerID: 1, Credit: 10, AckMode: wire.AckExplicit}.Command()); err != nil {
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
	q, err := b.AddQueue(name, QueueOptions{Durable: true}, nil, Placement{})
	if err != nil {
		return nil, err
	}
	return q, b.Recover()
}

// TestExpiryIndex: the shard's expiry index holds only the queues whose
// head has a TTL, so a tick looks at what came due and not at every queue;
// a message with a TTL behind a head without one is indexed once it
// becomes the head (here by a delivery), and then expires; a queue whose
// head expired leaves the index; a TTL still to come stays indexed and
// is not expired early.
func TestExpiryIndex(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	b := New(Config{Shards: 1, TickInterval: time.Hour, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err := b.Start(); err != nil {
		t.Fatal(err)
	}
	defer b.Stop()
	sh := b.shards[0]
	sess := &Session{ID: 1, Version: wire.Current, FrameMax: wire.FrameSizeDefault, Out: &discardWriter{}}
	var qs []*Queue
	for i := range 1000 {
		q, err := b.AddQueue(fmt.Sprint("q", i), QueueOptions{}, nil, Placement{})
		if err != nil {
			t.Fatal(err)
		}
		qs = append(qs, q)
	}
	plain, ttl, mixed, long := qs[0], qs[1], qs[2], qs[3]
	id := uint64(0)
	push := func(c Command) {
		t.Helper()
		if err := sh.Push(ctx, c); err != nil {
			t.Fatal(err)
		}
	}
	publish := func(p Publish) {
		t.Helper()
		id++
		p.Sess, p.CmdID, p.Now = sess, id, time.Now().UnixNano()
		push(p.Command())
	}
	body := func() *Body { return NewBody(nil, nil, nil, []byte("m"), false) }
	indexed := func() (n int) {
		t.Helper()
		if err := b.Call(sh, func(s *Shard) {
			for _, te := range s.expiry {
				if te.at == te.q.busy.expireAt {
					n++ // not stale
				}
			}
		}); err != nil {
			t.Fatal(err)
		}
		return n
	}
	// Times come from the commands, so nothing here depends on the
	// machine's speed: the TTLs are a minute and an hour, and the tick
	// claims to come two minutes later.
	t0 := time.Now().UnixNano()
	minute := int64(time.Minute)
	publish(Publish{Queue: plain, Body: body()})
	publish(Publish{Queue: ttl, TTLNanos: minute, Body: body()})
	publish(Publish{Queue: mixed, Body: body()})
	publish(Publish{Queue: mixed, TTLNanos: minute, Body: body()})
	publish(Publish{Queue: long, TTLNanos: 60 * minute, Body: body()})
	if n := indexed(); n != 2 {
		t.Fatalf("%d queues in the expiry index, want 2 (the two whose head has a TTL)", n)
	}
	// A delivery takes mixed's head; the message with a TTL behind it is
	// the head now, and indexed.
	push(Subscribe{Sess: sess, CmdID: 1000, Queue: mixed, ConsumerID: 1, Credit: 1, AckMode: wire.AckExplicit}.Command())
	// A call can share the subscribe's batch and run before its dispatch:
	// the one after it cannot.
	if err := b.Call(sh, func(*Shard) {}); err != nil {
		t.Fatal(err)
	}
	if n := indexed(); n != 3 {
		t.Fatalf("%d queues in the expiry index after the delivery, want 3", n)
	}
	push(tickCommand(t0 + 2*minute))
	var ready [4]int
	var expired uint64
	if err := b.Call(sh, func(*Shard) {
		for i, q := range []*Queue{plain, ttl, mixed, long} {
			ready[i] = q.Ready()
		}
		expired = mixed.Counters().Expired
	}); err != nil {
		t.Fatal(err)
	}
	if ready != [4]int{1, 0, 0, 1} || expired != 1 {
		t.Fatalf("after the tick: ready plain, ttl, mixed, long = %v (want [1 0 0 1]), mixed expired %d (want 1)", ready, expired)
	}
	if n := indexed(); n != 1 {
		t.Fatalf("%d queues in the expiry index at the end, want 1", n)
	}
}
