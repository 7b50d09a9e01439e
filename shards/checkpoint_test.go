package shards

import (
	"context"
	"encoding/binary"
	"fmt"
	"hash/crc32"
	"io"
	"log/slog"
	"math/rand/v2"
	"os"
	"path/filepath"
	"reflect"
	"runtime"
	"slices"
	"testing"
	"time"

	"github.com/berthmq/berth/journal"
	"github.com/berthmq/berth/wire"
)

// ckQueues are the queues of the checkpoint tests: plain ones, a priority
// queue, and one that a run deletes and declares again.
var ckQueues = []struct {
	name string
	opts QueueOptions
}{
	{"plain-a", QueueOptions{Durable: true}},
	{"plain-b", QueueOptions{Durable: true}},
	{"prio", QueueOptions{Durable: true, MaxPriority: 3}},
	{"dropped", QueueOptions{Durable: true}},
}

// ckBroker starts a two-shard broker with small journal segments (so
// compaction runs between checkpoints) on dir and the test queues.
func ckBroker(t *testing.T, dir string, fs journal.FS) (*Broker, map[string]*Queue) {
	t.Helper()
	cfg := Config{Shards: 2, TickInterval: time.Hour, Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
		Journal: &JournalConfig{Dir: dir, SegmentBytes: 4096, Fsync: journal.FsyncNever, FS: fs}}
	b := New(cfg)
	if err := b.Start(); err != nil {
		t.Fatal(err)
	}
	qs := map[string]*Queue{}
	for _, d := range ckQueues {
		q, err := b.AddQueue(d.name, d.opts, nil, Placement{})
		if err != nil {
			t.Fatal(err)
		}
		qs[d.name] = q
	}
	if err := b.Recover(); err != nil {
		t.Fatal(err)
	}
	return b, qs
}

// ckMsg is a recovered message as the state comparison sees it.
type ckMsg struct {
	Pos   uint64
	Count uint32
	Exp   int64
	Level int
	At    int64 // delayed ones only
	Size  uint64
}

// ckQueueState is a queue's messages in delivery order: each level's
// ready ones from the highest level down by Seq, then the delayed ones by
// deliver-at time; and its producer table.
type ckQueueState struct {
	Ready     [][]ckMsg
	Delayed   []ckMsg
	Unacked   int
	Producers map[uint64]uint64
}

type ckState struct {
	Queues map[string]ckQueueState
	Live   []uint64 // live plain journal records, all shards
}

func ckCollect(t *testing.T, b *Broker, qs map[string]*Queue, maxPos uint64) ckState {
	t.Helper()
	st := ckState{Queues: map[string]ckQueueState{}}
	for name, q := range qs {
		_ = b.Call(b.shards[q.shard], func(s *Shard) {
			// Whether the shard's timer promoted the delayed messages
			// that came due while it was down is a matter of timing:
			// promote them now.
			_ = q.Apply(&Event{Kind: EvPromote, Now: time.Now().UnixNano()}, s)
			var qst ckQueueState
			for lv := len(q.levels) - 1; lv >= 0; lv-- {
				l := &q.levels[lv]
				var es []*Entry
				for k := 0; k < l.ready.len(); k++ {
					es = append(es, l.ready.at(k))
				}
				es = append(es, l.released...)
				slices.SortFunc(es, func(a, b *Entry) int { return int(a.Seq) - int(b.Seq) })
				var ms []ckMsg
				for _, e := range es {
					ms = append(ms, ckMsg{Pos: e.JournalPos, Count: e.DeliveryCount, Exp: e.ExpiresAt, Level: e.level(), Size: e.size()})
				}
				qst.Ready = append(qst.Ready, ms)
			}
			ds := slices.Clone(q.delayedHeap())
			slices.SortFunc(ds, func(a, b delayedEntry) int {
				if a.at != b.at {
					return int(a.at - b.at)
				}
				return int(a.e.JournalPos) - int(b.e.JournalPos)
			})
			for _, d := range ds {
				e := d.e
				qst.Delayed = append(qst.Delayed, ckMsg{Pos: e.JournalPos, Count: e.DeliveryCount, Exp: e.ExpiresAt, Level: e.level(), At: d.at, Size: e.size()})
			}
			qst.Unacked = len(q.acquiredMap())
			qst.Producers = map[uint64]uint64{}
			if q.rare != nil {
				for id, p := range q.rare.producers.m {
					qst.Producers[id] = p.seq
				}
			}
			st.Queues[name] = qst
		})
	}
	for _, sh := range b.shards {
		_ = b.Call(sh, func(s *Shard) {
			for pos := uint64(1); pos <= maxPos; pos++ {
				if s.journal.j.Contains(journal.Pos(pos)) {
					st.Live = append(st.Live, uint64(sh.idx)<<48|pos)
				}
			}
		})
	}
	return st
}

