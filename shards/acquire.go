package shards

import (
	"cmp"
	"slices"
	"sort"

	"github.com/berthmq/berth/replication/event"
	"github.com/berthmq/berth/wire"
)

// Acquisitions of replicated queues are events of the group log (seed
// 000: "the owner multicasts notification of messages it acquires"). The
// master hands a message to a consumer in two steps:
//
//  1. dispatch acquires it here as for any queue (credit, tag, unacked)
//     but holds the delivery (Consumer.held) and notes the message for
//     its queue's next acquires event (hold);
//  2. at the end of the batch the shard proposes one acquires event per
//     queue (flushAcquires); when it commits, the held deliveries go out
//     (acquired).
//
// So every message a consumer ever received has a committed acquires
// event, and every member knows it: a follower moves the message to its
// acquired set when it applies the event (ApplyAcquires), and a broker
// that becomes master requeues exactly those, flagged redelivered with
// their delivery count raised (requeueInherited). A message no consumer
// was handed is delivered unflagged by the next master. The cost is one
// group commit between a message's dispatch and its delivery, and one
// event per queue per batch, not per message.
//
// Releases are events too (noteRelease): a consumer's release or its
// end puts a message back on every member with its count raised, and a
// held delivery given back (unhold) puts it back unseen, its count as it
// was. Per queue and batch the shard proposes its removals first, then
// its releases, then its acquires, so that a message released and handed
// out again in one batch is acquired last on every member.

// heldDelivery is a delivery waiting for its acquires event.
type heldDelivery struct {
	Delivery
	seq  uint64
	gen  uint64 // the queue's acquires event that records it (queueRare.acqGen)
	size int64  // counted in Consumer.heldBytes
}

// hold keeps d, the delivery of q's message seq just acquired for con,
// until the acquires event that records it commits.
func (s *Shard) hold(q *Queue, con *Consumer, d Delivery, seq uint64, size int64) {
	rs := s.listAcquiring(q)
	rs.idleTicks = 0
	rs.acquiring = append(rs.acquiring, seq)
	con.held = append(con.held, heldDelivery{Delivery: d, seq: seq, gen: rs.acqGen + 1, size: size})
	con.heldBytes += size
	rs.held++
	if len(rs.acquiring) == RemovesMax {
		s.proposeAcquires(q, false)
	}
}

// acquiresInFlightMax bounds a queue's acquires events proposed and not
// committed: what the queue hands out meanwhile gathers into the next
// event, so that under load an event records as many deliveries as one
// commit's time brings, rather than one batch of commands' worth (an
// event per batch halved the consume rate at the master, against the
// broker before acquires events).
const acquiresInFlightMax = 2

// ownerAcquiresInFlightMax is acquiresInFlightMax for an owner that is
// not the master: each of its events crosses to the master and its
// commit back before the deliveries it holds go out (no window), so
// more of them in flight keep its consumers fed.
const ownerAcquiresInFlightMax = 8

// acquiresInFlightLimit is q's bound on acquires events in flight.
func (s *Shard) acquiresInFlightLimit(q *Queue) int {
	if s.stamped(q) {
		return ownerAcquiresInFlightMax
	}
	return acquiresInFlightMax
}

// listAcquiring puts q on the shard's list of queues with releases or
// acquires to propose (Shard.acquiring), once.
func (s *Shard) listAcquiring(q *Queue) *queueRare {
	rs := q.rareState()
	if !rs.acqListed {
		rs.acqListed = true
		s.acquiring = append(s.acquiring, q)
	}
	return rs
}

// noteRelease notes, for q's next releases event, that this master put
// its acquired message seq back: unseen if no consumer saw it.
func (s *Shard) noteRelease(q *Queue, seq uint64, unseen bool) {
	rs := s.listAcquiring(q)
	if unseen {
		rs.returning = append(rs.returning, seq)
	} else {
		rs.releasing = append(rs.releasing, seq)
	}
	if len(rs.returning) == RemovesMax || len(rs.releasing) == RemovesMax {
		s.proposeReleases(q)
	}
}

// acquireWindowMax bounds the window an acquires event declares.
const acquireWindowMax = 1 << 16

