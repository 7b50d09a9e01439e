package controlplane

import (
	"encoding/binary"
	"time"

	"github.com/berthmq/berth/controlplane/ctlapi"
	"go.etcd.io/raft/v3"
	pb "go.etcd.io/raft/v3/raftpb"
	"go.etcd.io/raft/v3/tracker"
)

// The raft goroutine: its loop (run), stepping messages, handling each
// Ready (persist, send, apply, answer) and taking snapshots.

// recvQueueMax bounds raft messages received and not yet stepped.
const recvQueueMax = 4096

// run is the raft goroutine.
func (n *Node) run() {
	defer n.wg.Done()
	defer n.abortAll(ctlapi.ErrStopped)
	ticker := time.NewTicker(n.cfg.TickInterval)
	defer ticker.Stop()
	for {
		select {
		case <-n.stop:
			return
		case <-ticker.C:
			n.rn.Tick()
			n.expireReads(time.Now())
		case m := <-n.msgIn:
			n.step(m)
			for i := 0; i < recvQueueMax; i++ {
				select {
				case m = <-n.msgIn:
					n.step(m)
					continue
				default:
				}
				break
			}
		case r := <-n.transport.reports:
			if r.unreachable {
				n.rn.ReportUnreachable(r.to)
			}
			if r.snapshot {
				status := raft.SnapshotFinish
				if r.snapFailed {
					status = raft.SnapshotFailure
				}
				n.rn.ReportSnapshot(r.to, status)
			}
		case <-n.propSignal:
		case <-n.readSignal:
		case r := <-n.confQ:
			r.done <- n.rn.ProposeConfChange(r.cc)
		}
		n.drainProposals()
		n.drainReads()
		for n.rn.HasReady() {
			if err := n.handleReady(); err != nil {
				n.fail(err)
				return
			}
		}
	}
}

func (n *Node) step(m *pb.Message) {
	if m.GetType() == pb.MsgHeartbeat {
		// A controller whose data was wiped has an empty log while the
		// leader still remembers its old match index. Raft would panic on
		// a commit index past the log end; drop the commit instead and let
		// the following append or snapshot bring the log up.
		if last, _ := n.storage.LastIndex(); m.GetCommit() > last {
			m.Commit = nil
		}
	}
	if m.GetType() == pb.MsgApp && n.cfg.Join && n.unconfigured() {
		// A joining member must start from a snapshot, which carries the
		// configuration: entries applied onto no configuration would make
		// raft apply a membership change to an empty one. The leader
		// compacts its log right after the change, so its next probe
		// after this drop sends the snapshot.
		return
	}
	if m.GetType() == pb.MsgAppResp && m.GetReject() && n.isLdr.Load() {
		n.checkLostLog(m)
	}
	if err := n.rn.Step(m); err != nil && err != raft.ErrStepPeerNotFound {
		n.cfg.Logger.Debug("controlplane: step", "err", err)
	}
}

// unconfigured reports whether the node has no configuration yet: a joining
// member before its first snapshot.
func (n *Node) unconfigured() bool {
	n.confMu.Lock()
	defer n.confMu.Unlock()
	return len(n.confState.GetVoters()) == 0 && len(n.confState.GetLearners()) == 0
}

// lostLogCheckInterval rate-limits the lost-log check per follower: a
// follower that lost its log rejects every append in flight at once.
const lostLogCheckInterval = 100 * time.Millisecond

// checkLostLog runs on the leader for each rejected append. Raft assumes a
// follower never loses what it acknowledged, so it never lowers a
// follower's match below the acknowledged index. A controller whose data
// was wiped (a replaced disk, an operator's rm) then rejects the probe at
// its old match forever while the leader still holds that entry, and never
// catches up. When the follower's hint says its log ends before the match
// it acknowledged, the leader compacts its log past that match, so that
// raft's next probe finds the entry gone and sends a snapshot instead.
func (n *Node) checkLostLog(m *pb.Message) {
	from := m.GetFrom()
	now := time.Now()
	if now.Sub(n.lostLogSeen[from]) < lostLogCheckInterval {
		return
	}
	var match uint64
	var probing bool
	n.rn.WithProgress(func(id uint64, _ raft.ProgressType, pr tracker.Progress) {
		if id == from {
			match, probing = pr.Match, pr.State == tracker.StateProbe
		}
	})
	// Only a probe at the acknowledged index itself proves the loss: a
	// stale rejection of an earlier probe carries a lower index.
	if !probing || m.GetIndex() != match || m.GetRejectHint() >= match {
		return
	}
	if n.lostLogSeen == nil {
		n.lostLogSeen = map[uint64]time.Time{}
	}
	n.lostLogSeen[from] = now
	if n.compactPast.Load() < match+1 {
		n.compactPast.Store(match + 1)
	}
	n.cfg.Logger.Warn("controlplane: a controller lost log entries it had acknowledged; compacting so that it receives a snapshot",
		"node", n.self, "controller", from, "acknowledged", match, "log_end", m.GetRejectHint())
	if last, _ := n.storage.LastIndex(); last <= match {
		// Nothing was written since: the log needs an entry past the
		// match to compact to. An empty entry applies as nothing.
		n.rn.Propose(nil)
	}
}

