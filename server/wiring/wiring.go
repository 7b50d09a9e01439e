// Package wiring owns what routes messages to queues: exchanges, bindings,
// which queue names exist and with which options, the durable wiring log
// (the controller) and the local wiring file. It sits between the server,
// whose event loops route through its immutable Routing snapshot, and the
// shards, which own the queues themselves.
//
// A change is committed before it is applied: a durable declare, bind,
// unbind or delete is first recorded in the wiring log (a consensus round
// in the controller), then the queue is created on or dropped from its
// shard, and last a new Routing snapshot is published. Changes to
// different names run at the same time, each waiting for its own
// consensus round (the controller batches concurrent rounds into one log
// write); changes to one name are serialised from commit to apply, so the
// shards and the routing see them in the order the log committed them.
// Only the final snapshot swap is serialised for the whole broker, and no
// lock is held across a consensus round except the changed names' own.
package wiring

import (
	"hash/fnv"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/berthmq/berth/shards"
	"github.com/berthmq/berth/wire"
)

// Log records durable wiring changes. Its methods may block for a
// consensus round; the wiring calls them holding only the locks of the
// names being changed.
type Log interface {
	DeclareExchange(name string, kind uint8, opts ExchangeOptions) error
	DeclareQueue(name string, opts shards.QueueOptions) error
	Bind(exchange, queue, key string) error
	Unbind(exchange, queue, key string) error
	DeleteQueue(name string) error
	DeleteExchange(name string) error
	// Load returns the durable wiring to restore at start.
	Load() (*Snapshot, error)
}

// Snapshot is the durable wiring: exchanges, queues and bindings.
type Snapshot struct {
	Exchanges []WiringExchange
	Queues    []WiringQueue
	Bindings  []Binding
}

// Config configures the wiring.
type Config struct {
	Broker *shards.Broker
	// Dir holds the wiring file. Empty keeps no wiring on disk (a broker
	// without a journal).
	Dir string
	// Log, if set, is the authority for durable wiring: every durable
	// change is committed there before it takes effect, and Restore reads
	// the wiring from it rather than from the wiring file.
	Log    Log
	Logger *slog.Logger
	// Dropped, if set, is told of a queue deleted by DeleteQueue or
	// DropReplica, once its shard dropped it (and its consumers).
	Dropped func(q *shards.Queue)
	// Syncable, if set, says whether a queue the controller holds and
	// this broker lacks is to be added here by Sync (sync.go); a queue it
	// refuses stays on the brokers that have it.
	Syncable func(name string, opts shards.QueueOptions) bool
	// Foreign, if set, names the queues another broker keeps to itself:
	// Restore skips them and DeclareQueue refuses them.
	Foreign func(name string) bool
	// Droppable, if set, says whether Sync may drop q, a durable queue
	// the controller no longer holds.
	Droppable func(q *shards.Queue) bool
	// Place, if set, says where a new queue's messages live (a
	// replication group, or this broker); unset, every queue is this
	// broker's. It may ask the controller: the wiring calls it before
	// the shards take the queue.
	Place func(name string, opts shards.QueueOptions) shards.Placement
}

// place is Config.Place's answer for a new queue.
func (w *Wiring) place(name string, opts shards.QueueOptions) shards.Placement {
	if w.cfg.Place == nil {
		return shards.Placement{}
	}
	return w.cfg.Place(name, opts)
}

// nameStripes is how many locks serialise changes by name; two names that
// share a stripe only wait for each other.
const nameStripes = 256

// Wiring is a broker's exchanges, queues and bindings.
type Wiring struct {
	cfg     Config
	b       *shards.Broker
	log     *slog.Logger
	routing atomic.Pointer[Routing]

	// names serialises the changes of one exchange or queue name from
	// commit to apply. Taken before mu, in stripe order.
	names [nameStripes]sync.Mutex
	// mu serialises snapshot swaps (and, without a log, the wiring file
	// writes). Never held across a consensus round or a shard call.
	mu sync.Mutex

	restoring bool // Restore is replaying the wiring: do not log it again
	restored  atomic.Bool
	// committed counts the changes this broker committed to the log,
	// each bumped under its name's lock before it is applied (sync.go).
	committed atomic.Uint64
	// syncWarned: queues Sync has warned differ from the controller's
	// (Sync's caller only).
	syncWarned map[string]struct{}

	// exclusive lists each session's exclusive queues, so that a session's
	// end finds them without scanning every queue.
	exclusive struct {
		sync.Mutex
		bySession map[*shards.Session][]*shards.Queue
	}
}

