package shards

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"time"

	"github.com/berthmq/berth/journal"
)

// shardMeters are a shard's counters beyond ShardStats. Only ringFull is
// written off the shard goroutine: by producers that found the ring full,
// and each shard has its own. The rest belong to the shard goroutine and
// are read on it, by the metrics snapshot.
type shardMeters struct {
	ringFull  atomic.Uint64 // TryPush found the ring full
	recovery  time.Duration // journal replay and rebuild at start
	recovered uint64        // messages the replay brought back
}

// QueueMetrics are one queue's numbers at a snapshot.
type QueueMetrics struct {
	Name      string
	Ready     int // ready to deliver
	Unacked   int // delivered (acquired) and not yet settled
	Delayed   int // waiting for their deliver-at time
	Consumers int
	// Bytes is the payload and properties of every message the queue
	// holds, ready or acquired.
	Bytes uint64
	// Published counts the messages that entered the queue since start:
	// publishes, and dead letters routed to it. Messages recovered from
	// the journal at start are not counted.
	Published uint64
	// Delivered counts deliveries, redeliveries included.
	Delivered uint64
	// Accepted counts messages dequeued as accepted: by ACCEPT, or at
	// delivery to a consumer in ack mode none.
	Accepted     uint64
	DeadLettered uint64 // dead-lettered or discarded: rejected, expired, over a limit
	Expired      uint64
	// Replicated queues: the group, and the owner broker (own.go; 0 for
	// the group's master, whoever it is).
	Replicated bool
	Group      uint32
	Owner      uint32
}

// ShardMetrics are one shard's numbers, all taken at one instant on the
// shard's goroutine.
type ShardMetrics struct {
	Shard int
	Stats ShardStats
	// RingFull counts the times a non-blocking push (an event loop, a
	// ticker, another shard) found this shard's ring full.
	RingFull uint64
	// Journaled is false when the broker keeps nothing on disk; Journal,
	// Recovery and RecoveredMessages are then zero.
	Journaled         bool
	Journal           journal.Stats
	Recovery          time.Duration // journal recovery at start
	RecoveredMessages uint64
	Memory            MemoryMetrics
	// Queues holds the queues the selection asked for (QueueSelect),
	// QueueCount all of them, and Totals their sums, kept as the queues
	// change (entryPool.totals) rather than summed at each snapshot.
	Queues     []QueueMetrics
	QueueCount int
	Totals     QueueTotals
}

// QueueTotals are numbers summed over a shard's queues.
type QueueTotals struct {
	Ready, Unacked, Delayed, Consumers int
	Bytes                              uint64
}

// QueueSelect says which queues a metrics snapshot lists one by one.
type QueueSelect struct {
	// Max bounds the queues each shard lists: negative for all of them,
	// 0 for none. A shard holding more matching queues lists Max+1 of
	// them, so that the caller can tell the bound was passed; without a
	// Prefix, a shard holding more than Max queues lists none (its
	// QueueCount tells), so that such a snapshot visits no queue.
	Max int
	// Prefix lists only the queues whose name starts with it.
	Prefix string
}

// MemoryMetrics are a shard's memory budget numbers (memory.go).
type MemoryMetrics struct {
	LimitBytes    int64 // the shard's share; 0: no budget
	UsedBytes     int64 // what the shard counts against it
	PagedMessages int64 // messages whose body is on disk
	Throttled     bool  // publishers to the shard are held back
	Throttles     uint64
	PageOuts      uint64 // bodies paged out
	PageIns       uint64 // bodies read back
	PageErrors    uint64 // failed page-outs and read-backs
}

// ErrNotRunning is returned by Metrics before Start has recovered every
// shard, and after Stop.
var ErrNotRunning = errors.New("shards: broker not running")

// Metrics asks every shard for its numbers, once each and all at the same
// time. Each shard answers on its own goroutine from its plain counters,
// so the hot path needs neither locks nor atomics for them. It fails with
// ErrNotRunning before Start has recovered every shard (a shard busy
// replaying its journal would hold the caller up) and after Stop.
func (b *Broker) Metrics(ctx context.Context) ([]ShardMetrics, error) {
	return b.MetricsSelect(ctx, QueueSelect{Max: -1})
}

// MetricsSelect is Metrics listing only the queues sel asks for; the
// counts and totals still cover every queue. With a million queues a
// snapshot of each is tens of megabytes per scrape.
func (b *Broker) MetricsSelect(ctx context.Context, sel QueueSelect) ([]ShardMetrics, error) {
	if !b.Recovered() {
		return nil, ErrNotRunning
	}
	answers := make([]chan ShardMetrics, len(b.shards))
	for i, s := range b.shards {
		ch := make(chan ShardMetrics, 1) // a late answer is dropped, not blocked on
		answers[i] = ch
		if err := s.Push(ctx, CallCommand(func(sh *Shard) { ch <- sh.metrics(sel) })); err != nil {
			return nil, err
		}
	}
	out := make([]ShardMetrics, len(b.shards))
	for i, ch := range answers {
		select {
		case out[i] = <-ch:
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-b.ctx.Done():
			return nil, ErrNotRunning
		}
	}
	return out, nil
}

// metrics runs on the shard goroutine.
func (s *Shard) metrics(sel QueueSelect) ShardMetrics {
	m := ShardMetrics{Shard: s.idx, Stats: s.stats, RingFull: s.meters.ringFull.Load(),
		Recovery: s.meters.recovery, RecoveredMessages: s.meters.recovered}
	mem := &s.mem
	m.Memory = MemoryMetrics{LimitBytes: mem.limit, UsedBytes: mem.used, PagedMessages: mem.paged, Throttled: mem.throttling,
		Throttles: mem.throttles, PageOuts: mem.pageOuts, PageIns: mem.pageIns, PageErrors: mem.pageErrors}
	if s.journal != nil {
		m.Journaled = true
		m.Journal = s.journal.j.Stats()
	}
	m.QueueCount = s.queues.len()
	m.Totals = s.pool.totals // kept where the queues change: no walk
	listed := s.queues.len()
	if sel.Max >= 0 {
		listed = min(listed, sel.Max+1)
		if sel.Prefix == "" && s.queues.len() > sel.Max {
			listed = 0 // QueueCount tells the caller the bound was passed
		}
	}
	if listed == 0 {
		return m
	}
	m.Queues = make([]QueueMetrics, 0, listed)
	for q := range s.queues.all() {
		if !strings.HasPrefix(q.Name, sel.Prefix) {
			continue
		}
		c := q.Counters()
		m.Queues = append(m.Queues, QueueMetrics{
			Name: q.Name, Ready: q.Ready(), Unacked: q.Unacked(), Delayed: q.Delayed(), Consumers: len(q.consumers), Bytes: q.totalBytes,
			Published: c.Enqueued - c.Recovered, Delivered: c.Delivered, Accepted: c.Acked,
			DeadLettered: c.DeadLettered, Expired: c.Expired,
			Replicated: q.replicated, Group: q.group,
		})
		if rs := q.rare; rs != nil && q.replicated {
			m.Queues[len(m.Queues)-1].Owner = rs.ownedBy
		}
		if len(m.Queues) == listed {
			break
		}
	}
	return m
}
