package shards

import (
	"context"
	"fmt"
	"hash/fnv"
	"log/slog"
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
	// holdQueue and holdPos: a dead letter's source queue and record, to
	// dequeue once every target holds it (Shard.DeadLetter).
	holdQueue *Queue
	holdPos   uint64
}

var fanoutPool = sync.Pool{New: func() any { return new(Fanout) }}

// NewFanout returns a tracker for n targets.
func NewFanout(n int) *Fanout {
	f := fanoutPool.Get().(*Fanout)
	f.remaining.Store(int32(n))
	f.failure.Store(nil)
	f.holdQueue, f.holdPos = nil, 0
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
	// Journal, if set, keeps durable wiring and persistent messages on
	// durable queues on disk. Nil keeps everything in memory.
	Journal *JournalConfig
	// WiringLog, if set, is the authority for durable wiring (the
	// controller): every durable change is recorded there before it takes
	// effect, and Start restores the wiring from it rather than from the
	// local wiring file.
	WiringLog WiringLog
}

// WiringLog records durable wiring changes. Its methods may block (a
// consensus round); the broker calls them off the hot paths, holding its
// wiring lock so that changes reach the log in the order they take effect.
type WiringLog interface {
	DeclareExchange(name string, kind uint8, opts ExchangeOptions) error
	DeclareQueue(name string, opts QueueOptions) error
	Bind(exchange, queue, key string) error
	Unbind(exchange, queue, key string) error
	DeleteQueue(name string) error
	DeleteExchange(name string) error
	// Load returns the durable wiring to restore at start.
	Load() (*WiringSnapshot, error)
}

// WiringSnapshot is the durable wiring: exchanges, queues and bindings.
type WiringSnapshot struct {
	Exchanges []WiringExchange
	Queues    []WiringQueue
	Bindings  []Binding
}

// Broker is the single-node core: the shards, and the wiring that routes
// to them.
type Broker struct {
	cfg     Config
	log     *slog.Logger
	shards  []*Shard
	routing atomic.Pointer[Routing]

	mu struct {
		sync.Mutex // serialises wiring changes; never taken on a hot path
	}

	ctx       context.Context
	cancel    context.CancelFunc
	wg        sync.WaitGroup
	restore   *wiringState
	loadErr   error
	restoring bool // Start is replaying the wiring: do not log it again

	startup startup // what Start has done so far (ready.go)
}

// logged reports whether durable changes go to the wiring log now.
func (b *Broker) logged() bool { return b.cfg.WiringLog != nil && !b.restoring }

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
	b := &Broker{cfg: cfg, log: cfg.Logger}
	if cfg.Journal != nil {
		b.restore, b.loadErr = loadWiring(cfg.Journal.Dir)
		if b.restore != nil && b.restore.Shards > 0 && b.restore.Shards != cfg.Shards {
			// Queues hash onto shards and each shard has its journal, so the
			// count is fixed when the data directory is created.
			cfg.Logger.Warn("shards: keeping the shard count of the data directory", "configured", cfg.Shards, "data_dir", b.restore.Shards)
			cfg.Shards = b.restore.Shards
			b.cfg.Shards = cfg.Shards
		}
	}
	b.routing.Store(emptyRouting())
	for i := 0; i < cfg.Shards; i++ {
		b.shards = append(b.shards, newShard(i, b, ShardConfig{RingSize: cfg.RingSize, CreditMax: cfg.CreditMax, Logger: cfg.Logger}))
	}
	return b
}