// sendAtOnce notes q's message seq, just acquired, for the queue's next
// acquires event, and reports whether its delivery may go out at once:
// fewer deliveries sent at once wait for their events than the window
// (effectiveWindow), no release of the queue waits for its event (a
// message released and sent again at once would be counted one delivery
// short by a new master that never learnt of the release), and no
// delivery of it is held. The last keeps what went out at once and is
// not recorded yet, in each priority level, the first messages by Seq of
// those its followers hold ready: a held one, sent after them, has a
// higher Seq. That is what lets a new master find them (flagWindow). If
// not, the caller holds it (hold).
func (s *Shard) sendAtOnce(q *Queue, seq uint64) bool {
	rs := q.rareState()
	if uint64(rs.uncovered) >= uint64(effectiveWindow(rs)) || rs.held > 0 || rs.releasesInFlight > 0 || len(rs.releasing)+len(rs.returning) > 0 {
		return false
	}
	rs = s.listAcquiring(q)
	rs.idleTicks = 0
	rs.acquiring = append(rs.acquiring, seq)
	rs.sentNow = append(rs.sentNow, seq)
	rs.uncovered++
	if len(rs.acquiring) == RemovesMax {
		s.proposeAcquires(q, false)
	}
	return true
}

// effectiveWindow is how many deliveries this master may have sent at
// once whose acquires events have not committed: the window of its last
// committed event, and no more than that of any event in flight (a
// window it lowered binds at once; one it raised once it commits). A
// new master (or one whose last event declared 0) starts at 0: its first
// deliveries wait for their event.
func effectiveWindow(rs *queueRare) uint32 {
	w := rs.window
	for _, x := range rs.winInFlight {
		w = min(w, x)
	}
	return w
}

// declaredWindow is the window q's next acquires event declares: what its
// consumers may hold at once, their credit and what they hold unsettled
// (held deliveries included). Any value is safe, since the master never
// sends more at once than it declared; a larger one sends more at once,
// and lets a new master over-flag more after a crash.
func declaredWindow(q *Queue) uint32 {
	n := 0
	for _, con := range q.consumers {
		n += int(con.credit) + len(con.unacked)
		if con.ackNone {
			n += len(con.held)
		}
	}
	return uint32(min(n, acquireWindowMax))
}

// flushAcquires proposes every queue's releases and acquires events;
// flushRemoves calls it once it proposed the removals, at the end of each
// batch of commands. A queue whose removals the group did not take waits
// with the rest too, and its acquires wait for its releases: they would
// commit ahead of them, and a member would hold a message as acquired
// that its master holds as ready, or hand an auto-ack consumer a message
// whose removal a new master never learns.
func (s *Shard) flushAcquires() {
	keep := s.acquiring[:0]
	for _, q := range s.acquiring {
		rs := q.rare
		if len(rs.removing) == 0 && s.proposeReleases(q) && len(rs.acquiring) > 0 && rs.releasesInFlight == 0 && rs.acquiresInFlight < s.acquiresInFlightLimit(q) {
			s.proposeAcquires(q, false)
		}
		if len(rs.acquiring)+len(rs.releasing)+len(rs.returning) > 0 {
			keep = append(keep, q)
		} else {
			rs.acqListed = false
		}
	}
	clear(s.acquiring[len(keep):])
	s.acquiring = keep
}

// proposeReleases proposes q's pending releases, and reports whether none
// is left pending. What the group did not take for now stays pending, and
// what failed for now after it was proposed (too few replicas in sync
// just after an election) is pending again (released); the queue's
// acquires wait until no releases event is in flight, so that they
// follow it in the log. On any other refusal they are dropped (this
// broker is not the master any more, and applies the log again when it
// steps down).
func (s *Shard) proposeReleases(q *Queue) bool {
	rs := q.rare
	r := s.broker.loadReplicator()
	for _, l := range []*[]uint64{&rs.returning, &rs.releasing} {
		if len(*l) == 0 {
			continue
		}
		unseen := l == &rs.returning
		// A master's releases of what it acquired as an owner before it
		// became master are stamped (own.go): one event for each kind.
		var mine []uint64
		if !s.stamped(q) && len(rs.acqBy) > 0 {
			keep := (*l)[:0]
			for _, seq := range *l {
				if s.mineStamped(q, seq) {
					mine = append(mine, seq)
				} else {
					keep = append(keep, seq)
				}
			}
			*l = keep
		}
		for i, batch := range [][]uint64{*l, mine} {
			if len(batch) == 0 {
				continue
			}
			if err := s.proposeReleasesOf(q, r, batch, unseen, i == 1); err != nil {
				if code := CodeOf(err); code == wire.CodeUnavailable || code == wire.CodeResourceLimit {
					if !rs.acquireRefused {
						rs.acquireRefused = true
						s.log.Warn("shards: the group did not take the releases of replicated messages; proposing them again", "queue", q.Name, "messages", len(batch), "err", err)
					}
					if i == 0 {
						*l = append(*l, mine...)
					} else {
						*l = append((*l)[:0], mine...)
					}
					return false
				}
				s.log.Warn("shards: the releases of replicated messages were not proposed", "queue", q.Name, "messages", len(batch), "err", err)
			}
		}
		*l = (*l)[:0]
	}
	return true
}

