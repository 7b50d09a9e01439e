package controlplane

import (
	"context"
	"encoding/binary"
	"fmt"
	"sync"
	"time"

	"github.com/berthmq/berth/controlplane/ctlapi"
	"go.etcd.io/raft/v3"
)

// The read paths: ReadIndex and the leader's lease (drainReads,
// deliverReadStates), follower reads, and Read, which serves a read mode.

// Bounds on reads.
const (
	// readQueueMax bounds reads waiting for a ReadIndex.
	readQueueMax = 1 << 16
	// readBatchesMax bounds ReadIndex requests in flight.
	readBatchesMax = 1024
	// readRoundsMax bounds the ReadIndex rounds a node keeps in flight;
	// readers arriving meanwhile join the next round, so under load each
	// heartbeat round answers many readers.
	readRoundsMax = 2
	// readBatchTimeout drops a ReadIndex request whose answer was lost
	// (raft drops them silently, for example without a leader).
	readBatchTimeout = 3 * time.Second
)

type readRequest struct {
	follower bool
	done     chan readIndexResult // cap 1
	// seal, if set, is closed to newcomers by the raft goroutine before
	// the request's index is taken: readers that joined before it are
	// covered by the index, later ones must not join.
	seal *readSeal
}

// readSeal lets readers join a queued ReadIndex request until the raft
// goroutine takes its index.
type readSeal struct {
	mu     sync.Mutex
	sealed bool // guarded by mu
}

func sealReads(q []*readRequest) {
	for _, r := range q {
		if r.seal != nil {
			r.seal.mu.Lock()
			r.seal.sealed = true
			r.seal.mu.Unlock()
		}
	}
}

type readIndexResult struct {
	index uint64
	err   error
}

// ReadIndex returns an index such that the state at or after it reflects
// every write completed before the call. With follower set it may run on a
// follower; it fails with *LaggingError if the follower is too far behind.
func (n *Node) ReadIndex(ctx context.Context, follower bool) (uint64, error) {
	return n.readIndex(ctx, follower, nil)
}

// readIndex is ReadIndex for readers that may join until seal is sealed.
func (n *Node) readIndex(ctx context.Context, follower bool, seal *readSeal) (uint64, error) {
	if !follower && !n.isLdr.Load() {
		return 0, &ctlapi.NotLeaderError{Leader: n.leaderAddr()}
	}
	if n.lead.Load() == 0 {
		return 0, &ctlapi.NotLeaderError{}
	}
	r := &readRequest{follower: follower, done: make(chan readIndexResult, 1), seal: seal}
	n.readMu.Lock()
	if len(n.readQ) >= readQueueMax {
		n.readMu.Unlock()
		return 0, ctlapi.ErrBusy
	}
	n.readQ = append(n.readQ, r)
	n.readMu.Unlock()
	signal(n.readSignal)
	var res readIndexResult
	select {
	case res = <-r.done:
	case <-ctx.Done():
		return 0, fmt.Errorf("%w: %v", ctlapi.ErrTimeout, ctx.Err())
	case <-n.stop:
		return 0, ctlapi.ErrStopped
	}
	if res.err != nil {
		return 0, res.err
	}
	if follower {
		if applied := n.Applied(); res.index > applied+n.cfg.FollowerLagMax {
			return 0, &ctlapi.LaggingError{Leader: n.leaderAddr(), Behind: res.index - applied}
		}
	}
	return res.index, n.waitApplied(ctx, res.index)
}

func (n *Node) waitApplied(ctx context.Context, index uint64) error {
	for {
		n.mu.RLock()
		applied, ch := n.applied, n.appliedCh
		n.mu.RUnlock()
		if applied >= index {
			return nil
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return fmt.Errorf("%w: %v", ctlapi.ErrTimeout, ctx.Err())
		case <-n.stop:
			return ctlapi.ErrStopped
		}
	}
}

// drainReads turns every waiting reader into one ReadIndex request.
// readBatch is the readers sharing one ReadIndex request.
type readBatch struct {
	reqs []*readRequest
	sent time.Time // before the heartbeat round: a lease may start here
	term uint64
}

func (n *Node) leaseDuration() time.Duration {
	return time.Duration(n.cfg.ElectionTicks) * n.cfg.TickInterval * 3 / 4
}

