package session

import (
	"fmt"

	"github.com/berthmq/berth/shards"
	"github.com/berthmq/berth/wire"
)

// Subscribe is a SUBSCRIBE: consumer ConsumerID on Queue.
type Subscribe struct {
	CommandID  uint64
	ConsumerID uint32 // chosen by the client, unique within its session
	Queue      []byte
	Credit     uint32
	AckMode    uint8 // wire.AckExplicit or wire.AckNone
	Exclusive  bool
}

// Tags are the delivery tags a settle names, as ranges.
type Tags interface {
	Len() int
	At(i int) wire.Range
}

// Subscribe adds a consumer. It reports false when a full ring stopped
// it (call again with the same command).
func (s *Session) Subscribe(m *Subscribe, raw []byte) bool {
	rep := s.cfg.Replies
	if s.usedIDs.has(m.ConsumerID) {
		rep.Fail(m.CommandID, wire.CodeInvalid, "consumer id already used in this session")
		return true
	}
	if !s.usedIDs.canAdd(m.ConsumerID) {
		rep.Fail(m.CommandID, wire.CodeResourceLimit, fmt.Sprintf("this session used consumer ids in %d separate runs; number them upwards", idRangesMax))
		return true
	}
	if m.AckMode > wire.AckNone {
		rep.Fail(m.CommandID, wire.CodeInvalid, "unknown ack mode")
		return true
	}
	if g := s.cfg.Guard; g != nil && !g.CanConsume(m.Queue, m.CommandID) {
		return true
	}
	var q *shards.Queue
	if r := s.cfg.Resolve; r != nil {
		var remote bool
		if q, remote = r.SubscribeQueue(m.Queue, m.CommandID); remote {
			// Another broker serves the queue: consume there through
			// this one.
			s.cfg.Remote.Subscribe(m, raw)
			s.usedIDs.add(m.ConsumerID)
			s.consumers[m.ConsumerID] = remoteShard
			return true
		}
		if q == nil {
			return true
		}
	} else if q = s.cfg.Routing().Queue(m.Queue); q == nil {
		rep.Fail(m.CommandID, wire.CodeNotFound, "no queue "+string(m.Queue))
		return true
	}
	cmd := shards.Subscribe{Sess: s.Sess, CmdID: m.CommandID, Queue: q, ConsumerID: m.ConsumerID,
		Credit: m.Credit, AckMode: m.AckMode, Exclusive: m.Exclusive}
	if !s.push(q.Shard(), cmd.Command()) {
		return false
	}
	s.usedIDs.add(m.ConsumerID)
	s.consumers[m.ConsumerID] = q.Shard()
	if s.queueOf == nil {
		s.queueOf = map[uint32]*shards.Queue{}
	}
	s.queueOf[m.ConsumerID] = q
	if r := s.cfg.Reg; r != nil {
		r.NoteConsumer(q, m.ConsumerID)
	}
	return true
}

// Credit adds credit to a consumer. Credit for a consumer the session
// does not have (cancelled) is harmless and ignored.
func (s *Session) Credit(consumer, credit uint32, raw []byte) bool {
	shard, ok := s.consumers[consumer]
	if !ok {
		return true
	}
	if shard == remoteShard {
		s.cfg.Remote.Credit(consumer, credit, raw)
		return true
	}
	return s.push(shard, shards.Credit{Sess: s.Sess, ConsumerID: consumer, Credit: credit}.Command())
}

// Cancel ends a consumer. Its id keeps its shard: deliveries made before
// the cancel can still be settled.
func (s *Session) Cancel(cmdID uint64, consumer uint32, raw []byte) bool {
	shard, ok := s.consumers[consumer]
	if !ok {
		s.cfg.Replies.Fail(cmdID, wire.CodeNotFound, "no such consumer")
		return true
	}
	if shard == remoteShard {
		s.cfg.Remote.Cancel(cmdID, consumer, raw)
		return true
	}
	if !s.push(shard, shards.Cancel{Sess: s.Sess, CmdID: cmdID, ConsumerID: consumer}.Command()) {
		return false
	}
	if q := s.queueOf[consumer]; q != nil {
		delete(s.queueOf, consumer)
		if r := s.cfg.Reg; r != nil {
			r.ForgetConsumer(q, consumer)
		}
	}
	return true
}

