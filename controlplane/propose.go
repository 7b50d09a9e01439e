package controlplane

import (
	"context"
	"encoding/binary"
	"fmt"
	"slices"
	"sync/atomic"

	"github.com/berthmq/berth/controlplane/ctlapi"
)

// The write path: proposals from any goroutine queue for the raft goroutine,
// which packs them into log entries (drainProposals); each waiter gets its
// own result when its event applies (apply, in ready.go).

// Bounds on proposals.
const (
	// proposalQueueMax bounds proposals waiting for the raft goroutine.
	proposalQueueMax = 1 << 16
	// entryBytesMax bounds one log entry; a batch of proposals is split
	// into entries of at most this size.
	entryBytesMax = 256 << 10
	// readyProposalsMax bounds the proposals packed into one Ready, so a
	// burst does not make one giant fsync.
	readyProposalsMax = 8192
)

// proposal is one event waiting for the log. Proposals are queued in
// groups (one for Propose, a connection's burst of writes for the service)
// and answered as a group.
type proposal struct {
	data []byte
	seq  uint64
	grp  *proposalGroup
	idx  int // the proposal's slot in grp.res
}

// proposalGroup collects the results of proposals queued together.
type proposalGroup struct {
	res  []proposeResult // one per proposal, each written once by its finisher
	left atomic.Int32
	done chan struct{} // closed when every result is in
}

// finish delivers p's result. Every proposal is finished exactly once.
func (p *proposal) finish(r proposeResult) {
	p.grp.res[p.idx] = r
	if p.grp.left.Add(-1) == 0 {
		close(p.grp.done)
	}
}

type proposeResult struct {
	res ctlapi.Result
	err error
}

// Propose puts ev through the log and returns its result once applied on
// this node. Only the leader accepts proposals.
func (n *Node) Propose(ctx context.Context, ev ctlapi.Event) (ctlapi.Result, error) {
	if err := ctlapi.ValidateEvent(ev); err != nil {
		return ctlapi.Result{}, err
	}
	res, err := n.proposeMany(ctx, [][]byte{ctlapi.EncodeEvent(nil, ev)})
	if err != nil {
		return ctlapi.Result{}, err
	}
	return res[0].res, res[0].err
}

// proposeMany puts a group of encoded events through the log at once (one
// queue lock, consecutive sequence numbers, so usually one entry) and
// returns their results in order. If ctx ends first it returns ErrTimeout
// and the group's outcome is unknown.
func (n *Node) proposeMany(ctx context.Context, datas [][]byte) ([]proposeResult, error) {
	if !n.isLdr.Load() {
		return nil, &ctlapi.NotLeaderError{Leader: n.leaderAddr()}
	}
	g := &proposalGroup{res: make([]proposeResult, len(datas)), done: make(chan struct{})}
	g.left.Store(int32(len(datas)))
	ps := make([]proposal, len(datas))
	n.propMu.Lock()
	if len(n.propQ)+len(datas) > proposalQueueMax {
		n.propMu.Unlock()
		return nil, ctlapi.ErrBusy
	}
	for i, d := range datas {
		n.nextSeq++
		ps[i] = proposal{data: d, seq: n.nextSeq, grp: g, idx: i}
		n.propQ = append(n.propQ, &ps[i])
	}
	n.propMu.Unlock()
	signal(n.propSignal)
	select {
	case <-g.done:
		return g.res, nil
	case <-ctx.Done():
		return nil, fmt.Errorf("%w: %v", ctlapi.ErrTimeout, ctx.Err())
	case <-n.stop:
		return nil, ctlapi.ErrStopped
	}
}

const entryFormat = 1

// An entry carries a batch of events: format, proposer id, first sequence
// number, count, then each event as a uint32 length and bytes. Events of one
// entry have consecutive sequence numbers.
func (n *Node) drainProposals() {
	n.propMu.Lock()
	q := n.propQ
	if n.cfg.DisableBatching && len(q) > 1 {
		n.propQ = q[1:]
		q = q[:1]
		signal(n.propSignal)
	} else if len(q) > readyProposalsMax {
		n.propQ = slices.Clone(q[readyProposalsMax:])
		q = q[:readyProposalsMax]
		signal(n.propSignal)
	} else {
		n.propQ = nil
	}
	n.propMu.Unlock()
	if len(q) == 0 {
		return
	}
	if !n.isLdr.Load() {
		for _, p := range q {
			p.finish(proposeResult{err: &ctlapi.NotLeaderError{Leader: n.leaderAddr()}})
		}
		return
	}
	for len(q) > 0 {
		// q's sequence numbers are consecutive: they were assigned in queue
		// order under propMu.
		size := 21
		k := 0
		for k < len(q) && (k == 0 || size+4+len(q[k].data) <= entryBytesMax) {
			size += 4 + len(q[k].data)
			k++
		}
		batch := q[:k]
		q = q[k:]
		buf := make([]byte, 0, size)
		buf = append(buf, entryFormat)
		buf = binary.BigEndian.AppendUint64(buf, n.self)
		buf = binary.BigEndian.AppendUint64(buf, batch[0].seq)
		buf = binary.BigEndian.AppendUint32(buf, uint32(len(batch)))
		for _, p := range batch {
			buf = binary.BigEndian.AppendUint32(buf, uint32(len(p.data)))
			buf = append(buf, p.data...)
		}
		if err := n.rn.Propose(buf); err != nil {
			for _, p := range batch {
				p.finish(proposeResult{err: &ctlapi.NotLeaderError{Leader: n.leaderAddr()}})
			}
			continue
		}
		n.batches.observe(len(batch))
		for _, p := range batch {
			n.pending[p.seq] = p
		}
	}
}

func (n *Node) abortPending(err error) {
	for seq, p := range n.pending {
		delete(n.pending, seq)
		p.finish(proposeResult{err: err})
	}
}
