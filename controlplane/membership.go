package controlplane

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"time"

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
// had. With asynchronous storage writes the state machine applies the
// change's entry on the apply goroutine and raft applies the change on its
// own goroutine just after; snapshots wait until both have (confSeen,
// confIndex), so none records a configuration older than its index.

// confQueueMax bounds membership proposals waiting for the raft goroutine.
const confQueueMax = 4

type confRequest struct {
	cc   *pb.ConfChangeV2
	done chan error // cap 1
}

func encodeAddressBook(book map[uint64]string) []byte {
	e := encoder{}
	e.u32(uint32(len(book)))
	for _, id := range slices.Sorted(maps.Keys(book)) {
		e.u64(id)
		e.str(book[id])
	}
	return e.b
}

func decodeAddressBook(b []byte) (map[uint64]string, error) {
	d := decoder{b: b}
	n := d.count(10)
	book := make(map[uint64]string, n)
	for i := 0; i < n; i++ {
		id := d.u64()
		book[id] = d.str()
	}
	return book, d.finish()
}

func inConf(cs *pb.ConfState, id uint64) bool {
	return slices.Contains(cs.GetVoters(), id) || slices.Contains(cs.GetVotersOutgoing(), id) ||
		slices.Contains(cs.GetLearners(), id) || slices.Contains(cs.GetLearnersNext(), id)
}

// ChangeMembership adds and removes controllers in one joint-consensus
// change and waits until the cluster has left the joint configuration.
// add maps new members' ids to their addresses. Only the leader accepts it.
func (n *Node) ChangeMembership(ctx context.Context, add map[uint64]string, remove []uint64) error {
	if !n.isLdr.Load() {
		return &NotLeaderError{Leader: n.leaderAddr()}
	}
	n.confMu.Lock()
	cs := n.confState
	n.confMu.Unlock()
	if len(cs.GetVotersOutgoing()) > 0 {
		return errors.New("controlplane: a membership change is already in progress")
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
	cc := &pb.ConfChangeV2{Transition: pb.ConfChangeTransitionJointImplicit.Enum()}
	for id, addr := range add {
		if id == 0 || addr == "" || len(addr) > nameLenMax || target[id] {
			return fmt.Errorf("controlplane: cannot add controller %d at %q", id, addr)
		}
		target[id] = true
		book[id] = addr
		cc.Changes = append(cc.Changes, &pb.ConfChangeSingle{Type: pb.ConfChangeAddNode.Enum(), NodeId: proto.Uint64(id)})
	}
	for _, id := range remove {
		if !target[id] {
			return fmt.Errorf("controlplane: controller %d is not a member", id)
		}
		delete(target, id)
		delete(book, id)
		cc.Changes = append(cc.Changes, &pb.ConfChangeSingle{Type: pb.ConfChangeRemoveNode.Enum(), NodeId: proto.Uint64(id)})
	}
	if len(target) == 0 || len(cc.Changes) == 0 {
		return errors.New("controlplane: a membership change must change something and leave a member")
	}
	cc.Context = encodeAddressBook(book)
	req := confRequest{cc: cc, done: make(chan error, 1)}
	select {
	case n.confQ <- req:
	default:
		return ErrBusy
	}
	select {
	case err := <-req.done:
		if err != nil {
			return fmt.Errorf("controlplane: propose membership change: %w", err)
		}
	case <-ctx.Done():
		return fmt.Errorf("%w: %v", ErrTimeout, ctx.Err())
	case <-n.stop:
		return ErrStopped
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
			return fmt.Errorf("%w: membership change not complete: %v", ErrTimeout, ctx.Err())
		case <-n.stop:
			return ErrStopped
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
	if n.cfg.AsyncStorageWrites {
		// The apply goroutine takes snapshots in this mode; wake it.
		select {
		case n.applyQ <- applyItem{}:
		default: // a full queue wakes it anyway
		}
	}
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