// ckLoaded reports whether every shard of b recovered from a checkpoint.
func ckUsed(b *Broker) (all, any bool) {
	all = true
	for _, sh := range b.shards {
		_ = b.Call(sh, func(s *Shard) {
			all = all && s.journal.ck.loaded
			any = any || s.journal.ck.loaded
		})
	}
	return all, any
}

// ckWorkload runs a seeded random mix of publishes (priorities, deliver-at
// times past and future, TTLs, producer ids, some transient), deliveries
// settled by accept, release (a new delivery count) and reject, purges,
// and the deletion and new declaration of a queue, taking checkpoints at
// random moments (always at least one, never at the end unless end is
// ckEndWrite; ckEndFail tries one at the end whose rename fails, so the
// older one stays and the tail grows), and stops the broker as a crash
// would: everything appended is in the files, and no checkpoint is
// written at the stop.
func ckWorkload(t *testing.T, dir string, seed uint64, ops int, end int) {
	ckWorkloadAsync(t, dir, seed, ops, end, false, true)
}

// ckWorkloadAsync is ckWorkload; with async its checkpoints in the run are
// started and left to the writer while the workload goes on (the next
// one waits for the last), so the shard appends, dequeues and recounts
// while the writer merges. Without drops it never deletes a queue.
func ckWorkloadAsync(t *testing.T, dir string, seed uint64, ops int, end int, async, drops bool) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	rng := rand.New(rand.NewPCG(seed, 7))
	ffs := journal.NewFaultFS(nil)
	b, qs := ckBroker(t, dir, ffs)
	now := time.Now().UnixNano()
	type consumer struct {
		sess *Session
		w    *captureWriter
		tags []uint64
	}
	cons := map[string]*consumer{}
	subscribe := func(name string) {
		w := &captureWriter{}
		c := &consumer{sess: &Session{ID: uint64(len(cons) + 100), Version: wire.Current, FrameMax: wire.FrameSizeDefault, Out: w}, w: w}
		q := qs[name]
		if err := b.shards[q.shard].Push(ctx, Subscribe{Sess: c.sess, CmdID: 1, Queue: q, ConsumerID: 1}.Command()); err != nil {
			t.Fatal(err)
		}
		cons[name] = c
	}
	for _, d := range ckQueues {
		subscribe(d.name)
	}
	checkpoint := func() {
		for _, sh := range b.shards {
			_ = b.Call(sh, func(s *Shard) { s.checkpointNow() })
		}
	}
	names := []string{"plain-a", "plain-b", "prio", "dropped"}
	cmdID := uint64(1000)
	tookCk := false
	for i := 0; i < ops; i++ {
		name := names[rng.IntN(len(names))]
		q := qs[name]
		sh := b.shards[q.shard]
		c := cons[name]
		switch r := rng.IntN(100); {
		case r < 55:
			body := NewBody(nil, []byte(name), nil, fmt.Appendf(nil, "m%d-%d", i, rng.IntN(1000)), rng.IntN(10) != 0)
			if name == "prio" {
				body.Priority = uint8(rng.IntN(6))
			}
			switch rng.IntN(20) {
			case 0, 1:
				body.DeliverAt = now - int64(rng.IntN(1000))*int64(time.Millisecond) // due already
			case 2:
				body.DeliverAt = now + int64(time.Hour) + int64(rng.IntN(1000))
			}
			cmd := Publish{Queue: q, Body: body, Now: now, Sess: c.sess}
			if rng.IntN(10) == 0 {
				cmd.TTLNanos = int64(time.Hour)
			}
			cmdID++
			cmd.CmdID = cmdID
			if rng.IntN(5) == 0 {
				cmd.Producer = uint64(1 + rng.IntN(3))
			}
			if err := sh.Push(ctx, cmd.Command()); err != nil {
				t.Fatal(err)
			}
		case r < 75:
			// Credit, then settle some of what came.
			if err := sh.Push(ctx, Credit{Sess: c.sess, ConsumerID: 1, Credit: uint32(1 + rng.IntN(4))}.Command()); err != nil {
				t.Fatal(err)
			}
			_ = b.Call(sh, func(*Shard) {})
			for _, m := range c.w.take(t) {
				c.tags = append(c.tags, m.Tag)
			}
			for len(c.tags) > 0 && rng.IntN(4) != 0 {
				k := rng.IntN(len(c.tags))
				tag := c.tags[k]
				c.tags = slices.Delete(c.tags, k, k+1)
				settle := Settle{Sess: c.sess, CmdID: 2, ConsumerID: 1, NRanges: 1, Last: true}
				settle.Kind = []uint8{SettleAccept, SettleAccept, SettleRelease, SettleRelease, SettleReject}[rng.IntN(5)]
				settle.Ranges[0] = wire.Range{First: tag, Last: tag}
				if err := sh.Push(ctx, settle.Command()); err != nil {
					t.Fatal(err)
				}
			}
		case r < 77:
			if _, err := b.Purge(q); err != nil {
				t.Fatal(err)
			}
		case r < 78 && name == "dropped" && drops:
			if _, err := b.DropQueue(q); err != nil {
				t.Fatal(err)
			}
			nq, err := b.AddQueue(name, *q.Options, nil, Placement{})
			if err != nil {
				t.Fatal(err)
			}
			qs[name] = nq
			subscribe(name)
		case r < 82 && i < ops*9/10:
			if async {
				for _, sh := range b.shards {
					_ = b.Call(sh, func(s *Shard) {
						s.waitCheckpoint()
						s.startCheckpoint()
					})
				}
			} else {
				checkpoint()
			}
			tookCk = true
		}
	}
	if !tookCk || end == ckEndWrite {
		checkpoint()
	}
	if end == ckEndFail {
		ffs.SetRule(func(op journal.Op, name string, _ int) error {
			if op == journal.OpRename && filepath.Base(name) == "checkpoint.tmp" {
				return journal.ErrInjected
			}
			return nil
		})
		for i := range 200 {
			if err := b.shards[qs["plain-a"].shard].Push(ctx, Publish{Queue: qs["plain-a"], Body: NewBody(nil, nil, nil, fmt.Appendf(nil, "late%d", i), true), Now: now}.Command()); err != nil {
				t.Fatal(err)
			}
		}
		checkpoint()
		for _, sh := range b.shards {
			_ = b.Call(sh, func(s *Shard) {
				if s.journal.ck.failed == 0 {
					t.Errorf("shard %d: the checkpoint whose rename failed counts no failure", s.idx)
				}
			})
		}
	}
	for _, sh := range b.shards {
		_ = b.Call(sh, func(s *Shard) {
			s.waitCheckpoint()
			s.journal.ck.noFinal = true
		})
	}
	b.Stop()
}

