package shards

import (
	"bytes"
	"errors"
	"fmt"
	"github.com/berthmq/berth/replication/event"
	"io"
	"log/slog"
	"runtime"
	"slices"
	"strconv"
	"sync/atomic"
	"testing"

	"github.com/berthmq/berth/journal"
	"github.com/berthmq/berth/wire"
)

// journalReplicator stands for the group node in these tests: the
// enqueue events of a replicated queue are records of a real journal
// (the body as appendBodyRecord writes it), read back by position as
// the server reads its group journal.
type journalReplicator struct {
	j   *journal.Journal
	win journal.Window
	// outside is what MemoryBytes reports, and the journal's index with
	// it if countIndex.
	outside    atomic.Int64
	countIndex bool
	// sh is the shard whose acquires events commit at once (on the
	// test's goroutine, which drives the shard), unless holdAcquires:
	// then their tags wait in acqTags. acquires records each event.
	sh           *Shard
	holdAcquires bool
	acqTags      []uint64
	acquires     [][]uint64
	releases     []releaseEvent
	windows      []uint32
}

func (r *journalReplicator) ProposeReleases(_ *Queue, seqs []uint64, unseen bool, _ event.Stamp, tag uint64) error {
	r.releases = append(r.releases, releaseEvent{slices.Clone(seqs), unseen})
	r.sh.acquired(tag, nil)
	return nil
}

// releaseEvent is a releases event a journalReplicator took.
type releaseEvent struct {
	seqs   []uint64
	unseen bool
}

func (r *journalReplicator) ProposeAcquires(_ *Queue, seqs []uint64, window uint32, _ event.Stamp, tag uint64) error {
	r.windows = append(r.windows, window)
	r.acquires = append(r.acquires, slices.Clone(seqs))
	if r.holdAcquires {
		r.acqTags = append(r.acqTags, tag)
		return nil
	}
	r.sh.acquired(tag, nil)
	return nil
}

func (r *journalReplicator) MemoryBytes() int64 {
	if r.countIndex {
		return r.outside.Load() + r.j.IndexBytes()
	}
	return r.outside.Load()
}

func (r *journalReplicator) IsMaster(uint32) bool   { return true }
func (r *journalReplicator) Delivering(uint32) bool { return true }
func (r *journalReplicator) ProposeEnqueue(*Queue, *Body, int64, uint64, uint64, uint64) error {
	return errors.New("not in this test")
}
func (r *journalReplicator) ProposeRemoves(*Queue, []uint64, func(error)) error { return nil }
func (r *journalReplicator) Barrier(_ *Queue, done func(error)) error           { done(nil); return nil }
func (r *journalReplicator) ProposeDelete(*Queue) error                         { return nil }
func (r *journalReplicator) Skipped(*Queue, uint64)                             {}
func (r *journalReplicator) ProposeEvent(*Queue, []byte, uint64) error {
	return errors.New("not in this test")
}
func (r *journalReplicator) Self() uint32          { return 1 }
func (r *journalReplicator) Owning(uint32) bool    { return false }
func (r *journalReplicator) Live(_, _ uint32) bool { return true }
func (r *journalReplicator) Resync(uint32, uint64) {}
func (r *journalReplicator) Applied(uint32) uint64 { return 0 }

func (r *journalReplicator) ReadEnqueue(_ *Queue, _ uint64, pos uint64, dst []byte) (*Body, []byte, error) {
	rec, err := r.j.ReadAhead(journal.Pos(pos), &r.win, dst[:0])
	if err != nil {
		return nil, rec[:0], err
	}
	var rd wire.Reader
	rd.Reset(rec)
	b, err := parseBody(&rd, len(rec), 0)
	return b, rec[:0], err
}

// event journals b as the group log would its enqueue event, and
// returns its position.
func (r *journalReplicator) event(b *Body) uint64 {
	return uint64(r.j.Append(appendBodyRecord(nil, b), func(journal.Pos, error) {}))
}

// replicatedShard is a shard (not started: the test drives it) with a
// budget of limit bytes, a replicated queue and a journalReplicator.
func replicatedShard(t testing.TB, limit int64) (*Shard, *Queue, *journalReplicator) {
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	cfg := Config{Shards: 1, Logger: log}
	if limit > 0 {
		cfg.MemoryLimit, cfg.PagingDir = limit, t.TempDir()
	}
	br := New(cfg)
	if err := br.setupPaging(); err != nil {
		t.Fatal(err)
	}
	j, err := journal.Open(journal.Options{Dir: t.TempDir(), Fsync: journal.FsyncNever, Logger: log}, func(journal.Pos, journal.Pos, []byte) error { return nil })
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { j.Close() })
	s := br.shards[0]
	r := &journalReplicator{j: j, sh: s}
	br.SetReplicator(r)
	t.Cleanup(s.closePages)
	q := NewQueue("rq", QueueOptions{Durable: true}, 0, &s.pool)
	q.replicated, q.group = true, 1
	s.queues.add(q)
	return s, q, r
}

