package shards

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"log/slog"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/berthmq/berth/journal"
	"github.com/berthmq/berth/wire"
)

// Fanout tracks one published message routed to several queues: the
// publish completes when every queue has taken it.
type Fanout struct {
	remaining atomic.Int32
	failure   atomic.Pointer[Error]
	// held is a dead letter's source message, which its queue removes
	// once every target holds it (Shard.DeadLetter); held.queue is nil
	// for any other publish.
	held deadLettered
}

var fanoutPool = sync.Pool{New: func() any { return new(Fanout) }}

// NewFanout returns a tracker for n targets.
func NewFanout(n int) *Fanout {
	f := fanoutPool.Get().(*Fanout)
	f.remaining.Store(int32(n))
	f.failure.Store(nil)
	f.held = deadLettered{}
	return f
}

// done records one target's result and reports whether it was the last.
func (f *Fanout) done(err error) bool {
	if err != nil {
		e, ok := err.(*Error)
		if !ok {
			e = &Error{Code: CodeOf(err), Text: err.Error()}
		}
		f.failure.CompareAndSwap(nil, e)
	}
	return f.remaining.Add(-1) == 0
}

func (f *Fanout) err() error {
	if e := f.failure.Load(); e != nil {
		return e
	}
	return nil
}

func (f *Fanout) release() { fanoutPool.Put(f) }

// Config configures a Broker.
type Config struct {
	Shards    int
	RingSize  int    // per shard; default 8192
	CreditMax uint32 // per consumer; default 65536
	Logger    *slog.Logger
	// TickInterval is how often shards expire messages; default 100ms.
	TickInterval time.Duration
	// Journal, if set, keeps persistent messages on durable queues on
	// disk. Nil keeps everything in memory.
	Journal *JournalConfig
	// MemoryLimit is the memory budget for messages in bytes, split
	// evenly across the shards (memory.go); 0 means no budget.
	MemoryLimit int64
	// PagingDir holds the shards' paging files for transient bodies; its
	// content is removed at Start. Empty means a temporary directory.
	PagingDir string
	// OwnSlice is how long a broker that owns a replicated queue keeps it
	// while another broker wants it (own.go); 0 means OwnSliceDefault.
	// OwnRefresh and ConsumeAtReplicas are ShardConfig's.
	OwnSlice          time.Duration
	OwnRefresh        uint64
	ConsumeAtReplicas bool
}

// Router resolves an exchange and routing key to queues. The wiring layer
// implements it; shards use it to route dead letters.
type Router interface {
	Route(exchange, key []byte, dst []*Queue) ([]*Queue, error)
}

// Hooks are what the shards need from the layer above them. Both run off
// the event loops; AutoDeleted runs on its own goroutine.
type Hooks struct {
	Router Router
	// AutoDeleted is told that a queue was dropped by its shard because
	// its last consumer left (an auto-delete queue).
	AutoDeleted func(q *Queue)
}

// Broker is the per-core data plane: the shards, their queues and
// consumers, and the journals. The wiring (exchanges, bindings, which
// names exist) lives one layer up, in server/wiring; see doc.go.
type Broker struct {
	cfg    Config
	log    *slog.Logger
	shards []*Shard
	hooks  Hooks
	replicatorField

	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup

	startup startup // what Start and Recover have done so far (ready.go)
	// outbound is the bytes waiting on client connections, as the server
	// last summed them (SetOutbound); the shards count it in their
	// budget (memory.go).
	outbound atomic.Int64
	// pagingTemp is the temporary paging directory to remove at Stop.
	pagingTemp string
}

