package controlplane

import (
	"math"
	"slices"

	"github.com/berthmq/berth/controlplane/ctlapi"
)

// preferNewEpoch is the preferred broker a group's master names when it
// asks for a new epoch of a group it mastered before it restarted
// (replication/groups): no broker has the id, so the election moves the epoch
// on and the live master may win it again.
const preferNewEpoch = math.MaxUint32

// checkElect refuses, before anything is proposed, an election asked
// for a group that does not exist or naming a preferred broker that
// cannot win it: one that is not registered, or not in the group's
// replica set. An election for such a broker used to go ahead: it bumped
// the epochs, emptied the SyncStateSets down to the master (whose
// followers then had to catch up again) and was reported as groups
// getting a new master while the masters stayed. It holds n.mu for
// reading; ok is false with the refusal in res.
func (n *Node) checkElect(groups []uint32, preferred uint32) (res ctlapi.Result, ok bool) {
	n.mu.RLock()
	defer n.mu.RUnlock()
	check := preferred != 0 && preferred != preferNewEpoch
	if _, known := n.state.Broker(preferred); check && !known {
		return fail(ctlapi.CodeNotFound, "preferred broker %d is not registered; nothing was elected", preferred), false
	}
	for _, gid := range groups {
		g, exists := n.state.Group(gid)
		if !exists {
			return fail(ctlapi.CodeNotFound, "group %d does not exist (the cluster has %d groups); nothing was elected", gid, n.state.Config().Groups), false
		}
		if check && len(g.Replicas) > 0 && !slices.Contains(g.Replicas, preferred) {
			return fail(ctlapi.CodeInvalid, "preferred broker %d is not a replica of group %d (replicas %v) and cannot master it; nothing was elected",
				preferred, gid, g.Replicas), false
		}
	}
	return ctlapi.Result{}, true
}
