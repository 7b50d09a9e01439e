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

// TestSweepPagesResidentBacklog: a backlog filled from an empty shard
// keeps the bodies that arrived under the watermark in memory until the
// count passes it; then the sweep pages them out (all but the first
// sweepSkip), so that the entries of a backlog many times the share fit
// without throttling. Without the sweep the first half-share of bodies
// stayed resident for good, and the entries behind them took the count
// to the share: throttled with no consumer to end it. Every message then
// comes back in order with its body, whether the journal (persistent) or
// the paging file (transient) held it.
func TestSweepPagesResidentBacklog(t *testing.T) {
	for _, journaled := range []bool{true, false} {
		t.Run(fmt.Sprintf("journal=%v", journaled), func(t *testing.T) { testSweep(t, journaled) })
	}
}

func testSweep(t *testing.T, journaled bool) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	const limit = 4 << 20
	cfg := Config{Shards: 1, TickInterval: time.Hour, MemoryLimit: limit, PagingDir: t.TempDir(),
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}
	if journaled {
		cfg.Journal = &JournalConfig{Dir: t.TempDir()}
	}
	b := New(cfg)
	q, err := startWith(b, "deep")
	if err != nil {
		t.Fatal(err)
	}
	defer b.Stop()
	sh := b.shards[0]
	w := &captureWriter{}
	sess := &Session{ID: 1, Version: wire.Current, FrameMax: wire.FrameSizeDefault, Out: w}
	push := func(c Command) {
		t.Helper()
		if err := sh.Push(ctx, c); err != nil {
			t.Fatal(err)
		}
	}
	// 40,000 x 1 KiB: ten times the share. Their entries alone take
	// about half of it.
	const n = 40000
	payload := make([]byte, 1024)
	for i := range n {
		p := append([]byte(nil), payload...)
		copy(p, fmt.Sprintf("message %08d", i))
		push(Publish{Sess: sess, CmdID: uint64(i + 1), Queue: q, Body: NewBody(nil, []byte("deep"), []byte("props"), p, i%2 == 0), Now: time.Now().UnixNano()}.Command())
	}
	var resident, sweeps int
	var used, paged, outside int64
	var throttled bool
	deadline := time.Now().Add(20 * time.Second)
	for {
		if err := b.Call(sh, func(s *Shard) {
			resident = 0
			d := &q.levels[0].ready
			for i := range d.len() {
				if d.at(i).Body != nil {
					resident++
				}
			}
			used, paged, outside, throttled, sweeps = s.mem.used, s.mem.paged, s.mem.outside(), s.mem.throttling, int(s.mem.sweeps)
		}); err != nil {
			t.Fatal(err)
		}
		if resident <= sweepSkip && !throttled {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d messages: %d bodies still in memory, %d paged, %d bytes counted (%d outside the queues) of a %d-byte share, throttled %v, %d sweeps",
				n, resident, paged, used, outside, limit, throttled, sweeps)
		}
		time.Sleep(5 * time.Millisecond)
	}
	if sweeps == 0 {
		t.Fatal("no sweep ran")
	}
	t.Logf("%d messages: %d bodies in memory, %d paged, %d bytes counted (%d outside the queues), %d sweeps", n, resident, paged, used, outside, sweeps)

	consumeNumbered(t, push, w, sess, q, n, len(payload), n+1, 40*time.Second)
}