// How ckWorkload ends.
const (
	ckEndNone  = iota // the last checkpoint is somewhere in the run
	ckEndWrite        // a checkpoint right before the crash: no tail
	ckEndFail         // a last checkpoint whose rename fails
)

func copyDir(t *testing.T, src, dst string) {
	t.Helper()
	err := filepath.Walk(src, func(path string, fi os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(src, path)
		to := filepath.Join(dst, rel)
		if fi.IsDir() {
			return os.MkdirAll(to, 0o755)
		}
		data, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		return os.WriteFile(to, data, 0o644)
	})
	if err != nil {
		t.Fatal(err)
	}
}

// recoverState opens a broker on dir and returns its state; want says
// whether its shards must (ckMust) or must not (ckMustNot) have recovered
// from a checkpoint, or either (ckEither).
func recoverState(t *testing.T, dir string, want int) ckState {
	t.Helper()
	b, qs := ckBroker(t, dir, nil)
	defer b.Stop()
	all, any := ckUsed(b)
	if want == ckMust && !all {
		t.Fatalf("%s: a shard did not recover from its checkpoint", dir)
	}
	if want == ckMustNot && any {
		t.Fatalf("%s: a shard recovered from a checkpoint", dir)
	}
	return ckCollect(t, b, qs, 200_000)
}