// proposeReleasesOf proposes the release of seqs of q as one event,
// stamped if forceStamp or this broker is not the master.
func (s *Shard) proposeReleasesOf(q *Queue, r Replicator, seqs []uint64, unseen, forceStamp bool) error {
	rs := q.rare
	tag, ok := s.acqWaits.add(q, 0)
	var err error
	switch {
	case !ok:
		return Errorf(wire.CodeResourceLimit, "shard %d has %d acquires events waiting for their groups", s.idx, acqWaitsMax)
	case r == nil:
		err = Errorf(wire.CodeUnavailable, "the shards are not connected to the replication groups")
	default:
		w := s.acqWaits.at(tag)
		w.release, w.unseen, w.seqs, w.term = true, unseen, slices.Clone(seqs), rs.term
		st := s.stampFor(q, tag)
		if forceStamp {
			st = event.Stamp{Broker: r.Self(), Gen: rs.ownGen, Tag: tag}
		}
		w.stamped = st.Broker != 0
		rs.releasesInFlight++ // before: the outcome may come back at once
		if err = r.ProposeReleases(q, seqs, unseen, st, tag); err != nil {
			rs.releasesInFlight--
		}
	}
	if err != nil {
		s.acqWaits.take(tag)
		return err
	}
	s.stats.ReleasesEvents++
	return nil
}

// proposeAcquires proposes q's pending acquires as one event. What the
// group did not take for now (too few replicas in sync, a busy node or
// backlog, or the shard's table of waiting events full) stays pending for
// the next batch; on any other refusal (this broker is not the master
// any more) the held deliveries are given back to the queue.
//
// An event declares the window of deliveries the master may send at once
// after it commits (declaredWindow; 0 when shrink, the idle master's
// event at a tick, tickAcquires).
func (s *Shard) proposeAcquires(q *Queue, shrink bool) {
	rs := q.rare
	// A message sent at once whose earlier event failed, and that was
	// settled since, is not acquired any more: it leaves the event.
	keep := rs.acquiring[:0]
	for _, seq := range rs.acquiring {
		if q.Acquired(seq) != nil {
			keep = append(keep, seq)
		}
	}
	clear(rs.acquiring[len(keep):])
	rs.acquiring = keep
	var win uint32
	if !shrink {
		win = declaredWindow(q)
	}
	gen := rs.acqGen + 1
	tag, ok := s.acqWaits.add(q, gen)
	var err error
	if !ok {
		err = Errorf(wire.CodeResourceLimit, "shard %d has %d acquires events waiting for their groups", s.idx, acqWaitsMax)
	} else if r := s.broker.loadReplicator(); r == nil {
		err = Errorf(wire.CodeUnavailable, "the shards are not connected to the replication groups")
	} else {
		// The outcome may come back at once (acquired): the held
		// deliveries carry gen already, the count of events in flight
		// and the window are up already, and rs.acquiring is not read
		// there.
		st := s.stampFor(q, tag)
		if st.Broker != 0 {
			// An owner that is not the master sends nothing at once: its
			// lease (Replicator.Owning) cannot tell it in time that it
			// lost the queue, so each of its deliveries waits for its
			// acquires event, which never counts for a lost owner
			// (own.go).
			win = 0
		}
		w := s.acqWaits.at(tag)
		w.window, w.term, w.immediate = win, rs.term, append(w.immediate[:0], rs.sentNow...)
		if w.stamped = st.Broker != 0; w.stamped {
			w.seqs = slices.Clone(rs.acquiring) // proposed again if it fails (own.go)
		}
		rs.acquiresInFlight++
		rs.winInFlight = append(rs.winInFlight, win)
		if err = r.ProposeAcquires(q, rs.acquiring, win, st, tag); err != nil {
			rs.acquiresInFlight--
			rs.winInFlight = rs.winInFlight[:len(rs.winInFlight)-1]
		}
	}
	if err == nil {
		s.stats.AcquiresEvents++
		rs.acqGen = gen
		rs.acquiring = rs.acquiring[:0]
		rs.sentNow = rs.sentNow[:0]
		if win > 0 && !rs.windowed {
			rs.windowed = true
			s.windowed = append(s.windowed, q)
		}
		if rs.acquireRefused {
			rs.acquireRefused = false
			s.log.Info("shards: the group took the acquires it had refused", "queue", q.Name)
		}
		return
	}
	if ok {
		s.acqWaits.take(tag)
	}
	if code := CodeOf(err); code == wire.CodeUnavailable || code == wire.CodeResourceLimit {
		if !rs.acquireRefused {
			rs.acquireRefused = true
			s.log.Warn("shards: the group did not take the acquires of replicated messages; proposing them again", "queue", q.Name, "messages", len(rs.acquiring), "err", err)
		}
		return
	}
	s.log.Warn("shards: the acquires of replicated messages were not proposed; they go back to the queue", "queue", q.Name, "messages", len(rs.acquiring), "err", err)
	rs.acquiring = rs.acquiring[:0]
	rs.uncovered -= len(rs.sentNow) // this broker steps down: resetGroup follows
	rs.sentNow = rs.sentNow[:0]
	rs.acqGen = gen // the holds of gen end here
	s.unholdQueue(q, gen)
}

