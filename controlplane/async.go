package controlplane

import (
	"fmt"

	"github.com/cockroachdb/pebble/v2"
	"go.etcd.io/raft/v3"
	pb "go.etcd.io/raft/v3/raftpb"
	"google.golang.org/protobuf/proto"
)

// Asynchronous storage writes (Config.AsyncStorageWrites). Raft hands log
// writes to LocalAppendThread and committed entries to LocalApplyThread as
// messages; the append goroutine persists them, several at a time with one
// fsync, and the apply goroutine applies. Both hand raft's responses back to
// the raft goroutine through the local queue.

const (
	// storageQueueMax bounds the append and apply messages in flight. The
	// local queue needs no bound of its own: each message in these queues
	// carries a bounded number of responses.
	storageQueueMax = 1024
	// appendBatchMax bounds the append messages group-committed together.
	appendBatchMax = 256
)

type applyItem struct {
	m    *pb.Message
	snap *pb.Snapshot
}

// localItem is a raft response or a configuration change for the raft
// goroutine.
type localItem struct {
	m  *pb.Message
	cc confItem
}

// confItem is a membership change and the index of its entry.
type confItem struct {
	cc    *pb.ConfChangeV2
	index uint64
}

func (n *Node) local(m *pb.Message) {
	n.localMu.Lock()
	n.localQ = append(n.localQ, localItem{m: m})
	n.localMu.Unlock()
	signal(n.localSignal)
}

func (n *Node) localConf(c confItem) {
	n.localMu.Lock()
	n.localQ = append(n.localQ, localItem{cc: c})
	n.localMu.Unlock()
	signal(n.localSignal)
}

func (n *Node) stepLocal() {
	n.localMu.Lock()
	q := n.localQ
	n.localQ = nil
	n.localMu.Unlock()
	for _, it := range q {
		if it.cc.cc != nil {
			n.applyConfChange(it.cc)
			continue
		}
		m := it.m
		if err := n.rn.Step(m); err != nil {
			n.cfg.Logger.Error("controlplane: step local message", "type", m.GetType().String(), "err", err)
		}
	}
}

func (n *Node) handleReadyAsync() error {
	rd := n.rn.Ready()
	n.softState(rd)
	for _, m := range rd.Messages {
		switch m.GetTo() {
		case raft.LocalAppendThread:
			select {
			case n.appendQ <- m:
			case <-n.stop:
				return ErrStopped
			}
		case raft.LocalApplyThread:
			select {
			case n.applyQ <- applyItem{m: m}:
			case <-n.stop:
				return ErrStopped
			}
		default:
			n.transport.send(m)
		}
	}
	n.deliverReadStates(rd.ReadStates)
	return nil
}

func (n *Node) appendLoop() {
	defer n.wg.Done()
	hs, _, _ := n.storage.InitialState()
	lastTerm, lastVote := hs.GetTerm(), hs.GetVote()
	batch := make([]*pb.Message, 0, appendBatchMax)
	for {
		select {
		case <-n.stop:
			return
		case m := <-n.appendQ:
			batch = append(batch[:0], m)
		}
	more:
		for len(batch) < appendBatchMax {
			select {
			case m := <-n.appendQ:
				batch = append(batch, m)
			default:
				break more
			}
		}
		if err := n.storage.saveMessages(batch, &lastTerm, &lastVote); err != nil {
			n.fail(err)
			return
		}
		for _, m := range batch {
			if snap := m.GetSnapshot(); !raft.IsEmptySnap(snap) {
				select {
				case n.applyQ <- applyItem{snap: snap}:
				case <-n.stop:
					return
				}
			}
			for _, r := range m.GetResponses() {
				if r.GetTo() == n.self || r.GetTo() == raft.LocalAppendThread || r.GetTo() == raft.LocalApplyThread {
					n.local(r)
				} else {
					n.transport.send(r)
				}
			}
		}
	}
}

func (n *Node) applyLoop() {
	defer n.wg.Done()
	for {
		var item applyItem
		select {
		case <-n.stop:
			return
		case item = <-n.applyQ:
		}
		if item.m == nil && item.snap == nil {
			// A wake-up: a snapshot may be due (see checkLostLog).
			if err := n.maybeSnapshot(); err != nil {
				n.fail(err)
				return
			}
			continue
		}
		if item.snap != nil {
			if item.snap.GetMetadata().GetIndex() > n.Applied() {
				if err := n.restoreSnapshot(item.snap); err != nil {
					n.fail(err)
					return
				}
			}
			continue
		}
		n.apply(item.m.GetEntries())
		if err := n.maybeSnapshot(); err != nil {
			n.fail(err)
			return
		}
		for _, r := range item.m.GetResponses() {
			n.local(r)
		}
	}
}

// saveMessages persists a group of MsgStorageAppend messages with one pebble
// batch, synced when any of them carries entries, a snapshot, or a new term
// or vote; then publishes them, in order, to the memory cache.
func (s *diskStorage) saveMessages(msgs []*pb.Message, lastTerm, lastVote *uint64) error {
	b := s.db.NewBatch()
	defer b.Close()
	sync := false
	var buf []byte
	hasSnap := false
	for _, m := range msgs {
		snap := m.GetSnapshot()
		if !raft.IsEmptySnap(snap) {
			sync, hasSnap = true, true
		}
		if len(m.GetEntries()) > 0 {
			sync = true
		}
		var err error
		if buf, err = s.writeLog(b, snap, m.GetEntries(), buf); err != nil {
			return err
		}
		if m.Term != nil {
			hs := &pb.HardState{Term: m.Term, Vote: m.Vote, Commit: m.Commit}
			raw, err := proto.Marshal(hs)
			if err != nil {
				return fmt.Errorf("controlplane: encode hard state: %w", err)
			}
			b.Set(keyHardState, raw, nil)
			if hs.GetTerm() != *lastTerm || hs.GetVote() != *lastVote {
				sync = true
				*lastTerm, *lastVote = hs.GetTerm(), hs.GetVote()
			}
		}
	}
	if hasSnap {
		s.snapMu.Lock()
		defer s.snapMu.Unlock()
	}
	opts := pebble.NoSync
	if sync {
		opts = pebble.Sync
	}
	if err := b.Commit(opts); err != nil {
		return fmt.Errorf("controlplane: write log: %w", err)
	}
	for _, m := range msgs {
		if snap := m.GetSnapshot(); !raft.IsEmptySnap(snap) {
			if err := s.MemoryStorage.ApplySnapshot(snap); err != nil && err != raft.ErrSnapOutOfDate {
				return err
			}
		}
		if m.Term != nil {
			if err := s.MemoryStorage.SetHardState(&pb.HardState{Term: m.Term, Vote: m.Vote, Commit: m.Commit}); err != nil {
				return err
			}
		}
		if err := s.MemoryStorage.Append(m.GetEntries()); err != nil {
			return err
		}
	}
	return nil
}
