package server

import (
	"errors"
	"slices"
	"time"

	"github.com/berthmq/berth/server/wiring"
	"github.com/berthmq/berth/shards"
)

// Wiring made through other brokers. Every durable declare, bind, unbind
// and delete is committed in the controller by the broker that took it;
// the other brokers learn of it here: watchWiring long-polls the
// controller's applied index (WaitChange) and, when it moves, reads the
// controller's wiring (a follower read as fresh as the leader's commit)
// and brings this broker's in step (wiring.Sync). Before it, a queue
// declared at one broker was unknown to the others until they restarted:
// a publish there to it was refused with not-found.
//
// A pass reads the whole wiring, so passes are spaced by ten times the
// last one's duration, at least wiringSyncMin: a broker with a million
// queues (a pass of about a second) spends about a tenth of a core on it
// while the wiring keeps changing, and nothing once it stops. (Spacing
// small wirings by wiringSyncMin alone was tried: during a storm of
// 20,000 declares it made 28 passes instead of 7 and cost the declaring
// broker a fifth of its rate.)
const (
	wiringSyncMin   = 50 * time.Millisecond
	wiringSyncMax   = 30 * time.Second
	wiringSyncRetry = 500 * time.Millisecond
)

func (s *Server) watchWiring() {
	defer s.regWG.Done()
	wl := s.wiringLog
	spacing := wiringSyncMin
	s.followApplied(0, wiringSyncRetry, func() time.Duration { return spacing }, func() bool {
		start := time.Now()
		token := s.wiring.SyncToken()
		snap, err := wl.Load()
		var st wiring.SyncStats
		if err == nil {
			st, err = s.wiring.Sync(token, snap)
		}
		took := time.Since(start)
		spacing = min(max(10*took, wiringSyncMin), wiringSyncMax)
		s.metrics.wiringSyncSeconds.Observe(took.Seconds())
		if st.Changed() > 0 {
			s.log.Info("wiring: brought in changes made through other brokers",
				"exchanges_added", st.ExchangesAdded, "exchanges_removed", st.ExchangesRemoved,
				"queues_added", st.QueuesAdded, "queues_removed", st.QueuesRemoved,
				"bindings_added", st.BindingsAdded, "bindings_removed", st.BindingsRemoved,
				"queues", len(snap.Queues), "took", took.Round(time.Microsecond))
		}
		switch {
		case s.regCtx.Err() != nil:
			return false
		case errors.Is(err, wiring.ErrSyncRaced):
			return false // read again: this broker's own change moved the index anyway
		case err != nil:
			s.metrics.wiringSyncFailures.Inc()
			// Backing off: a wiring too large to read (a controller
			// answer is at most 64 MiB) would otherwise be read again
			// and again.
			spacing = min(max(2*spacing, wiringSyncRetry), wiringSyncMax)
			s.log.Warn("server: bringing in wiring changes from the controller failed; retrying", "err", err, "in", spacing)
			return false
		}
		s.metrics.wiringSyncs.Inc()
		if r := s.replicator; r != nil && r.ForeignLen() > 0 {
			// Another broker's local queue that the controller no
			// longer holds is no longer kept off this broker.
			held := make(map[string]bool, len(snap.Queues))
			for _, q := range snap.Queues {
				held[q.Name] = true
			}
			if err := r.RemoveForeignMissing(func(name string) bool { return held[name] }); err != nil {
				s.log.Error("server: updating the list of other brokers' local queues failed", "err", err)
			}
		}
		return true
	})
}

// syncable says whether a durable queue declared through another broker
// is to be added here: a replicated one is, since every broker routes to
// it (its group's members apply its events, the others forward to its
// master). One the cluster keeps local stays on the broker that declared
// it (OPERATIONS.md): a queue seen here while the cluster has no groups
// was declared before "berthctl cluster init", and goes on this broker's
// list of foreign queues, which it never restores or declares.
func (s *Server) syncable(name string, opts shards.QueueOptions) bool {
	r := s.replicator
	if r == nil || !opts.Durable || opts.Exclusive || r.IsLocal(name) || r.IsForeign(name) {
		return false
	}
	n, known := r.GroupCount(s.regCtx)
	if !known {
		return false // the next pass decides
	}
	if n == 0 {
		if err := r.AddForeign(name); err != nil {
			s.log.Error("server: writing down another broker's local queue failed", "queue", name, "err", err)
		}
		return false
	}
	return true
}

// foreignQueue reports whether name is another broker's local queue
// (replication/localqueues.go): not restored here, not declared here.
func (s *Server) foreignQueue(name string) bool {
	return s.replicator != nil && s.replicator.IsForeign(name)
}

// syncDroppable says whether a pass may drop q, a durable queue the
// controller no longer holds: only a replicated queue's copy at a broker
// outside its group's replica set, which forwards to the master and holds
// no message. A member's copy goes when its group's log applies the
// deletion (DropReplica), and a queue this broker keeps to itself is
// never dropped by a pass.
func (s *Server) syncDroppable(q *shards.Queue) bool {
	g, ok := q.Replicated()
	if !ok {
		return false
	}
	m := s.groups.Load()
	if m == nil {
		return false
	}
	v := m.View()
	if v == nil || int(g) >= len(v.Groups) || len(v.Groups[g].Replicas) == 0 {
		return false
	}
	return !slices.Contains(v.Groups[g].Replicas, s.brokerID)
}
