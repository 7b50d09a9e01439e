package shards

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"math/rand"
	"testing"
	"time"

	"github.com/berthmq/berth/journal"
	"github.com/berthmq/berth/wire"
)

// walkTotals sums what Metrics reports over every queue of the shard, as
// Metrics did before the running totals. Run it on the shard goroutine.
func walkTotals(s *Shard) QueueTotals {
	var t QueueTotals
	for q := range s.queues.all() {
		t.Ready += q.Ready()
		t.Unacked += q.Unacked()
		t.Delayed += q.Delayed()
		t.Consumers += len(q.consumers)
		t.Bytes += q.totalBytes
	}
	return t
}

// durableReplicator is the replicator of the test's replicated queue
// (placed by the test: every durable queue in group 1).
type durableReplicator struct{ *journalReplicator }

// dlxRouter routes every dead letter to one queue.
type dlxRouter struct{ q *Queue }

func (r *dlxRouter) Route(_, _ []byte, dst []*Queue) ([]*Queue, error) { return append(dst, r.q), nil }

// TestQueueTotalsMatchWalk drives a running shard through random
// operations on queues of several kinds (plain, drop-head and
// reject-publish bounds, max deliveries with dead letters to another
// queue, priorities with a queue TTL, a replicated queue) under a memory
// budget small enough to page bodies out: publishes with TTLs, priorities
// and deliver-at times, subscribes, cancels, credit, accepts, releases,
// rejects, ticks that expire and promote, purges, deletes and re-adds,
// session closes, replicated enqueues and removes, and a group reset.
// After every operation the shard's running totals (what Metrics
// reports) must equal a walk over its queues. Leaving out any one of the
// counting points makes it fail.
func TestQueueTotalsMatchWalk(t *testing.T) {
	seed := time.Now().UnixNano()
	rng := rand.New(rand.NewSource(seed))
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	b := New(Config{Shards: 1, TickInterval: time.Hour, MemoryLimit: 64 << 10, PagingDir: t.TempDir(), Logger: log})
	j, err := journal.Open(journal.Options{Dir: t.TempDir(), Fsync: journal.FsyncNever, Logger: log}, func(journal.Pos, journal.Pos, []byte) error { return nil })
	if err != nil {
		t.Fatal(err)
	}
	defer j.Close()
	repl := &journalReplicator{j: j, sh: b.shards[0]}
	b.SetReplicator(durableReplicator{repl})
	router := &dlxRouter{}
	b.SetHooks(Hooks{Router: router, AutoDeleted: func(*Queue) {}})
	if err := b.Start(); err != nil {
		t.Fatal(err)
	}
	defer b.Stop()
	if err := b.Recover(); err != nil {
		t.Fatal(err)
	}
	sh := b.shards[0]
	kinds := map[string]QueueOptions{
		"plain":  {},
		"drop":   {MaxLength: 4, Overflow: wire.OverflowDropHead},
		"reject": {MaxLength: 4},
		"maxdel": {MaxDeliveries: 2, DeadLetterExchange: "dlx"},
		"prio":   {MaxPriority: 3, MessageTTLMs: 30},
		"dlq":    {},
		"rq":     {Durable: true}, // replicated: every durable queue is placed in group 1
		"deep":   {},              // takes bursts, so that its bodies page out
	}
	names := []string{"plain", "drop", "reject", "maxdel", "prio", "dlq", "rq", "deep"}
	queues := map[string]*Queue{}
	add := func(name string) {
		q, err := b.AddQueue(name, kinds[name], nil, Placement{Group: 1, Replicated: kinds[name].Durable})
		if err != nil {
			t.Fatal(err)
		}
		queues[name] = q
		if name == "dlq" {
			router.q = q // read by the shard: set between operations, each waited for
		}
	}
	for _, name := range names {
		add(name)
	}
	if _, ok := queues["rq"].Replicated(); !ok {
		t.Fatal("rq is not replicated")
	}
	var sessions []*Session
	for i := range 3 {
		sessions = append(sessions, &Session{ID: uint64(i + 1), Version: wire.Current, FrameMax: wire.FrameSizeDefault, Out: &discardWriter{}})
	}
	now := time.Now().UnixNano()
	cmdID := uint64(0)
	replSeq := uint64(0)
	push := func(c Command) {
		t.Helper()
		if err := sh.Push(ctx, c); err != nil {
			t.Fatal(err)
		}
	}
	nextID := func() uint64 { cmdID++; return cmdID }
	call := func(f func(s *Shard)) {
		t.Helper()
		if err := b.Call(sh, f); err != nil {
			t.Fatal(err)
		}
	}
	payload := make([]byte, 2048)
	seen := map[string]int{}
	steps := 3000
	if testing.Short() {
		steps = 800
	}
	for step := range steps {
		now += int64(rng.Intn(15)) * int64(time.Millisecond)
		name := names[rng.Intn(len(names))]
		q := queues[name]
		sess := sessions[rng.Intn(len(sessions))]
		var op string
		switch r := rng.Intn(100); {
		case r < 35:
			op = "publish"
			if name == "rq" {
				op = "replicated enqueue"
				replSeq++
				body := NewBody(nil, []byte("rq"), nil, payload[:rng.Intn(len(payload))], true)
				if rng.Intn(4) == 0 {
					body.DeliverAt = now + int64(rng.Intn(400))*int64(time.Millisecond)
				}
				var logPos uint64
				if rng.Intn(2) == 0 {
					logPos = repl.event(body) // pageable: its body is in the group log
				}
				call(func(s *Shard) { s.ApplyEnqueue(q, replSeq, body, 0, 0, 0, logPos) })
				break
			}
			body := NewBody(nil, []byte(name), nil, payload[:rng.Intn(len(payload))], false)
			body.Priority = uint8(rng.Intn(5))
			if rng.Intn(4) == 0 {
				body.DeliverAt = now + int64(rng.Intn(40))*int64(time.Millisecond)
			} else if name == "drop" && rng.Intn(4) != 0 {
				// In a full drop-head queue with nothing ready, a publish
				// drops a delayed one.
				body.DeliverAt = now + int64(rng.Intn(400))*int64(time.Millisecond)
			}
			c := Publish{Sess: sess, Queue: q, Body: body}
			if rng.Intn(4) == 0 {
				c.TTLNanos = int64(rng.Intn(40)) * int64(time.Millisecond)
			}
			c.CmdID, c.Now = nextID(), now
			push(c.Command())
			for range 40 * boolInt(name == "deep") {
				push(Publish{Sess: sess, CmdID: nextID(), Queue: q, Body: NewBody(nil, []byte(name), nil, payload, false), Now: now}.Command())
			}
		case r < 45:
			op = "subscribe"
			if name == "deep" && rng.Intn(8) != 0 {
				q = queues["plain"] // deep is consumed rarely, so that it grows and pages
			}
			mode := wire.AckExplicit
			if rng.Intn(4) == 0 {
				mode = wire.AckNone
			}
			push(Subscribe{Sess: sess, CmdID: nextID(), Queue: q, ConsumerID: uint32(rng.Intn(4)), Credit: uint32(1 + rng.Intn(6)), AckMode: mode}.Command())
		case r < 50:
			op = "cancel"
			push(Cancel{Sess: sess, CmdID: nextID(), ConsumerID: uint32(rng.Intn(4))}.Command())
		case r < 58:
			op = "credit"
			push(Credit{Sess: sess, ConsumerID: uint32(rng.Intn(4)), Credit: uint32(1 + rng.Intn(6))}.Command())
		case r < 80:
			kind := []uint8{SettleAccept, SettleRelease, SettleReject}[rng.Intn(3)]
			op = fmt.Sprint("settle ", kind)
			var tags []uint64
			var conID uint32
			call(func(s *Shard) {
				for key, con := range s.consumers {
					if len(con.unacked) > 0 {
						sess = key.sess
						conID = key.id
						for tag := range con.unacked {
							tags = append(tags, tag)
						}
						break
					}
				}
			})
			if len(tags) == 0 {
				continue
			}
			tag := tags[rng.Intn(len(tags))]
			c := Settle{Kind: kind, Sess: sess, ConsumerID: conID, NRanges: 1, Last: true}
			c.Ranges[0] = wire.Range{First: tag, Last: tag}
			c.CmdID = nextID()
			push(c.Command())
		case r < 88:
			op = "tick"
			now += int64(rng.Intn(30)) * int64(time.Millisecond)
			push(tickCommand(now))
		case r < 91:
			op = "purge"
			if _, err := b.Purge(q); err != nil {
				t.Fatal(err)
			}
		case r < 93:
			op = "delete"
			if _, err := b.DropQueue(q); err != nil {
				t.Fatal(err)
			}
			add(name)
		case r < 95:
			op = "session closed"
			b.SessionClosed(sess)
			i := slicesIndex(sessions, sess)
			sessions[i] = &Session{ID: sess.ID + 100, Version: wire.Current, FrameMax: wire.FrameSizeDefault, Out: &discardWriter{}}
		case r < 97:
			op = "replicated remove"
			rq := queues["rq"]
			var seq uint64
			call(func(s *Shard) {
				if h := rq.delayedHeap(); len(h) > 0 && rng.Intn(2) == 0 {
					seq = h[rng.Intn(len(h))].e.Seq
				} else if e := rq.Head(); e != nil && rng.Intn(2) == 0 {
					seq = e.Seq
				} else {
					for s := range rq.acquiredMap() {
						seq = s
						break
					}
				}
			})
			if seq == 0 {
				continue
			}
			call(func(s *Shard) { s.ApplyRemove(rq, seq) })
		case r < 99:
			// More delayed messages than the drop-head queue's bound: once
			// nothing ready is left to drop, a delayed one goes.
			op = "delayed burst"
			for range 6 {
				body := NewBody(nil, []byte("drop"), nil, payload[:16], false)
				body.DeliverAt = now + int64(time.Second)
				push(Publish{Sess: sess, CmdID: nextID(), Queue: queues["drop"], Body: body, Now: now}.Command())
			}
		default:
			op = "group reset"
			b.ResetGroup(1)
			b.GroupMastered(1)
		}
		seen[op]++
		var got, want QueueTotals
		var paged int64
		call(func(s *Shard) { got, want, paged = s.pool.totals, walkTotals(s), s.mem.paged })
		if got != want {
			t.Fatalf("seed %d step %d after %s on %s: running totals %+v, a walk over the queues gives %+v", seed, step, op, name, got, want)
		}
		if paged > 0 {
			seen["paged"]++
		}
	}
	// The run means little unless it went through every path.
	for _, op := range []string{"publish", "replicated enqueue", "subscribe", "cancel", "credit", "settle 1", "settle 2", "settle 3", "tick", "purge", "delete", "session closed", "replicated remove", "delayed burst", "group reset", "paged"} {
		if seen[op] == 0 {
			t.Fatalf("seed %d: no %q in %d steps: %v", seed, op, steps, seen)
		}
	}
	var c QueueCounters
	for _, q := range queues {
		call(func(*Shard) {
			x := q.Counters()
			c.Delivered += x.Delivered
			c.Expired += x.Expired
			c.DeadLettered += x.DeadLettered
			c.Acked += x.Acked
		})
	}
	if c.Delivered == 0 || c.Expired == 0 || c.DeadLettered == 0 || c.Acked == 0 {
		t.Fatalf("seed %d: counters of the live queues %+v: some path never ran", seed, c)
	}
	t.Logf("seed %d: %v; live queues counted %+v", seed, seen, c)
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}

func slicesIndex(ss []*Session, s *Session) int {
	for i, x := range ss {
		if x == s {
			return i
		}
	}
	return -1
}
