package shards

import (
	"slices"
	"time"

	"github.com/berthmq/berth/replication/event"
	"github.com/berthmq/berth/wire"
)

// Queue ownership (seed 000: "moving queue ownership"). Each replicated
// queue has at most one owner broker at a time, and only the owner
// acquires its messages. Ownership is state of the group log: an own
// event passes it (event.Own), and every member applies it at the same
// index, so all agree who owns the queue at each one. A queue no own
// event passed is owned by its group's master, whoever that is (owner
// 0), as before ownership.
//
// An owner that is not the master acquires from its own copy of the
// queue, which it keeps by applying the log as every follower does, and
// proposes its acquires, releases and removals through the master
// (the replicator forwards them) with a stamp: its broker id, the
// ownership number it holds the queue under, and a tag of its own. It
// learns their outcome when it applies them: a stamped acquires counts
// only if the queue's owner is that broker under that number, a stamped
// release or removal only for messages that broker holds acquired. So
// the rules are the same on every member, and an owner that lost the
// queue acquires nothing and completes nothing under its old ownership
// (fencing). Failures to propose come back at once (AcquiresCommitted).
//
// A broker whose local consumers hold credit on a queue records that it
// wants it (event.Want). The owner hands the queue over (an own event
// naming the next broker that wants it, by id, round robin) when none
// of its own consumers has credit left, or when its time slice ends
// (ShardConfig.OwnSlice) while another broker wants it. It first stops
// handing messages out and waits until everything it proposed
// committed, so that its last acquires event covers every delivery it
// sent at once, and the next owner inherits no window. A queue whose
// consumers all sit on one broker never moves: it costs nothing.
//
// An owner that is not the master owns only while it hears from the
// master (Replicator.Owning: within half the group's lag). The master
// takes back the queues of an owner silent for twice the lag
// (Replicator.Live): an own event naming the master (owner 0) with the
// lost broker to requeue, which puts back, redelivered, every message
// that broker held acquired from the queue, and counts the window of
// its last acquires event as delivered (flagWindowHere). The lost broker,
// if it comes back, applies that event too; what it did as owner ahead
// of the log is void, so it drops its copies of the group's queues and
// applies the log again (Replicator.Resync), as a master that steps down
// does, and its consumers of the group's queues are ended.

// OwnSliceDefault is ShardConfig.OwnSlice's default.
const OwnSliceDefault = 200 * time.Millisecond

// OwnRefreshDefault is ShardConfig.OwnRefresh's default: about what a
// group log compacts in (replication/groups compactEveryDefault).
const OwnRefreshDefault = 4096

// ownWatchEvery is how many ticks apart a master looks for owners and
// holders of acquisitions that went silent.
const ownWatchEvery = 10

// Kinds of an acqWait beyond acquires and releases.
const (
	waitRemoves = 1 + iota // a stamped removes event, done told at its apply
	waitOwn                // an own event of this owner's handover
	waitWant               // a want event of this broker
)

// self is this broker's id, 0 without a replicator.
func (s *Shard) self() uint32 {
	if r := s.broker.loadReplicator(); r != nil {
		return r.Self()
	}
	return 0
}

// owns reports whether this broker is q's owner: q is not replicated, or
// no own event passed it and this broker masters its group, or an own
// event passed it to this broker.
func (s *Shard) owns(q *Queue) bool {
	if !q.replicated {
		return true
	}
	rs := q.rare
	if rs == nil || rs.ownedBy == 0 {
		return s.masters(q)
	}
	return rs.ownedBy == s.self()
}

// stamped reports whether what this broker proposes of q's acquisitions
// carries its stamp: it is not the group's master (a master's events are
// its own without one).
func (s *Shard) stamped(q *Queue) bool { return !s.masters(q) }

// stampFor is the stamp of q's next event of this broker, under tag.
func (s *Shard) stampFor(q *Queue, tag uint64) event.Stamp {
	if !s.stamped(q) {
		return event.Stamp{}
	}
	rs := q.rareState()
	return event.Stamp{Broker: s.self(), Gen: rs.ownGen, Tag: tag}
}

// mineStamped reports whether the removal or release of q's message seq
// by this broker is stamped: this broker is not the master, or acquired
// the message as an owner before it became master.
func (s *Shard) mineStamped(q *Queue, seq uint64) bool {
	if s.stamped(q) {
		return true
	}
	rs := q.rare
	return rs != nil && rs.acqBy != nil && rs.acqBy[seq] == s.self() && rs.acqBy[seq] != 0
}

