package shards

import (
	"io"
	"log/slog"
	"strconv"
	"testing"

	"github.com/berthmq/berth/journal"
	"github.com/berthmq/berth/wire"
)

// BenchmarkConsumeBacklog measures the shard's cost of consuming a
// backlog of 1 KiB messages that is in memory (paged=false, no budget) or
// paged out (paged=true: a 1 MiB budget, so all but the head are on disk:
// transient bodies in the paging file, persistent ones in the journal).
// Each op is one message delivered and accepted; the backlog is refilled
// with the timer stopped. The shard is driven by hand, as in
// BenchmarkShardPublishDeliverAccept, with the journal under FsyncNever
// so that fsync does not dominate.
//
//	go test ./shards -run '^$' -bench ConsumeBacklog -benchmem
func BenchmarkConsumeBacklog(b *testing.B) {
	for _, persistent := range []bool{false, true} {
		for _, paged := range []bool{false, true} {
			name := "persistent=" + strconv.FormatBool(persistent) + "/paged=" + strconv.FormatBool(paged)
			b.Run(name, func(b *testing.B) { benchConsumeBacklog(b, persistent, paged) })
		}
	}
}

func benchConsumeBacklog(b *testing.B, persistent, paged bool) {
	const (
		backlog = 50_000
		credit  = 256
	)
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	cfg := Config{Shards: 1, Logger: log}
	if paged {
		cfg.MemoryLimit, cfg.PagingDir = 1<<20, b.TempDir()
	}
	br := New(cfg)
	if err := br.setupPaging(); err != nil {
		b.Fatal(err)
	}
	s := br.shards[0]
	defer s.closePages()
	if persistent {
		if err := s.openJournal(JournalConfig{Dir: b.TempDir(), Fsync: journal.FsyncNever}, log); err != nil {
			b.Fatal(err)
		}
		defer s.closeJournal()
	}
	q := NewQueue("q", QueueOptions{Durable: true}, 0, &s.pool)
	s.queues.add(q)
	sess := &Session{ID: 1, Version: wire.Current, FrameMax: wire.FrameSizeDefault, Out: &discardWriter{}}
	s.handleCmd(Subscribe{Sess: sess, CmdID: 1, Queue: q, ConsumerID: 1}.Command())
	payload := make([]byte, 1024)
	settleJournal := func() {
		if s.journal == nil {
			return
		}
		if err := s.journal.j.Sync(); err != nil {
			b.Fatal(err)
		}
		for s.journal.pending.size > 0 {
			s.drainJournal()
		}
	}
	fill := func(k int) {
		for i := 0; i < k; i++ {
			cmd := Publish{Queue: q, Body: NewBody(nil, []byte("q"), nil, payload, persistent), Now: 1}.Command()
			s.handle(&cmd)
		}
		settleJournal()
	}
	var accepted uint64
	consume := func(k int) {
		for left := k; left > 0; {
			n := min(left, credit)
			s.handleCmd(Credit{Sess: sess, ConsumerID: 1, Credit: uint32(n)}.Command())
			s.dispatchDirty()
			s.flush()
			cmd := Settle{Kind: SettleAccept, Sess: sess, ConsumerID: 1, NRanges: 1, Last: true}
			cmd.Ranges[0] = wire.Range{First: accepted + 1, Last: accepted + uint64(n)}
			s.handleCmd(cmd.Command())
			accepted += uint64(n)
			left -= n
			if s.journal != nil {
				s.drainJournal()
			}
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
	settleJournal()
	if q.Depth() != 0 || q.Counters().Acked != accepted {
		b.Fatalf("depth %d, acked %d of %d", q.Depth(), q.Counters().Acked, accepted)
	}
	b.ReportMetric(float64(s.mem.pageIns)/float64(b.N), "pageins/op")
}