func (w *Wiring) addExclusive(q *shards.Queue) {
	w.exclusive.Lock()
	defer w.exclusive.Unlock()
	if w.exclusive.bySession == nil {
		w.exclusive.bySession = map[*shards.Session][]*shards.Queue{}
	}
	w.exclusive.bySession[q.Owner()] = append(w.exclusive.bySession[q.Owner()], q)
}

func (w *Wiring) removeExclusive(q *shards.Queue) {
	w.exclusive.Lock()
	defer w.exclusive.Unlock()
	qs := slices.DeleteFunc(w.exclusive.bySession[q.Owner()], func(x *shards.Queue) bool { return x == q })
	if len(qs) == 0 {
		delete(w.exclusive.bySession, q.Owner())
	} else {
		w.exclusive.bySession[q.Owner()] = qs
	}
}

func (w *Wiring) exclusiveOf(sess *shards.Session) []*shards.Queue {
	w.exclusive.Lock()
	defer w.exclusive.Unlock()
	return slices.Clone(w.exclusive.bySession[sess])
}

// New returns the wiring of b and connects b's dead-letter routing and
// auto-delete hooks to it. Call it before b.Start.
func New(cfg Config) *Wiring {
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	w := &Wiring{cfg: cfg, b: cfg.Broker, log: cfg.Logger}
	w.routing.Store(emptyRouting())
	w.b.SetHooks(shards.Hooks{Router: w, AutoDeleted: w.autoDeleted})
	return w
}

// Routing returns the current snapshot. It never blocks.
func (w *Wiring) Routing() *Routing { return w.routing.Load() }

// Queue looks a queue up by name in the current snapshot, or nil
// (replication.Wiring). It does not allocate.
func (w *Wiring) Queue(name []byte) *shards.Queue { return w.Routing().Queue(name) }

// Route routes through the current snapshot (shards.Router).
func (w *Wiring) Route(exchange, key []byte, dst []*shards.Queue) ([]*shards.Queue, error) {
	return w.routing.Load().Route(exchange, key, dst)
}

// Restored reports whether Restore has finished.
func (w *Wiring) Restored() bool { return w.restored.Load() }

// Restore brings back the durable wiring: from the log if there is one,
// otherwise from the wiring file. The broker's shards must be running
// (shards.Broker.Start) and their journals not yet replayed
// (shards.Broker.Recover), so that the replay finds its queues.
func (w *Wiring) Restore() error {
	if w.cfg.Dir == "" {
		w.restored.Store(true)
		return nil
	}
	st, err := loadWiring(w.cfg.Dir)
	if err != nil {
		return err
	}
	if w.cfg.Log != nil {
		snap, err := w.cfg.Log.Load()
		if err != nil {
			return shards.Errorf(wire.CodeInternal, "wiring: load from the controller: %v", err)
		}
		st = &wiringState{Exchanges: snap.Exchanges, Queues: snap.Queues, Bindings: snap.Bindings}
	}
	if w.cfg.Log != nil || st == nil {
		w.mu.Lock()
		err = w.saveLocked(w.routing.Load()) // records the shard count
		w.mu.Unlock()
	}
	// Otherwise restoreState rewrites the file once the wiring is back:
	// writing it empty first would lose the wiring to a crash between.
	if err != nil || st == nil {
		w.restored.Store(err == nil)
		return err
	}
	w.restoring = true
	defer func() { w.restoring = false }()
	if err := w.restoreState(st); err != nil {
		return err
	}
	w.log.Info("wiring: restored", "exchanges", len(st.Exchanges), "queues", len(st.Queues), "bindings", len(st.Bindings))
	w.restored.Store(true)
	return nil
}