func replicatedPayload(i int) []byte {
	p := bytes.Repeat([]byte{byte('a' + i%26)}, 1024)
	copy(p, strconv.Itoa(i))
	return p
}

// TestReplicatedPaging: a replicated queue under a 1 MiB budget. Past the
// high watermark, a message whose event the group log dropped (a logPos)
// has its body paged out and uncounted; one whose event the log still
// holds (no logPos) stays in memory and counted. Every message is then
// read back in order with its body, and once they are gone nothing is
// counted. Without paging of replicated bodies the 3,000 KiB would stay
// counted and the shard would throttle.
func TestReplicatedPaging(t *testing.T) {
	const n, limit = 3000, 1 << 20
	s, q, r := replicatedShard(t, limit)
	held := 0
	for i := range n {
		b := NewBody(nil, []byte("rq"), nil, replicatedPayload(i), true)
		var pos uint64
		if i%50 != 0 {
			pos = r.event(b) // the log dropped this one's data
		} else if s.mem.used > s.mem.high {
			held++
		}
		s.ApplyEnqueue(q, uint64(i+1), b, 0, 0, 0, pos)
		s.publishMemory()
	}
	m := &s.mem
	if m.throttling || m.used > m.limit {
		t.Fatalf("%d of %d bytes counted with %d of %d messages paged; throttling %v", m.used, m.limit, m.paged, n, m.throttling)
	}
	if want := int64(n*49/50 - residentHeadMin - 600); m.paged < want {
		t.Fatalf("%d messages paged, want at least %d", m.paged, want)
	}
	if !s.Paging() {
		t.Fatal("the shard above its high watermark does not say so (Paging)")
	}
	var inMemory int
	for d, i := &q.levels[0].ready, 0; i < d.len(); i++ {
		if e := d.at(i); e.Body != nil && e.page == 0 && i > residentHeadMin {
			inMemory++
		}
	}
	if inMemory < held {
		t.Fatalf("%d messages whose event the log holds are in memory past the head, want %d", inMemory, held)
	}
	for i := range n {
		h := q.Head()
		if h == nil {
			t.Fatalf("the queue is empty after %d of %d", i, n)
		}
		if h.Body == nil && !s.pageIn(q) {
			t.Fatalf("message %d was not read back", i)
		}
		if h.Seq != uint64(i+1) || !bytes.Equal(h.Body.Payload, replicatedPayload(i)) {
			t.Fatalf("message %d: seq %d, payload %.8q", i, h.Seq, h.Body.Payload)
		}
		s.ApplyRemove(q, h.Seq)
	}
	s.flushRemoves()
	if m.used != 0 || m.paged != 0 {
		t.Fatalf("%d bytes and %d paged messages counted after every message left", m.used, m.paged)
	}
	if m.pageIns == 0 || m.pageErrors != 0 {
		t.Fatalf("%d read back, %d errors", m.pageIns, m.pageErrors)
	}
}

// BenchmarkReplicatedConsumeBacklog is BenchmarkConsumeBacklog for a
// replicated queue: 1 KiB messages applied as the group log hands them
// over, in memory (no budget) or paged out (a 1 MiB budget, the log's
// copy dropped, read back from a journal by position through a
// read-ahead window), then delivered with ack mode none.
//
//	go test ./shards -run '^$' -bench ReplicatedConsumeBacklog -benchmem
func BenchmarkReplicatedConsumeBacklog(b *testing.B) {
	for _, paged := range []bool{false, true} {
		b.Run(fmt.Sprintf("paged=%v", paged), func(b *testing.B) {
			const backlog, credit = 50_000, 256
			var limit int64
			if paged {
				limit = 1 << 20
			}
			s, q, r := replicatedShard(b, limit)
			s.setMastered(q.group, true) // a master delivers once its shard took GroupMastered
			sess := &Session{ID: 1, Version: wire.Current, FrameMax: wire.FrameSizeDefault, Out: &discardWriter{}}
			s.handleCmd(Subscribe{Sess: sess, CmdID: 1, Queue: q, ConsumerID: 1, AckMode: wire.AckNone}.Command())
			payload := make([]byte, 1024)
			seq := uint64(0)
			fill := func(k int) {
				for range k {
					seq++
					body := NewBody(nil, []byte("rq"), nil, payload, true)
					var pos uint64
					if paged {
						pos = r.event(body)
					}
					s.ApplyEnqueue(q, seq, body, 0, 0, 0, pos)
					s.publishMemory()
				}
				if err := r.j.Sync(); err != nil {
					b.Fatal(err)
				}
			}
			consume := func(k int) {
				for left := k; left > 0; {
					n := min(left, credit)
					s.handleCmd(Credit{Sess: sess, ConsumerID: 1, Credit: uint32(n)}.Command())
					s.dispatchDirty()
					s.flush()
					s.flushRemoves()
					left -= n
				}
			}
			b.ReportAllocs()
			b.SetBytes(int64(len(payload)))
			b.ResetTimer()
			for done := 0; done < b.N; {
				k := min(backlog, b.N-done)
				b.StopTimer()
				fill(k)
				if paged && k >= 10_000 && s.mem.paged < int64(k)/2 {
					b.Fatalf("only %d of %d messages paged", s.mem.paged, k)
				}
				b.StartTimer()
				consume(k)
				done += k
			}
			b.StopTimer()
			if q.Depth() != 0 {
				b.Fatalf("depth %d after consuming", q.Depth())
			}
			b.ReportMetric(float64(s.mem.pageIns)/float64(b.N), "pageins/op")
		})
	}
}