const (
	ckMustNot = iota
	ckMust
	ckEither
)

// compareStates checks the checkpoint's recovery against the full
// replay's: the same messages in the same order with the same delivery
// counts, priorities, expiries and deliver-at times, the same live
// journal records, and producer tables that know at least what the
// replay knows (a compacted journal forgets producers of consumed
// messages; the checkpoint keeps the live table).
func compareStates(t *testing.T, what string, got, want ckState) {
	t.Helper()
	n, counted := 0, 0
	for _, w := range want.Queues {
		for _, l := range w.Ready {
			for _, m := range l {
				if m.Count > 0 {
					counted++
				}
			}
		}
	}
	t.Logf("%s: %d messages redelivered before the stop", what, counted)
	for name, w := range want.Queues {
		g := got.Queues[name]
		if !reflect.DeepEqual(g.Ready, w.Ready) || !reflect.DeepEqual(g.Delayed, w.Delayed) || g.Unacked != w.Unacked {
			t.Errorf("%s: queue %s differs:\n got ready %v delayed %v\nwant ready %v delayed %v", what, name, g.Ready, g.Delayed, w.Ready, w.Delayed)
		}
		for id, seq := range w.Producers {
			if g.Producers[id] < seq {
				t.Errorf("%s: queue %s knows producer %d up to %d, the replay up to %d", what, name, id, g.Producers[id], seq)
			}
		}
		for _, l := range w.Ready {
			n += len(l)
		}
		n += len(w.Delayed)
	}
	if !reflect.DeepEqual(got.Live, want.Live) {
		t.Errorf("%s: live journal records differ: %d against %d", what, len(got.Live), len(want.Live))
	}
	if n == 0 {
		t.Errorf("%s: nothing recovered; the workload proves nothing", what)
	}
}