// Start runs the shard goroutines and their tickers, then restores the
// durable wiring and replays the journals.
func (b *Broker) Start() error {
	if b.loadErr != nil {
		return b.loadErr
	}
	b.startShards()
	if b.cfg.Journal == nil {
		b.startup.wiringRestored.Store(true)
		b.startup.recovered.Store(true)
		return nil
	}
	if err := b.restoreWiring(); err != nil {
		b.Stop()
		return err
	}
	b.startup.wiringRestored.Store(true)
	for _, s := range b.shards {
		var err error
		if callErr := b.Call(s, func(sh *Shard) { err = sh.openJournal(*b.cfg.Journal, b.log) }); callErr != nil {
			err = callErr
		}
		if err != nil {
			b.Stop()
			return fmt.Errorf("shards: open journal of shard %d: %w", s.idx, err)
		}
		b.startup.shardsRecovered.Add(1)
	}
	b.startup.recovered.Store(true)
	return nil
}

func (b *Broker) restoreWiring() error {
	st := b.restore
	if b.cfg.WiringLog != nil {
		snap, err := b.cfg.WiringLog.Load()
		if err != nil {
			return fmt.Errorf("shards: load wiring: %w", err)
		}
		st = &wiringState{Exchanges: snap.Exchanges, Queues: snap.Queues, Bindings: snap.Bindings}
		if err := b.saveWiringLocked(b.routing.Load()); err != nil { // records the shard count
			return err
		}
	}
	if st == nil {
		return b.saveWiringLocked(b.routing.Load()) // records the shard count
	}
	b.restoring = true
	defer func() { b.restoring = false }()
	for _, x := range st.Exchanges {
		if err := b.DeclareExchange(x.Name, x.Kind, x.Options, false); err != nil {
			return fmt.Errorf("shards: restore exchange %q: %w", x.Name, err)
		}
	}
	for _, q := range st.Queues {
		if _, err := b.DeclareQueue(q.Name, q.Options, false, nil); err != nil {
			return fmt.Errorf("shards: restore queue %q: %w", q.Name, err)
		}
	}
	for _, bd := range st.Bindings {
		if err := b.Bind(bd.Exchange, bd.Queue, bd.Key); err != nil {
			return fmt.Errorf("shards: restore binding: %w", err)
		}
	}
	b.log.Info("shards: wiring restored", "exchanges", len(st.Exchanges), "queues", len(st.Queues), "bindings", len(st.Bindings))
	return nil
}

func wiringLogError(err error) error {
	if e, ok := err.(*Error); ok {
		return e
	}
	return Errorf(wire.CodeInternal, "controller: %v", err)
}

// commitLocked publishes a new routing snapshot, saving it first when the
// change touched durable wiring. b.mu must be held.
func (b *Broker) commitLocked(n *Routing, durable bool) error {
	if durable && b.cfg.WiringLog == nil {
		if err := b.saveWiringLocked(n); err != nil {
			return err
		}
	}
	b.routing.Store(n)
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
					s.TryPush(Command{Op: OpTick, Now: now.UnixNano()})
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
			}
		})
	}
	b.cancel()
	b.wg.Wait()
	for _, s := range b.shards {
		if err := s.closeJournal(); err != nil {
			b.log.Error("shards: close journal", "shard", s.idx, "err", err)
		}
	}
	b.cancel = nil
}

// Shards returns the shards.
func (b *Broker) Shards() []*Shard { return b.shards }

// CreditMax is the most credit one consumer may hold.
func (b *Broker) CreditMax() uint32 { return b.cfg.CreditMax }

// Routing returns the current wiring snapshot. It never blocks.
func (b *Broker) Routing() *Routing { return b.routing.Load() }

// ShardFor picks the shard of a queue name.
func (b *Broker) ShardFor(name string) int {
	h := fnv.New32a()
	h.Write([]byte(name))
	return int(h.Sum32() % uint32(len(b.shards)))
}