// TestReplicatedPagedIndexBytes: a paged replicated message costs the
// shard its Entry and its ring slot, EntryBytes (56), and the budget
// counts EntryBytes + logEntryBytes (64) for it, the group log's slot and
// journal position included (measured in replication/group and replication/groups:
// TestPagedEntryBytes, TestNodePagedEntryBytes). Measured as the heap
// after GC, with the group journal's records written beforehand, over
// 2^17 messages (the ring's size, so it has no slack).
func TestReplicatedPagedIndexBytes(t *testing.T) {
	const n = 1 << 17
	s, q, r := replicatedShard(t, 64<<10)
	payload := make([]byte, 100)
	pos := make([]uint64, n)
	for i := range pos {
		pos[i] = r.event(NewBody(nil, []byte("rq"), nil, payload, true))
	}
	before := int64(liveHeap())
	for i := range n {
		s.ApplyEnqueue(q, uint64(i+1), NewBody(nil, []byte("rq"), nil, payload, true), 0, 0, 0, pos[i])
		s.publishMemory()
	}
	per := float64(int64(liveHeap())-before) / n
	runtime.KeepAlive(pos)
	t.Logf("%.1f bytes a paged replicated message in the shard; %d counted", per, entryCost(q))
	if s.mem.paged < n-1000 {
		t.Fatalf("%d of %d paged", s.mem.paged, n)
	}
	// 2.5 bytes of slack (330 KB) for what other goroutines allocate
	// meanwhile; slabs of 256 entries took 61.2 bytes.
	if per > float64(EntryBytes)+2.5 {
		t.Fatalf("a paged replicated message costs the shard %.1f bytes, want at most %.1f", per, float64(EntryBytes)+2.5)
	}
	if got := entryCost(q); got > 64 {
		t.Fatalf("a paged replicated message is counted as %d bytes, want at most 64", got)
	}
	if s.mem.used > int64(n)*entryCost(q)+s.mem.high {
		t.Fatalf("%d bytes counted for %d messages", s.mem.used, n)
	}
}

// BenchmarkReplicatedPagedCapacity measures how many replicated messages
// of 2 KiB a 16 MiB budget holds before the shard throttles, paged past
// the high watermark, with the group journal's index counted as the
// shard's loop counts it (index=true; the test's journal stands for the
// group's) or not (index=false, as before it was). Each paged one costs
// 64 bytes of index in the shard and the group log,
// and about 32 in the journal's index (a 24-byte slot in a ring of a
// power of two of them, 8 bytes in its segment's list). It writes
// 300 MB to the journal, so it is a benchmark, run once:
//
//	go test ./shards -run '^$' -bench ReplicatedPagedCapacity -benchtime 1x
func BenchmarkReplicatedPagedCapacity(b *testing.B) {
	const limit = 16 << 20
	for _, count := range []bool{false, true} {
		b.Run(fmt.Sprintf("index=%v", count), func(b *testing.B) { replicatedPagedCapacity(b, limit, count) })
	}
}

func replicatedPagedCapacity(b *testing.B, limit int64, countIndex bool) {
	for range b.N {
		s, q, r := replicatedShard(b, limit)
		r.countIndex = countIndex
		payload := make([]byte, 2048)
		n := 0
		for ; !s.mem.throttling && n < 1_000_000; n++ {
			body := NewBody(nil, []byte("rq"), nil, payload, true)
			s.ApplyEnqueue(q, uint64(n+1), body, 0, 0, 0, r.event(body))
			if n%256 == 0 {
				s.chargeOutbound()
				s.publishMemory()
			}
		}
		b.ReportMetric(float64(n), "msgs")
		b.ReportMetric(float64(s.mem.paged), "paged")
		b.ReportMetric(float64(s.mem.replSeen), "index-bytes")
	}
}