func (n *Node) softState(rd raft.Ready) {
	if rd.SoftState != nil {
		wasLeader := n.isLdr.Load()
		n.setLeader(rd.SoftState.Lead)
		isLeader := rd.SoftState.RaftState == raft.StateLeader
		n.isLdr.Store(isLeader)
		if wasLeader && !isLeader {
			n.abortPending(ctlapi.ErrLeaderChanged)
		}
		if !isLeader || rd.SoftState.Lead == raft.None {
			n.abortReads(ctlapi.ErrReadAborted)
		}
		if isLeader && !wasLeader {
			n.mu.RLock()
			brokers := n.state.Brokers()
			n.mu.RUnlock()
			n.hb.becomeLeader(brokers, time.Now())
			n.cfg.Logger.Info("controlplane: this member leads the controller", "node", n.self,
				"brokers", len(brokers), "grace", n.cfg.LeaderGrace)
		}
	}
	if rd.HardState != nil {
		n.term.Store(rd.HardState.GetTerm())
	}
}

func (n *Node) handleReady() error {
	rd := n.rn.Ready()
	n.softState(rd)
	// A leader may send its appends before its own fsync (raft thesis
	// 10.2.1): it counts itself toward a quorum only for entries it has
	// persisted, so its disk write and its followers' overlap. For the same
	// reason every entry a leader sees committed was persisted by an
	// earlier Ready (acks are stepped only after that Ready's write), so it
	// applies, and answers its clients, before this Ready's fsync.
	// Everyone else persists first: their messages vouch for what is on
	// disk, and their committed entries may be in this Ready's Entries.
	if n.isLdr.Load() && raft.IsEmptySnap(rd.Snapshot) {
		for _, m := range rd.Messages {
			n.transport.send(m)
		}
		n.apply(rd.CommittedEntries)
		n.deliverReadStates(rd.ReadStates)
		if err := n.storage.save(rd.HardState, rd.Entries, rd.Snapshot, rd.MustSync); err != nil {
			return err
		}
	} else {
		if err := n.storage.save(rd.HardState, rd.Entries, rd.Snapshot, rd.MustSync); err != nil {
			return err
		}
		for _, m := range rd.Messages {
			n.transport.send(m)
		}
		if !raft.IsEmptySnap(rd.Snapshot) {
			if err := n.restoreSnapshot(rd.Snapshot); err != nil {
				return err
			}
		}
		n.apply(rd.CommittedEntries)
		n.deliverReadStates(rd.ReadStates)
	}
	n.rn.Advance(rd)
	return n.maybeSnapshot()
}

func (n *Node) abortAll(err error) {
	n.abortPending(err)
	n.abortReads(err)
	n.propMu.Lock()
	for _, p := range n.propQ {
		p.finish(proposeResult{err: err})
	}
	n.propQ = nil
	n.propMu.Unlock()
	n.readMu.Lock()
	for _, r := range n.readQ {
		r.done <- readIndexResult{err: err}
	}
	n.readQ = nil
	n.readMu.Unlock()
}

func (n *Node) restoreSnapshot(snap *pb.Snapshot) error {
	raw, err := decompressSnapshot(snap.GetData())
	if err != nil {
		return err
	}
	state, err := DecodeState(raw)
	if err != nil {
		return err
	}
	n.mu.Lock()
	n.state = state
	n.applied = snap.GetMetadata().GetIndex()
	close(n.appliedCh)
	n.appliedCh = make(chan struct{})
	n.mu.Unlock()
	n.snapIndex = snap.GetMetadata().GetIndex()
	n.bytesSinceSnap = 0
	n.confMu.Lock()
	n.confState = snap.GetMetadata().GetConfState()
	n.confIndex = snap.GetMetadata().GetIndex()
	n.confMu.Unlock()
	n.adoptAddressBook(state.Controllers())
	return nil
}