// acqByMine reports whether the log holds q's message seq as acquired by
// this broker as an owner (acqBy).
func (s *Shard) acqByMine(q *Queue, seq uint64) bool {
	rs := q.rare
	if rs == nil || rs.acqBy == nil {
		return false
	}
	by, ok := rs.acqBy[seq]
	return ok && by == s.self()
}

// watchOwnership lists q for the checks of the next tick (tickOwnership).
func (s *Shard) watchOwnership(q *Queue) {
	if !q.replicated {
		return
	}
	rs := q.rareState()
	if !rs.ownWatched {
		rs.ownWatched = true
		s.ownWatch = append(s.ownWatch, q)
	}
}

// hasCredit reports whether a consumer of q on this shard has credit.
func hasCredit(q *Queue) bool {
	for _, con := range q.consumers {
		if con.credit > 0 {
			return true
		}
	}
	return false
}

// quiet reports whether nothing of q that this broker proposed, or holds
// to propose, waits: what a handover waits for.
func quiet(q *Queue) bool {
	rs := q.rare
	return rs == nil || len(rs.acquiring)+len(rs.releasing)+len(rs.returning)+len(rs.removing)+len(rs.removingBy) == 0 &&
		rs.acquiresInFlight == 0 && rs.releasesInFlight == 0 && rs.removesInFlight == 0 && rs.uncovered == 0 && rs.held == 0
}

// tickOwnership, at each tick, proposes this broker's wants of the
// queues it watches, starts and ends its handovers, and (every
// ownWatchEvery ticks, as a master) takes back the queues of owners that
// went silent.
func (s *Shard) tickOwnership() {
	r := s.broker.loadReplicator()
	if r == nil {
		return
	}
	self := r.Self()
	dt := s.now - s.ownTick
	if s.ownTick == 0 || dt < 0 {
		dt = 0
	}
	s.ownTick = s.now
	keep := s.ownWatch[:0]
	for _, q := range s.ownWatch {
		rs := q.rare
		if q.deleted || rs == nil {
			if rs != nil {
				rs.ownWatched = false
			}
			continue
		}
		if rs.ownedBy == self && !s.hasMastered(q.group) {
			s.stats.OwnedNanos += uint64(dt)
		}
		if rs.heldReady > 0 && s.leased(q) {
			for _, con := range q.consumers {
				s.sendHeld(q, con, rs.heldReady)
			}
			rs.heldReady = 0
		}
		credit := hasCredit(q)
		// This broker wants the queue while its consumers have credit
		// and it does not own it (an own event that gives a broker the
		// queue ends its want, on every member: ApplyOwn).
		wanted := slices.Contains(rs.wanters, self)
		if desire := credit && !s.owns(q); rs.wantInFlight == 0 && desire != wanted {
			s.proposeWant(q, !desire)
		}
		if s.owns(q) {
			others := len(rs.wanters) > 0 && (len(rs.wanters) > 1 || rs.wanters[0] != self)
			// An empty queue stays: handing it over moves nothing.
			if others && !rs.handing && q.Ready() > 0 && (!credit || s.now-rs.ownedAt >= int64(s.ownSlice())) {
				rs.handing = true // dispatch stops (delivers)
			}
			if rs.handing && !others && !rs.ownInFlight {
				rs.handing = false
				s.markDirty(q)
			}
			if rs.handing && !rs.ownInFlight && quiet(q) {
				s.proposeOwn(q, nextWanter(rs.wanters, self), 0)
			}
		} else if rs.handing {
			rs.handing = false
		}
		if len(q.consumers) > 0 || rs.heldReady > 0 || rs.handing || rs.wantInFlight > 0 || rs.ownInFlight || slices.Contains(rs.wanters, self) ||
			rs.ownedBy == self && len(rs.wanters) > 0 {
			keep = append(keep, q)
		} else {
			rs.ownWatched = false
		}
	}
	clear(s.ownWatch[len(keep):])
	s.ownWatch = keep

	if s.ownTicks++; s.ownTicks < ownWatchEvery {
		return
	}
	s.ownTicks = 0
	s.refreshOwnership(r)
	keepF := s.foreign[:0]
	for _, q := range s.foreign {
		rs := q.rare
		if q.deleted || rs == nil || !rs.foreignListed {
			continue
		}
		if rs.ownedBy == 0 || rs.ownedBy == self {
			if len(rs.acqBy) == 0 {
				rs.foreignListed = false
				continue
			}
		}
		keepF = append(keepF, q)
		if rs.orphans {
			s.checkOrphans(q)
		}
		if !s.masters(q) || rs.ownInFlight {
			continue
		}
		// An owner silent past twice the lag loses the queue; the
		// acquisitions of a silent broker go back.
		if o := rs.ownedBy; o != 0 && o != self && !r.Live(q.group, o) {
			s.log.Warn("shards: the owner of a replicated queue went silent; its master takes the queue back and requeues what it had acquired", "queue", q.Name, "owner", o)
			s.proposeOwn(q, 0, o)
			continue
		}
		for _, b := range holders(rs.acqBy) {
			if b != self && b != rs.ownedBy && !r.Live(q.group, b) {
				s.log.Warn("shards: a broker holding acquired messages of a replicated queue went silent; its master requeues them", "queue", q.Name, "broker", b)
				s.proposeOwn(q, rs.ownedBy, b)
				break
			}
		}
	}
	clear(s.foreign[len(keepF):])
	s.foreign = keepF
}

