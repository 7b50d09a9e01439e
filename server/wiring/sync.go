package wiring

import (
	"errors"

	"github.com/berthmq/berth/shards"
)

// Keeping in step with the controller. A broker's durable wiring comes
// from the controller at start (Restore), and its own changes go through
// the controller first; Sync brings in what other brokers changed since:
// their declares, binds, unbinds and deletes. The server calls it when
// the controller's applied index moves (server/wiringsync.go).
//
// Sync compares a snapshot of the controller's wiring with this broker's
// durable wiring (exchanges marked durable; queues durable and not
// exclusive; bindings between those) and makes this broker's match: it
// adds what is missing here and drops what the controller no longer
// holds, but only the queues Config.Droppable allows (the server lets it
// drop only copies that hold no messages: a group member's copy goes
// through its group's log). Nothing is recorded in the log: the
// controller has it already.
//
// A snapshot read while this broker made a change of its own may be
// older than that change, and acting on it would undo the change. So
// every change this broker commits to the log bumps a counter (under the
// name's lock, before it is applied), Sync is given the counter as it
// was before the snapshot was read (SyncToken), and it checks the counter
// under each name's lock before touching the name: a change in between
// ends the pass with ErrSyncRaced, and the caller reads again.

// ErrSyncRaced ends a Sync pass that met a change this broker made after
// the snapshot was read; read the snapshot again and retry.
var ErrSyncRaced = errors.New("wiring: a local change raced the sync; read the controller's wiring again")

// SyncToken returns the count of changes this broker committed to the
// log; take it before reading the snapshot given to Sync.
func (w *Wiring) SyncToken() uint64 { return w.committed.Load() }

// SyncStats counts what a Sync pass changed here.
type SyncStats struct {
	ExchangesAdded, ExchangesRemoved int
	QueuesAdded, QueuesRemoved       int
	BindingsAdded, BindingsRemoved   int
}

// Changed is the number of changes in s.
func (s SyncStats) Changed() int {
	return s.ExchangesAdded + s.ExchangesRemoved + s.QueuesAdded + s.QueuesRemoved + s.BindingsAdded + s.BindingsRemoved
}