// restoreState adds the wiring st to the routing in one snapshot: the
// checks of DeclareExchange, DeclareQueue and Bind without a snapshot swap
// per change, and the queues added on their shards by one goroutine per
// shard. Nothing routes before Restore returns, so nothing sees the
// wiring half restored.
func (w *Wiring) restoreState(st *wiringState) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	n := *w.routing.Load()
	for _, x := range st.Exchanges {
		if x.Name == "" || x.Kind > KindTopic {
			return shards.Errorf(wire.CodeInvalid, "wiring: restore exchange %q of kind %d: not a declarable exchange", x.Name, x.Kind)
		}
		if n.exchange(x.Name) == nil {
			n.addExchange(x.Name, x.Kind, x.Options)
		}
	}
	for _, q := range st.Queues {
		if q.Name == "" {
			return shards.Errorf(wire.CodeInvalid, "wiring: restore a queue without a name")
		}
		if d := q.Options.DeadLetterExchange; d != "" && n.exchange(d) == nil {
			return shards.Errorf(wire.CodeNotFound, "wiring: restore queue %q: no dead-letter exchange %q", q.Name, d)
		}
	}
	// The shards take their queues in bulk (one round trip per shard per
	// few thousand queues), in parallel.
	specs := make([]shards.QueueSpec, 0, len(st.Queues))
	seen := make(map[string]struct{}, len(st.Queues))
	for _, q := range st.Queues {
		if _, dup := seen[q.Name]; dup || n.queue(q.Name) != nil {
			continue // listed twice: keep the first
		}
		if w.cfg.Foreign != nil && w.cfg.Foreign(q.Name) {
			continue // another broker's own queue (its bindings find no queue here)
		}
		seen[q.Name] = struct{}{}
		specs = append(specs, shards.QueueSpec{Name: q.Name, Options: q.Options, Place: w.place(q.Name, q.Options)})
	}
	seen = nil
	added, addErr := w.b.AddQueues(specs)
	if addErr != nil {
		addErr = shards.Errorf(shards.CodeOf(addErr), "wiring: restore queues: %v", addErr)
	}
	var vals []*shards.Queue
	for _, q := range added {
		if q == nil {
			continue // its shard failed: addErr says why
		}
		if n.queues.Len() == 0 {
			vals = append(vals, q)
		} else {
			n.addQueue(q)
		}
	}
	if len(vals) > 0 {
		// Built at once rather than a path copy per queue.
		n.queues = buildQueueTable(vals)
	}
	if addErr != nil {
		return addErr
	}
	// One batch for every binding: the tables this snapshot does not
	// share with the published one grow in place (pmapEdit), each queue's
	// list of bindings grows here and enters the table once, at the end,
	// and two maps answer what a bind otherwise finds by scanning the
	// queue's other bindings (a duplicate; a pattern already in the trie),
	// so a queue with many bindings costs no more per binding.
	ed := &pmapEdit{}
	lists := map[string][]queueBinding{}
	initial := map[string][]queueBinding{} // bindings the routing had already
	type placedKey struct {
		q        *shards.Queue
		exchange string
		pattern  string // normalised; "" for a fanout
	}
	placed := map[placedKey]struct{}{}
	bound := map[Binding]struct{}{}
	for _, bd := range st.Bindings {
		// A pattern accepted before the cap existed is kept: the trie
		// leaves out what can match nothing.
		q := n.queue(bd.Queue)
		ex := n.exchange(bd.Exchange)
		if q == nil && w.cfg.Foreign != nil && w.cfg.Foreign(bd.Queue) {
			continue // to another broker's own queue, not restored here
		}
		if ex == nil || q == nil {
			return shards.Errorf(wire.CodeNotFound, "wiring: restore binding %s -> %s (%q): no such exchange or queue", bd.Exchange, bd.Queue, bd.Key)
		}
		if _, dup := bound[bd]; dup {
			continue
		}
		bound[bd] = struct{}{}
		qb, ok := lists[q.Name]
		if !ok {
			qb = slices.Clip(n.liveBindings(q.Name)) // shared: the first append copies it
			initial[q.Name] = qb
		}
		nb := queueBinding{exchange: bd.Exchange, gen: ex.gen, key: bd.Key}
		if slices.Contains(initial[q.Name], nb) {
			continue
		}
		covered := ex.covered(bd.Key, initial[q.Name])
		switch ex.kind {
		case KindFanout, KindTopic:
			pk := placedKey{q: q, exchange: bd.Exchange}
			if ex.kind == KindTopic {
				words, _ := topicTrieWords(bd.Key)
				pk.pattern = strings.Join(words, ".")
			}
			if _, ok := placed[pk]; ok {
				covered = true
			}
			placed[pk] = struct{}{}
		}
		if c := ex.withIn(ed, q, bd.Key, covered); c != ex {
			n.exchanges = n.exchanges.SetIn(ed, bd.Exchange, c)
		}
		lists[q.Name] = append(qb, nb)
	}
	for name, qb := range lists {
		n.bindings = n.bindings.SetIn(ed, name, queueBindings{list: qb, swept: len(qb)})
	}
	if w.cfg.Log == nil {
		if err := w.saveLocked(&n); err != nil {
			return err
		}
	}
	w.routing.Store(&n)
	return nil
}