// tickAcquires, at each tick, lets the window of a master's queue down
// to 0 once the queue has sent nothing for two ticks and every event of
// it committed: a new master then treats none of what it inherits ready
// as maybe delivered, so a failover of an idle master flags exactly what
// was handed out.
func (s *Shard) tickAcquires() {
	keep := s.windowed[:0]
	for _, q := range s.windowed {
		rs := q.rare
		if q.deleted || rs.window == 0 && len(rs.winInFlight) == 0 {
			rs.windowed = false
			continue
		}
		keep = append(keep, q)
		if !s.owns(q) || rs.window == 0 || rs.uncovered > 0 || rs.acquiresInFlight > 0 || rs.releasesInFlight > 0 ||
			len(rs.acquiring)+len(rs.releasing)+len(rs.returning)+len(rs.removing) > 0 {
			rs.idleTicks = 0
			continue
		}
		if rs.idleTicks++; rs.idleTicks >= 2 {
			rs.idleTicks = 0
			s.proposeAcquires(q, true)
		}
	}
	clear(s.windowed[len(keep):])
	s.windowed = keep
}

// AcquiresCommitted reports the outcome of the acquires event the shard
// gave tag to (Replicator.ProposeAcquires). It runs on any goroutine but
// the shard's, and allocates nothing when err is nil; a full ring is
// waited out, since an outcome must not be lost.
func (s *Shard) AcquiresCommitted(tag uint64, err error) {
	cmd := acquiredCommand(tag)
	if err != nil {
		cmd = CallCommand(func(sh *Shard) { sh.acquired(tag, err) })
	}
	_ = s.pushWait(s.broker.ctx, cmd) // fails only once the broker closes
}

// acquired ends the holds of the acquires event under tag: committed,
// the deliveries it records go out; failed, they go back to the queue
// (the event may still have committed: the next master then flags them,
// as the meaning of the flag allows). For a releases event, see
// proposeReleases.
func (s *Shard) acquired(tag uint64, err error) {
	w, ok := s.acqWaits.take(tag)
	if !ok {
		if err == nil {
			s.log.Error("shards: an acquires event's outcome for no waiting event", "tag", tag)
		}
		// (A stamped event's failure can come after its apply.)
		return
	}
	q := w.q
	rs := q.rareState()
	if w.term != rs.term {
		if w.done != nil {
			w.done(Errorf(wire.CodeOutcomeUnknown, "this broker lost queue %q with the settle in flight; its outcome is unknown", q.Name))
		}
		return // proposed before this broker stepped down (resetGroup)
	}
	if w.kind != 0 {
		s.ownOutcome(q, tag, w, err)
		return
	}
	if w.release {
		s.released(q, tag, w, err)
		return
	}
	rs.acquiresInFlight--
	rs.winInFlight = rs.winInFlight[1:] // a queue's events end in order
	if len(rs.acquiring) > 0 {
		s.listAcquiring(q) // what gathered meanwhile goes now
	}
	if err != nil && w.stamped && !q.deleted && s.owns(q) {
		s.acquiresFailed(q, tag, w)
		return
	}
	if err != nil {
		s.log.Warn("shards: an acquires event did not commit; its held deliveries go back to the queue", "queue", q.Name, "err", err)
		s.unholdQueue(q, w.gen)
		// Those sent at once went out: their acquisitions are proposed
		// again at the next tick, and stay counted against the window.
		again := false
		for _, seq := range w.immediate {
			if q.Acquired(seq) != nil && s.owns(q) {
				rs.acquiring = append(rs.acquiring, seq)
				rs.sentNow = append(rs.sentNow, seq)
				again = true
			} else {
				rs.uncovered--
			}
		}
		if again && !rs.acqListed {
			s.acqRetry = append(s.acqRetry, q)
		}
		return
	}
	rs.window = w.window
	rs.uncovered -= len(w.immediate)
	if w.stamped && !s.leased(q) {
		// Committed, but this owner's lease lapsed meanwhile: the held
		// deliveries go out once it is back (tickOwnership), or never,
		// if the queue was taken back (own.go).
		rs.heldReady = max(rs.heldReady, w.gen)
		s.watchOwnership(q)
		return
	}
	for _, con := range q.consumers {
		s.sendHeld(q, con, w.gen)
	}
}