type delivery struct {
	p   *proposal
	res ctlapi.Result
}

func (n *Node) apply(ents []*pb.Entry) {
	if len(ents) == 0 {
		return
	}
	var out []delivery
	var ccs []confItem
	n.mu.Lock()
	for _, e := range ents {
		if e.GetIndex() <= n.applied {
			continue
		}
		switch e.GetType() {
		case pb.EntryNormal:
			if len(e.GetData()) > 0 {
				out = n.applyBatchLocked(e.GetData(), out)
			}
		default:
			cc, err := decodeConfEntry(e)
			if err != nil {
				n.cfg.Logger.Error("controlplane: bad configuration change entry", "index", e.GetIndex(), "err", err)
				break
			}
			if len(cc.GetContext()) > 0 {
				if book, err := decodeAddressBook(cc.GetContext()); err == nil {
					n.state.applyMembership(book)
				}
			}
			ccs = append(ccs, confItem{cc, e.GetIndex()})
		}
		n.applied = e.GetIndex()
		n.bytesSinceSnap += len(e.GetData())
	}
	close(n.appliedCh)
	n.appliedCh = make(chan struct{})
	n.mu.Unlock()
	for _, d := range out {
		d.p.finish(proposeResult{res: d.res})
	}
	for _, c := range ccs {
		n.applyConfChange(c)
	}
}

// applyBatchLocked applies one entry's events. A malformed event is skipped
// with a logged error on every node alike, so state stays identical.
func (n *Node) applyBatchLocked(data []byte, out []delivery) []delivery {
	if len(data) < 21 || data[0] != entryFormat {
		n.cfg.Logger.Error("controlplane: malformed log entry")
		return out
	}
	proposer := binary.BigEndian.Uint64(data[1:])
	seq := binary.BigEndian.Uint64(data[9:])
	count := binary.BigEndian.Uint32(data[17:])
	rest := data[21:]
	for i := uint32(0); i < count; i++ {
		if len(rest) < 4 {
			n.cfg.Logger.Error("controlplane: truncated log entry")
			return out
		}
		ln := binary.BigEndian.Uint32(rest)
		if uint64(ln) > uint64(len(rest)-4) {
			n.cfg.Logger.Error("controlplane: truncated log entry")
			return out
		}
		raw := rest[4 : 4+ln]
		rest = rest[4+ln:]
		var res ctlapi.Result
		if ev, err := ctlapi.DecodeEvent(raw); err != nil {
			res = fail(ctlapi.CodeInvalid, "undecodable event: %v", err)
		} else {
			res = n.state.Apply(ev)
		}
		if proposer == n.self {
			if p := n.pending[seq+uint64(i)]; p != nil {
				delete(n.pending, p.seq)
				out = append(out, delivery{p, res})
			}
		}
	}
	return out
}

func (n *Node) maybeSnapshot() error {
	if n.cfg.SnapshotEntries < 0 && n.compactPast.Load() == 0 {
		return nil
	}
	n.mu.RLock()
	applied := n.applied
	past := n.compactPast.Load()
	forcePast := past != 0 && applied >= past
	due := n.cfg.SnapshotEntries >= 0 &&
		(applied >= n.snapIndex+uint64(n.cfg.SnapshotEntries) || n.bytesSinceSnap >= n.cfg.SnapshotBytes)
	force := n.forceSnap.Load()
	if !force && !forcePast && !due {
		n.mu.RUnlock()
		return nil
	}
	raw := n.state.Encode()
	n.mu.RUnlock()
	data := compressSnapshot(raw)
	compactTo := n.snapIndex
	if applied > uint64(n.cfg.SnapshotTrailing) && applied-uint64(n.cfg.SnapshotTrailing) > compactTo {
		compactTo = applied - uint64(n.cfg.SnapshotTrailing)
	}
	if force {
		compactTo = applied
		n.forceSnap.Store(false)
	}
	if forcePast {
		compactTo = max(compactTo, past)
		n.compactPast.CompareAndSwap(past, 0)
	}
	n.confMu.Lock()
	cs := n.confState
	n.confMu.Unlock()
	if err := n.storage.compact(applied, compactTo, cs, data); err != nil {
		return err
	}
	n.snapIndex = applied
	n.bytesSinceSnap = 0
	return nil
}