// TestCheckpointMatchesReplay runs seeded random workloads, stops as a
// crash would (after a checkpoint in the middle, so recovery reads the
// checkpoint and the journal's tail), and checks that recovery from the
// checkpoint gives exactly the state a full replay of the same files
// gives. A checkpoint cut short, or corrupt, must be ignored for a full
// replay; a leftover temporary file must not matter; a checkpoint write
// whose rename failed leaves the older checkpoint, used with a longer
// tail; a journal segment cut short after the checkpoint (a disk that
// lost a file's tail) gives what a full replay of the same files gives.
func TestCheckpointMatchesReplay(t *testing.T) {
	for _, seed := range []uint64{1, 2, 3, 4} {
		t.Run(fmt.Sprint("seed", seed), func(t *testing.T) {
			src := t.TempDir()
			end := map[uint64]int{3: ckEndFail, 4: ckEndWrite}[seed]
			ckWorkload(t, src, seed, 3000, end)
			dirs := map[string]string{}
			for _, k := range []string{"ck", "full", "torn", "corrupt", "cut-ck", "cut-full"} {
				dirs[k] = filepath.Join(t.TempDir(), k)
				copyDir(t, src, dirs[k])
			}
			shardDirs, _ := filepath.Glob(filepath.Join(dirs["full"], "shard-*"))
			if len(shardDirs) != 2 {
				t.Fatalf("shard directories: %v", shardDirs)
			}
			for _, sd := range []string{"shard-000", "shard-001"} {
				for _, k := range []string{"full", "cut-full"} {
					if err := os.Remove(filepath.Join(dirs[k], sd, "checkpoint")); err != nil {
						t.Fatal(err)
					}
				}
				for _, k := range []string{"cut-ck", "cut-full"} {
					// The segment appended to last, the one a crash may
					// leave short: the highest first position in its
					// header (a compaction output's is 0, and it is
					// fsynced before it is renamed into place).
					segs, _ := filepath.Glob(filepath.Join(dirs[k], sd, "*.seg"))
					var last string
					var lastBase uint64
					for _, seg := range segs {
						data, err := os.ReadFile(seg)
						if err != nil || len(data) < 16 {
							t.Fatalf("segment %s: %v", seg, err)
						}
						if base := binary.LittleEndian.Uint64(data[8:16]); base >= lastBase {
							last, lastBase = seg, base
						}
					}
					fi, err := os.Stat(last)
					if err != nil {
						t.Fatal(err)
					}
					if err := os.Truncate(last, fi.Size()*2/3); err != nil {
						t.Fatal(err)
					}
				}
				ckFile := filepath.Join(dirs["torn"], sd, "checkpoint")
				data, err := os.ReadFile(ckFile)
				if err != nil {
					t.Fatal(err)
				}
				// A torn write: only a prefix made it (a rename never
				// publishes one, but a disk may lose the tail of a file).
				if err := os.WriteFile(ckFile, data[:len(data)*2/3], 0o644); err != nil {
					t.Fatal(err)
				}
				data[len(data)/2] ^= 0x40
				if err := os.WriteFile(filepath.Join(dirs["corrupt"], sd, "checkpoint"), data, 0o644); err != nil {
					t.Fatal(err)
				}
				// An interrupted write of a newer checkpoint.
				if err := os.WriteFile(filepath.Join(dirs["ck"], sd, "checkpoint.tmp"), data[:len(data)/3], 0o644); err != nil {
					t.Fatal(err)
				}
			}
			full := recoverState(t, dirs["full"], ckMustNot)
			compareStates(t, "checkpoint and tail", recoverState(t, dirs["ck"], ckMust), full)
			compareStates(t, "torn checkpoint", recoverState(t, dirs["torn"], ckMustNot), full)
			compareStates(t, "corrupt checkpoint", recoverState(t, dirs["corrupt"], ckMustNot), full)
			compareStates(t, "segment cut short", recoverState(t, dirs["cut-ck"], ckEither), recoverState(t, dirs["cut-full"], ckMustNot))
		})
	}
}

// TestCheckpointWhileShardWorks takes checkpoints that the writer merges
// while the shard goes on publishing, settling (new delivery counts,
// dequeues, dead letters), purging and deleting a queue; then starts
// again from the checkpoint (so the next ones merge into the loaded one
// and the tail's changes to it), or with seed 12 from a full replay, and
// does it again, and stops as a crash would. Recovery from the last checkpoint must give exactly what a full
// replay of the same files gives.
func TestCheckpointWhileShardWorks(t *testing.T) {
	for _, seed := range []uint64{11, 12} {
		t.Run(fmt.Sprint("seed", seed), func(t *testing.T) {
			src := t.TempDir()
			ckWorkloadAsync(t, src, seed, 1500, ckEndNone, true, true)
			if seed == 12 {
				// The second run replays everything: its checkpoints
				// start from what the replay restored.
				for _, sd := range []string{"shard-000", "shard-001"} {
					if err := os.Remove(filepath.Join(src, sd, "checkpoint")); err != nil {
						t.Fatal(err)
					}
				}
			}
			// No queue is deleted in this run: the producers of a
			// deleted queue's records that compaction has not removed yet
			// count for the queue declared again under its name in a
			// replay, but not in the checkpoint, which has the live
			// table (as before this test; compareStates allows a
			// checkpoint to know more, not less).
			ckWorkloadAsync(t, src, seed+100, 200, ckEndNone, true, false)
			dirs := map[string]string{}
			for _, k := range []string{"ck", "full"} {
				dirs[k] = filepath.Join(t.TempDir(), k)
				copyDir(t, src, dirs[k])
			}
			for _, sd := range []string{"shard-000", "shard-001"} {
				if err := os.Remove(filepath.Join(dirs["full"], sd, "checkpoint")); err != nil {
					t.Fatal(err)
				}
			}
			full := recoverState(t, dirs["full"], ckMustNot)
			compareStates(t, "checkpoint merged while the shard worked", recoverState(t, dirs["ck"], ckMust), full)
		})
	}
}