// logged reports whether durable changes go to the log now.
func (w *Wiring) logged() bool { return w.cfg.Log != nil && !w.restoring }

// logError gives a log failure a wire code.
func logError(err error) error {
	if e, ok := err.(*shards.Error); ok {
		return e
	}
	return shards.Errorf(wire.CodeInternal, "controller: %v", err)
}

// lockNames locks the stripes of the given names in stripe order and
// returns the unlock.
func (w *Wiring) lockNames(names ...string) func() {
	var idx [2]int
	n := 0
	for _, name := range names {
		i := stripe(name)
		if !slices.Contains(idx[:n], i) {
			idx[n] = i
			n++
		}
	}
	held := idx[:n]
	slices.Sort(held)
	for _, i := range held {
		w.names[i].Lock()
	}
	return func() {
		for j := len(held) - 1; j >= 0; j-- {
			w.names[held[j]].Unlock()
		}
	}
}

// stripe is the lock index of a name.
func stripe(name string) int {
	h := fnv.New32a()
	h.Write([]byte(name))
	return int(h.Sum32() % nameStripes)
}

// apply builds the next snapshot from the current one with change and
// publishes it, saving the wiring file first when the change is durable
// and there is no log.
func (w *Wiring) apply(durable bool, change func(n *Routing)) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	n := *w.routing.Load() // the tables are persistent: copying the struct is enough
	change(&n)
	if durable && w.cfg.Log == nil {
		if err := w.saveLocked(&n); err != nil {
			return err
		}
	}
	w.routing.Store(&n)
	return nil
}

func checkQueue(q *shards.Queue, opts shards.QueueOptions, passive bool, owner *shards.Session) (*shards.Queue, error) {
	if o := q.Owner(); o != nil && o != owner {
		return nil, shards.Errorf(wire.CodeNotAllowed, "queue %q is exclusive to another session", q.Name)
	}
	if passive || *q.Options == opts {
		return q, nil
	}
	return nil, shards.Errorf(wire.CodePreconditionFailed, "queue %q exists with other options", q.Name)
}

// DeclareQueue creates a queue, or checks an existing one. owner is the
// session of an exclusive queue.
func (w *Wiring) DeclareQueue(name string, opts shards.QueueOptions, passive bool, owner *shards.Session) (*shards.Queue, error) {
	if name == "" {
		return nil, shards.Errorf(wire.CodeInvalid, "a queue needs a name")
	}
	if q := w.Routing().queue(name); q != nil {
		return checkQueue(q, opts, passive, owner)
	}
	if passive {
		return nil, shards.Errorf(wire.CodeNotFound, "no queue %q", name)
	}
	if w.cfg.Foreign != nil && w.cfg.Foreign(name) {
		return nil, shards.Errorf(wire.CodePreconditionFailed,
			"queue %q lives on another broker of the cluster, which declared it before the cluster's replication was set up; use it there", name)
	}
	defer w.lockNames(name)()
	r := w.Routing()
	if q := r.queue(name); q != nil {
		return checkQueue(q, opts, passive, owner)
	}
	if opts.DeadLetterExchange != "" && r.exchange(opts.DeadLetterExchange) == nil {
		return nil, shards.Errorf(wire.CodeNotFound, "no dead-letter exchange %q", opts.DeadLetterExchange)
	}
	if opts.Durable && !opts.Exclusive && w.logged() {
		if err := w.cfg.Log.DeclareQueue(name, opts); err != nil {
			return nil, logError(err)
		}
		w.committed.Add(1)
	}
	// The shard learns of the queue before any event loop can route to it.
	q, err := w.b.AddQueue(name, opts, owner, w.place(name, opts))
	if err != nil {
		return nil, err
	}
	if err := w.apply(opts.Durable, func(n *Routing) { n.addQueue(q) }); err != nil {
		_, _ = w.b.DropQueue(q)
		return nil, err
	}
	if q.Owner() != nil {
		w.addExclusive(q)
	}
	return q, nil
}

