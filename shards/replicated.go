package shards

import (
	"context"
	"github.com/berthmq/berth/replication/event"
	"sync/atomic"

	"github.com/berthmq/berth/wire"
)

// Replicator carries the events of replicated queues through their
// replication group's log (replication/groups). A replicated queue's messages
// live in the group log, not in the shard's journal: the group's master
// proposes each enqueue and each removal, and every member of the group,
// the master included, applies them when they commit (ApplyEnqueue,
// ApplyRemove). Only the master delivers.
//
// Its methods are called on the shard goroutine and must not block; done
// callbacks run later on another goroutine.
type Replicator interface {
	// IsMaster reports whether this broker is the master of group g.
	IsMaster(g uint32) bool
	// Delivering reports whether this broker, as g's master, may hand
	// out g's messages now: it holds the controller's lease, and the
	// fence after its election has passed, so no master it replaced
	// delivers any more (group.Member.Delivering). It is asked at each
	// dispatch, so it must be cheap (atomic loads and a clock read).
	Delivering(g uint32) bool
	// ProposeEnqueue proposes the enqueue of b on q, and reports the
	// outcome to q's shard, Shard.Committed(tag, err), once the event is
	// committed and applied here. An error means it was not proposed (and
	// nothing is reported). producer and producerSeq (0 for none) travel
	// in the event, for ApplyEnqueue's deduplication.
	ProposeEnqueue(q *Queue, b *Body, expiresAt int64, producer, producerSeq uint64, tag uint64) error
	// ProposeRemoves proposes, as one event, the removal of messages
	// seqs (at most RemovesMax) from q; done, if not nil, is told when it
	// committed. seqs is the caller's again when it returns.
	ProposeRemoves(q *Queue, seqs []uint64, done func(error)) error
	// ProposeReleases proposes, as one event, that this broker put
	// acquired messages seqs (at most RemovesMax) of q back, unseen if no
	// consumer saw them (their delivery counts stay), and reports the
	// outcome as ProposeAcquires does. seqs is the caller's again when it
	// returns.
	ProposeReleases(q *Queue, seqs []uint64, unseen bool, st event.Stamp, tag uint64) error
	// ProposeAcquires proposes, as one event, that this broker, q's
	// owner, handed messages seqs (at most RemovesMax) of q out to
	// consumers, and reports the outcome to q's shard,
	// Shard.AcquiresCommitted(tag, err), once the event committed and
	// every event before it did. An error means it was not proposed (and
	// nothing is reported). seqs is the caller's again when it returns.
	// window is the event's (Shard.flagWindow). An event with a stamp
	// (st.Broker not 0: this broker is not the master, own.go) goes
	// through the master, and only its failure is reported: the shard
	// learns that it counted when it applies it.
	ProposeAcquires(q *Queue, seqs []uint64, window uint32, st event.Stamp, tag uint64) error
	// ProposeEvent proposes data, an own or want event or a stamped
	// removes event of q (own.go), through the master if this broker is
	// not it, and reports only its failure, to AcquiresCommitted(tag,
	// err): the shard learns its outcome when it applies it.
	ProposeEvent(q *Queue, data []byte, tag uint64) error
	// Self is this broker's id.
	Self() uint32
	// Owning reports whether this broker, a member of group g that is
	// not its master, heard from the master recently enough to act as
	// the owner of g's queues it owns (own.go). Cheap, as Delivering.
	Owning(g uint32) bool
	// Live reports whether broker b, a member of group g, answered this
	// broker, g's master, recently enough to keep the queues it owns and
	// the messages it holds (true if this broker is not g's master).
	Live(g, b uint32) bool
	// Applied is the index of the last entry of group g this broker
	// applied, 0 if not known. Cheap, as Delivering.
	Applied(g uint32) uint64
	// Resync makes this broker drop its copies of group g's queues and
	// apply g's log again: at index it applied an own event by which the
	// group took back what this broker owned (own.go).
	Resync(g uint32, index uint64)
	// Barrier calls done once every event proposed before it on q's group
	// committed.
	Barrier(q *Queue, done func(error)) error
	// ProposeDelete proposes the deletion of q, which the master dropped:
	// the followers drop their copy when it commits.
	ProposeDelete(q *Queue) error
	// ReadEnqueue reads back the body of q's message seq, whose enqueue
	// event the group log paged out (ApplyEnqueue's logPos), from the
	// group journal at logPos. It may use dst's array; it returns it
	// for the next call. The body is a new one with one reference.
	ReadEnqueue(q *Queue, seq, logPos uint64, dst []byte) (*Body, []byte, error)
	// Skipped tells that ApplyEnqueue skipped q's enqueue at seq as a
	// producer's duplicate: the entry has no effect here, like that of a
	// message removed since, so applying the log again must not enqueue
	// it (with the producer table reset, it could not tell it is a
	// duplicate) and compaction may pass it. Called on the shard
	// goroutine; it must not block.
	Skipped(q *Queue, seq uint64)
	// MemoryBytes is what the replication holds in memory outside the
	// group logs: the group journal's index and the frames queued for
	// peers. The shards count it against the budget (memory.go); it is
	// called on each shard goroutine once per loop, so it must be cheap
	// (a few atomic loads) and safe from any goroutine.
	MemoryBytes() int64
}

