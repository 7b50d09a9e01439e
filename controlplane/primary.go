package controlplane

// Active-passive mode: the primary broker.
//
// In active-active mode (the default) every broker takes clients. In
// active-passive mode (SetClusterConfig Mode ModeActivePassive) the
// controller also elects one primary broker and moves the role when that
// broker dies (berthctl primary shows it, "primary elect" hands it over).
// Brokers do not act on the role yet: every broker still takes clients,
// and nothing refuses or redirects them to the primary (GetPrimary serves
// whoever would). The state holds the primary's broker
// id (0: none) and the primary epoch, which every change of primary bumps,
// clearing it included, and which never goes back, across mode switches too,
// so that a broker acting as primary could fence itself with it.
//
// The ElectPrimary event carries the heartbeat snapshot it is decided from,
// as ElectMaster does for groups: for each candidate, whether it is alive
// and Data, the sum of the indexes of the group log ends it last reported.
// Apply, on every controller alike:
//
//  1. refuses with CodeWrongMode unless the cluster is active-passive, and
//     with CodeStaleEpoch unless the event's Epoch is the current primary
//     epoch (it was decided from an old view; a newer election won);
//  2. with Preferred set (an admin handover): the preferred broker becomes
//     primary if it is registered (else CodeNotFound) and not reported dead
//     in the snapshot (else CodeInvalid). A snapshot without it, as the
//     client's admin call sends, does not veto it; if it is in fact dead the
//     failure detector moves the role on within one broker timeout;
//  3. otherwise a live registered primary keeps the role (no change);
//  4. otherwise the live registered candidate with the highest Data wins,
//     ties to the lowest broker id;
//  5. with no live candidate a primary is cleared under a new epoch, which
//     fences it; with none to clear nothing changes.
//
// Result.Value is 1 when the primary changed, else 0.
//
// Switching the mode to active-passive changes nothing by itself: the
// leader's failure detector (scanLoop) elects a primary at its next scan
// once a broker is alive. Switching back to active-active clears the
// primary under a new epoch. Removing the primary's broker (CleanBrokerData)
// clears it the same way; the detector then elects another.
//
// The failure detector, on the leader, at each scan in active-passive mode:
// with no primary, if some registered broker is alive, it proposes an
// election from all live registered brokers (O(brokers)); with a primary,
// it looks up that one broker's heartbeat entry (O(1)) and proposes an
// election when the broker is dead. A primary this leader has no entry for
// (a new leader before its first heartbeat) gets one broker timeout.
//
// Persistence: the primary and its epoch are fields of the state and of
// snapshot format 3; a format 2 snapshot decodes as "no primary, epoch 0".

import (
	"context"
	"slices"
	"time"

	"github.com/berthmq/berth/controlplane/ctlapi"
)

// Primary returns the primary broker (0: none) and the primary epoch.
func (s *State) Primary() (broker, epoch uint32) {
	return s.primary, s.primaryEpoch
}

// setPrimary records broker as primary under the next epoch.
func (s *State) setPrimary(broker uint32) {
	s.primary = broker
	s.primaryEpoch++
}

// clearPrimary removes the primary, if any, under a new epoch.
func (s *State) clearPrimary() {
	if p, _ := s.Primary(); p != 0 {
		s.setPrimary(0)
	}
}

func (s *State) electPrimary(ev *ctlapi.ElectPrimary) ctlapi.Result {
	if s.config.Mode != ctlapi.ModeActivePassive {
		return fail(ctlapi.CodeWrongMode, "cluster is active-active: it has no primary")
	}
	cur, epoch := s.Primary()
	if ev.Epoch != epoch {
		return fail(ctlapi.CodeStaleEpoch, "primary epoch is %d, not %d", epoch, ev.Epoch)
	}
	if epoch == ^uint32(0) {
		return fail(ctlapi.CodeInvalid, "primary epoch space exhausted")
	}
	winner, res := decidePrimary(cur, ev, s.brokers)
	if res.Code != ctlapi.CodeOK {
		return res
	}
	if winner == cur {
		return ctlapi.Result{}
	}
	s.setPrimary(winner)
	return ctlapi.Result{Value: 1}
}

// decidePrimary is the election rule described at the top of this file. It
// returns the primary after the event (cur when nothing changes).
func decidePrimary(cur uint32, ev *ctlapi.ElectPrimary, brokers map[uint32]*ctlapi.Broker) (uint32, ctlapi.Result) {
	if ev.Preferred != 0 {
		if brokers[ev.Preferred] == nil {
			return cur, fail(ctlapi.CodeNotFound, "broker %d is not registered", ev.Preferred)
		}
		for _, c := range ev.Candidates {
			if c.Broker == ev.Preferred && !c.Alive {
				return cur, fail(ctlapi.CodeInvalid, "broker %d is not alive", ev.Preferred)
			}
		}
		return ev.Preferred, ctlapi.Result{}
	}
	var best ctlapi.PrimaryCandidate
	found := false
	for _, c := range ev.Candidates {
		if !c.Alive || brokers[c.Broker] == nil {
			continue
		}
		if c.Broker == cur {
			return cur, ctlapi.Result{} // the primary lives: it keeps the role
		}
		if !found || c.Data > best.Data || (c.Data == best.Data && c.Broker < best.Broker) {
			best, found = c, true
		}
	}
	if !found {
		return 0, ctlapi.Result{}
	}
	return best.Broker, ctlapi.Result{}
}