// New builds a broker; Start runs its shards.
func New(cfg Config) *Broker {
	if cfg.Shards <= 0 {
		cfg.Shards = 1
	}
	if cfg.RingSize <= 0 {
		cfg.RingSize = 8192
	}
	if cfg.CreditMax == 0 {
		cfg.CreditMax = 65536
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.TickInterval <= 0 {
		cfg.TickInterval = 100 * time.Millisecond
	}
	b := &Broker{cfg: cfg, log: cfg.Logger, hooks: Hooks{Router: noRouter{}, AutoDeleted: func(*Queue) {}}}
	for i := 0; i < cfg.Shards; i++ {
		b.shards = append(b.shards, newShard(i, b, ShardConfig{RingSize: cfg.RingSize, CreditMax: cfg.CreditMax, Logger: cfg.Logger, OwnSlice: cfg.OwnSlice, OwnRefresh: cfg.OwnRefresh, ConsumeAtReplicas: cfg.ConsumeAtReplicas}))
	}
	return b
}

// noRouter routes nothing: dead letters are dropped until SetHooks.
type noRouter struct{}

func (noRouter) Route(_, _ []byte, dst []*Queue) ([]*Queue, error) { return dst, ErrNoExchange }

// ErrNoExchange is returned when routing through an exchange that does not
// exist.
var ErrNoExchange = errors.New("shards: no such exchange")

// SetHooks connects the broker to the layer above. Call it before Start.
func (b *Broker) SetHooks(h Hooks) {
	if h.Router != nil {
		b.hooks.Router = h.Router
	}
	if h.AutoDeleted != nil {
		b.hooks.AutoDeleted = h.AutoDeleted
	}
}

// Start runs the shard goroutines and their tickers. The queues that
// existed before a restart are then added (AddQueue) and Recover replays
// the journals into them.
func (b *Broker) Start() error {
	if err := b.setupPaging(); err != nil {
		return err
	}
	b.startShards()
	if b.cfg.Journal == nil {
		b.startup.recovered.Store(true)
	}
	return nil
}

// Recover replays each shard's journal into the queues added since Start.
// A record of a queue that no longer exists is dropped.
func (b *Broker) Recover() error {
	if b.cfg.Journal == nil {
		return nil
	}
	// The shards recover at once, each on its own goroutine.
	errs := make([]error, len(b.shards))
	var wg sync.WaitGroup
	for i, s := range b.shards {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var err error
			if callErr := b.Call(s, func(sh *Shard) { err = sh.openJournal(*b.cfg.Journal, b.log) }); callErr != nil {
				err = callErr
			}
			if err != nil {
				errs[i] = fmt.Errorf("shards: open journal of shard %d: %w", s.idx, err)
				return
			}
			b.startup.shardsRecovered.Add(1)
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return err
	}
	b.startup.recovered.Store(true)
	return nil
}

func (b *Broker) startShards() {
	b.ctx, b.cancel = context.WithCancel(context.Background())
	for _, s := range b.shards {
		s := s
		b.wg.Add(2)
		go func() { defer b.wg.Done(); s.run(b.ctx) }()
		go func() {
			defer b.wg.Done()
			t := time.NewTicker(b.cfg.TickInterval)
			defer t.Stop()
			for {
				select {
				case <-b.ctx.Done():
					return
				case now := <-t.C:
					s.TryPush(tickCommand(now.UnixNano()))
				}
			}
		}()
	}
}

// Stop ends the shard goroutines after they drain what they hold.
func (b *Broker) Stop() {
	if b.cancel == nil {
		return
	}
	// Let every shard finish the commands already in its ring, make its
	// journal durable and send the completions that follow.
	for _, s := range b.shards {
		_ = b.Call(s, func(sh *Shard) {
			if sh.journal != nil {
				_ = sh.journal.j.Sync()
				for sh.journal.pending.size > 0 && sh.drainJournal() {
				}
				sh.dispatchDirty()
				sh.finalCheckpoint()
			}
		})
	}
	b.cancel()
	b.wg.Wait()
	for _, s := range b.shards {
		if err := s.closeJournal(); err != nil {
			b.log.Error("shards: close journal", "shard", s.idx, "err", err)
		}
		s.closePages()
		s.stopTimers()
	}
	if b.pagingTemp != "" {
		_ = os.RemoveAll(b.pagingTemp)
	}
	b.cancel = nil
}

// Shards returns the shards.
func (b *Broker) Shards() []*Shard { return b.shards }

// CreditMax is the most credit one consumer may hold.
func (b *Broker) CreditMax() uint32 { return b.cfg.CreditMax }

// ShardFor picks the shard of a queue name.
func (b *Broker) ShardFor(name string) int {
	h := fnv.New32a()
	h.Write([]byte(name))
	return int(h.Sum32() % uint32(len(b.shards)))
}

// Call runs f on shard s and waits for it. For management only.
func (b *Broker) Call(s *Shard, f func(*Shard)) error {
	done := make(chan struct{})
	cmd := CallCommand(func(sh *Shard) { f(sh); sh.flush(); close(done) })
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := s.Push(ctx, cmd); err != nil {
		return err
	}
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// AddQueue creates a queue on its shard (ShardFor(name)) and returns it
// once it is in the shard's ring: the shard takes it before any command
// pushed to it after AddQueue returns (a publish routed to the queue, a
// Call that lists the shard's queues), without a round trip to wait for.
// owner is the session of an exclusive queue. The caller (the wiring
// layer) makes sure the name is not in use and publishes the queue for
// routing only after AddQueue returns.
//
// place says whether the queue is replicated and in which group: the
// caller decides it (it may need to ask the controller), so that the
// shards make no round trip of their own.
func (b *Broker) AddQueue(name string, opts QueueOptions, owner *Session, place Placement) (*Queue, error) {
	idx := b.ShardFor(name)
	s := b.shards[idx]
	q := NewQueue(name, opts, idx, &s.pool)
	if opts.Exclusive && owner != nil {
		q.owner = owner
	}
	q.group, q.replicated = place.Group, place.Replicated
	cmd := addQueueCommand(q)
	if !s.in.TryPush(cmd) {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := s.Push(ctx, cmd); err != nil {
			return nil, Errorf(wire.CodeInternal, "declare %q: %v", name, err)
		}
	}
	return q, nil
}

// Placement says where a queue's messages live: in the log of
// replication group Group (Replicated), or on this broker alone.
type Placement struct {
	Group      uint32
	Replicated bool
}

// QueueSpec is one queue for AddQueues.
type QueueSpec struct {
	Name    string
	Options QueueOptions
	Owner   *Session // of an exclusive queue
	Place   Placement
}

// addQueuesBatch is how many queues AddQueues hands a shard in one Call:
// a shard keeps serving its other commands between batches.
const addQueuesBatch = 4096

// AddQueues creates many queues at once, as AddQueue does each: every
// shard takes its queues in one round trip per addQueuesBatch of them, and
// the shards take theirs in parallel. It returns the queues in the order
// of specs. After an error, the queues of a failed shard are nil in the
// result and known to no shard; the others are created.
func (b *Broker) AddQueues(specs []QueueSpec) ([]*Queue, error) {
	qs := make([]*Queue, len(specs))
	byShard := make([][]int, len(b.shards))
	for i := range specs {
		sp := &specs[i]
		idx := b.ShardFor(sp.Name)
		q := NewQueue(sp.Name, sp.Options, idx, &b.shards[idx].pool)
		if sp.Options.Exclusive && sp.Owner != nil {
			q.owner = sp.Owner
		}
		q.group, q.replicated = sp.Place.Group, sp.Place.Replicated
		qs[i] = q
		byShard[idx] = append(byShard[idx], i)
	}
	errs := make([]error, len(b.shards))
	var wg sync.WaitGroup
	for si, list := range byShard {
		if len(list) == 0 {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			total := len(list)
			for len(list) > 0 {
				batch := list[:min(len(list), addQueuesBatch)]
				err := b.Call(b.shards[si], func(sh *Shard) {
					if sh.queues.len() == 0 && total > addQueuesBatch {
						// A start-up's restore: size the set once rather
						// than growing it through every doubling.
						sh.queues.reserve(total)
					}
					for _, i := range batch {
						sh.queues.add(qs[i])
					}
				})
				if err != nil {
					errs[si] = Errorf(wire.CodeInternal, "declare %d queues on shard %d: %v", len(list), si, err)
					for _, i := range list {
						qs[i] = nil
					}
					return
				}
				list = list[len(batch):]
			}
		}()
	}
	wg.Wait()
	return qs, errors.Join(errs...)
}

// CheckDrop checks on q's shard that q may be dropped: with ifUnused, that
// it has no consumers; with ifEmpty, that it holds no messages.
func (b *Broker) CheckDrop(q *Queue, ifUnused, ifEmpty bool) error {
	var err error
	callErr := b.Call(b.shards[q.shard], func(*Shard) {
		if ifUnused && len(q.consumers) > 0 {
			err = Errorf(wire.CodePreconditionFailed, "queue %q has consumers", q.Name)
		} else if ifEmpty && q.Depth() > 0 {
			err = Errorf(wire.CodePreconditionFailed, "queue %q is not empty", q.Name)
		}
	})
	if callErr != nil {
		return Errorf(wire.CodeInternal, "delete %q: %v", q.Name, callErr)
	}
	return err
}

// DropQueue deletes q and every message in it, and cancels its consumers.
// It returns the number of messages dropped.
func (b *Broker) DropQueue(q *Queue) (int, error) {
	dropped := 0
	if err := b.Call(b.shards[q.shard], func(s *Shard) { dropped = s.dropQueue(q) }); err != nil {
		return 0, Errorf(wire.CodeInternal, "delete %q: %v", q.Name, err)
	}
	return dropped, nil
}

// autoDelete runs on q's shard goroutine when its last consumer left.
func (b *Broker) autoDelete(q *Queue) {
	b.shards[q.shard].dropQueue(q)
	go b.hooks.AutoDeleted(q) // off the shard goroutine: the wiring may wait on other shards
}

// dropQueue marks q deleted and drops its messages and consumers. It runs
// on q's shard goroutine.
func (s *Shard) dropQueue(q *Queue) int { return s.dropQueueSeqs(q, nil) }

// dropQueueSeqs is dropQueue that appends to seqs, if not nil, the Seq of
// every message it drops.
func (s *Shard) dropQueueSeqs(q *Queue, seqs *[]uint64) int {
	if q.deleted {
		return 0
	}
	n := q.Depth()
	// The server hears of these through the queue's deletion, which
	// also tells their clients: not through Session.OnConsumerGone.
	for _, con := range append([]*Consumer(nil), q.consumers...) {
		dropHeld(con) // deliveries waiting for an acquires event (acquire.go)
		delete(s.consumers, consumerKey{con.Session, con.ID})
	}
	for key, con := range s.consumers {
		if con.queue == q {
			dropHeld(con)
			delete(s.consumers, key)
		}
	}
	if q.rare != nil {
		q.rare.acquiring, q.rare.releasing, q.rare.returning = nil, nil, nil
	}
	s.pool.totals.Consumers -= len(q.consumers)
	q.consumers = nil
	// Acquired messages go too: their settles will find nothing.
	fx := nopEffects{s, seqs}
	for seq := range q.acquiredMap() {
		ev := Event{Kind: EvDequeue, Seq: seq}
		_ = q.Apply(&ev, fx)
	}
	ev := Event{Kind: EvPurge}
	_ = q.Apply(&ev, fx)
	q.deleted = true
	s.queues.remove(q)
	if q.busy != nil {
		q.busy.expireAt = 0 // its entry in the expiry index, if any, is stale
	}
	if q.replicated {
		if r := s.broker.loadReplicator(); r != nil && s.masters(q) {
			// The removals release the group log: each member forgets
			// the enqueues of the messages they remove when they commit.
			// Those the group does not take now stay pending, and are
			// proposed again (flushRemoves), deleted queue or not.
			_ = s.proposeRemoves(q, nil)
			if err := r.ProposeDelete(q); err != nil {
				s.log.Warn("shards: the deletion of a replicated queue was not proposed; its followers keep an empty copy until they restart", "queue", q.Name, "err", err)
			}
		}
	}
	return n
}

// nopEffects drops messages without dead-lettering them, appending their
// Seqs to seqs if it is not nil.
type nopEffects struct {
	s    *Shard
	seqs *[]uint64
}

func (nopEffects) DeadLetter(*Queue, *Entry, DeadLetterReason) {}
func (n nopEffects) Removed(q *Queue, e *Entry) {
	if n.seqs != nil {
		*n.seqs = append(*n.seqs, e.Seq)
	}
	n.s.Removed(q, e)
}

// Purge drops every ready and delayed message of q and returns how many.
func (b *Broker) Purge(q *Queue) (int, error) {
	n := 0
	if err := b.Call(b.shards[q.shard], func(s *Shard) {
		n = q.Ready() + q.Delayed()
		ev := Event{Kind: EvPurge}
		_ = q.Apply(&ev, nopEffects{s: s})
	}); err != nil {
		return 0, Errorf(wire.CodeInternal, "purge %q: %v", q.Name, err)
	}
	return n, nil
}

// SessionClosed requeues what the session held on every shard. It may
// block; never call it from an event loop. The wiring layer deletes the
// session's exclusive queues.
func (b *Broker) SessionClosed(sess *Session) {
	sess.MarkClosed()
	for _, s := range b.shards {
		_ = s.Push(context.Background(), sessionClosedCommand(sess))
	}
}

// QueueInfo describes a queue for status pages.
type QueueInfo struct {
	Name      string `json:"name"`
	Shard     int    `json:"shard"`
	Ready     int    `json:"ready"`
	Unacked   int    `json:"unacked"`
	Delayed   int    `json:"delayed"` // waiting for their deliver-at time
	Consumers int    `json:"consumers"`
	Durable   bool   `json:"durable"`
	Enqueued  uint64 `json:"enqueued"`
	Delivered uint64 `json:"delivered"`
	Acked     uint64 `json:"acked"`
	// Group is a replicated queue's replication group (absent for a
	// queue that lives on this broker alone); Master is that group's
	// master as this broker knows it, filled in by the server.
	Group  *uint32 `json:"group,omitempty"`
	Master uint32  `json:"master,omitempty"`
	// AcquireWindow is a replicated queue's window (shards/acquire.go):
	// on its master, how many deliveries it may send before the events
	// recording them commit; on a follower, that of the last acquires
	// event it applied, which is how many of the messages it holds ready
	// it would flag as maybe delivered if it became master now.
	AcquireWindow uint32 `json:"acquire_window,omitempty"`
	// Owner is the broker that owns a replicated queue (own.go): the one
	// that hands its messages out. 0 here means the group's master, which
	// the server fills in. Handovers counts the own events that moved
	// the queue; WantedBy lists the brokers whose consumers wait for it.
	Owner     uint32   `json:"owner,omitempty"`
	Handovers uint64   `json:"handovers,omitempty"`
	WantedBy  []uint32 `json:"wanted_by,omitempty"`
}

// info is q's QueueInfo; it runs on q's shard goroutine.
func (q *Queue) info() QueueInfo {
	c := q.Counters()
	in := QueueInfo{Name: q.Name, Shard: q.Shard(), Ready: q.Ready(), Unacked: q.Unacked(), Delayed: q.Delayed(),
		Consumers: len(q.consumers), Durable: q.Options.Durable, Enqueued: c.Enqueued, Delivered: c.Delivered, Acked: c.Acked}
	if q.replicated {
		g := q.group
		in.Group = &g
		if rs := q.rare; rs != nil {
			in.AcquireWindow = effectiveWindow(rs)
			in.Owner, in.Handovers = rs.ownedBy, rs.ownGen
			in.WantedBy = slices.Clone(rs.wanters)
		}
	}
	return in
}

// Queues returns a consistent view of every queue, asking each shard.
func (b *Broker) Queues() []QueueInfo {
	var out []QueueInfo
	var mu sync.Mutex
	for _, s := range b.shards {
		_ = b.Call(s, func(sh *Shard) {
			mu.Lock()
			defer mu.Unlock()
			for q := range sh.queues.all() {
				out = append(out, q.info())
			}
		})
	}
	return out
}

// QueueInfos returns the view Queues gives of the listed queues only, in
// their order, asking each of their shards once: a page of a long list.
// A queue dropped meanwhile is left out.
func (b *Broker) QueueInfos(qs []*Queue) []QueueInfo {
	infos := make([]QueueInfo, len(qs))
	live := make([]bool, len(qs))
	for si, s := range b.shards {
		_ = b.Call(s, func(sh *Shard) {
			for i, q := range qs {
				if q.Shard() != si {
					continue
				}
				if !sh.queues.has(q) {
					continue
				}
				live[i] = true
				infos[i] = q.info()
			}
		})
	}
	out := infos[:0]
	for i := range infos {
		if live[i] {
			out = append(out, infos[i])
		}
	}
	return out
}

// Stats sums the shards' counters.
func (b *Broker) Stats() ShardStats {
	var t ShardStats
	for _, s := range b.shards {
		_ = b.Call(s, func(sh *Shard) {
			t.Published += sh.stats.Published
			t.Delivered += sh.stats.Delivered
			t.Accepted += sh.stats.Accepted
			t.DeadLettered += sh.stats.DeadLettered
			t.DroppedDeadLetters += sh.stats.DroppedDeadLetters
			t.StoreErrors += sh.stats.StoreErrors
			t.Duplicates += sh.stats.Duplicates
			t.AcquiresEvents += sh.stats.AcquiresEvents
			t.ReleasesEvents += sh.stats.ReleasesEvents
			t.Inherited += sh.stats.Inherited
		})
	}
	return t
}

// JournalStats sums the shards' journal counters; ok is false when the
// broker keeps nothing on disk.
func (b *Broker) JournalStats() (total journal.Stats, ok bool) {
	for _, s := range b.shards {
		st, has := s.JournalStats()
		if !has {
			continue
		}
		ok = true
		total.Segments += st.Segments
		total.DiskBytes += st.DiskBytes
		total.LiveBytes += st.LiveBytes
		total.LiveRecords += st.LiveRecords
		total.Appends += st.Appends
		total.Fsyncs += st.Fsyncs
		total.RecordsSynced += st.RecordsSynced
		total.Compactions += st.Compactions
		total.SegmentsReclaimed += st.SegmentsReclaimed
		total.DroppedBytes += st.DroppedBytes
		if total.Err == nil {
			total.Err = st.Err
		}
	}
	return total, ok
}