// pageGroupLog marks an Entry.page that is a replicated message's
// position in its group's journal rather than a paging-file location
// (whose segment ids stay far below 1<<31).
const pageGroupLog = 1 << 63

type replicatorBox struct{ r Replicator }

// SetReplicator connects the broker to the replication groups. Queues
// added from then on whose Group says so are replicated; set it before the
// wiring is restored.
func (b *Broker) SetReplicator(r Replicator) { b.replicator.Store(&replicatorBox{r}) }

func (b *Broker) loadReplicator() Replicator {
	if box := b.replicator.Load(); box != nil {
		return box.r
	}
	return nil
}

// replicatorField is embedded in Broker.
type replicatorField struct{ replicator atomic.Pointer[replicatorBox] }

// Replicated reports whether q's events go through a group log, and its
// group.
func (q *Queue) Replicated() (group uint32, ok bool) { return q.group, q.replicated }

// ApplyEnqueue applies a committed enqueue of a replicated queue: the
// message gets the event's log index as its Seq, and is deliverable at
// once. logPos, if not 0, is the event's position in the group journal:
// the group log dropped the event's data (the shard was above its high
// watermark, Paging), so b holds the only copy in memory and the shard
// may page it out, to read it back from there (ReadEnqueue). An enqueue whose (producer, producerSeq) is not newer than the
// last one applied for that producer on q is skipped (dedup.go); every
// member skips it alike, and the master completes its command as usual.
// It runs on q's shard goroutine (inside Broker.Call or a pushed call);
// b's reference passes to the queue.
func (s *Shard) ApplyEnqueue(q *Queue, seq uint64, b *Body, expiresAt int64, producer, producerSeq, logPos uint64) {
	if q.deleted {
		// Committed after the master dropped the queue: the entry has no
		// effect, and compaction may pass it.
		b.Unref()
		if r := s.broker.loadReplicator(); r != nil {
			r.Skipped(q, seq)
		}
		return
	}
	if q.duplicate(producer, producerSeq) {
		b.Unref()
		s.stats.Duplicates++
		if r := s.broker.loadReplicator(); r != nil {
			r.Skipped(q, seq)
		}
		return
	}
	q.noteProducer(producer, producerSeq)
	ev := Event{Kind: EvEnqueue, Seq: seq, Body: b, ExpiresAt: expiresAt, Priority: b.Priority, DeliverAt: b.DeliverAt}
	if err := q.Apply(&ev, s); err != nil {
		// Full here though the master took it (a smaller bound, or
		// removes not applied yet): keep it rather than diverge.
		q.place(&ev, uint64(b.Size()))
	}
	if logPos != 0 {
		q.busy.tail.page = pageGroupLog | logPos
	}
	s.admit(q)
	s.noteExpiry(q, expiresAt)
	if ev.DeliverAt != 0 {
		s.schedule(q, ev.DeliverAt)
	}
	if len(q.consumers) > 0 {
		s.markDirty(q)
	}
}

