package controlplane

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"time"

	"github.com/berthmq/berth/controlplane/ctlapi"
	"github.com/berthmq/berth/wire"
	pb "go.etcd.io/raft/v3/raftpb"
	"google.golang.org/protobuf/proto"
)

// Membership changes by joint consensus. A change is one ConfChangeV2 with
// JointImplicit transition: raft enters the joint configuration (old and new
// majorities both needed) and leaves it by itself once the change applies.
// The entry's context holds the complete address book of the new
// membership; applying it records that book in the state, so a restarted
// member, or one that received a snapshot, knows whom to talk to.
//
// Every member snapshots and compacts right after applying a change, so a
// member that joins later always starts from a snapshot carrying the right
// configuration rather than replaying entries from a configuration it never
// had. The raft goroutine applies the change's entry to the state and then
// the change to raft (applyConfChange) before it looks for a snapshot to
// take, so no snapshot records a configuration older than its index.

// confQueueMax bounds membership proposals waiting for the raft goroutine.
const confQueueMax = 4

type confRequest struct {
	cc   *pb.ConfChangeV2
	done chan error // cap 1
}

// confItem is a membership change and the index of its entry.
type confItem struct {
	cc    *pb.ConfChangeV2
	index uint64
}

func encodeAddressBook(book map[uint64]string) []byte { return ctlapi.AppendMembers(nil, book) }

func decodeAddressBook(b []byte) (map[uint64]string, error) {
	r := wire.NewReader(b)
	book := ctlapi.ReadMembers(r)
	return book, r.Done()
}

func inConf(cs *pb.ConfState, id uint64) bool {
	return slices.Contains(cs.GetVoters(), id) || slices.Contains(cs.GetVotersOutgoing(), id) ||
		slices.Contains(cs.GetLearners(), id) || slices.Contains(cs.GetLearnersNext(), id)
}

// ChangeMembership adds and removes controllers in one joint-consensus
// change and waits until the cluster has left the joint configuration.
// add maps new members' ids to their addresses. Only the leader accepts it.
//
// It refuses, with a message naming the reason, an id of 0, an address
// that is not host:port or is another member's, adding a member or
// removing a non-member, an id both added and removed, a change that
// leaves no member or more than VotersMax, and a change while another is
// in progress. A change whose outcome already holds (every added id is a
// voter at that address, every removed id is gone) succeeds without a
// new entry, so a caller that lost the reply can repeat it.
func (n *Node) ChangeMembership(ctx context.Context, add map[uint64]string, remove []uint64) error {
	if !n.isLdr.Load() {
		return &ctlapi.NotLeaderError{Leader: n.leaderAddr()}
	}
	n.confMu.Lock()
	cs := n.confState
	n.confMu.Unlock()
	if len(cs.GetVotersOutgoing()) > 0 {
		return errors.New("controlplane: a membership change is already in progress; retry when it completes")
	}
	target := map[uint64]bool{}
	for _, id := range cs.GetVoters() {
		target[id] = true
	}
	book := map[uint64]string{}
	n.peersMu.RLock()
	for id := range target {
		book[id] = n.peers[id]
	}
	n.peersMu.RUnlock()
	if len(add) == 0 && len(remove) == 0 {
		return errors.New("controlplane: a membership change must add or remove a controller")
	}
	removing := map[uint64]bool{}
	for _, id := range remove {
		if id == 0 {
			return errors.New("controlplane: cannot remove controller 0: ids start at 1")
		}
		if removing[id] {
			return fmt.Errorf("controlplane: controller %d is listed twice for removal", id)
		}
		if _, ok := add[id]; ok {
			return fmt.Errorf("controlplane: controller %d is both added and removed", id)
		}
		removing[id] = true
	}
	done := true
	for id, addr := range add {
		if !target[id] || book[id] != addr {
			done = false
		}
	}
	for id := range removing {
		if target[id] {
			done = false
		}
	}
	if done {
		return nil // already in effect: a repeated request
	}
	addrOwner := map[string]uint64{}
	for id, a := range book {
		addrOwner[a] = id
	}
	cc := &pb.ConfChangeV2{Transition: pb.ConfChangeTransitionJointImplicit.Enum()}
	for _, id := range slices.Sorted(maps.Keys(add)) {
		addr := add[id]
		if id == 0 {
			return errors.New("controlplane: cannot add controller 0: ids start at 1")
		}
		if target[id] {
			return fmt.Errorf("controlplane: cannot add controller %d: it is already a member (at %s)", id, book[id])
		}
		if err := ctlapi.CheckControllerAddr(addr); err != nil {
			return fmt.Errorf("controlplane: cannot add controller %d: %v", id, err)
		}
		if other, ok := addrOwner[addr]; ok && !removing[other] {
			return fmt.Errorf("controlplane: cannot add controller %d: controller %d already has the address %s", id, other, addr)
		}
		addrOwner[addr] = id
		target[id] = true
		book[id] = addr
		cc.Changes = append(cc.Changes, &pb.ConfChangeSingle{Type: pb.ConfChangeAddNode.Enum(), NodeId: proto.Uint64(id)})
	}
	for _, id := range remove {
		if !target[id] {
			return fmt.Errorf("controlplane: cannot remove controller %d: it is not a member", id)
		}
		delete(target, id)
		delete(book, id)
		cc.Changes = append(cc.Changes, &pb.ConfChangeSingle{Type: pb.ConfChangeRemoveNode.Enum(), NodeId: proto.Uint64(id)})
	}
	if len(target) == 0 {
		return errors.New("controlplane: a membership change must leave at least one controller")
	}
	if len(target) > ctlapi.VotersMax {
		return fmt.Errorf("controlplane: a controller group has at most %d members; this change would leave %d", ctlapi.VotersMax, len(target))
	}
	cc.Context = encodeAddressBook(book)
	req := confRequest{cc: cc, done: make(chan error, 1)}
	select {
	case n.confQ <- req:
	default:
		return ctlapi.ErrBusy
	}
	select {
	case err := <-req.done:
		if err != nil {
			return fmt.Errorf("controlplane: propose membership change: %w", err)
		}
	case <-ctx.Done():
		return fmt.Errorf("%w: %v", ctlapi.ErrTimeout, ctx.Err())
	case <-n.stop:
		return ctlapi.ErrStopped
	}
	want := slices.Sorted(maps.Keys(target))
	for {
		n.confMu.Lock()
		cs := n.confState
		n.confMu.Unlock()
		if slices.Equal(slices.Sorted(slices.Values(cs.GetVoters())), want) && len(cs.GetVotersOutgoing()) == 0 {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%w: membership change not complete: %v", ctlapi.ErrTimeout, ctx.Err())
		case <-n.stop:
			return ctlapi.ErrStopped
		case <-time.After(5 * time.Millisecond):
		}
	}
}