func (n *Node) drainReads() {
	n.readMu.Lock()
	q := n.readQ
	n.readQ = nil
	n.readMu.Unlock()
	renew := false
	var st raft.BasicStatus
	now := time.Now()
	if n.cfg.LeaseRead && n.isLdr.Load() {
		st = n.rn.BasicStatus()
		if st.RaftState == raft.StateLeader && st.HardState.GetTerm() == n.leaseTerm && now.Before(n.leaseUntil) {
			// While the lease holds no other leader can exist, so the
			// commit index covers every write completed before now. Only
			// this goroutine moves it, so it holds until the seal.
			idx := st.HardState.GetCommit()
			sealReads(q)
			for _, r := range q {
				r.done <- readIndexResult{index: idx}
			}
			if len(q) > 0 {
				n.leaseUsed = now
			}
			q = nil
			// Renew ahead of expiry only while the lease is in use, so an
			// idle leader sends no extra heartbeat rounds.
			renew = !n.leaseRenewing && n.leaseUntil.Sub(now) < n.leaseDuration()/2 &&
				now.Sub(n.leaseUsed) < n.leaseDuration()
		}
		// Otherwise the readers' own ReadIndex round, below, renews it.
	}
	if len(q) == 0 && !renew {
		return
	}
	if len(n.readBatches) >= readRoundsMax {
		// Put the readers back; the next round takes them when an answer
		// arrives (deliverReadStates signals).
		n.readMu.Lock()
		n.readQ = append(q, n.readQ...)
		n.readMu.Unlock()
		return
	}
	if len(n.readBatches) >= readBatchesMax {
		for _, r := range q {
			r.done <- readIndexResult{err: ctlapi.ErrBusy}
		}
		return
	}
	sealReads(q)
	if renew {
		n.leaseRenewing = true
	}
	n.nextReadID++
	id := n.nextReadID
	var ctx [16]byte
	binary.BigEndian.PutUint64(ctx[:], n.self)
	binary.BigEndian.PutUint64(ctx[8:], id)
	n.readBatches[id] = &readBatch{reqs: q, sent: now, term: st.HardState.GetTerm()}
	n.rn.ReadIndex(ctx[:])
}

// Read runs fn on the state once the read mode's consistency is met. fn runs
// under the state's read lock and must not keep references into it.
func (n *Node) Read(ctx context.Context, mode ctlapi.ReadMode, fn func(*State)) error {
	switch mode {
	case ctlapi.ReadUnsafe:
		if !n.isLdr.Load() {
			return &ctlapi.NotLeaderError{Leader: n.leaderAddr()}
		}
	case ctlapi.ReadConsistent, ctlapi.ReadFollower:
		if _, err := n.ReadIndex(ctx, mode == ctlapi.ReadFollower); err != nil {
			return err
		}
	default:
		return fmt.Errorf("%w: unknown read mode %d", ctlapi.ErrBadRequest, mode)
	}
	n.mu.RLock()
	defer n.mu.RUnlock()
	fn(n.state)
	return nil
}

// expireReads fails ReadIndex requests that got no answer in time.
func (n *Node) expireReads(now time.Time) {
	for id, b := range n.readBatches {
		if now.Sub(b.sent) > readBatchTimeout {
			for _, r := range b.reqs {
				r.done <- readIndexResult{err: ctlapi.ErrReadAborted}
			}
			delete(n.readBatches, id)
			if b.term != 0 {
				n.leaseRenewing = false
			}
		}
	}
}

func (n *Node) deliverReadStates(states []raft.ReadState) {
	if len(states) > 0 {
		signal(n.readSignal) // readers held back by readRoundsMax may go now
	}
	for _, rs := range states {
		if len(rs.RequestCtx) != 16 || binary.BigEndian.Uint64(rs.RequestCtx) != n.self {
			continue
		}
		id := binary.BigEndian.Uint64(rs.RequestCtx[8:])
		b := n.readBatches[id]
		if b == nil {
			continue
		}
		delete(n.readBatches, id)
		for _, r := range b.reqs {
			r.done <- readIndexResult{index: rs.Index}
		}
		if n.cfg.LeaseRead && b.term != 0 && n.isLdr.Load() {
			if st := n.rn.BasicStatus(); st.HardState.GetTerm() == b.term && st.RaftState == raft.StateLeader {
				if until := b.sent.Add(n.leaseDuration()); until.After(n.leaseUntil) || n.leaseTerm != b.term {
					n.leaseUntil, n.leaseTerm = until, b.term
				}
				n.leaseRenewing = false
			}
		}
	}
}

func (n *Node) abortReads(err error) {
	for id, b := range n.readBatches {
		for _, r := range b.reqs {
			r.done <- readIndexResult{err: err}
		}
		delete(n.readBatches, id)
	}
	n.leaseUntil, n.leaseTerm, n.leaseRenewing = time.Time{}, 0, false
}