// ApplyRemove applies a committed removal of a replicated queue's
// message; the master removed it already, a follower drops it now.
func (s *Shard) ApplyRemove(q *Queue, seq uint64) {
	ev := Event{Kind: EvRemove, Seq: seq}
	_ = q.Apply(&ev, s)
	s.watchHead(q)
}

// RemovesMax bounds the messages of one removal event of a replicated
// queue.
const RemovesMax = 4096

// noteRemoved queues the removal of message seq from q, a replicated
// queue of which this broker is master, for the next removal event: a
// settle, a purge or an expiry pass becomes one event per queue rather
// than one per message.
func (s *Shard) noteRemoved(q *Queue, seq uint64) {
	rs := q.rareState()
	if len(rs.removing) == 0 {
		s.removing = append(s.removing, q)
	}
	rs.removing = append(rs.removing, seq)
	if len(rs.removing) == RemovesMax {
		_ = s.proposeRemoves(q, nil)
	}
}

// proposeRemoves proposes q's pending removals, done (if not nil) told
// when they committed; without any, done waits for a barrier instead. An
// error means not all were proposed and done will not be called.
//
// Removals the group did not take for now (too few replicas in sync, a
// busy node or backlog) stay pending, and the shard proposes them again
// after its next batch of commands or tick: the messages are gone here,
// and until the removal commits the followers still hold them (a master
// after a failover would deliver them again). Removals refused because
// this broker is not the group's master are dropped: it applies the log
// again when it steps down, which puts the messages back.
func (s *Shard) proposeRemoves(q *Queue, done func(error)) error {
	r := s.broker.loadReplicator()
	if q.rare == nil || len(q.rare.removing) == 0 {
		if done == nil {
			return nil
		}
		return r.Barrier(q, done)
	}
	rs := q.rare
	for i := 0; i < len(rs.removing); {
		n := min(len(rs.removing)-i, RemovesMax)
		var d func(error)
		if i+n == len(rs.removing) {
			d = done
		}
		err := r.ProposeRemoves(q, rs.removing[i:i+n], d)
		if err == nil {
			i += n
			continue
		}
		if code := CodeOf(err); code == wire.CodeUnavailable || code == wire.CodeResourceLimit {
			if !rs.removeRefused {
				rs.removeRefused = true
				s.log.Warn("shards: the group did not take the removal of replicated messages; proposing it again", "queue", q.Name, "messages", len(rs.removing)-i, "err", err)
			}
			rs.removing = append(rs.removing[:0], rs.removing[i:]...)
			return err
		}
		// The messages are gone here and the log still has them: a
		// master that steps down applies the log again, and a later
		// master delivers them again.
		s.log.Warn("shards: the removal of replicated messages was not proposed", "queue", q.Name, "messages", len(rs.removing)-i, "err", err)
		rs.removing = rs.removing[:0]
		return err
	}
	if rs.removeRefused {
		rs.removeRefused = false
		s.log.Info("shards: the group took the removals it had refused", "queue", q.Name)
	}
	rs.removing = rs.removing[:0]
	return nil
}

// flushRemoves proposes every queue's pending removals, and then their
// acquires events (flushAcquires); the shard calls it at the end of each
// batch of commands. Queues whose removals the
// group did not take stay on the list, deleted ones too: the removals
// of a deleted queue's messages are what releases their entries in the
// master's group log (the master drops its queue at once, and applies
// them to no queue).
func (s *Shard) flushRemoves() {
	keep := s.removing[:0]
	for _, q := range s.removing {
		_ = s.proposeRemoves(q, nil)
		if rs := q.rare; rs != nil && len(rs.removingBy)+len(rs.removeDone) > 0 {
			_ = s.proposeRemovesBy(q, nil) // own.go
		}
		if rs := q.rare; rs != nil && len(rs.removing)+len(rs.removingBy)+len(rs.removeDone) > 0 {
			keep = append(keep, q)
		}
	}
	clear(s.removing[len(keep):])
	s.removing = keep
	s.flushAcquires()
}