// primaryAlive reports whether broker id still counts as alive for keeping
// the primary role. A broker this leader has no entry for is seeded and gets
// the new leader's grace, so a new leader does not move the primary before
// the primary could heartbeat to it.
func (h *heartbeats) primaryAlive(id uint32, now time.Time) bool {
	s := h.shard(id)
	s.mu.Lock()
	if e := s.brokers[id]; e != nil {
		alive := !e.dead && now.Before(e.deadline)
		s.mu.Unlock()
		return alive
	}
	s.mu.Unlock()
	h.seed(id, now)
	return true
}

// primaryCandidate is broker id's entry in a primary election's snapshot.
func (h *heartbeats) primaryCandidate(id uint32, now time.Time) ctlapi.PrimaryCandidate {
	s := h.shard(id)
	s.mu.Lock()
	defer s.mu.Unlock()
	c := ctlapi.PrimaryCandidate{Broker: id}
	if e := s.brokers[id]; e != nil {
		c.Alive = e.heard && !e.dead && now.Before(e.deadline)
		c.Data = e.data
	}
	return c
}

// primaryElection builds the ElectPrimary event the failure detector would
// propose now, or nil when nothing needs electing: the mode is
// active-active, or the primary lives, or there is no primary and no live
// broker to make one. preferred, if not 0, asks for a handover and always
// gives an event.
func (n *Node) primaryElection(now time.Time, preferred uint32) *ctlapi.ElectPrimary {
	n.mu.RLock()
	defer n.mu.RUnlock()
	if n.state.Config().Mode != ctlapi.ModeActivePassive {
		return nil
	}
	cur, epoch := n.state.Primary()
	if preferred == 0 && cur != 0 && n.hb.primaryAlive(cur, now) {
		return nil
	}
	ev := &ctlapi.ElectPrimary{Epoch: epoch, Preferred: preferred}
	if cur != 0 {
		ev.Candidates = append(ev.Candidates, n.hb.primaryCandidate(cur, now))
	}
	if preferred != 0 && preferred != cur {
		ev.Candidates = append(ev.Candidates, n.hb.primaryCandidate(preferred, now))
	}
	live := 0
	for id := range n.state.brokers {
		if len(ev.Candidates) >= ctlapi.PrimaryCandidatesMax {
			break
		}
		if id == cur || id == preferred {
			continue
		}
		if c := n.hb.primaryCandidate(id, now); c.Alive {
			ev.Candidates = append(ev.Candidates, c)
			live++
		}
	}
	if preferred == 0 && cur == 0 && live == 0 {
		return nil // nobody to elect; proposing would change nothing
	}
	// Map order is random; the rule does not depend on it, but sorted
	// events are easier to read in a log dump.
	slices.SortFunc(ev.Candidates, func(a, b ctlapi.PrimaryCandidate) int { return int(int64(a.Broker) - int64(b.Broker)) })
	return ev
}

// scanPrimary is the failure detector's primary step. It returns a channel
// closed when its proposal, if any, finishes.
func (n *Node) scanPrimary(now time.Time) <-chan struct{} {
	ev := n.primaryElection(now, 0)
	if ev == nil {
		return nil
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		// A refusal (stale epoch, mode switched meanwhile) or a lost
		// proposal needs no retry bookkeeping: the next scan decides again
		// from the state as it is then.
		n.Propose(ctx, ev)
	}()
	return done
}

// ElectPrimaryNow proposes a primary election from this leader's heartbeat
// data. preferred, if not 0, hands the role to that broker, which must be
// registered and not known dead; 0 elects only if the primary is missing or
// dead. A refusal by the state machine is returned as a *ResultError.
func (n *Node) ElectPrimaryNow(ctx context.Context, preferred uint32) (ctlapi.Result, error) {
	if !n.isLdr.Load() {
		return ctlapi.Result{}, &ctlapi.NotLeaderError{Leader: n.leaderAddr()}
	}
	ev := n.primaryElection(time.Now(), preferred)
	if ev == nil {
		n.mu.RLock()
		mode := n.state.Config().Mode
		n.mu.RUnlock()
		if mode != ctlapi.ModeActivePassive {
			return ctlapi.Result{}, &ctlapi.ResultError{Code: ctlapi.CodeWrongMode, Msg: "cluster is active-active: it has no primary"}
		}
		return ctlapi.Result{}, nil // nothing to change
	}
	res, err := n.Propose(ctx, ev)
	if err != nil {
		return res, err
	}
	return res, res.Err()
}

// primaryData sums the indexes of reported log ends, saturating.
func primaryData(ends []ctlapi.GroupLogEnd) uint64 {
	var sum uint64
	for _, l := range ends {
		if sum+l.LogEnd.Index < sum {
			return ^uint64(0)
		}
		sum += l.LogEnd.Index
	}
	return sum
}