// Sync makes this broker's durable wiring match snap, the controller's
// wiring read after SyncToken returned token. It returns what it changed,
// ErrSyncRaced if a local change came in between (what it did until then
// is consistent with the log, and stays), or the error of a shard that
// refused a queue.
func (w *Wiring) Sync(token uint64, snap *Snapshot) (SyncStats, error) {
	var st SyncStats
	if w.cfg.Log == nil || !w.restored.Load() {
		return st, nil
	}
	// locked takes the names' locks and reports whether no local change
	// came in since the snapshot; the caller unlocks.
	locked := func(names ...string) (func(), bool) {
		unlock := w.lockNames(names...)
		if w.committed.Load() != token {
			unlock()
			return nil, false
		}
		return unlock, true
	}

	// Exchanges first, then queues, then bindings, which need both; the
	// removals in the reverse order.
	want := make(map[string]WiringExchange, len(snap.Exchanges))
	for _, x := range snap.Exchanges {
		want[x.Name] = x
	}
	for _, x := range snap.Exchanges {
		if ex := w.Routing().exchange(x.Name); ex != nil && ex.kind == x.Kind && ex.options.Durable {
			continue
		}
		unlock, ok := locked(x.Name)
		if !ok {
			return st, ErrSyncRaced
		}
		ex := w.Routing().exchange(x.Name)
		if ex != nil && (ex.kind != x.Kind || !ex.options.Durable) {
			// A local exchange of that name, not the cluster's (it was
			// deleted and declared again elsewhere with other settings,
			// or this one is transient): the controller's wins.
			_ = w.apply(false, func(n *Routing) { n.removeExchange(x.Name) })
			st.ExchangesRemoved++
			ex = nil
		}
		if ex == nil {
			_ = w.apply(false, func(n *Routing) { n.addExchange(x.Name, x.Kind, x.Options) })
			st.ExchangesAdded++
		}
		unlock()
	}

	wantQ := make(map[string]shards.QueueOptions, len(snap.Queues))
	for _, q := range snap.Queues {
		wantQ[q.Name] = q.Options
	}
	for _, wq := range snap.Queues {
		q := w.Routing().queue(wq.Name)
		if q != nil && *q.Options == wq.Options {
			continue
		}
		unlock, ok := locked(wq.Name)
		if !ok {
			return st, ErrSyncRaced
		}
		// Asked under the name's lock, with no local change since the
		// snapshot: Syncable writes down a queue it refuses as another
		// broker's own (the foreign list), and a declare of this name in
		// flight here (committed in the controller, not applied yet)
		// must not be taken for one. It was asked before the lock, and a
		// broker's own queue declared before "cluster init" could go on
		// its foreign list: after a restart it was not restored, and its
		// messages were dropped as orphans.
		if q == nil && w.cfg.Syncable != nil && w.Routing().queue(wq.Name) == nil && !w.cfg.Syncable(wq.Name, wq.Options) {
			unlock()
			continue
		}
		err := w.syncQueueLocked(wq, &st)
		unlock()
		if err != nil {
			return st, err
		}
	}

	wantB := make(map[Binding]struct{}, len(snap.Bindings))
	for _, b := range snap.Bindings {
		wantB[b] = struct{}{}
		r := w.Routing()
		if r.hasBinding(b.Exchange, b.Queue, b.Key) || r.exchange(b.Exchange) == nil || r.queue(b.Queue) == nil {
			continue
		}
		unlock, ok := locked(b.Exchange, b.Queue)
		if !ok {
			return st, ErrSyncRaced
		}
		r = w.Routing()
		if q := r.queue(b.Queue); q != nil && r.exchange(b.Exchange) != nil && !r.hasBinding(b.Exchange, b.Queue, b.Key) {
			_ = w.apply(false, func(n *Routing) { n.bind(b.Exchange, q, b.Key) })
			st.BindingsAdded++
		}
		unlock()
	}

	// What the controller no longer holds: durable bindings, queues and
	// exchanges of this broker that snap lacks.
	var staleB []Binding
	var staleQ []string
	r := w.Routing()
	r.queues.All(func(name string, q *shards.Queue) bool {
		if !q.Options.Durable || q.Options.Exclusive {
			return true
		}
		if _, ok := wantQ[name]; !ok {
			if w.cfg.Droppable == nil || w.cfg.Droppable(q) {
				staleQ = append(staleQ, name)
			}
			return true
		}
		for _, bd := range r.liveBindings(name) {
			if ex := r.exchange(bd.exchange); ex == nil || !ex.options.Durable {
				continue
			}
			b := Binding{Exchange: bd.exchange, Queue: name, Key: bd.key}
			if _, ok := wantB[b]; !ok {
				staleB = append(staleB, b)
			}
		}
		return true
	})
	var staleX []string
	r.exchanges.All(func(name string, ex *exchange) bool {
		if _, ok := want[name]; !ok && ex.options.Durable {
			staleX = append(staleX, name)
		}
		return true
	})
	for _, b := range staleB {
		unlock, ok := locked(b.Exchange, b.Queue)
		if !ok {
			return st, ErrSyncRaced
		}
		r := w.Routing()
		if q := r.queue(b.Queue); q != nil && r.hasBinding(b.Exchange, b.Queue, b.Key) {
			_ = w.apply(false, func(n *Routing) { n.unbind(b.Exchange, q, b.Key) })
			st.BindingsRemoved++
		}
		unlock()
	}
	for _, name := range staleQ {
		unlock, ok := locked(name)
		if !ok {
			return st, ErrSyncRaced
		}
		if q := w.Routing().queue(name); q != nil && q.Options.Durable && !q.Options.Exclusive {
			if w.dropLocked(q) {
				st.QueuesRemoved++
			}
		}
		unlock()
	}
	for _, name := range staleX {
		unlock, ok := locked(name)
		if !ok {
			return st, ErrSyncRaced
		}
		if ex := w.Routing().exchange(name); ex != nil && ex.options.Durable {
			_ = w.apply(false, func(n *Routing) { n.removeExchange(name) })
			st.ExchangesRemoved++
		}
		unlock()
	}
	return st, nil
}

// syncQueueLocked adds the queue wq.Name here if it is missing. Its name
// lock is held.
func (w *Wiring) syncQueueLocked(wq WiringQueue, st *SyncStats) error {
	q := w.Routing().queue(wq.Name)
	if q != nil && *q.Options == wq.Options {
		return nil
	}
	if q != nil {
		// A queue of that name with other options: this broker's own
		// transient or exclusive one, or the cluster's deleted and
		// declared again elsewhere, whose old copy its group's log
		// drops here (DropReplica), after which a pass adds the new
		// one. A pass never drops a queue for its options: a copy
		// with messages is not the place to guess.
		if _, seen := w.syncWarned[wq.Name]; !seen {
			if w.syncWarned == nil {
				w.syncWarned = map[string]struct{}{}
			}
			w.syncWarned[wq.Name] = struct{}{}
			w.log.Warn("wiring: a queue here differs from the cluster's queue of the same name; left as it is", "queue", wq.Name)
		}
		return nil
	}
	nq, err := w.b.AddQueue(wq.Name, wq.Options, nil, w.place(wq.Name, wq.Options))
	if err != nil {
		return err
	}
	if err := w.apply(false, func(n *Routing) { n.addQueue(nq) }); err != nil {
		_, _ = w.b.DropQueue(nq)
		return err
	}
	st.QueuesAdded++
	return nil
}

// dropLocked drops q, which another broker deleted, from its shard and
// the routing, as DropReplica does. Its name lock is held.
func (w *Wiring) dropLocked(q *shards.Queue) bool {
	if _, err := w.b.DropQueue(q); err != nil {
		w.log.Warn("wiring: drop a queue the controller no longer holds", "queue", q.Name, "err", err)
		return false
	}
	w.unpublish(q)
	w.dropped(q)
	return true
}