// released ends a releases event's wait: its queue's acquires may go now;
// one that failed for now is pending again.
func (s *Shard) released(q *Queue, tag uint64, w acqWait, err error) {
	rs := q.rareState()
	rs.releasesInFlight--
	if err == nil && rs.acquiresInFlight < s.acquiresInFlightLimit(q) && len(rs.acquiring) > 0 {
		s.listAcquiring(q)
	}
	if err == nil || q.deleted || !s.masters(q) && !s.stamped(q) {
		if err != nil {
			s.log.Warn("shards: a releases event of replicated messages did not commit", "queue", q.Name, "messages", len(w.seqs), "err", err)
		}
		if len(rs.acquiring) > 0 {
			s.listAcquiring(q)
		}
		return
	}
	if code := CodeOf(err); code != wire.CodeUnavailable && code != wire.CodeResourceLimit {
		s.log.Warn("shards: a releases event of replicated messages did not commit", "queue", q.Name, "messages", len(w.seqs), "err", err)
		if w.stamped {
			s.loseTag(tag, q.group) // it may commit still: applied, it changes nothing here (own.go)
		}
		return
	}
	// Proposed again at the next tick (or with the queue's next
	// acquires), not at once: an outcome that comes back at once would
	// make the shard and the node spin while the group is short of
	// replicas.
	if w.unseen {
		rs.returning = append(rs.returning, w.seqs...)
	} else {
		rs.releasing = append(rs.releasing, w.seqs...)
	}
	if !rs.acqListed {
		s.acqRetry = append(s.acqRetry, q)
	}
}

// retryAcquiring lists again the queues whose releases failed for now
// (released); the shard calls it at each tick.
func (s *Shard) retryAcquiring() {
	for _, q := range s.acqRetry {
		if r := q.rare; r != nil && len(r.releasing)+len(r.returning)+len(r.acquiring) > 0 {
			s.listAcquiring(q)
		}
		if r := q.rare; r != nil && len(r.removingBy)+len(r.removeDone) > 0 && !slices.Contains(s.removing, q) {
			s.removing = append(s.removing, q) // own.go
		}
	}
	clear(s.acqRetry)
	s.acqRetry = s.acqRetry[:0]
}

// sendHeld sends con's held deliveries of events up to gen.
func (s *Shard) sendHeld(q *Queue, con *Consumer, gen uint64) {
	n := 0
	for n < len(con.held) && con.held[n].gen <= gen {
		n++
	}
	if n == 0 {
		return
	}
	q.rare.held -= n
	for i := range con.held[:n] {
		h := &con.held[i]
		size := h.size
		con.heldBytes -= size
		if !s.stillHeld(q, con, h) {
			h.Body.Unref() // settled before it went out (a guessed tag), or gone
			continue
		}
		con.pending = append(con.pending, h.Delivery)
		con.pendingBytes += size
		if len(con.pending) == 1 {
			o := s.out(con.Session)
			o.consumers = append(o.consumers, con)
		}
		if con.ackNone {
			ev := Event{Kind: EvDequeue, Seq: h.seq}
			s.localAcq, s.localStamped = true, q.replicated && s.stamped(q)
			_ = q.Apply(&ev, s)
			s.localAcq, s.localStamped = false, false
		}
	}
	clear(con.held[:n])
	con.held = slices.Delete(con.held, 0, n)
	if len(con.held) == 0 {
		con.heldBytes = 0
	}
}

// stillHeld reports whether h's message is still acquired for con under
// h's tag.
func (s *Shard) stillHeld(q *Queue, con *Consumer, h *heldDelivery) bool {
	if q.Acquired(h.seq) == nil {
		return false
	}
	if con.ackNone {
		return true
	}
	seq, ok := con.unacked[h.Tag]
	return ok && seq == h.seq
}

