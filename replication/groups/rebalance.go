package groups

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/berthmq/berth/controlplane/ctlapi"
)

// Rebalancing. The controller places each group with its replicas in an
// order whose first broker is the group's preferred master: the
// placement spreads the first replicas, and so the masters, evenly over
// the brokers. A failover moves the groups of a dead broker to the
// others, and nothing moved them back: a broker that restarted served as
// a follower only, and the survivors carried its masters' load for good.
// Now the master of a group whose preferred broker is back hands the
// group over to it, as Kafka's preferred-leader election does:
//
//  1. Every Rebalance interval, the master lists the groups it masters
//     whose preferred broker is in their SyncStateSet, and was at the
//     previous look too, in the same epoch: a broker that just rejoined
//     has to stay in sync for a whole interval first.
//  2. For each in turn it stops taking publishes for the group (they
//     fail with group.ErrHandover, a retryable error with nothing
//     proposed; ManagerConfig.HandoverHolds says which proposals are
//     publishes, and consumers' settles go on), waits until everything
//     in its log is committed, which means every member of the set, the
//     preferred one included, holds it durably, and asks the controller
//     for a handover (ctlclient.Handover) with its log end. A settle
//     proposed after that and not committed before the new epoch ends
//     as in a failover: its outcome unknown, its message delivered again.
//  3. The controller elects the preferred broker under a new epoch; this
//     broker learns it as any election and becomes a follower. No
//     publish is lost, since none was proposed during the pause, and
//     what its consumers held unaccepted is delivered again by the new
//     master (guarantee 6).
//
// A pause that does not end in a handover (the preferred broker does not
// catch up within handoverCatchUp, or the controller refuses) ends at
// once, and the pause never outlives handoverPauseMax even if the
// controller's answer is lost.
const (
	// RebalanceDefault is berthd's rebalance interval.
	RebalanceDefault = 30 * time.Second
	handoverCatchUp  = time.Second
	handoverPauseMax = 3 * time.Second
	handoverPoll     = 2 * time.Millisecond
)

// rebalance hands groups over to their preferred masters every interval.
func (m *Manager) rebalance(n *Node, every time.Duration) {
	defer m.wg.Done()
	t := time.NewTicker(every)
	defer t.Stop()
	seen := map[uint32]uint32{} // group -> epoch its preferred broker was in sync at the last look
	for {
		select {
		case <-m.ctx.Done():
			return
		case <-t.C:
		}
		v := m.View()
		if v == nil {
			continue
		}
		next := map[uint32]uint32{}
		for _, g := range v.Groups {
			to, ok := m.handoverTarget(n, g)
			if !ok {
				continue
			}
			if ep, ok := seen[g.ID]; !ok || ep != g.Epoch {
				next[g.ID] = g.Epoch
				continue
			}
			if err := m.handover(n, g.ID, to); err != nil {
				m.log.Info("groups: rebalance: the handover did not happen; the group keeps its master", "group", g.ID, "to", to, "err", err)
				next[g.ID] = g.Epoch
				continue
			}
			m.log.Info("groups: rebalance: handed the group over to its preferred master", "group", g.ID, "to", to)
		}
		seen = next
	}
}

// handoverTarget reports the broker to hand group g over to: its
// preferred master, when this broker masters g in the controller's
// record and its node, and the preferred one is in the SyncStateSet.
func (m *Manager) handoverTarget(n *Node, g ctlapi.Group) (uint32, bool) {
	if g.Master != m.cfg.Self || len(g.Replicas) == 0 || g.Replicas[0] == m.cfg.Self || !slices.Contains(g.SyncStateSet, g.Replicas[0]) {
		return 0, false
	}
	if st, err := n.Status(g.ID); err != nil || st.Epoch != g.Epoch || !n.IsMaster(g.ID) {
		return 0, false
	}
	return g.Replicas[0], true
}

// handover hands group g over to broker to (steps 2 and 3 above). It
// returns nil once the controller moved the master; the node then learns
// the new epoch from the controller as usual.
func (m *Manager) handover(n *Node, g, to uint32) error {
	if err := n.BeginHandover(g, to, handoverPauseMax); err != nil {
		return err
	}
	ended := false
	defer func() {
		if !ended {
			n.EndHandover(g)
		}
	}()
	deadline := time.Now().Add(handoverCatchUp)
	var epoch uint32
	var end ctlapi.LogEnd
	for {
		ok, ep, le, err := n.HandoverReady(g)
		if err != nil {
			return err
		}
		if ok {
			epoch, end = ep, le
			break
		}
		if ep == 0 || !n.IsMaster(g) {
			return fmt.Errorf("no longer master")
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("broker %d did not catch up within %v", to, handoverCatchUp)
		}
		select {
		case <-m.ctx.Done():
			return m.ctx.Err()
		case <-time.After(handoverPoll):
		}
	}
	var moved bool
	err := m.call(func(ctx context.Context) error {
		var err error
		moved, err = m.cfg.Ctl.Handover(ctx, ctlapi.Handover{Group: g, Epoch: epoch, From: m.cfg.Self, To: to, LogEnd: end})
		return err
	})
	if err != nil {
		return err
	}
	if !moved {
		return fmt.Errorf("the controller kept the master")
	}
	// The pause holds until the new epoch reaches the node: proposals
	// taken meanwhile would only be truncated.
	ended = true
	m.handovers.Add(1)
	return nil
}

// Handovers is how many groups this broker has handed to their preferred
// masters.
func (m *Manager) Handovers() uint64 { return m.handovers.Load() }