// DeclareExchange creates an exchange, or checks an existing one.
func (w *Wiring) DeclareExchange(name string, kind uint8, opts ExchangeOptions, passive bool) error {
	if name == "" {
		return shards.Errorf(wire.CodeNotAllowed, "the default exchange cannot be declared")
	}
	if kind > KindTopic {
		return shards.Errorf(wire.CodeInvalid, "unknown exchange kind %d", kind)
	}
	check := func(ex *exchange) error {
		if passive || (ex.kind == kind && ex.options == opts) {
			return nil
		}
		return shards.Errorf(wire.CodePreconditionFailed, "exchange %q exists with other options", name)
	}
	if ex := w.Routing().exchange(name); ex != nil {
		return check(ex)
	}
	if passive {
		return shards.Errorf(wire.CodeNotFound, "no exchange %q", name)
	}
	defer w.lockNames(name)()
	if ex := w.Routing().exchange(name); ex != nil {
		return check(ex)
	}
	if opts.Durable && w.logged() {
		if err := w.cfg.Log.DeclareExchange(name, kind, opts); err != nil {
			return logError(err)
		}
		w.committed.Add(1)
	}
	return w.apply(opts.Durable, func(n *Routing) { n.addExchange(name, kind, opts) })
}

// Bind adds a binding; binding twice is a no-op.
func (w *Wiring) Bind(exchangeName, queue, key string) error {
	defer w.lockNames(exchangeName, queue)()
	r := w.Routing()
	ex, q := r.exchange(exchangeName), r.queue(queue)
	if ex == nil {
		return shards.Errorf(wire.CodeNotFound, "no exchange %q", exchangeName)
	}
	if q == nil {
		return shards.Errorf(wire.CodeNotFound, "no queue %q", queue)
	}
	// A pattern accepted before the cap existed is kept on restore: it is
	// compiled to one that matches nothing, in bounded time.
	if ex.kind == KindTopic && !w.restoring {
		if err := TopicPatternError(key); err != nil {
			return err
		}
	}
	if r.hasBinding(exchangeName, queue, key) {
		return nil
	}
	durable := q.Options.Durable && !q.Options.Exclusive && ex.options.Durable
	if durable && w.logged() {
		if err := w.cfg.Log.Bind(exchangeName, queue, key); err != nil {
			return logError(err)
		}
		w.committed.Add(1)
	}
	return w.apply(durable, func(n *Routing) { n.bind(exchangeName, q, key) })
}

// Unbind removes a binding.
func (w *Wiring) Unbind(exchangeName, queue, key string) error {
	defer w.lockNames(exchangeName, queue)()
	r := w.Routing()
	if !r.hasBinding(exchangeName, queue, key) {
		return shards.Errorf(wire.CodeNotFound, "no binding %s -> %s (%q)", exchangeName, queue, key)
	}
	q, ex := r.queue(queue), r.exchange(exchangeName)
	durable := q.Options.Durable && ex.options.Durable
	if durable && w.logged() {
		if err := w.cfg.Log.Unbind(exchangeName, queue, key); err != nil {
			return logError(err)
		}
		w.committed.Add(1)
	}
	return w.apply(true, func(n *Routing) { n.unbind(exchangeName, q, key) })
}

// DeleteQueue deletes a queue and every message in it, and cancels its
// consumers. It returns the number of messages dropped. A durable queue's
// deletion is committed in the log first: a log that refuses leaves the
// queue as it was.
func (w *Wiring) DeleteQueue(name string, ifUnused, ifEmpty bool) (int, error) {
	defer w.lockNames(name)()
	q := w.Routing().queue(name)
	if q == nil {
		return 0, shards.Errorf(wire.CodeNotFound, "no queue %q", name)
	}
	if ifUnused || ifEmpty {
		if err := w.b.CheckDrop(q, ifUnused, ifEmpty); err != nil {
			return 0, err
		}
	}
	if q.Options.Durable && !q.Options.Exclusive && w.logged() {
		if err := w.cfg.Log.DeleteQueue(name); err != nil {
			return 0, logError(err)
		}
		w.committed.Add(1)
	}
	dropped, err := w.b.DropQueue(q)
	if err != nil {
		return 0, err
	}
	w.unpublish(q)
	w.dropped(q)
	return dropped, nil
}

// DropReplica drops this broker's copy of the replicated queue name,
// which its group's master deleted (the controller has it deleted
// already), and returns the Seqs of the messages the copy held
// (shards.Broker.DropReplica). Nothing is recorded.
func (w *Wiring) DropReplica(name string) []uint64 {
	defer w.lockNames(name)()
	q := w.Routing().queue(name)
	if q == nil {
		return nil
	}
	seqs, err := w.b.DropReplica(q)
	if err != nil {
		w.log.Warn("wiring: drop the copy of a deleted replicated queue", "queue", name, "err", err)
		return nil
	}
	w.unpublish(q)
	w.dropped(q)
	return seqs
}