// Call runs f on shard s and waits for it. For management only.
func (b *Broker) Call(s *Shard, f func(*Shard)) error {
	done := make(chan struct{})
	cmd := Command{Op: opCall, Call: func(sh *Shard) { f(sh); sh.flush(); close(done) }}
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

// DeclareQueue creates a queue, or checks an existing one. owner is the
// session of an exclusive queue.
func (b *Broker) DeclareQueue(name string, opts QueueOptions, passive bool, owner *Session) (*Queue, error) {
	if name == "" {
		return nil, Errorf(wire.CodeInvalid, "a queue needs a name")
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	r := b.routing.Load()
	if q := r.queues[name]; q != nil {
		if q.owner != nil && q.owner != owner {
			return nil, Errorf(wire.CodeNotAllowed, "queue %q is exclusive to another session", name)
		}
		if passive || q.Options == opts {
			return q, nil
		}
		return nil, Errorf(wire.CodePreconditionFailed, "queue %q exists with other options", name)
	}
	if passive {
		return nil, Errorf(wire.CodeNotFound, "no queue %q", name)
	}
	if opts.DeadLetterExchange != "" && r.exchanges[opts.DeadLetterExchange] == nil {
		return nil, Errorf(wire.CodeNotFound, "no dead-letter exchange %q", opts.DeadLetterExchange)
	}
	if opts.Durable && !opts.Exclusive && b.logged() {
		if err := b.cfg.WiringLog.DeclareQueue(name, opts); err != nil {
			return nil, wiringLogError(err)
		}
	}
	idx := b.ShardFor(name)
	s := b.shards[idx]
	q := NewQueue(name, opts, idx, &s.pool)
	if opts.Exclusive {
		q.owner = owner
	}
	// The shard learns of the queue before any event loop can route to it.
	if err := b.Call(s, func(sh *Shard) { sh.queues[q] = struct{}{} }); err != nil {
		return nil, Errorf(wire.CodeInternal, "declare %q: %v", name, err)
	}
	n := r.clone()
	n.queues[name] = q
	if err := b.commitLocked(n, opts.Durable); err != nil {
		_ = b.Call(s, func(sh *Shard) { delete(sh.queues, q) })
		return nil, err
	}
	return q, nil
}

// DeclareExchange creates an exchange, or checks an existing one.
func (b *Broker) DeclareExchange(name string, kind uint8, opts ExchangeOptions, passive bool) error {
	if name == "" {
		return Errorf(wire.CodeNotAllowed, "the default exchange cannot be declared")
	}
	if kind > KindTopic {
		return Errorf(wire.CodeInvalid, "unknown exchange kind %d", kind)
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	r := b.routing.Load()
	if ex := r.exchanges[name]; ex != nil {
		if passive || (ex.kind == kind && ex.options == opts) {
			return nil
		}
		return Errorf(wire.CodePreconditionFailed, "exchange %q exists with other options", name)
	}
	if passive {
		return Errorf(wire.CodeNotFound, "no exchange %q", name)
	}
	if opts.Durable && b.logged() {
		if err := b.cfg.WiringLog.DeclareExchange(name, kind, opts); err != nil {
			return wiringLogError(err)
		}
	}
	n := r.clone()
	n.exchanges[name] = &exchange{name: name, kind: kind, options: opts, direct: map[string][]*Queue{}}
	return b.commitLocked(n, opts.Durable)
}

// Bind adds a binding; binding twice is a no-op.
func (b *Broker) Bind(exchangeName, queue, key string) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	r := b.routing.Load()
	if r.exchanges[exchangeName] == nil {
		return Errorf(wire.CodeNotFound, "no exchange %q", exchangeName)
	}
	if r.queues[queue] == nil {
		return Errorf(wire.CodeNotFound, "no queue %q", queue)
	}
	// A pattern accepted before the cap existed is kept on restore: it is
	// compiled to one that matches nothing, in bounded time.
	if r.exchanges[exchangeName].kind == KindTopic && !b.restoring {
		if err := TopicPatternError(key); err != nil {
			return err
		}
	}
	nb := Binding{Exchange: exchangeName, Queue: queue, Key: key}
	for _, x := range r.bindings {
		if x == nb {
			return nil
		}
	}
	durable := r.queues[queue].Options.Durable && !r.queues[queue].Options.Exclusive && r.exchanges[exchangeName].options.Durable
	if durable && b.logged() {
		if err := b.cfg.WiringLog.Bind(exchangeName, queue, key); err != nil {
			return wiringLogError(err)
		}
	}
	n := r.clone()
	n.bindings = append(n.bindings, nb)
	n.rebuildExchanges()
	return b.commitLocked(n, durable)
}

// Unbind removes a binding.
func (b *Broker) Unbind(exchangeName, queue, key string) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	r := b.routing.Load()
	nb := Binding{Exchange: exchangeName, Queue: queue, Key: key}
	n := r.clone()
	kept := n.bindings[:0]
	found := false
	for _, x := range n.bindings {
		if x == nb {
			found = true
			continue
		}
		kept = append(kept, x)
	}
	if !found {
		return Errorf(wire.CodeNotFound, "no binding %s -> %s (%q)", exchangeName, queue, key)
	}
	if q, ex := r.queues[queue], r.exchanges[exchangeName]; q != nil && ex != nil && q.Options.Durable && ex.options.Durable && b.logged() {
		if err := b.cfg.WiringLog.Unbind(exchangeName, queue, key); err != nil {
			return wiringLogError(err)
		}
	}
	n.bindings = kept
	n.rebuildExchanges()
	return b.commitLocked(n, true)
}

// DeleteQueue deletes a queue and every message in it, and cancels its
// consumers. It returns the number of messages dropped.
func (b *Broker) DeleteQueue(name string, ifUnused, ifEmpty bool) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	q := b.routing.Load().queues[name]
	if q == nil {
		return 0, Errorf(wire.CodeNotFound, "no queue %q", name)
	}
	var err error
	dropped := 0
	callErr := b.Call(b.shards[q.shard], func(s *Shard) {
		if ifUnused && len(q.consumers) > 0 {
			err = Errorf(wire.CodePreconditionFailed, "queue %q has consumers", name)
			return
		}
		if ifEmpty && q.Depth() > 0 {
			err = Errorf(wire.CodePreconditionFailed, "queue %q is not empty", name)
			return
		}
		dropped = s.dropQueue(q)
	})
	if callErr != nil {
		return 0, Errorf(wire.CodeInternal, "delete %q: %v", name, callErr)
	}
	if err != nil {
		return 0, err
	}
	b.removeQueueLocked(q)
	return dropped, nil
}