// Settle accepts, releases or rejects (op) a consumer's deliveries tags.
// A settle of many ranges goes to its shard in parts of
// shards.RangesInline; the last part completes it. When a full ring
// stops it, Resume says which part is next.
func (s *Session) Settle(cmdID uint64, consumer uint32, op Op, tags Tags, raw []byte) bool {
	shard, ok := s.consumers[consumer]
	if !ok {
		s.cfg.Replies.Fail(cmdID, wire.CodeNotFound, "no such consumer")
		return true
	}
	if shard == remoteShard {
		s.cfg.Remote.Settle(cmdID, consumer, op, tags, raw)
		return true
	}
	n := tags.Len()
	if n == 0 {
		s.cfg.Replies.Complete(cmdID)
		return true
	}
	kind := op.settleKind()
	parts := (n + shards.RangesInline - 1) / shards.RangesInline
	for part := s.Resume; part < parts; part++ {
		cmd := shards.Settle{Sess: s.Sess, CmdID: cmdID, ConsumerID: consumer, Kind: kind}
		for k := 0; k < shards.RangesInline; k++ {
			r := part*shards.RangesInline + k
			if r >= n {
				break
			}
			cmd.Ranges[k] = tags.At(r)
			cmd.NRanges++
		}
		cmd.Last = part == parts-1
		if !s.push(shard, cmd.Command()) {
			s.Resume = part
			return false
		}
	}
	return true
}

// Has reports whether the session has consumer id, and whether another
// broker serves it.
func (s *Session) Has(id uint32) (ok, remote bool) {
	shard, ok := s.consumers[id]
	return ok, shard == remoteShard
}

// ConsumerGone drops the session's record of consumer id, served here,
// which its shard forgot for good (shards.Session.OnConsumerGone): its
// SUBSCRIBE failed, or it was cancelled or its queue deleted with nothing
// left to settle. Without it a session that subscribes and cancels (a
// reply queue per request) kept an entry per consumer until it ended.
func (s *Session) ConsumerGone(id uint32) {
	if shard, ok := s.consumers[id]; !ok || shard == remoteShard {
		return
	}
	delete(s.consumers, id)
	if q := s.queueOf[id]; q != nil {
		delete(s.queueOf, id)
		if r := s.cfg.Reg; r != nil {
			r.ForgetConsumer(q, id)
		}
	}
}

// Forget drops consumer id at once, its queue or its master gone; the
// broker's registry already forgot it.
func (s *Session) Forget(id uint32) {
	delete(s.consumers, id)
	delete(s.queueOf, id)
}

// Served calls f for each consumer served here and its queue: at the
// session's end, for the registry.
func (s *Session) Served(f func(id uint32, q *shards.Queue)) {
	for id, q := range s.queueOf {
		f(id, q)
	}
}

// Counts are the session's records: of its consumers, of those served
// here, and of the runs of consumer ids it used (tests check they stay
// bounded).
func (s *Session) Counts() (consumers, served, idRuns int) {
	return len(s.consumers), len(s.queueOf), len(s.usedIDs.runs)
}

// EachShard calls f with the shard of each consumer served here (a shard
// once per consumer on it).
func (s *Session) EachShard(f func(shard int)) {
	for _, sh := range s.consumers {
		if sh != remoteShard {
			f(sh)
		}
	}
}

// MarkRemote records consumer id as served by the Remote, as Subscribe
// does when the Resolver says another broker serves its queue (tests set
// up a proxied consumer with it).
func (s *Session) MarkRemote(id uint32) {
	s.usedIDs.add(id)
	s.consumers[id] = remoteShard
}