func (w *Wiring) dropped(q *shards.Queue) {
	if w.cfg.Dropped != nil {
		w.cfg.Dropped(q)
	}
}

// unpublish removes a dropped queue from the routing. The queue's name
// lock is held.
func (w *Wiring) unpublish(q *shards.Queue) {
	if q.Owner() != nil {
		w.removeExclusive(q)
	}
	err := w.apply(q.Options.Durable, func(n *Routing) { n.removeQueue(q) })
	if err != nil {
		// The queue is gone from memory; on restart it comes back empty
		// of the messages whose dequeues were journaled.
		w.log.Error("wiring: save the wiring file after deleting a queue", "queue", q.Name, "err", err)
		w.mu.Lock()
		n := *w.routing.Load()
		n.removeQueue(q)
		w.routing.Store(&n)
		w.mu.Unlock()
	}
}

// autoDeleted removes a queue its shard dropped when its last consumer
// left.
func (w *Wiring) autoDeleted(q *shards.Queue) {
	defer w.lockNames(q.Name)()
	if w.Routing().queue(q.Name) != q {
		return
	}
	if q.Options.Durable && !q.Options.Exclusive && w.logged() {
		// The queue is gone from this broker already; a log that refuses
		// leaves it to come back empty on restart.
		if err := w.cfg.Log.DeleteQueue(q.Name); err != nil {
			w.log.Error("wiring: record an auto-deleted queue", "queue", q.Name, "err", err)
		} else {
			w.committed.Add(1)
		}
	}
	w.unpublish(q)
}

// DeleteExchange deletes an exchange and its bindings.
func (w *Wiring) DeleteExchange(name string, ifUnused bool) error {
	defer w.lockNames(name)()
	ex := w.Routing().exchange(name)
	if ex == nil {
		return shards.Errorf(wire.CodeNotFound, "no exchange %q", name)
	}
	if ifUnused && ex.count > 0 {
		return shards.Errorf(wire.CodePreconditionFailed, "exchange %q has bindings", name)
	}
	if ex.options.Durable && w.logged() {
		if err := w.cfg.Log.DeleteExchange(name); err != nil {
			return logError(err)
		}
		w.committed.Add(1)
	}
	return w.apply(ex.options.Durable, func(n *Routing) { n.removeExchange(name) })
}

// Purge drops every ready message of a queue and returns how many.
func (w *Wiring) Purge(name string) (int, error) {
	q := w.Routing().queue(name)
	if q == nil {
		return 0, shards.Errorf(wire.CodeNotFound, "no queue %q", name)
	}
	return w.b.Purge(q)
}

// SessionClosed requeues what the session held and deletes its exclusive
// queues. It may block; never call it from an event loop.
func (w *Wiring) SessionClosed(sess *shards.Session) {
	w.b.SessionClosed(sess)
	for _, q := range w.exclusiveOf(sess) {
		func() {
			defer w.lockNames(q.Name)()
			if w.Routing().queue(q.Name) != q {
				return
			}
			if _, err := w.b.DropQueue(q); err == nil {
				w.unpublish(q)
			}
		}()
	}
}

// Adopt makes sure the durable queue name, which the controller holds,
// exists on this broker too, and returns it: a replicated queue's events
// can reach a broker before the declare made on another broker does. It
// reads the controller's wiring (a consensus read) only when the queue is
// missing here, and records nothing: the controller has it already.
func (w *Wiring) Adopt(name string) (*shards.Queue, error) {
	if q := w.Routing().queue(name); q != nil {
		return q, nil
	}
	if w.cfg.Log == nil {
		return nil, shards.Errorf(wire.CodeNotFound, "no queue %q", name)
	}
	snap, err := w.cfg.Log.Load()
	if err != nil {
		return nil, logError(err)
	}
	for _, wq := range snap.Queues {
		if wq.Name != name {
			continue
		}
		defer w.lockNames(name)()
		if q := w.Routing().queue(name); q != nil {
			return q, nil
		}
		q, err := w.b.AddQueue(name, wq.Options, nil, w.place(name, wq.Options))
		if err != nil {
			return nil, err
		}
		if err := w.apply(false, func(n *Routing) { n.addQueue(q) }); err != nil {
			_, _ = w.b.DropQueue(q)
			return nil, err
		}
		return q, nil
	}
	return nil, shards.Errorf(wire.CodeNotFound, "no queue %q in the controller", name)
}