// unholdQueue gives the held deliveries of q's events up to gen back to
// the queue, on every consumer.
func (s *Shard) unholdQueue(q *Queue, gen uint64) {
	for _, con := range q.consumers {
		s.unhold(q, con, gen)
	}
	s.markDirty(q)
}

// unhold gives con's held deliveries of events up to gen back to the
// queue: the messages are ready again, in their places, with their
// delivery counts as they were (no consumer saw them), and con gets its
// credit back.
func (s *Shard) unhold(q *Queue, con *Consumer, gen uint64) {
	n := 0
	for n < len(con.held) && con.held[n].gen <= gen {
		n++
	}
	rs := q.rareState()
	rs.held -= n
	for i := range con.held[:n] {
		h := &con.held[i]
		con.heldBytes -= h.size
		if s.stillHeld(q, con, h) {
			e := q.Acquired(h.seq)
			q.unacquire(e)
			q.putBack(e)
			by, inLog := rs.acqByOf(h.seq)
			_, maybe := rs.maybeAcq[h.seq]
			if h.gen > rs.acqGen && !(inLog && by == s.self()) && !maybe {
				// Not proposed yet: the acquires event goes without it.
				// (One that failed and committed all the same is in the
				// log: acquiresFailed, ApplyAcquires.)
				if i := slices.Index(rs.acquiring, h.seq); i >= 0 {
					rs.acquiring = slices.Delete(rs.acquiring, i, i+1)
				}
			} else {
				if i := slices.Index(rs.acquiring, h.seq); i >= 0 {
					rs.acquiring = slices.Delete(rs.acquiring, i, i+1)
				}
				s.noteRelease(q, h.seq, true)
			}
			if !con.ackNone {
				delete(con.unacked, h.Tag)
			}
			if containsConsumer(q.consumers, con) {
				con.credit++
			}
		}
		h.Body.Unref()
	}
	clear(con.held[:n])
	con.held = slices.Delete(con.held, 0, n)
	if len(con.held) == 0 {
		con.heldBytes = 0
	}
}

// unholdAll gives back every delivery con holds (the consumer is
// cancelled or its session closed).
func (s *Shard) unholdAll(con *Consumer) {
	if len(con.held) > 0 {
		s.unhold(con.queue, con, ^uint64(0))
		s.markDirty(con.queue)
	}
}

// dropHeld forgets con's held deliveries and its acquisitions without
// touching the queue: the broker stepped down as master of the queue's
// group (resetGroup), whose log applied again rebuilds the queue, and
// whose next master requeues what this one handed out.
func dropHeld(con *Consumer) {
	if rs := con.queue.rare; rs != nil {
		rs.held -= len(con.held)
	}
	for i := range con.held {
		con.held[i].Body.Unref()
	}
	clear(con.held)
	con.held = con.held[:0]
	con.heldBytes = 0
	clear(con.unacked)
}

// voidHeld is dropHeld for a consumer that stays: the tags it held are
// kept as void (Consumer.voided), so that their accepts and rejects fail.
func voidHeld(con *Consumer) {
	for tag := range con.unacked {
		if len(con.voided) >= voidedMax {
			break
		}
		if con.voided == nil {
			con.voided = make(map[uint64]struct{}, len(con.unacked))
		}
		con.voided[tag] = struct{}{}
	}
	dropHeld(con)
}