func (b *Broker) removeQueueLocked(q *Queue) {
	r := b.routing.Load()
	if r.queues[q.Name] != q {
		return
	}
	if q.Options.Durable && !q.Options.Exclusive && b.logged() {
		// The queue is gone from this broker already; a log that refuses
		// leaves it to come back empty on restart.
		if err := b.cfg.WiringLog.DeleteQueue(q.Name); err != nil {
			b.log.Error("shards: record queue deletion", "queue", q.Name, "err", err)
		}
	}
	n := r.clone()
	delete(n.queues, q.Name)
	n.rebuildExchanges()
	if err := b.commitLocked(n, q.Options.Durable); err != nil {
		// The queue is gone from memory; on restart it comes back empty
		// of the messages whose dequeues were journaled.
		b.log.Error("shards: save wiring after deleting a queue", "queue", q.Name, "err", err)
		b.routing.Store(n)
	}
}

// autoDelete runs on q's shard goroutine when its last consumer left.
func (b *Broker) autoDelete(q *Queue) {
	s := b.shards[q.shard]
	s.dropQueue(q)
	go func() {
		// Off the shard goroutine: wiring changes may wait on other shards.
		b.mu.Lock()
		defer b.mu.Unlock()
		b.removeQueueLocked(q)
	}()
}

