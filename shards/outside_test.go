package shards

import (
	"context"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/berthmq/berth/wire"
)

// plainReplicator is a journalReplicator that replicates no queue: it
// only reports what the replication holds outside the group logs.
type plainReplicator struct{ journalReplicator }

// TestMemoryCountsOutsideQueues: the budget counts what the broker holds
// outside its queues. The shard journal's index: 30,000 persistent
// messages grow it past 1 MiB, and the shard counts it (and Memory()
// reports it). What the replication reports (the group journal's index,
// the frames queued for peers): 12 MiB of it over an 8 MiB share takes
// the count past the watermark though the queues hold 5 MiB, and the
// shard pages their bodies out. Without the counting the shard pages
// nothing here and counts no journal index (the test fails on both).
// What the queues do not hold counts up to half the share: 100 MiB of it
// counts as much as 12 (counted whole, it would throttle for good).
func TestMemoryCountsOutsideQueues(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	const limit = 8 << 20
	b := New(Config{Shards: 1, TickInterval: time.Hour, MemoryLimit: limit, PagingDir: t.TempDir(),
		Journal: &JournalConfig{Dir: t.TempDir()}, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	r := &plainReplicator{}
	b.SetReplicator(r)
	q, err := startWith(b, "deep")
	if err != nil {
		t.Fatal(err)
	}
	defer b.Stop()
	sh := b.shards[0]
	sess := &Session{ID: 1, Version: wire.Current, FrameMax: wire.FrameSizeDefault, Out: &discardWriter{}}
	const n = 30_000
	for i := range n {
		if err := sh.Push(ctx, Publish{Sess: sess, CmdID: uint64(i + 1), Queue: q,
			Body: NewBody(nil, []byte("deep"), nil, make([]byte, 16), true), Now: time.Now().UnixNano()}.Command()); err != nil {
			t.Fatal(err)
		}
	}
	state := func() (used, journalCharged, index int64, throttled bool) {
		t.Helper()
		// A call is a loop of the shard: it counts what is outside after
		// it, and the next call sees it.
		for range 2 {
			if err := b.Call(sh, func(s *Shard) {
				used, journalCharged, index, throttled = s.mem.used, s.mem.journalSeen, s.journal.j.IndexBytes(), s.mem.throttling
			}); err != nil {
				t.Fatal(err)
			}
		}
		return
	}
	used, charged, index, _ := state()
	if index < 1<<20 || charged != index {
		t.Fatalf("%d messages journaled: the journal's index takes %d bytes, the shard counts %d of it", n, index, charged)
	}
	if st := b.Memory(); st.JournalIndexBytes != index {
		t.Fatalf("Memory() says the journal index takes %d bytes, want %d", st.JournalIndexBytes, index)
	}
	t.Logf("%d messages: %d bytes counted, %d of them the journal's index", n, used, charged)

	// 12 MiB held by the replication counts up to half the share; with
	// the queue's 5 MiB that is over the watermark, so the shard pages
	// the queue's bodies out (the sweep, memory.go) and ends below the
	// share. Counted: the cap for the outside and every entry.
	r.outside.Store(12 << 20)
	var paged int64
	pagedNow := func() int64 {
		t.Helper()
		for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(time.Millisecond) {
			if err := b.Call(sh, func(s *Shard) { paged = s.mem.paged }); err != nil {
				t.Fatal(err)
			}
			if paged >= n-sweepSkip || time.Now().After(deadline) {
				return paged
			}
		}
	}
	if paged = pagedNow(); paged < n-sweepSkip {
		t.Fatalf("the replication holds 12 MiB over an 8 MiB share: %d of %d bodies paged out", paged, n)
	}
	used, _, _, throttled := state()
	if throttled || sh.Throttled() || used < limit/2+n*EntryBytes {
		t.Fatalf("the replication holds 12 MiB over an 8 MiB share, the bodies paged out: counted %d bytes, throttled %v; want at least %d, not throttled", used, throttled, limit/2+n*EntryBytes)
	}
	if st := b.Memory(); st.ReplicationBytes != 12<<20 {
		t.Fatalf("Memory() says the replication holds %d bytes, want %d", st.ReplicationBytes, 12<<20)
	}
	r.outside.Store(0)
	if used, _, _, throttled = state(); throttled || sh.Throttled() || used >= limit/2 {
		t.Fatalf("the replication let go: counted %d bytes, throttled %v", used, throttled)
	}

	// What the queues do not hold counts up to half the share, however
	// much it is: 100 MiB that throttling cannot bring down (a peer that
	// is down) leaves the queue the other half, and draining the queue
	// leaves only the cap.
	r.outside.Store(100 << 20)
	if used, _, _, throttled = state(); throttled || used > limit/2+6<<20 || used < limit/2 {
		t.Fatalf("the replication holds 100 MiB: counted %d bytes, throttled %v; want half the share counted for it", used, throttled)
	}
	if _, err := b.Purge(q); err != nil {
		t.Fatal(err)
	}
	if used, _, _, throttled = state(); throttled || sh.Throttled() || used > limit/2 {
		t.Fatalf("the queue drained, the replication still at 100 MiB: counted %d bytes, throttled %v", used, throttled)
	}
}

// TestMemoryCountsCheckpoint: what a shard's checkpoint writer keeps
// between checkpoints (the last checkpoint, which the next is merged
// into) counts against the budget and shows in Memory(). Without the
// counting the shard counts none of it and the test fails.
func TestMemoryCountsCheckpoint(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	b := New(Config{Shards: 1, TickInterval: time.Hour, MemoryLimit: 256 << 20, PagingDir: t.TempDir(),
		Journal: &JournalConfig{Dir: t.TempDir()}, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	q, err := startWith(b, "kept")
	if err != nil {
		t.Fatal(err)
	}
	defer b.Stop()
	sh := b.shards[0]
	sess := &Session{ID: 1, Version: wire.Current, FrameMax: wire.FrameSizeDefault, Out: &discardWriter{}}
	const n = 20_000
	for i := range n {
		if err := sh.Push(ctx, Publish{Sess: sess, CmdID: uint64(i + 1), Queue: q,
			Body: NewBody(nil, []byte("kept"), nil, make([]byte, 16), true), Now: time.Now().UnixNano()}.Command()); err != nil {
			t.Fatal(err)
		}
	}
	if err := b.Call(sh, func(s *Shard) { s.checkpointNow() }); err != nil {
		t.Fatal(err)
	}
	var held, seen, outside int64
	for range 2 { // a call is a loop of the shard: the next one sees what it counted
		if err := b.Call(sh, func(s *Shard) {
			held, seen, outside = s.journal.ck.owner.heldBytes(), s.mem.ckSeen, s.mem.outsideCharged
		}); err != nil {
			t.Fatal(err)
		}
	}
	if held < n*4 {
		t.Fatalf("a checkpoint of %d messages leaves its writer %d bytes: too few to hold it", n, held)
	}
	if seen != held || outside < held {
		t.Fatalf("the checkpoint writer holds %d bytes; the shard counts %d of it (%d outside the queues in all)", held, seen, outside)
	}
	if st := b.Memory(); st.CheckpointBytes != held {
		t.Fatalf("Memory() says the checkpoint writer holds %d bytes, want %d", st.CheckpointBytes, held)
	}
	t.Logf("%d messages checkpointed: the writer keeps %d bytes (%.1f a message)", n, held, float64(held)/n)
}