// ApplyAcquires applies a committed acquires event of replicated queue q
// on a member that did not propose it (a proposer acquired the messages
// when it proposed the event): each message moves to the acquired set,
// held for the proposer's consumer. It runs on q's shard goroutine.
//
// window is the event's: how many more deliveries its proposer may send
// before its next event commits, which a new owner treats as maybe
// delivered (flagWindow). st is the proposer's stamp when it is not the
// master (own.go): the event counts only if st's broker owns q under
// st's number; the broker itself learns so here.
func (s *Shard) ApplyAcquires(q *Queue, seqs []uint64, window uint32, st event.Stamp) {
	if q.deleted {
		return
	}
	rs := q.rareState()
	valid := st.Broker == 0 || rs.ownedBy == st.Broker && rs.ownGen == st.Gen
	if s.ownLive(q, st) {
		if !valid {
			s.acquired(st.Tag, Errorf(wire.CodeUnavailable, "queue %q passed to another owner before this broker's acquires event", q.Name))
			return
		}
		if rs.acqBy == nil {
			rs.acqBy = make(map[uint64]uint32)
		}
		for _, seq := range seqs {
			if q.Acquired(seq) != nil {
				rs.acqBy[seq] = st.Broker
			}
			delete(rs.maybeAcq, seq)
		}
		s.listForeign(q)
		s.acquired(st.Tag, nil)
		return
	}
	if st.Broker == 0 && s.hasMastered(q.group) || !valid {
		return // this master's own; or void
	}
	if s.lost(st) {
		// This broker's, given up on and kept here (acquiresFailed): the
		// messages still acquired here are this broker's in the log too.
		for _, seq := range seqs {
			if q.Acquired(seq) != nil {
				if rs.acqBy == nil {
					rs.acqBy = make(map[uint64]uint32)
				}
				rs.acqBy[seq] = st.Broker
			}
		}
		return
	}
	if st.Broker != 0 && st.Broker == s.self() {
		// This broker's, from before it restarted or applied the log
		// again: no consumer of its holds what it acquired.
		rs.orphans = true
	}
	rs.window, rs.windowBy = window, st.Broker
	for _, seq := range seqs {
		e := q.takeReady(seq)
		if e == nil {
			continue // removed here already, or never enqueued (a dropped head)
		}
		if q.busy.acquired == nil {
			q.busy.acquired = make(map[uint64]*Entry)
		}
		q.busy.acquired[seq] = e
		q.free.totals.Unacked++
		if st.Broker != 0 {
			if rs.acqBy == nil {
				rs.acqBy = make(map[uint64]uint32)
			}
			rs.acqBy[seq] = st.Broker
		}
	}
	if st.Broker != 0 {
		s.listForeign(q)
	}
	s.watchHead(q)
}

// ApplyReleases applies a committed releases event of replicated queue q
// on a member that did not propose it: each message its proposer held
// as acquired is ready again, its delivery count raised unless unseen (a
// message that reaches the queue's delivery limit goes, as at the
// master, which dead-letters it and proposes its removal). st is the
// proposer's stamp when it is not the master (own.go): only what st's
// broker holds goes back. It runs on q's shard goroutine.
func (s *Shard) ApplyReleases(q *Queue, seqs []uint64, unseen bool, st event.Stamp) {
	if q.deleted {
		return
	}
	rs := q.rareState()
	if s.ownLive(q, st) {
		for _, seq := range seqs {
			delete(rs.acqBy, seq)
		}
		s.acquired(st.Tag, nil)
		return
	}
	if st.Broker == 0 && s.hasMastered(q.group) {
		return
	}
	if s.lost(st) {
		for _, seq := range seqs {
			if by, ok := rs.acqBy[seq]; ok && by == st.Broker {
				delete(rs.acqBy, seq)
			}
		}
		return
	}
	owner := st.Broker == 0 || rs.ownedBy == st.Broker && rs.ownGen == st.Gen
	for _, seq := range seqs {
		by, held := rs.acqBy[seq]
		if held && by != st.Broker {
			continue // another broker's
		}
		e := q.Acquired(seq)
		if e == nil {
			if !unseen && owner {
				// Sent at once and released before its acquires event
				// committed, or whose acquires event failed: it was
				// delivered all the same.
				if e := q.findReady(seq); e != nil {
					e.DeliveryCount++
				}
			}
			continue
		}
		if !held && st.Broker != 0 {
			continue // the master's
		}
		delete(rs.acqBy, seq)
		if unseen {
			q.unacquire(e)
			q.putBack(e)
			continue
		}
		ev := Event{Kind: EvRelease, Seq: seq}
		_ = q.Apply(&ev, s)
	}
	s.watchHead(q)
}

// findReady is q's ready message seq (released ones too), or nil.
func (q *Queue) findReady(seq uint64) *Entry {
	for lv := range q.levels {
		l := &q.levels[lv]
		if i := sort.Search(l.ready.len(), func(i int) bool { return l.ready.at(i).Seq >= seq }); i < l.ready.len() && l.ready.at(i).Seq == seq {
			return l.ready.at(i)
		}
		for _, e := range l.released {
			if e.Seq == seq {
				return e
			}
		}
	}
	return nil
}

// flagWindow counts as delivered once, and flags, what the last master
// may have sent at once after its last committed acquires event
// (windowEntries). It runs on becoming master, before requeueInherited;
// its followers count them alike (a releases event, which raises the
// count of a ready message). Each is an over-count when the old master
// had not sent it.
func (s *Shard) flagWindow(q *Queue) {
	entries := s.windowEntries(q)
	s.stats.Inherited += uint64(len(entries))
	for _, e := range entries {
		e.DeliveryCount++
		s.noteRelease(q, e.Seq, false)
	}
}

