package shards

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/berthmq/berth/wire"
)

// TestEntrySize holds the compact index entry a paged message keeps in
// memory at most 64 bytes, its ring slot included.
func TestEntrySize(t *testing.T) {
	if EntryBytes > 64 {
		t.Fatalf("a paged message costs %d bytes in memory, want at most 64", EntryBytes)
	}
	t.Logf("index bytes per paged message: %d", EntryBytes)
}

// captureWriter keeps what a shard writes to a session.
type captureWriter struct {
	mu  sync.Mutex
	buf []byte
}

func (w *captureWriter) WriteAsync(bufs [][]byte, done func()) error {
	w.mu.Lock()
	for _, b := range bufs {
		w.buf = append(w.buf, b...)
	}
	w.mu.Unlock()
	done()
	return nil
}

// take returns the deliveries written since the last call.
func (w *captureWriter) take(t *testing.T) []wire.DeliverMessage {
	w.mu.Lock()
	defer w.mu.Unlock()
	var out []wire.DeliverMessage
	n := 0
	for {
		h, body, k, err := wire.Next(w.buf[n:], wire.FrameSizeMax)
		if err != nil {
			t.Fatalf("frame from the shard: %v", err)
		}
		if k == 0 {
			break
		}
		n += k
		if h.Type != wire.TypeDeliver {
			continue
		}
		var d wire.Deliver
		if err := wire.DecodeDeliver(body, &d); err != nil {
			t.Fatal(err)
		}
		var m wire.DeliverMessage
		for d.Next(&m) {
			m.Payload = append([]byte(nil), m.Payload...)
			m.Props = append([]byte(nil), m.Props...)
			m.Exchange, m.RoutingKey = nil, nil
			out = append(out, m)
		}
	}
	w.buf = w.buf[:copy(w.buf, w.buf[n:])]
	return out
}

// TestPagingRoundTrip publishes far more than a shard's memory share to
// a queue with no consumer, persistent and transient messages mixed, and
// checks that the shard paged bodies out (to the journal and to the
// paging file), raised its throttle flag, then delivered every message
// once, in order and intact, coming back to nothing counted, nothing
// paged, no throttle and no paging file. Without a journal every message
// goes to the paging file.
func TestPagingRoundTrip(t *testing.T) {
	for _, journaled := range []bool{true, false} {
		t.Run(fmt.Sprintf("journal=%v", journaled), func(t *testing.T) {
			testPagingRoundTrip(t, journaled)
		})
	}
}