// heldBy reports whether acqBy holds a message acquired by broker b.
func heldBy(acqBy map[uint64]uint32, b uint32) bool {
	for _, by := range acqBy {
		if by == b && b != 0 {
			return true
		}
	}
	return false
}

// checkOrphans looks, once nothing of q that this broker proposed is in
// flight, for messages the log holds as acquired by this broker and that
// no consumer of this broker holds: their consumers were ended when it
// applied the log again (a master's step-down, whose consumers the server
// ends; a lost owner's resync) or when it restarted, and nothing else
// would settle them. It proposes an own event that requeues what it holds
// (as a master does for a silent broker), keeping the queue's owner, or
// giving it back to the master if this broker owns it. Every member
// applies the requeue at the same index, this broker too, which applies
// the log again then (ApplyOwn), so what its consumers acquired since is
// void here as well: nothing stays held by two brokers.
func (s *Shard) checkOrphans(q *Queue) {
	rs := q.rare
	self := s.self()
	if q.deleted || self == 0 || !heldBy(rs.acqBy, self) {
		rs.orphans = false
		return
	}
	if rs.ownInFlight || !quiet(q) {
		return // the next check
	}
	here := map[uint64]bool{}
	for _, con := range s.consumers {
		if con.queue != q {
			continue
		}
		for _, seq := range con.unacked {
			here[seq] = true
		}
		for _, h := range con.held {
			here[h.seq] = true
		}
	}
	n := 0
	for seq, by := range rs.acqBy {
		if by == self && !here[seq] {
			n++
		}
	}
	if n == 0 {
		rs.orphans = false
		return
	}
	owner := rs.ownedBy
	if owner == self {
		owner = 0
	}
	s.log.Warn("shards: the group's log holds messages of a replicated queue as acquired by this broker, which no consumer here holds any more; proposing their requeue", "queue", q.Name, "messages", n)
	s.stats.OrphanRequeues++
	s.proposeOwn(q, owner, self)
}

// listRefresh lists q for refreshOwnership, once.
func (s *Shard) listRefresh(q *Queue) {
	rs := q.rareState()
	if !rs.refreshListed {
		rs.refreshListed = true
		s.refresh = append(s.refresh, q)
	}
}