// Members returns the current voters.
func (n *Node) Members() []uint64 {
	n.confMu.Lock()
	defer n.confMu.Unlock()
	return slices.Sorted(slices.Values(n.confState.GetVoters()))
}

// memberAddrs returns the current voters with the addresses this node
// knows for them.
func (n *Node) memberAddrs() map[uint64]string {
	ids := n.Members()
	out := make(map[uint64]string, len(ids))
	n.peersMu.RLock()
	for _, id := range ids {
		out[id] = n.peers[id]
	}
	n.peersMu.RUnlock()
	return out
}

// decodeConfEntry reads a configuration change entry of either version.
func decodeConfEntry(e *pb.Entry) (*pb.ConfChangeV2, error) {
	switch e.GetType() {
	case pb.EntryConfChangeV2:
		cc := &pb.ConfChangeV2{}
		if err := proto.Unmarshal(e.GetData(), cc); err != nil {
			return nil, err
		}
		return cc, nil
	case pb.EntryConfChange:
		cc := &pb.ConfChange{}
		if err := proto.Unmarshal(e.GetData(), cc); err != nil {
			return nil, err
		}
		return cc.AsV2(), nil
	}
	return nil, fmt.Errorf("controlplane: entry type %v is no configuration change", e.GetType())
}

// applyConfChange runs on the raft goroutine.
func (n *Node) applyConfChange(c confItem) {
	cc := c.cc
	cs := n.rn.ApplyConfChange(cc)
	n.confMu.Lock()
	n.confState = cs
	n.confIndex = max(n.confIndex, c.index)
	n.confMu.Unlock()
	if len(cc.GetContext()) > 0 {
		if book, err := decodeAddressBook(cc.GetContext()); err == nil {
			n.peersMu.Lock()
			for id, a := range book {
				n.peers[id] = a
			}
			n.peersMu.Unlock()
			for id, a := range book {
				n.transport.addPeer(id, a)
			}
		}
	}
	// Members that left (once out of the joint configuration too) get no
	// more traffic.
	n.peersMu.Lock()
	for id := range n.peers {
		if id != n.self && !inConf(cs, id) {
			delete(n.peers, id)
			n.transport.removePeer(id)
		}
	}
	n.peersMu.Unlock()
	n.forceSnap.Store(true)
}

// adoptAddressBook points the transport at the members a restored state
// records, when membership ever changed.
func (n *Node) adoptAddressBook(book map[uint64]string) {
	if len(book) == 0 {
		return
	}
	n.peersMu.Lock()
	n.peers = maps.Clone(book)
	if _, ok := n.peers[n.self]; !ok {
		n.peers[n.self] = n.cfg.Peers[n.self]
	}
	n.peersMu.Unlock()
	for id, a := range book {
		n.transport.addPeer(id, a)
	}
}

// learnPeer records the address a peer announced in its connection hello,
// if this member has none for it and needs one: while joining (before the
// first snapshot brings the address book) or for a member of the current
// configuration. A joiner started with a partial peer list otherwise could
// not answer a leader it had no address for, and never got its snapshot.
func (n *Node) learnPeer(id uint64, addr string) {
	n.confMu.Lock()
	cs := n.confState
	n.confMu.Unlock()
	if !(len(cs.GetVoters()) == 0 && len(cs.GetLearners()) == 0) && !inConf(cs, id) {
		return
	}
	n.peersMu.Lock()
	if _, ok := n.peers[id]; ok || id == n.self {
		n.peersMu.Unlock()
		return
	}
	n.peers[id] = addr
	n.peersMu.Unlock()
	if n.transport.learnPeer(id, addr) {
		n.cfg.Logger.Info("controlplane: learned a member's address from its hello", "node", n.self, "member", id, "addr", addr)
	}
}