// DropReplica drops q, a replicated queue whose deletion its group's log
// committed on this broker, which is not the group's master, as
// DropQueue does. It returns the Seqs of the messages q still held, the
// log indexes of their enqueues: dropped with the queue, those entries
// have no effect left, and the caller forgets them (its removals went
// before, and forgot theirs).
func (b *Broker) DropReplica(q *Queue) ([]uint64, error) {
	var seqs []uint64
	if err := b.Call(b.shards[q.shard], func(s *Shard) { s.dropQueueSeqs(q, &seqs) }); err != nil {
		return nil, Errorf(wire.CodeInternal, "delete %q: %v", q.Name, err)
	}
	return seqs, nil
}

// Complete completes a client's command from a pushed call (a replicated
// publish or settle whose event committed).
func (s *Shard) Complete(sess *Session, cmdID uint64, fan *Fanout, err error) {
	s.completeCmd(sess, cmdID, fan, err)
}

// Push runs f on the shard goroutine without waiting for it; false if the
// ring is full.
func (s *Shard) TryCall(f func(*Shard)) bool {
	return s.TryPush(CallCommand(f))
}

// PushCall runs f on the shard goroutine without waiting for it to run,
// parking while the ring is full, until ctx ends (an error then: f will
// not run). Not from an event loop.
func (s *Shard) PushCall(ctx context.Context, f func(*Shard)) error {
	return s.pushWait(ctx, CallCommand(f))
}

// pushWait is Push that counts a full ring (TryPush's meter) before it
// parks.
func (s *Shard) pushWait(ctx context.Context, cmd Command) error {
	if s.TryPush(cmd) {
		return nil
	}
	return s.in.Push(ctx, cmd)
}

// GroupMastered tells the shards that this broker became master of group
// g: its replicated queues are dispatched again, and the messages an
// earlier master handed out and that were not settled (those this
// broker holds as acquired from the log's acquires events, applied
// before this call, which follows them on the shard's ring) are
// requeued, flagged redelivered with their delivery count raised
// (acquire.go). A message no earlier master handed out is delivered
// unflagged. It does not wait, except for room in a full ring.
func (b *Broker) GroupMastered(g uint32) {
	call := groupMastered(g)
	for _, s := range b.shards {
		if s.PushCall(b.ctx, call) != nil {
			return
		}
	}
}

// groupMastered is GroupMastered's work on one shard.
func groupMastered(g uint32) func(*Shard) {
	return func(sh *Shard) {
		sh.setMastered(g, true)
		for q := range sh.queues.all() {
			if q.replicated && q.group == g {
				if q.rare != nil {
					// What the last master may have sent at once is this
					// one's to flag: only a master's acquires events
					// declare a window (an owner that is not the master
					// declares none), so a window here is the last
					// master's, whoever owned the queue.
					sh.flagWindow(q)
					q.rare.window = 0 // this master's own, from its first event
				}
				sh.requeueInherited(q)
				sh.markDirty(q)
				sh.watchOwnership(q)
			}
		}
	}
}

// GroupDelivering tells the shards that this broker may deliver from
// group g's replicated queues again (Replicator.Delivering turned true:
// the fence after its election passed, or a lapsed lease was renewed):
// they are dispatched again. It does not wait, except for room in a full
// ring.
func (b *Broker) GroupDelivering(g uint32) {
	for _, s := range b.shards {
		call := func(sh *Shard) {
			for q := range sh.queues.all() {
				if q.replicated && q.group == g {
					sh.markDirty(q)
				}
			}
		}
		if s.PushCall(b.ctx, call) != nil {
			return
		}
	}
}

// ResetGroup drops, on every shard, the messages of group g's replicated
// queues, ready and acquired, without proposing anything: the broker
// stopped being g's master and applies the committed log again. It waits
// until every shard has done it.
func (b *Broker) ResetGroup(g uint32) {
	call := resetGroup(g)
	for _, s := range b.shards {
		_ = b.Call(s, call)
	}
}