// refreshOwnership states again the own and want events in effect that
// this broker is the proposer of, once their group's log has moved
// OwnRefresh entries past them: an event in effect is never compacted
// (replication's ownTrack), and would keep every entry after it; its
// restatement supersedes it. The queue's owner (its master, for an own
// event that gave the queue back to the master) restates its own event,
// once nothing of it is in flight (it bumps the ownership number); a
// broker that still wants a queue, its want.
func (s *Shard) refreshOwnership(r Replicator) {
	every := s.cfg.OwnRefresh
	if every == 0 {
		every = OwnRefreshDefault
	}
	self := r.Self()
	keep := s.refresh[:0]
	for _, q := range s.refresh {
		rs := q.rare
		if q.deleted || rs == nil || rs.ownIndex == 0 && rs.wantIndex == 0 {
			if rs != nil {
				rs.refreshListed = false
			}
			continue
		}
		keep = append(keep, q)
		at := r.Applied(q.group)
		mine := rs.ownedBy == self || rs.ownedBy == 0 && s.masters(q)
		if mine && rs.ownIndex != 0 && at > rs.ownIndex+every && !rs.handing && !rs.ownInFlight && quiet(q) {
			s.proposeOwn(q, rs.ownedBy, 0)
		}
		if rs.wantIndex != 0 && at > rs.wantIndex+every && rs.wantInFlight == 0 && slices.Contains(rs.wanters, self) {
			s.proposeWant(q, false)
		}
	}
	clear(s.refresh[len(keep):])
	s.refresh = keep
}

// ownSlice is the time an owner keeps a queue while another broker
// wants it.
func (s *Shard) ownSlice() time.Duration {
	if s.cfg.OwnSlice > 0 {
		return s.cfg.OwnSlice
	}
	return OwnSliceDefault
}

// holders lists the brokers that hold messages of acqBy, in increasing
// order.
func holders(acqBy map[uint64]uint32) []uint32 {
	var out []uint32
	for _, b := range acqBy {
		if !slices.Contains(out, b) {
			out = append(out, b)
		}
	}
	slices.Sort(out)
	return out
}

// nextWanter is the broker after self among wanters (sorted), round
// robin; 0 if none but self.
func nextWanter(wanters []uint32, self uint32) uint32 {
	for _, b := range wanters {
		if b > self {
			return b
		}
	}
	for _, b := range wanters {
		if b != self {
			return b
		}
	}
	return 0
}

// proposeWant proposes that this broker wants q, or (withdraw) no more.
func (s *Shard) proposeWant(q *Queue, withdraw bool) {
	rs := q.rareState()
	r := s.broker.loadReplicator()
	tag, ok := s.acqWaits.add(q, 0)
	if !ok {
		return // the next tick asks again
	}
	w := s.acqWaits.at(tag)
	w.kind, w.term = waitWant, rs.term
	data := event.AppendWant(nil, &event.Want{Queue: []byte(q.Name), Broker: r.Self(), Withdraw: withdraw, Stamp: event.Stamp{Broker: r.Self(), Gen: rs.ownGen, Tag: tag}})
	rs.wantInFlight++
	if err := r.ProposeEvent(q, data, tag); err != nil {
		rs.wantInFlight--
		s.acqWaits.take(tag)
	}
}

// proposeOwn proposes that q passes to owner (0: the group's master),
// with requeue's acquisitions put back if not 0.
func (s *Shard) proposeOwn(q *Queue, owner, requeue uint32) {
	rs := q.rareState()
	r := s.broker.loadReplicator()
	tag, ok := s.acqWaits.add(q, 0)
	if !ok {
		return
	}
	w := s.acqWaits.at(tag)
	w.kind, w.term = waitOwn, rs.term
	// Stamped by the master too: the stamp's tag is how this broker knows
	// its event when it applies it (an own event counts by its number).
	o := event.Own{Queue: []byte(q.Name), Gen: rs.ownGen + 1, Owner: owner, Requeue: requeue, Stamp: event.Stamp{Broker: r.Self(), Gen: rs.ownGen, Tag: tag}}
	rs.ownInFlight = true
	if err := r.ProposeEvent(q, event.AppendOwn(nil, &o), tag); err != nil {
		rs.ownInFlight = false
		s.acqWaits.take(tag)
		s.log.Debug("shards: an own event was not proposed; the next tick tries again", "queue", q.Name, "err", err)
	}
}

// ownOutcome ends the wait of an own, want or stamped removes event that
// failed to be proposed or whose apply came (err nil).
func (s *Shard) ownOutcome(q *Queue, tag uint64, w acqWait, err error) {
	rs := q.rareState()
	switch w.kind {
	case waitWant:
		rs.wantInFlight--
	case waitOwn:
		rs.ownInFlight = false
	case waitRemoves:
		rs.removesInFlight--
		if err != nil {
			s.loseTag(tag, q.group)
			// Not proposed, or its outcome unknown: proposed again (a
			// removal applies once).
			if !q.deleted && CodeOf(err) != wire.CodeShutdown {
				// The messages are gone here: the removal must reach the
				// log, and is proposed again (at the next tick, not at
				// once). The settle is answered now, with the failure
				// (unavailable, or outcome-unknown), as a master's is:
				// it may have taken effect, and will.
				rs.removingBy = append(rs.removingBy, w.seqs...)
				s.acqRetry = append(s.acqRetry, q)
			}
		}
		if w.done != nil {
			w.done(err)
		}
	}
}