// BenchmarkCheckpointCapture measures a checkpoint of a shard with
// 1,000,000 journaled messages of 128 bytes over 100 durable queues (a
// journal of the default 2 MiB segments): one op is 1,000 more publishes
// then a checkpoint taken and written. capture-µs is how long the
// capture held the shard, encode-ms how long the writer then took to
// merge and encode it off the shard.
//
//	go test ./shards -run '^$' -bench CheckpointCapture -benchtime 5x
func BenchmarkCheckpointCapture(b *testing.B) {
	const n, queues = 1_000_000, 100
	br, qs := ckBenchBroker(b, n, queues)
	defer br.Stop()
	sh := br.shards[0]
	ctx := context.Background()
	payload := make([]byte, 128)
	// The first checkpoint of a run without one walks the queues.
	_ = br.Call(sh, func(s *Shard) { s.checkpointNow() })
	b.ResetTimer()
	var capture, encode time.Duration
	var bytes int
	for i := 0; i < b.N; i++ {
		for k := 0; k < 1000; k++ {
			if err := sh.Push(ctx, Publish{Queue: qs[k%queues], Body: NewBody(nil, nil, nil, payload, true), Now: time.Now().UnixNano()}.Command()); err != nil {
				b.Fatal(err)
			}
		}
		_ = br.Call(sh, func(s *Shard) {
			s.checkpointNow()
			capture += s.journal.ck.lastCapture
			encode += s.journal.ck.lastEncode
			bytes = s.journal.ck.lastBytes
		})
	}
	b.StopTimer()
	b.ReportMetric(float64(capture.Microseconds())/float64(b.N), "capture-µs")
	b.ReportMetric(float64(encode.Milliseconds())/float64(b.N), "encode-ms")
	b.ReportMetric(float64(bytes)/n, "bytes/msg")
}

// ckBenchBroker is a one-shard broker with n durable messages of 128
// bytes over the given number of queues.
func ckBenchBroker(b *testing.B, n, queues int) (*Broker, []*Queue) {
	cfg := Config{Shards: 1, TickInterval: time.Hour, Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
		Journal: &JournalConfig{Dir: b.TempDir(), Fsync: journal.FsyncNever}}
	br := New(cfg)
	if err := br.Start(); err != nil {
		b.Fatal(err)
	}
	var qs []*Queue
	for i := 0; i < queues; i++ {
		q, err := br.AddQueue(fmt.Sprintf("q%03d", i), QueueOptions{Durable: true}, nil, Placement{})
		if err != nil {
			b.Fatal(err)
		}
		qs = append(qs, q)
	}
	if err := br.Recover(); err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	payload := make([]byte, 128)
	sh := br.shards[0]
	for i := 0; i < n; i++ {
		if err := sh.Push(ctx, Publish{Queue: qs[i%queues], Body: NewBody(nil, nil, nil, payload, true), Now: time.Now().UnixNano()}.Command()); err != nil {
			b.Fatal(err)
		}
	}
	_ = br.Call(sh, func(s *Shard) { _ = s.journal.j.Sync() })
	return br, qs
}