// resetGroup is ResetGroup's work on one shard.
func resetGroup(g uint32) func(*Shard) {
	return func(sh *Shard) {
		sh.setMastered(g, false)
		sh.forgetLost(g) // own.go
		// What this broker's consumers hold of the group's queues is
		// void here: held deliveries never go out, and an accept or
		// reject of an acquisition fails (the log applied again holds the
		// messages a next master requeues).
		for _, con := range sh.consumers {
			if q := con.queue; q.replicated && q.group == g {
				voidHeld(con)
			}
		}
		sh.acqWaits.each(func(tag uint64, w *acqWait) {
			if q := w.q; q != nil && q.replicated && q.group == g && w.done != nil {
				w.done(Errorf(wire.CodeOutcomeUnknown, "this broker applies the log of queue %q's group again with the settle in flight; its outcome is unknown", q.Name))
				w.done = nil
			}
		})
		for q := range sh.queues.all() {
			if !q.replicated || q.group != g {
				continue
			}
			for seq := range q.acquiredMap() {
				ev := Event{Kind: EvRemove, Seq: seq}
				_ = q.Apply(&ev, sh)
			}
			ev := Event{Kind: EvPurge}
			_ = q.Apply(&ev, sh)
			q.resetProducers() // the log applied again rebuilds it
			if q.rare != nil {
				// Removals not taken: the log applied again puts
				// their messages back.
				q.rare.removing = q.rare.removing[:0]
				q.rare.removeRefused = false
				rs := q.rare
				rs.acquiring = rs.acquiring[:0]
				rs.releasing = rs.releasing[:0]
				rs.returning = rs.returning[:0]
				rs.acquireRefused = false
				// The window and the events in flight are this
				// mastership's; their outcomes are ignored (term).
				rs.term++
				rs.window, rs.winInFlight, rs.uncovered, rs.sentNow = 0, nil, 0, rs.sentNow[:0]
				rs.acquiresInFlight, rs.releasesInFlight, rs.idleTicks = 0, 0, 0
				// Ownership is the log's: applied again, it comes back.
				// The settles waiting for this broker's stamped removals
				// end (own.go).
				lost := Errorf(wire.CodeOutcomeUnknown, "this broker applies the log of queue %q's group again with the settle in flight; its outcome is unknown", q.Name)
				for _, d := range rs.removeDone {
					d(lost)
				}
				// What the log holds as acquired by this broker was held
				// by consumers that are now void (and ended): once the
				// log is applied again, checkOrphans has it requeued.
				rs.orphans = rs.orphans || heldBy(rs.acqBy, sh.self())
				rs.ownedBy, rs.ownGen, rs.wanters, rs.acqBy, rs.ownIndex, rs.wantIndex = 0, 0, nil, nil, 0, 0
				rs.handing, rs.ownInFlight, rs.wantInFlight, rs.heldReady, rs.maybeAcq = false, false, 0, 0, nil
				rs.removingBy, rs.removeDone, rs.removesInFlight = nil, nil, 0
			}
		}
	}
}

// AdmitReplicated is the master's admission of an enqueue to replicated
// queue q, whether its own client's (replicatedPublish) or forwarded by
// another broker (replication's serveForward), before it proposes it:
// dup when it resends a publish q applied already (it then completes
// with success and stays out of the group log), or an error, resource-
// limit, when q refuses a message of size bytes (reject-publish). On
// q's shard.
func (q *Queue) AdmitReplicated(producer, seq uint64, size int) (dup bool, err error) {
	if q.duplicate(producer, seq) {
		// The first copy is committed, so this one completes as it did.
		// Members skip a duplicate entry when they apply it live, but one
		// that applies a compacted log again (after a step-down, a restart
		// or an install) starts from an empty table and would enqueue it:
		// only this check keeps such entries out of the log, except for a
		// resend that arrives while its first copy is still uncommitted.
		return true, nil
	}
	if q.CheckEnqueue(size) != nil {
		return false, Errorf(wire.CodeResourceLimit, "queue %q is full", q.Name)
	}
	return false, nil
}