// windowEntries are what the owner whose acquires event declared q's
// window may have sent at once after it: in each priority level, the
// first window ready messages in the order it delivers them (by Seq;
// delayed messages that came due are made ready first, since it may
// have sent those too).
func (s *Shard) windowEntries(q *Queue) []*Entry {
	if q.rare == nil || q.rare.window == 0 {
		return nil
	}
	w := int(q.rare.window)
	ev := Event{Kind: EvPromote, Now: s.now}
	_ = q.Apply(&ev, s)
	// A message the log holds as acquired by a broker that is not the
	// master was not ready at the last master, so it is not in its window:
	// here it is ready only because this broker released it (as an owner)
	// ahead of the log, and its releases event counts it (ApplyReleases).
	acqBy := q.rare.acqBy
	var out []*Entry
	for lv := range q.levels {
		l := &q.levels[lv]
		var level []*Entry
		for i := range l.ready.len() {
			e := l.ready.at(i)
			if _, held := acqBy[e.Seq]; held {
				continue
			}
			level = append(level, e)
			if len(level) == w {
				break
			}
		}
		for _, e := range l.released {
			if _, held := acqBy[e.Seq]; !held {
				level = append(level, e)
			}
		}
		slices.SortFunc(level, func(a, b *Entry) int { return cmp.Compare(a.Seq, b.Seq) })
		out = append(out, level[:min(w, len(level))]...)
	}
	return out
}

// requeueInherited puts back, flagged redelivered with their delivery
// count raised, the messages of q that an earlier master handed out and
// that were not settled: those this member holds as acquired by a
// master (acqBy has the others, which their brokers still hold), and no
// consumer of its own holds (it acquired those as the queue's owner
// before it became master). A message whose count reaches the queue's
// delivery limit is dead-lettered, as at a release.
func (s *Shard) requeueInherited(q *Queue) {
	if len(q.acquiredMap()) == 0 {
		return
	}
	var here map[uint64]bool
	for _, con := range q.consumers {
		for _, seq := range con.unacked {
			if here == nil {
				here = map[uint64]bool{}
			}
			here[seq] = true
		}
		for _, h := range con.held {
			if here == nil {
				here = map[uint64]bool{}
			}
			here[h.seq] = true
		}
	}
	seqs := make([]uint64, 0, len(q.acquiredMap()))
	for seq := range q.acquiredMap() {
		if _, by := q.rare.acqByOf(seq); !by && !here[seq] {
			seqs = append(seqs, seq)
		}
	}
	slices.Sort(seqs)
	s.stats.Inherited += uint64(len(seqs))
	for _, seq := range seqs {
		ev := Event{Kind: EvRelease, Seq: seq}
		_ = q.Apply(&ev, s)
		s.noteRelease(q, seq, false)
	}
}

// acqByOf is the broker that holds seq acquired when it is not a master.
func (rs *queueRare) acqByOf(seq uint64) (uint32, bool) {
	if rs == nil || rs.acqBy == nil {
		return 0, false
	}
	b, ok := rs.acqBy[seq]
	return b, ok
}

// acqWaitsMax bounds a shard's acquires events waiting to commit.
const acqWaitsMax = 1 << 16

// acqWait is an acquires event waiting to commit: its queue, and the
// queue's event number (queueRare.acqGen) it carries.
type acqWait struct {
	q   *Queue
	gen uint64
	// kind is 0 for acquires and releases events, else waitRemoves,
	// waitOwn or waitWant (own.go); done is a stamped removes event's;
	// stamped: the event carries this broker's stamp (own.go).
	kind    uint8
	done    func(error)
	stamped bool
	// release: a releases event, of seqs (unseen ones), not an acquires.
	release, unseen bool
	seqs            []uint64
	// An acquires event's window, and the seqs it records that were sent
	// at once (the slot keeps the array for its next use).
	window    uint32
	immediate []uint64
	// term is the queue's queueRare.term when it was proposed.
	term uint32
}

// acqWaits are a shard's acquires and releases events waiting to commit,
// by tag (waitTable).
type acqWaits struct{ waitTable[acqWait] }

func (w *acqWaits) add(q *Queue, gen uint64) (uint64, bool) {
	tag, v, ok := w.waitTable.add(acqWaitsMax)
	if ok {
		*v = acqWait{q: q, gen: gen, immediate: v.immediate[:0]}
	}
	return tag, ok
}

// take keeps the slot's immediate array for its next use: the value it
// returns shares it, so read its immediate before the next add.
func (w *acqWaits) take(tag uint64) (acqWait, bool) {
	return w.waitTable.take(tag, func(v *acqWait) { v.q, v.seqs, v.done = nil, nil, nil })
}