// lostTagsMax bounds Shard.lostTags: past it the oldest knowledge goes
// (the table is cleared), at the cost of a late commit applied here.
const lostTagsMax = 1 << 14

// loseTag notes tag as a stamped event of this broker, of group g, that
// may still commit after its failure came back.
func (s *Shard) loseTag(tag uint64, g uint32) {
	if s.lostTags == nil || len(s.lostTags) >= lostTagsMax {
		s.lostTags = map[uint64]uint32{}
	}
	s.lostTags[tag] = g
}

// forgetLost forgets the lost tags of group g: this broker dropped its
// copies of g's queues (resetGroup), so an event of one, applied again
// or late, is applied as any member's.
func (s *Shard) forgetLost(g uint32) {
	for tag, tg := range s.lostTags {
		if tg == g {
			delete(s.lostTags, tag)
		}
	}
}

// lost reports whether st is a stamped event of this broker given up on
// (loseTag), forgetting it: it applies nothing of it.
func (s *Shard) lost(st event.Stamp) bool {
	if st.Broker == 0 || st.Broker != s.self() || s.lostTags == nil {
		return false
	}
	if _, ok := s.lostTags[st.Tag]; ok {
		delete(s.lostTags, st.Tag)
		return true
	}
	return false
}

// acquiresFailed handles the failure of this broker's stamped acquires
// event under tag (not taken, or its outcome unknown): its held
// deliveries stay held, now for the queue's next event, which records
// its messages again (an acquire applies once); the event, should it
// commit all the same, changes nothing here (loseTag).
func (s *Shard) acquiresFailed(q *Queue, tag uint64, w acqWait) {
	rs := q.rareState()
	s.loseTag(tag, q.group)
	next := rs.acqGen + 1
	for _, con := range q.consumers {
		for i := range con.held {
			if con.held[i].gen == w.gen {
				con.held[i].gen = next
			}
		}
	}
	for _, seq := range w.seqs {
		if rs.maybeAcq == nil {
			rs.maybeAcq = map[uint64]struct{}{}
		}
		rs.maybeAcq[seq] = struct{}{}
		if q.Acquired(seq) == nil {
			continue // settled meanwhile
		}
		rs.acquiring = append(rs.acquiring, seq)
		if slices.Contains(w.immediate, seq) {
			rs.sentNow = append(rs.sentNow, seq)
		}
	}
	for _, seq := range w.immediate {
		if q.Acquired(seq) == nil {
			rs.uncovered--
		}
	}
	if !rs.acqListed {
		s.acqRetry = append(s.acqRetry, q) // at the next tick, not at once
	}
}

// ownLive reports whether st is this broker's and names its live wait
// for q: a stamped event it proposed and now applies. False when the
// event is not a live proposal of this broker: it applies it then as any
// member's (this broker applies its log again, or gave the wait up).
func (s *Shard) ownLive(q *Queue, st event.Stamp) bool {
	if st.Broker == 0 || st.Broker != s.self() {
		return false
	}
	w, ok := s.acqWaits.peek(st.Tag)
	return ok && w.q == q && w.term == q.rareState().term
}

// ownApplied takes this broker's live wait for q under st, if ownLive.
func (s *Shard) ownApplied(q *Queue, st event.Stamp) (acqWait, bool) {
	if !s.ownLive(q, st) {
		return acqWait{}, false
	}
	return s.acqWaits.take(st.Tag)
}