// TestCheckpointGarbage gives recovery checkpoints with random bytes
// changed and their CRC made right again, so that only the parsing
// stands between them and the index: every start must succeed (a bad
// checkpoint is dropped for a full replay, or taken if it still parses)
// and nothing may panic.
func TestCheckpointGarbage(t *testing.T) {
	dir := t.TempDir()
	ckWorkload(t, dir, 9, 800, ckEndWrite)
	var orig [2][]byte
	for i := range orig {
		data, err := os.ReadFile(filepath.Join(dir, fmt.Sprintf("shard-%03d", i), "checkpoint"))
		if err != nil {
			t.Fatal(err)
		}
		orig[i] = data
	}
	rng := rand.New(rand.NewPCG(9, 9))
	crc := crc32.MakeTable(crc32.Castagnoli)
	for round := 0; round < 150; round++ {
		for i, data := range orig {
			data = slices.Clone(data)
			body := data[:len(data)-4]
			for k := 1 + rng.IntN(4); k > 0; k-- {
				at := 28 + rng.IntN(len(body)-28) // past the fixed header
				body[at] = byte(rng.IntN(256))
				if rng.IntN(2) == 0 {
					body[at] = 0 // a zero delta, size or length is the likeliest trap
				}
			}
			binary.LittleEndian.PutUint32(data[len(data)-4:], crc32.Checksum(body, crc))
			if err := os.WriteFile(filepath.Join(dir, fmt.Sprintf("shard-%03d", i), "checkpoint"), data, 0o644); err != nil {
				t.Fatal(err)
			}
		}
		b, _ := ckBroker(t, dir, nil)
		for _, sh := range b.shards {
			_ = b.Call(sh, func(s *Shard) { s.journal.ck.noFinal = true })
		}
		b.Stop()
	}
}

// BenchmarkCheckpointStall measures how long a checkpoint holds a shard
// with 1M or 5M journaled messages of 128 bytes over 100 queues: a probe
// goroutine sends the shard empty calls one after another and records
// each round trip while the shard takes a checkpoint (the second of the
// run: the first of a run that loaded none walks the queues in any
// case) and the writer merges, encodes and writes it. max-stall-ms is
// the longest round trip during the checkpoint, idle-max-ms the longest
// in as long a time without one, capture-ms how long the capture itself
// held the shard.
//
//	go test ./shards -run '^$' -bench CheckpointStall -benchtime 1x
func BenchmarkCheckpointStall(b *testing.B) {
	for _, n := range []int{1_000_000, 5_000_000} {
		b.Run(fmt.Sprintf("%dM", n/1_000_000), func(b *testing.B) {
			br, qs := ckBenchBroker(b, n, 100)
			defer br.Stop()
			sh := br.shards[0]
			ctx := context.Background()
			payload := make([]byte, 128)
			force := func(s *Shard) {
				s.journal.ck.every = 1
				s.journal.ck.appends = 1 << 40
				s.maybeCheckpoint()
			}
			_ = br.Call(sh, force)
			_ = br.Call(sh, func(s *Shard) { s.waitCheckpoint() })
			// probe records the longest round trip until stop closes.
			probe := func(stop chan struct{}) (time.Duration, int) {
				var worst time.Duration
				calls := 0
				for {
					select {
					case <-stop:
						return worst, calls
					default:
					}
					t0 := time.Now()
					_ = br.Call(sh, func(*Shard) {})
					worst = max(worst, time.Since(t0))
					calls++
				}
			}
			b.ResetTimer()
			var stall, idle, capture time.Duration
			for i := 0; i < b.N; i++ {
				for k := 0; k < 10_000; k++ {
					if err := sh.Push(ctx, Publish{Queue: qs[k%len(qs)], Body: NewBody(nil, nil, nil, payload, true), Now: time.Now().UnixNano()}.Command()); err != nil {
						b.Fatal(err)
					}
				}
				_ = br.Call(sh, func(s *Shard) { _ = s.journal.j.Sync() })
				// The fill's garbage is collected first: a collection of a
				// growing heap of GiBs stalls everything on its own.
				runtime.GC()
				stop := make(chan struct{})
				res := make(chan time.Duration)
				go func() {
					w, _ := probe(stop)
					res <- w
				}()
				t0 := time.Now()
				_ = br.Call(sh, force)
				for written := false; !written; {
					_ = br.Call(sh, func(s *Shard) {
						if s.journal.ck.inFlight {
							select {
							case d := <-s.journal.ck.done:
								s.checkpointDone(d)
								written = true
							default:
							}
						} else {
							written = true
						}
					})
					time.Sleep(time.Millisecond)
				}
				took := time.Since(t0)
				close(stop)
				_ = br.Call(sh, func(s *Shard) { capture = max(capture, s.journal.ck.lastCapture) })
				stall = max(stall, <-res)
				// As long again with no checkpoint, for comparison.
				stop = make(chan struct{})
				go func() {
					w, _ := probe(stop)
					res <- w
				}()
				time.Sleep(took)
				close(stop)
				idle = max(idle, <-res)
			}
			b.StopTimer()
			b.ReportMetric(float64(stall.Microseconds())/1000, "max-stall-ms")
			b.ReportMetric(float64(idle.Microseconds())/1000, "idle-max-ms")
			b.ReportMetric(float64(capture.Microseconds())/1000, "capture-ms")
		})
	}
}