func testPagingRoundTrip(t *testing.T, journaled bool) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	pageDir := t.TempDir()
	// A leftover from an earlier run must go at start.
	stale := filepath.Join(pageDir, "shard-000", "00000001.page")
	if err := os.MkdirAll(filepath.Dir(stale), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(stale, []byte("old"), 0o600); err != nil {
		t.Fatal(err)
	}
	const limit = 1 << 20
	cfg := Config{Shards: 1, TickInterval: time.Hour, MemoryLimit: limit, PagingDir: pageDir,
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
	if _, err := os.Stat(stale); !os.IsNotExist(err) {
		t.Fatalf("a stale paging file survived the start: %v", err)
	}
	sh := b.shards[0]
	w := &captureWriter{}
	sess := &Session{ID: 1, Version: wire.Current, FrameMax: wire.FrameSizeDefault, Out: w}
	push := func(c Command) {
		t.Helper()
		if err := sh.Push(ctx, c); err != nil {
			t.Fatal(err)
		}
	}
	const n = 20000
	payload := make([]byte, 1024)
	for i := 0; i < n; i++ {
		p := append([]byte(nil), payload...)
		copy(p, fmt.Sprintf("message %08d", i))
		push(Publish{Sess: sess, CmdID: uint64(i + 1), Queue: q, Body: NewBody(nil, []byte("deep"), []byte("props"), p, i%2 == 0), Now: time.Now().UnixNano()}.Command())
	}
	var used, paged int64
	var throttled bool
	var outside int64
	if err := b.Call(sh, func(s *Shard) {
		used, paged, throttled, outside = s.mem.used, s.mem.paged, s.mem.throttling, s.mem.outside()
	}); err != nil {
		t.Fatal(err)
	}
	// Bodies are 20 MiB; the share is 1 MiB.
	if paged < n/2 || !throttled || !sh.Throttled() {
		t.Fatalf("after %d publishes over a %d-byte share: %d paged, counted %d bytes, throttled %v", n, limit, paged, used, throttled)
	}
	if used-outside > limit+n*EntryBytes {
		t.Fatalf("counted %d bytes for %d messages of 1 KiB under a %d-byte share", used, n, limit)
	}
	// Memory() reads what the shard publishes at the end of its batch,
	// which may come just after the call above returned.
	for deadline := time.Now().Add(5 * time.Second); ; {
		st := b.Memory()
		if st.PagedMessages == paged && len(st.ThrottledShards) == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("Memory() = %+v, the shard counted %d paged", st, paged)
		}
		time.Sleep(time.Millisecond)
	}
	t.Logf("%d messages: %d paged, %d bytes counted (share %d)", n, paged, used, limit)

	consumeNumbered(t, push, w, sess, q, n, len(payload), n+1, 50*time.Second)
	var pageIns uint64
	var depth int
	if err := b.Call(sh, func(s *Shard) {
		// The journal's index stays counted: freed records leave it
		// with their segment.
		used, paged, throttled, pageIns, depth = s.mem.used-s.mem.outside(), s.mem.paged, s.mem.throttling, s.mem.pageIns, q.Depth()
	}); err != nil {
		t.Fatal(err)
	}
	if depth != 0 || used != 0 || paged != 0 || throttled || sh.Throttled() || pageIns == 0 {
		t.Fatalf("after consuming everything: depth %d, counted %d bytes, %d paged, throttled %v, %d read back", depth, used, paged, throttled, pageIns)
	}
	files, _ := filepath.Glob(filepath.Join(pageDir, "shard-000", "*.page"))
	if len(files) != 0 {
		t.Fatalf("paging files left after the queue drained: %v", files)
	}
}

// consumeNumbered subscribes consumer 1 of sess to q (command id
// firstCmd) and takes n messages, "message %08d" in order, each of
// payloadLen bytes with props "props" and persistent when its number is
// even, accepting each batch and giving its credit back, within d.
func consumeNumbered(t *testing.T, push func(Command), w *captureWriter, sess *Session, q *Queue, n, payloadLen int, firstCmd uint64, d time.Duration) {
	t.Helper()
	push(Subscribe{Sess: sess, CmdID: firstCmd, Queue: q, ConsumerID: 1, Credit: 500, AckMode: wire.AckExplicit}.Command())
	got := 0
	cmdID := firstCmd + 1
	for deadline := time.Now().Add(d); got < n; {
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d delivered", got, n)
		}
		ms := w.take(t)
		if len(ms) == 0 {
			time.Sleep(time.Millisecond)
			continue
		}
		for _, m := range ms {
			want := fmt.Sprintf("message %08d", got)
			if string(m.Payload[:len(want)]) != want || len(m.Payload) != payloadLen || string(m.Props) != "props" {
				t.Fatalf("delivery %d: %q... (%d bytes), want %q", got, m.Payload[:16], len(m.Payload), want)
			}
			if persistent := m.Flags&wire.MsgPersistent != 0; persistent != (got%2 == 0) {
				t.Fatalf("delivery %d: persistent %v", got, persistent)
			}
			got++
		}
		settle := Settle{Kind: SettleAccept, Sess: sess, CmdID: cmdID, ConsumerID: 1, NRanges: 1, Last: true}
		settle.Ranges[0] = wire.Range{First: ms[0].Tag, Last: ms[len(ms)-1].Tag}
		cmdID++
		push(settle.Command())
		push(Credit{Sess: sess, ConsumerID: 1, Credit: uint32(len(ms))}.Command())
	}
}