// ApplyOwn applies a committed own event of replicated queue q, at log
// index (every member, the master and the owners too).
func (s *Shard) ApplyOwn(q *Queue, o *event.Own, index uint64) {
	rs := q.rareState()
	w, mine := s.ownApplied(q, o.Stamp)
	if mine {
		defer s.ownOutcome(q, o.Stamp.Tag, w, nil)
	}
	if q.deleted || o.Gen <= rs.ownGen {
		return // passed over by another own event: void everywhere
	}
	self := s.self()
	if o.Requeue != 0 && o.Requeue == self && !s.hasMastered(q.group) {
		// This broker lost what it owned: what it did ahead of the log
		// is void. Its copies of the group's queues here go now (its
		// settles in flight fail, and none of its events applied from
		// here on counts as its own), and the node applies the group's
		// log again, which resets its other shards too.
		if r := s.broker.loadReplicator(); r != nil {
			r.Resync(q.group, index)
		}
		if s.revokedAt == nil {
			s.revokedAt = map[uint32]uint64{}
		}
		if s.revokedAt[q.group] < index {
			// (Once: applied again, the event takes its course below.)
			s.revokedAt[q.group] = index
			resetGroup(q.group)(s)
			return
		}
	}
	lost := o.Requeue != 0 && o.Requeue == rs.ownedBy
	if o.Requeue != 0 {
		// The window first: it counts what is ready, and what comes
		// back next is counted by its requeue.
		// (Only the lost owner's own window: one an earlier master
		// declared is stale on a follower, flagged by the master that
		// followed it, and 0 on the master, which reset it.)
		if lost && rs.windowBy == o.Requeue {
			s.flagWindowHere(q)
		}
		s.requeueHeldBy(q, o.Requeue)
	}
	rs.ownedBy, rs.ownGen, rs.ownIndex = o.Owner, o.Gen, index
	if i, found := slices.BinarySearch(rs.wanters, o.Owner); found && o.Owner != 0 {
		rs.wanters = slices.Delete(rs.wanters, i, i+1) // it has what it wanted
		if o.Owner == self {
			rs.wantIndex = 0
		}
	}
	rs.window, rs.handing = 0, false
	s.listRefresh(q)
	s.stats.OwnEvents++
	if s.owns(q) {
		rs.ownedAt = s.now
		s.markDirty(q)
	}
	if rs.ownedBy != 0 && rs.ownedBy != self || len(rs.acqBy) > 0 {
		s.listForeign(q)
	}
	s.watchOwnership(q)
}

// listForeign lists q among the queues a master watches for silent
// owners and holders.
func (s *Shard) listForeign(q *Queue) {
	rs := q.rareState()
	if !rs.foreignListed {
		rs.foreignListed = true
		s.foreign = append(s.foreign, q)
	}
}

// ApplyWant applies a committed want event of replicated queue q, at
// log index.
func (s *Shard) ApplyWant(q *Queue, broker uint32, withdraw bool, tag, index uint64) {
	rs := q.rareState()
	if broker == s.self() {
		rs.wantIndex = 0
		if !withdraw {
			rs.wantIndex = index
			s.listRefresh(q)
		}
	}
	if w, mine := s.ownApplied(q, event.Stamp{Broker: broker, Tag: tag}); mine {
		defer s.ownOutcome(q, tag, w, nil)
	}
	i, found := slices.BinarySearch(rs.wanters, broker)
	switch {
	case withdraw && found:
		rs.wanters = slices.Delete(rs.wanters, i, i+1)
	case !withdraw && !found:
		rs.wanters = slices.Insert(rs.wanters, i, broker)
	}
	s.watchOwnership(q)
}

// requeueHeldBy puts back, redelivered, the messages of q that broker b
// holds acquired (it was lost), on this member; the master dead-letters
// those that reach the delivery limit, as at a release.
func (s *Shard) requeueHeldBy(q *Queue, b uint32) {
	rs := q.rare
	if rs == nil || len(rs.acqBy) == 0 {
		return
	}
	var seqs []uint64
	for seq, by := range rs.acqBy {
		if by == b {
			seqs = append(seqs, seq)
		}
	}
	slices.Sort(seqs)
	for _, seq := range seqs {
		delete(rs.acqBy, seq)
		if q.Acquired(seq) == nil {
			continue
		}
		ev := Event{Kind: EvRelease, Seq: seq}
		_ = q.Apply(&ev, s)
	}
	s.stats.Inherited += uint64(len(seqs))
	s.watchHead(q)
}

// flagWindowHere is flagWindow applied by every member alike at an own
// event that takes a queue from a lost owner: no releases event follows.
func (s *Shard) flagWindowHere(q *Queue) {
	for _, e := range s.windowEntries(q) {
		e.DeliveryCount++
	}
}