// BenchmarkCheckpointLog measures what the checkpoint logs add to each
// journal record on the shard: one op is an enqueue logged for one of 100
// queues and a dequeue of an older message, with the logs handed over
// and taken back (as a checkpoint does) every 262,144 ops. It allocates
// nothing once the logs have grown.
//
//	go test ./shards -run '^$' -bench CheckpointLog -benchmem
func BenchmarkCheckpointLog(b *testing.B) {
	s := &Shard{journal: &shardJournal{}}
	s.journal.ck.logOn = true
	var qs []*Queue
	for i := 0; i < 100; i++ {
		qs = append(qs, NewQueue(fmt.Sprintf("q%03d", i), QueueOptions{Durable: true}, 0, &s.pool))
	}
	e := &Entry{Body: NewBody(nil, nil, nil, make([]byte, 128), true), ExpiresAt: 0}
	cycle := func() {
		c := &s.journal.ck
		for q, l := range c.logs {
			l.clear()
			c.spareLogs = append(c.spareLogs, l)
			delete(c.logs, q)
		}
		c.lastQ, c.lastLog = nil, nil
	}
	for i := 0; i < 1<<18; i++ {
		q := qs[i%len(qs)]
		s.logEnqueue(q, journal.Pos(i+1), e)
		s.logDequeue(q, journal.Pos(i+1))
	}
	cycle()
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if i%(1<<18) == 0 {
			cycle()
		}
		q := qs[i%len(qs)]
		s.logEnqueue(q, journal.Pos(i+1), e)
		s.logDequeue(q, journal.Pos(i+1))
	}
}

// TestCheckpointLogsDroppedOnJournalError: once the journal has failed no
// checkpoint is taken again in the run, so the shard must stop logging
// what its records change (the logs would grow for good). Fails if the
// logs are kept.
func TestCheckpointLogsDroppedOnJournalError(t *testing.T) {
	ffs := journal.NewFaultFS(nil)
	b, qs := ckBroker(t, t.TempDir(), ffs)
	defer b.Stop()
	q := qs["plain-a"]
	sh := b.shards[q.shard]
	ctx := context.Background()
	publish := func(n int) {
		for i := 0; i < n; i++ {
			if err := sh.Push(ctx, Publish{Queue: q, Body: NewBody(nil, nil, nil, []byte("x"), true), Now: time.Now().UnixNano()}.Command()); err != nil {
				t.Fatal(err)
			}
		}
		_ = b.Call(sh, func(s *Shard) { _ = s.journal.j.Sync() })
	}
	publish(10)
	ffs.SetRule(func(op journal.Op, _ string, _ int) error {
		if op == journal.OpWrite {
			return journal.ErrInjected
		}
		return nil
	})
	publish(10)
	logged := func() (n int) {
		_ = b.Call(sh, func(s *Shard) {
			s.maybeCheckpoint()
			for _, l := range s.journal.ck.logs {
				n += l.nAdds + len(l.addsX)
			}
		})
		return n
	}
	if err := b.Call(sh, func(s *Shard) {
		if s.journal.j.Stats().Err == nil {
			t.Fatal("the injected write failure did not fail the journal")
		}
	}); err != nil {
		t.Fatal(err)
	}
	_ = logged()
	publish(100)
	if n := logged(); n != 0 {
		t.Errorf("%d enqueues logged after the journal failed", n)
	}
}
