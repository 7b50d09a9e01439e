package shards

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/berthmq/berth/wire"
)

// TestMetricsSnapshot drives a journaled broker through known traffic and
// checks what one Metrics call reports: per-queue numbers, the shard's
// ring-full count while its goroutine is held, and after a restart the
// recovered messages, which are not counted as publishes.
func TestMetricsSnapshot(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	dir := t.TempDir()
	cfg := Config{Shards: 2, RingSize: 16, TickInterval: time.Hour, // no ticks to fill the ring
		Journal: &JournalConfig{Dir: dir}, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}
	b := New(cfg)
	if _, err := b.Metrics(ctx); !errors.Is(err, ErrNotRunning) {
		t.Fatalf("Metrics before Start: %v, want ErrNotRunning", err)
	}
	if b.Recovered() {
		t.Fatal("recovered before Start")
	}
	q, err := startWith(b, "dq")
	if err != nil {
		t.Fatal(err)
	}
	if !b.Recovered() || b.ShardsRecovered() != 2 {
		t.Fatalf("after Recover: recovered %v shards %d", b.Recovered(), b.ShardsRecovered())
	}
	sh := b.shards[q.shard]
	sess := &Session{ID: 1, Version: wire.Current, FrameMax: wire.FrameSizeDefault, Out: &discardWriter{}}
	push := func(c Command) {
		t.Helper()
		if err := sh.Push(ctx, c); err != nil {
			t.Fatal(err)
		}
	}
	payload := []byte("0123456789")
	for i := 1; i <= 10; i++ {
		push(Publish{Sess: sess, CmdID: uint64(i), Queue: q, Body: NewBody(nil, []byte("dq"), nil, payload, true), Now: time.Now().UnixNano()}.Command())
	}
	push(Subscribe{Sess: sess, CmdID: 11, Queue: q, ConsumerID: 1, Credit: 4, AckMode: wire.AckExplicit}.Command())
	// Persistent messages become deliverable once their enqueues are
	// durable: wait for the four deliveries before the settle.
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(time.Millisecond) {
		unacked := 0
		if err := b.Call(sh, func(*Shard) { unacked = q.Unacked() }); err != nil {
			t.Fatal(err)
		}
		if unacked == 4 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d of 4 deliveries after 10 s", unacked)
		}
	}
	settle := Settle{Kind: SettleAccept, Sess: sess, CmdID: 12, ConsumerID: 1, NRanges: 1, Last: true}
	settle.Ranges[0] = wire.Range{First: 1, Last: 3}
	push(settle.Command())

	ms, err := b.Metrics(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(ms) != 2 {
		t.Fatalf("%d shards", len(ms))
	}
	m := ms[q.shard]
	if m.Shard != q.Shard() || !m.Journaled || len(m.Queues) != 1 {
		t.Fatalf("shard metrics %+v", m)
	}
	want := QueueMetrics{Name: "dq", Ready: 6, Unacked: 1, Consumers: 1, Bytes: 7 * uint64(len(payload)),
		Published: 10, Delivered: 4, Accepted: 3}
	if m.Queues[0] != want {
		t.Fatalf("queue metrics\n got %+v\nwant %+v", m.Queues[0], want)
	}
	if m.Stats.Published != 10 || m.Stats.Delivered != 4 || m.Stats.Accepted != 3 || m.Stats.StoreErrors != 0 {
		t.Fatalf("shard stats %+v", m.Stats)
	}
	// 10 enqueue records and 3 dequeue records.
	if m.Journal.Appends != 13 {
		t.Fatalf("journal appends %d, want 13", m.Journal.Appends)
	}
	if m.RingFull != 0 || ms[1-q.shard].RingFull != 0 {
		t.Fatalf("ring full %d and %d before any ring was full", m.RingFull, ms[1-q.shard].RingFull)
	}

	// Hold the shard goroutine, fill its ring, and fail three pushes.
	held, release := make(chan struct{}), make(chan struct{})
	push(CallCommand(func(*Shard) { close(held); <-release }))
	<-held
	for n := 0; sh.TryPush(tickCommand(0)); n++ {
		if n > 1<<20 {
			t.Fatal("the ring never filled")
		}
	}
	sh.TryPush(tickCommand(0))
	sh.TryPush(tickCommand(0))
	close(release)
	ms, err = b.Metrics(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if ms[q.shard].RingFull != 3 || ms[1-q.shard].RingFull != 0 {
		t.Fatalf("ring full %d on the held shard (want 3), %d on the other (want 0)", ms[q.shard].RingFull, ms[1-q.shard].RingFull)
	}
	b.Stop()
	if _, err := b.Metrics(ctx); !errors.Is(err, ErrNotRunning) {
		t.Fatalf("Metrics after Stop: %v, want ErrNotRunning", err)
	}

	// The 7 messages not accepted come back; they are not publishes.
	b = New(cfg)
	if _, err := startWith(b, "dq"); err != nil {
		t.Fatal(err)
	}
	defer b.Stop()
	ms, err = b.Metrics(ctx)
	if err != nil {
		t.Fatal(err)
	}
	m = ms[q.shard]
	if m.RecoveredMessages != 7 || m.Recovery <= 0 || ms[1-q.shard].RecoveredMessages != 0 {
		t.Fatalf("recovered %d in %v on the queue's shard, %d on the other", m.RecoveredMessages, m.Recovery, ms[1-q.shard].RecoveredMessages)
	}
	want = QueueMetrics{Name: "dq", Ready: 7, Bytes: 7 * uint64(len(payload))}
	if len(m.Queues) != 1 || m.Queues[0] != want {
		t.Fatalf("after restart queue metrics %+v, want %+v", m.Queues, want)
	}
	if m.Stats.Published != 0 {
		t.Fatalf("after restart shard published %d, want 0", m.Stats.Published)
	}
}