// noteRemovedBy notes, for q's next stamped removes event, this broker's
// removal of message seq.
func (s *Shard) noteRemovedBy(q *Queue, seq uint64) {
	rs := q.rareState()
	if len(rs.removing) == 0 && len(rs.removingBy) == 0 {
		s.removing = append(s.removing, q)
	}
	rs.removingBy = append(rs.removingBy, seq)
}

// proposeRemovesBy proposes q's pending stamped removals as events, the
// last one telling done (if not nil) at its apply; with none pending and
// done not nil, an empty one (which orders done after every removal
// before it).
func (s *Shard) proposeRemovesBy(q *Queue, done func(error)) error {
	rs := q.rareState()
	r := s.broker.loadReplicator()
	if r == nil {
		return Errorf(wire.CodeUnavailable, "the shards are not connected to the replication groups")
	}
	dones := rs.removeDone
	rs.removeDone = nil
	if done != nil {
		dones = append(dones, done)
	}
	all := func(err error) {
		for _, d := range dones {
			d(err)
		}
	}
	if len(rs.removingBy) == 0 && len(dones) == 0 {
		return nil
	}
	for first := true; first || len(rs.removingBy) > 0; first = false {
		n := min(len(rs.removingBy), RemovesMax)
		tag, ok := s.acqWaits.add(q, 0)
		if !ok {
			rs.removeDone = dones
			return Errorf(wire.CodeResourceLimit, "shard %d has %d events waiting for their groups", s.idx, acqWaitsMax)
		}
		w := s.acqWaits.at(tag)
		w.kind, w.term, w.seqs = waitRemoves, rs.term, slices.Clone(rs.removingBy[:n])
		if n == len(rs.removingBy) && len(dones) > 0 {
			w.done = all
		}
		// Stamped by this broker even as master: these are what it
		// acquired as an owner before (mineStamped).
		data := event.AppendRemoves(nil, q.Name, rs.removingBy[:n], event.Stamp{Broker: r.Self(), Gen: rs.ownGen, Tag: tag})
		rs.removesInFlight++
		if err := r.ProposeEvent(q, data, tag); err != nil {
			rs.removesInFlight--
			s.acqWaits.take(tag)
			rs.removeDone = dones
			return err
		}
		rs.removingBy = rs.removingBy[n:]
	}
	rs.removingBy = rs.removingBy[:0]
	return nil
}

// ApplyRemovesBy applies a committed stamped removes event of q: each
// message st's broker holds acquired leaves, and each one that no broker
// holds, if st's broker owns q under st's number (a delivery it sent at
// once and that was settled before its acquires event went).
func (s *Shard) ApplyRemovesBy(q *Queue, seqs []uint64, st event.Stamp) {
	rs := q.rareState()
	if w, mine := s.ownApplied(q, st); mine {
		// It counts for the messages this broker holds in the log, and
		// for those no broker holds while it owns the queue under st's
		// number, as on every member; a message taken back from it
		// meanwhile was not removed, and the settle fails.
		owner := rs.ownedBy == st.Broker && rs.ownGen == st.Gen
		var err error
		for _, seq := range seqs {
			if by, held := rs.acqBy[seq]; held && by == st.Broker || !held && owner {
				delete(rs.acqBy, seq)
				continue
			}
			err = Errorf(wire.CodeOutcomeUnknown, "queue %q was taken back from this broker before its accept reached the group; the message was requeued", q.Name)
		}
		if err == nil {
			s.ownOutcome(q, st.Tag, w, nil)
			return
		}
		rs.removesInFlight-- // (not proposed again: it cannot count)
		if w.done != nil {
			w.done(err)
		}
		return
	}
	if s.lost(st) {
		for _, seq := range seqs {
			delete(rs.acqBy, seq)
		}
		return
	}
	owner := rs.ownedBy == st.Broker && rs.ownGen == st.Gen
	for _, seq := range seqs {
		by, held := rs.acqBy[seq]
		if held && by != st.Broker || !held && (!owner || q.Acquired(seq) != nil) {
			continue
		}
		delete(rs.acqBy, seq)
		ev := Event{Kind: EvRemove, Seq: seq}
		s.fromLog = true
		_ = q.Apply(&ev, s)
		s.fromLog = false
	}
	s.watchHead(q)
}