// dropQueue marks q deleted and drops its messages and consumers. It runs
// on q's shard goroutine.
func (s *Shard) dropQueue(q *Queue) int {
	if q.deleted {
		return 0
	}
	n := q.Depth()
	for _, con := range append([]*Consumer(nil), q.consumers...) {
		delete(s.consumers, consumerKey{con.Session, con.ID})
	}
	for key, con := range s.consumers {
		if con.queue == q {
			delete(s.consumers, key)
		}
	}
	q.consumers = nil
	// Acquired messages go too: their settles will find nothing.
	for seq := range q.acquired {
		ev := Event{Kind: EvDequeue, Seq: seq}
		_ = q.Apply(&ev, nopEffects{s})
	}
	ev := Event{Kind: EvPurge}
	_ = q.Apply(&ev, nopEffects{s})
	q.deleted = true
	delete(s.queues, q)
	return n
}

// nopEffects drops messages without dead-lettering them.
type nopEffects struct{ s *Shard }

func (nopEffects) DeadLetter(*Queue, *Entry, DeadLetterReason) {}
func (n nopEffects) Removed(q *Queue, e *Entry)                { n.s.Removed(q, e) }

// DeleteExchange deletes an exchange and its bindings.
func (b *Broker) DeleteExchange(name string, ifUnused bool) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	r := b.routing.Load()
	ex := r.exchanges[name]
	if ex == nil {
		return Errorf(wire.CodeNotFound, "no exchange %q", name)
	}
	if ifUnused && ex.count > 0 {
		return Errorf(wire.CodePreconditionFailed, "exchange %q has bindings", name)
	}
	if ex.options.Durable && b.logged() {
		if err := b.cfg.WiringLog.DeleteExchange(name); err != nil {
			return wiringLogError(err)
		}
	}
	n := r.clone()
	delete(n.exchanges, name)
	n.rebuildExchanges()
	return b.commitLocked(n, ex.options.Durable)
}

// Purge drops every ready message of a queue and returns how many.
func (b *Broker) Purge(name string) (int, error) {
	q := b.routing.Load().queues[name]
	if q == nil {
		return 0, Errorf(wire.CodeNotFound, "no queue %q", name)
	}
	n := 0
	if err := b.Call(b.shards[q.shard], func(s *Shard) {
		n = q.Ready()
		ev := Event{Kind: EvPurge}
		_ = q.Apply(&ev, nopEffects{s})
	}); err != nil {
		return 0, Errorf(wire.CodeInternal, "purge %q: %v", name, err)
	}
	return n, nil
}

// SessionClosed requeues what the session held on every shard and deletes
// its exclusive queues. It may block; never call it from an event loop.
func (b *Broker) SessionClosed(sess *Session) {
	sess.MarkClosed()
	for _, s := range b.shards {
		_ = s.Push(context.Background(), Command{Op: OpSessionClosed, Sess: sess})
	}
	var exclusive []string
	for name, q := range b.routing.Load().queues {
		if q.owner == sess {
			exclusive = append(exclusive, name)
		}
	}
	for _, name := range exclusive {
		_, _ = b.DeleteQueue(name, false, false)
	}
}

// QueueInfo describes a queue for status pages.
type QueueInfo struct {
	Name      string `json:"name"`
	Shard     int    `json:"shard"`
	Ready     int    `json:"ready"`
	Unacked   int    `json:"unacked"`
	Consumers int    `json:"consumers"`
	Durable   bool   `json:"durable"`
	Enqueued  uint64 `json:"enqueued"`
	Delivered uint64 `json:"delivered"`
	Acked     uint64 `json:"acked"`
}

// Queues returns a consistent view of every queue, asking each shard.
func (b *Broker) Queues() []QueueInfo {
	r := b.routing.Load()
	var out []QueueInfo
	var mu sync.Mutex
	for _, s := range b.shards {
		_ = b.Call(s, func(sh *Shard) {
			mu.Lock()
			defer mu.Unlock()
			for _, q := range r.queues {
				if q.shard != sh.idx {
					continue
				}
				out = append(out, QueueInfo{Name: q.Name, Shard: q.shard, Ready: q.Ready(), Unacked: q.Unacked(),
					Consumers: len(q.consumers), Durable: q.Options.Durable, Enqueued: q.Enqueued, Delivered: q.Delivered, Acked: q.Acked})
			}
		})
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