// replicatedPublish proposes a publish to a replicated queue.
func (s *Shard) replicatedPublish(p *Publish, expiresAt int64) {
	q := p.Queue
	r := s.broker.loadReplicator()
	if dup, err := q.AdmitReplicated(p.Producer, p.CmdID, p.Body.Size()); dup || err != nil {
		p.Body.Unref()
		if dup {
			s.stats.Duplicates++
		}
		s.completeCmd(p.Sess, p.CmdID, p.Fanout, err)
		return
	}
	tag, ok := s.replWaits.add(p.Sess, p.CmdID, p.Fanout)
	if !ok {
		p.Body.Unref()
		s.completeCmd(p.Sess, p.CmdID, p.Fanout, Errorf(wire.CodeResourceLimit, "shard %d has %d replicated publishes waiting for their groups; retry", s.idx, replWaitsMax))
		return
	}
	err := r.ProposeEnqueue(q, p.Body, expiresAt, p.Producer, p.CmdID, tag)
	// Until it commits and is applied, the event's data is held in the
	// group log: it counts against the budget (memory.go), so a burst
	// of publishes that outruns the group throttles like a backlog.
	inflight := bodyBytes(p.Body)
	p.Body.Unref() // the proposal copied it
	if err != nil {
		s.replWaits.take(tag)
		s.completeCmd(p.Sess, p.CmdID, p.Fanout, err)
		return
	}
	if s.mem.limit != 0 {
		s.replWaits.at(tag).bytes = inflight
		s.charge(inflight)
	}
	s.stats.Published++
}

// Committed reports the outcome of the replicated publish that the shard
// gave tag to (Replicator.ProposeEnqueue). It runs on any goroutine but
// the shard's, and allocates nothing when err is nil; a full ring is
// waited out, since a completion must not be lost.
func (s *Shard) Committed(tag uint64, err error) {
	cmd := replDoneCommand(tag)
	if err != nil {
		cmd = CallCommand(func(sh *Shard) { sh.replDone(tag, err) })
	}
	_ = s.pushWait(s.broker.ctx, cmd) // fails only once the broker closes
}

// replDone completes the publish waiting under tag.
func (s *Shard) replDone(tag uint64, err error) {
	w, ok := s.replWaits.take(tag)
	if !ok {
		s.log.Error("shards: a replicated publish's outcome for no waiting publish", "tag", tag)
		return
	}
	if w.bytes != 0 {
		s.charge(-w.bytes)
	}
	s.completeCmd(w.sess, w.cmdID, w.fan, err)
}

// TryApplyEnqueue is ApplyEnqueue pushed onto the shard's ring from
// another goroutine, without allocating; false if the ring is full (b's
// reference stays the caller's then).
func (s *Shard) TryApplyEnqueue(q *Queue, seq uint64, b *Body, expiresAt int64, producer, producerSeq, logPos uint64) bool {
	return s.TryPush(replEnqueue{q, seq, b, expiresAt, producer, producerSeq, logPos}.command())
}

// PushApplyEnqueue is TryApplyEnqueue that parks while the ring is full,
// until ctx ends (an error then: b's reference stays the caller's).
func (s *Shard) PushApplyEnqueue(ctx context.Context, q *Queue, seq uint64, b *Body, expiresAt int64, producer, producerSeq, logPos uint64) error {
	return s.pushWait(ctx, replEnqueue{q, seq, b, expiresAt, producer, producerSeq, logPos}.command())
}

// replWaitsMax bounds a shard's replicated publishes waiting for their
// events.
const replWaitsMax = 1 << 20

// replWait is a replicated publish waiting for its event.
type replWait struct {
	sess  *Session
	cmdID uint64
	fan   *Fanout
	bytes int64 // counted against the budget while it waits
}

// replWaits are a shard's replicated publishes waiting for their events,
// by tag (waitTable).
type replWaits struct{ waitTable[replWait] }

func (w *replWaits) add(sess *Session, cmdID uint64, fan *Fanout) (uint64, bool) {
	tag, v, ok := w.waitTable.add(replWaitsMax)
	if ok {
		*v = replWait{sess: sess, cmdID: cmdID, fan: fan}
	}
	return tag, ok
}

func (w *replWaits) take(tag uint64) (replWait, bool) {
	return w.waitTable.take(tag, func(v *replWait) { *v = replWait{} })
}

// pushCompletion completes a command from another goroutine. A full ring
// is waited out: a completion must not be lost.
func (s *Shard) pushCompletion(sess *Session, id uint64, fan *Fanout, err error) {
	f := func(sh *Shard) { sh.completeCmd(sess, id, fan, err) }
	_ = s.PushCall(s.broker.ctx, f) // fails only once the broker closes
}
