package shards

import (
	"context"
	"log/slog"
	"slices"
	"time"

	"github.com/berthmq/berth/journal"
	"github.com/berthmq/berth/ring"
	"github.com/berthmq/berth/wire"
)

// Consumer is a subscription of one session to one queue. It lives on the
// queue's shard.
type Consumer struct {
	ID        uint32
	Session   *Session
	queue     *Queue
	credit    uint32
	ackNone   bool
	exclusive bool
	nextTag   uint64
	unacked   map[uint64]uint64 // tag -> queue Seq
	pending   []Delivery        // on their way this cycle; each holds a reference to its body
	// pendingBytes is the size of the pending deliveries, which count
	// against the session's OutMax before they are submitted.
	pendingBytes int64
	out          *sessOut
	// held are deliveries from a replicated queue waiting for the
	// acquires event that records them to commit (acquire.go), oldest
	// first; heldBytes is their size, counted against OutMax as pending.
	held      []heldDelivery
	heldBytes int64
	// voided are the tags of deliveries this consumer held when its
	// broker's copy of the queue's group was reset (dropHeld): their
	// acquisitions are void, so an accept or reject of one fails rather
	// than complete as a settle of an unknown tag would. At most
	// voidedMax; voidHit: a part of the settle under way met one.
	voided  map[uint64]struct{}
	voidHit bool
}

// voidedMax bounds Consumer.voided: past it the tags of a further reset
// are not kept (their settles then complete as unknown tags do).
const voidedMax = 1 << 16

type consumerKey struct {
	sess *Session
	id   uint32
}

// ShardConfig configures a shard.
type ShardConfig struct {
	RingSize  int
	CreditMax uint32
	Logger    *slog.Logger
	// OwnSlice is how long an owner of a replicated queue keeps it while
	// another broker wants it (own.go); 0 means OwnSliceDefault.
	OwnSlice time.Duration
	// ConsumeAtReplicas lets a consumer of a replicated queue subscribe
	// on a broker that is not its group's master, which then takes the
	// queue's ownership in turns (own.go); off, such a subscribe is
	// refused (the server proxies it to the master).
	ConsumeAtReplicas bool
	// OwnRefresh is how many entries a group's log may move past an own
	// or want event in effect before its proposer states it again (so
	// that compaction can pass the old one); 0 means OwnRefreshDefault.
	OwnRefresh uint64
}

// Shard owns a set of queues and runs them on one goroutine.
type Shard struct {
	idx    int
	broker *Broker
	cfg    ShardConfig
	log    *slog.Logger

	// removing lists the replicated queues with removals not proposed
	// yet (Queue.removing); flushRemoves proposes them.
	removing []*Queue
	// acquiring lists the replicated queues with held deliveries whose
	// acquires event is not proposed yet (queueRare.acquiring);
	// flushAcquires proposes them, and acqWaits keeps those proposed
	// until they commit.
	acquiring []*Queue
	acqWaits  acqWaits
	// lostTags are the tags of this broker's stamped events whose
	// outcome came back as a failure after they may have reached the
	// master (own.go): if one commits all the same, this broker applies
	// nothing of it, having kept (acquires) or made (releases, removals)
	// its effect here already. Bounded by lostTagsMax.
	lostTags map[uint64]uint32 // tag: its group
	// acqRetry lists queues whose releases failed for now, listed again
	// at the next tick (Shard.released); windowed those whose window may
	// shrink at a tick (tickAcquires).
	acqRetry []*Queue
	windowed []*Queue
	// ownWatch lists the replicated queues whose ownership this broker
	// checks at each tick (own.go): those it has consumers of, owns with
	// others waiting, or has want or own events in flight for. foreign
	// lists those owned by, or with messages held by, a broker that is
	// not the master, which a master watches for silence; ownTicks
	// counts the ticks to its next look.
	ownWatch []*Queue
	foreign  []*Queue
	ownTicks int
	ownTick  int64 // s.now at the last tickOwnership
	// revokedAt is, by group, the index of the last own event that took
	// this broker's queues back and made this shard drop its copies
	// (ApplyOwn).
	revokedAt map[uint32]uint64
	// refresh lists the queues with an own or want event in effect
	// (queueRare.ownIndex, wantIndex).
	refresh []*Queue
	// localAcq is set while this broker settles its own consumers'
	// acquisitions (a removal it proposes, stamped if it is not the
	// master), fromLog while it applies another broker's stamped
	// removal (which it proposes nothing for).
	localAcq, fromLog bool
	// localStamped: the settle under way is of a broker that is not the
	// master (its removals are stamped), as decided at its start.
	localStamped bool
	// mastered[g]: this shard took Broker.GroupMastered(g) from its ring,
	// and no Broker.ResetGroup(g) since. The node readies a mastership
	// only after it handed the shards every entry the new master
	// inherited, and pushes GroupMastered behind them on the same ring,
	// so with it set this shard's copies of g's queues hold every event
	// an earlier master committed. The Replicator's IsMaster and
	// Delivering are the node's view, which runs ahead of the ring:
	// without this a new master could deliver a message whose removal
	// (its accept, committed under the old master) it had not applied
	// yet. masters and delivers ask both.
	mastered []bool
	// dlHeld is the replicated message DeadLetter just sent on, whose
	// removal waits for its targets.
	dlHeld *Entry
	// replWaits are the replicated publishes waiting for their events
	// (replicated.go).
	replWaits replWaits

	sig  *ring.Signal
	in   *ring.MPSC[Command]
	cmds []Command

	queues    queueSet
	consumers map[consumerKey]*Consumer
	outs      map[*Session]*sessOut
	dirtyOuts []*sessOut
	dirtyQs   []*Queue
	qDirty    map[*Queue]bool
	// expiry is the expiry index: a heap of (time, queue) holding every
	// queue whose head has a TTL under that head's expiry time or earlier
	// (queueBusy.expireAt; watchHead keeps it so). The tick takes the entries
	// that came due, so it costs O(due), not O(queues): a shard may hold a
	// million idle queues.
	expiry   timerHeap
	timers   shardTimers // queues with delayed messages (delay.go)
	pool     entryPool
	deferred []Command // dead letters for other shards whose rings were full
	now      int64
	journal  *shardJournal // nil when the broker keeps nothing on disk

	stats  ShardStats
	meters shardMeters // metrics.go
	mem    memory      // the shard's share of the memory budget (memory.go)
}

// ShardStats are counters read by the metrics endpoint (approximate).
type ShardStats struct {
	Published, Delivered, Accepted, DeadLettered, DroppedDeadLetters, StoreErrors uint64
	// Duplicates counts publishes skipped as retries of an enqueue
	// applied before (dedup.go).
	Duplicates uint64
	// AcquiresEvents and ReleasesEvents count the acquires and releases
	// events of replicated queues the shard proposed as master, and
	// Inherited the messages it requeued flagged redelivered on becoming
	// master because an earlier master had handed them out (acquire.go).
	AcquiresEvents, ReleasesEvents, Inherited uint64
	// OwnEvents counts the own events applied: the handovers of
	// replicated queues (own.go). OwnedNanos is the time this broker
	// owned replicated queues it does not master the group of, summed
	// over those queues that had consumers here, counted at ticks.
	OwnEvents, OwnedNanos uint64
	// OrphanRequeues counts the own events this broker proposed to requeue
	// messages the log holds as acquired by it that no consumer of its
	// holds any more (checkOrphans).
	OrphanRequeues uint64
}

// deferredMax bounds dead letters waiting for room in another shard's
// ring; past it they are dropped and counted.
const deferredMax = 1 << 16

func newShard(idx int, b *Broker, cfg ShardConfig) *Shard {
	sig := ring.NewSignal()
	return &Shard{
		idx: idx, broker: b, cfg: cfg, log: cfg.Logger,
		sig:       sig,
		in:        ring.NewMPSCSignal[Command](cfg.RingSize, sig),
		cmds:      make([]Command, 256),
		consumers: map[consumerKey]*Consumer{},
		outs:      map[*Session]*sessOut{},
		qDirty:    map[*Queue]bool{},
		// The clock starts at the wall clock, not 0: recovery and the
		// first subscribers come before the first tick, and a message
		// whose TTL ran out while the broker was down must not be
		// delivered to them.
		now: time.Now().UnixNano(),
	}
}

// TryPush hands cmd to the shard without blocking; false if its ring is full.
func (s *Shard) TryPush(cmd Command) bool {
	if s.in.TryPush(cmd) {
		return true
	}
	s.meters.ringFull.Add(1)
	return false
}

// Push hands cmd to the shard, waiting for room. Never call it from an
// event loop.
func (s *Shard) Push(ctx context.Context, cmd Command) error { return s.in.Push(ctx, cmd) }

// WaitRoom parks until the shard's ring has room for a command or ctx is
// done (a reader goroutine that found it full; event loops come back
// instead). A TryPush after it may still find the ring full.
func (s *Shard) WaitRoom(ctx context.Context) error { return s.in.WaitRoom(ctx) }

func (s *Shard) run(ctx context.Context) {
	ready := func() bool {
		if s.journal != nil && (s.journal.done.Ready() || s.journal.overflowed()) {
			return true
		}
		return s.in.Ready()
	}
	for {
		got := s.drainJournal()
		n := s.in.PopBatch(s.cmds)
		if n > 0 {
			// One clock read per batch keeps expiry exact to the batch
			// rather than to the tick.
			if now := time.Now().UnixNano(); now > s.now {
				s.now = now
			}
		}
		for i := 0; i < n; i++ {
			s.handle(&s.cmds[i])
			s.cmds[i] = Command{}
		}
		if got || n > 0 {
			s.dispatchDirty()
			s.flushRemoves()
			s.flush()
			s.chargeOutbound()
			if s.sweepDue() {
				s.sweepResident()
			}
			s.publishMemory()
			continue
		}
		if len(s.deferred) > 0 {
			s.retryDeferred()
		}
		if s.sweepDue() {
			// A slice at a time, between batches of commands
			// (memory.go); the loop comes back here while a pass lasts.
			s.sweepResident()
			s.chargeOutbound()
			s.publishMemory()
			continue
		}
		if err := s.sig.Wait(ctx, ready); err != nil {
			return
		}
	}
}

// handle runs one command on the shard goroutine, reading it through
// its op's view (command.go).
func (s *Shard) handle(c *Command) {
	if c.now > s.now {
		s.now = c.now
	}
	switch c.op {
	case opPublish:
		p := c.publish()
		s.publish(&p)
	case opSubscribe:
		sub := c.subscribe()
		s.subscribe(&sub)
	case opCancel:
		s.cancel(c.cancel())
	case opCredit:
		cr := c.credit()
		if con := s.consumers[consumerKey{cr.Sess, cr.ConsumerID}]; con != nil {
			con.credit += cr.Credit
			if con.credit > s.cfg.CreditMax {
				con.credit = s.cfg.CreditMax
			}
			s.markDirty(con.queue)
		}
	case opSettle:
		st := c.settle()
		s.settle(&st)
	case opSessionClosed:
		s.sessionClosed(c.sess)
	case opTick:
		s.tick()
		s.maybeCheckpoint()
	case opWake:
		s.fireTimers()
	case opCall:
		c.call(s)
	case opReplDone:
		s.replDone(c.replDoneTag(), nil)
	case opAcquired:
		s.acquired(c.replDoneTag(), nil)
	case opReplEnqueue:
		e := c.replEnqueue()
		s.ApplyEnqueue(e.queue, e.seq, e.body, e.expiresAt, e.producer, e.producerSeq, e.logPos)
	case opAddQueue:
		s.queues.add(c.queue)
	case opDeadLettered:
		d := c.deadLettered()
		if q := d.queue; q.replicated {
			if s.masters(q) && !s.mineStamped(q, d.seq) {
				s.noteRemoved(q, d.seq)
			} else if s.stamped(q) || s.mineStamped(q, d.seq) {
				s.noteRemovedBy(q, d.seq) // a reject this owner dead-lettered (own.go)
			}
		} else if s.journal != nil {
			s.releaseHeld(uint64(d.journalPos))
			s.appendDequeue(q, d.journalPos, nil, 0)
		}
	case opResume:
		for key, con := range s.consumers {
			if key.sess == c.sess {
				s.markDirty(con.queue)
			}
		}
	}
}

func (s *Shard) out(sess *Session) *sessOut {
	o := s.outs[sess]
	if o == nil {
		o = &sessOut{sess: sess}
		s.outs[sess] = o
	}
	if !o.queued {
		o.queued = true
		s.dirtyOuts = append(s.dirtyOuts, o)
	}
	return o
}

func (s *Shard) markDirty(q *Queue) {
	if !s.qDirty[q] {
		s.qDirty[q] = true
		s.dirtyQs = append(s.dirtyQs, q)
	}
}

// completeCmd completes a command, or fails it when err is not nil.
func (s *Shard) completeCmd(sess *Session, id uint64, fan *Fanout, err error) {
	if fan != nil {
		if !fan.done(err) {
			return
		}
		err = fan.err()
		if fan.held.queue != nil {
			s.deadLettered(fan.held, err)
		}
		fan.release()
	}
	if sess == nil || id == 0 {
		return
	}
	o := s.out(sess)
	o.done++
	if err != nil {
		o.fail(id, CodeOf(err), err.Error())
	} else {
		o.complete(id)
	}
}

func (s *Shard) publish(p *Publish) {
	q := p.Queue
	if q.deleted {
		p.Body.Unref()
		s.completeCmd(p.Sess, p.CmdID, p.Fanout, Errorf(wire.CodeNotFound, "queue %q was deleted", q.Name))
		return
	}
	ev := Event{Kind: EvEnqueue, Body: p.Body, Priority: p.Body.Priority}
	// A delayed message's TTL runs from its deliver-at time: it cannot be
	// consumed before then.
	from := p.Now
	if at := p.Body.DeliverAt; at > p.Now {
		ev.DeliverAt, from = at, at
	}
	if p.TTLNanos > 0 {
		ev.ExpiresAt = from + p.TTLNanos
	}
	if t := q.Options.TTLNanos(); t > 0 && (ev.ExpiresAt == 0 || from+t < ev.ExpiresAt) {
		ev.ExpiresAt = from + t
	}
	if q.replicated {
		s.replicatedPublish(p, ev.ExpiresAt)
		return
	}
	if q.duplicate(p.Producer, p.CmdID) {
		// A retry of a publish this queue enqueued already: its
		// completion is the one the first copy earned (after its record,
		// if any, is durable: completeAfterJournal waits for it).
		p.Body.Unref()
		s.stats.Duplicates++
		if s.journal != nil && s.journal.pending.size > 0 {
			s.journal.pending.push(jctx{sess: p.Sess, cmdID: p.CmdID, fan: p.Fanout})
		} else {
			s.completeCmd(p.Sess, p.CmdID, p.Fanout, nil)
		}
		return
	}
	if s.journaled(q, p.Body) {
		if err := q.CheckEnqueue(p.Body.Size()); err != nil {
			p.Body.Unref()
			s.completeCmd(p.Sess, p.CmdID, p.Fanout, Errorf(wire.CodeResourceLimit, "queue %q is full", q.Name))
			return
		}
		// The record goes first, so that anything the enqueue drops is
		// journaled after it.
		pos := s.appendEnqueue(q, &Entry{Body: p.Body, ExpiresAt: ev.ExpiresAt}, p.Producer, p.CmdID)
		q.noteProducer(p.Producer, p.CmdID)
		seq := q.nextSeq // what enqueue assigns
		s.journal.pending.push(jctx{pos: pos, sess: p.Sess, cmdID: p.CmdID, fan: p.Fanout, q: q, seq: seq})
		ev.JournalPos = uint64(pos)
		if err := q.Apply(&ev, s); err != nil {
			panic("shards: enqueue failed after its check: " + err.Error())
		}
		// Deliverable when the record is durable (journalDone), not now.
		q.enqueueUnsafe(seq)
		s.noteExpiry(q, ev.ExpiresAt)
		s.admit(q)
		if ev.DeliverAt != 0 {
			s.schedule(q, ev.DeliverAt)
		}
		s.stats.Published++
		return
	}
	if err := q.Apply(&ev, s); err != nil {
		p.Body.Unref()
		if err == ErrQueueFull {
			err = Errorf(wire.CodeResourceLimit, "queue %q is full", q.Name)
		}
		s.completeCmd(p.Sess, p.CmdID, p.Fanout, err)
		return
	}
	q.noteProducer(p.Producer, p.CmdID)
	s.noteExpiry(q, ev.ExpiresAt)
	s.admit(q)
	if ev.DeliverAt != 0 {
		s.schedule(q, ev.DeliverAt)
	}
	s.stats.Published++
	s.completeCmd(p.Sess, p.CmdID, p.Fanout, nil)
	if len(q.consumers) > 0 && ev.DeliverAt == 0 {
		s.markDirty(q)
	}
}

func (s *Shard) subscribe(sub *Subscribe) {
	q := sub.Queue
	key := consumerKey{sub.Sess, sub.ConsumerID}
	if s.consumers[key] != nil {
		// The consumer of that id stays: the session is not told it went.
		s.completeCmd(sub.Sess, sub.CmdID, nil, Errorf(wire.CodeInvalid, "consumer id %d is in use", sub.ConsumerID))
		return
	}
	refuse := func(err error) {
		s.completeCmd(sub.Sess, sub.CmdID, nil, err)
		sub.Sess.consumerGone(sub.ConsumerID)
	}
	if q.deleted {
		refuse(Errorf(wire.CodeNotFound, "queue %q was deleted", q.Name))
		return
	}
	if q.replicated {
		r := s.broker.loadReplicator()
		if r == nil {
			refuse(Errorf(wire.CodeUnavailable, "queue %q is replicated in group %d, and the shards are not connected to the replication groups yet; retry", q.Name, q.group))
			return
		}
		if !s.cfg.ConsumeAtReplicas && !r.IsMaster(q.group) {
			refuse(Errorf(wire.CodeNotAllowed,
				"queue %q is replicated in group %d, whose master is another broker: consume there", q.Name, q.group))
			return
		}
	}
	if q.owner != nil && q.owner != sub.Sess {
		refuse(Errorf(wire.CodeNotAllowed, "queue %q is exclusive to another session", q.Name))
		return
	}
	for _, other := range q.consumers {
		if other.exclusive || sub.Exclusive {
			refuse(Errorf(wire.CodeNotAllowed, "queue %q has an exclusive consumer", q.Name))
			return
		}
	}
	credit := sub.Credit
	if credit > s.cfg.CreditMax {
		credit = s.cfg.CreditMax
	}
	con := &Consumer{ID: sub.ConsumerID, Session: sub.Sess, queue: q, credit: credit,
		ackNone: sub.AckMode == wire.AckNone, exclusive: sub.Exclusive, unacked: map[uint64]uint64{}}
	s.consumers[key] = con
	q.consumers = append(q.consumers, con)
	s.pool.totals.Consumers++
	q.everConsumed = true
	s.completeCmd(sub.Sess, sub.CmdID, nil, nil)
	s.markDirty(q)
	s.watchOwnership(q)
}

func (s *Shard) cancel(cn Cancel) {
	con := s.consumers[consumerKey{cn.Sess, cn.ConsumerID}]
	if con == nil {
		s.completeCmd(cn.Sess, cn.CmdID, nil, Errorf(wire.CodeNotFound, "no consumer %d", cn.ConsumerID))
		return
	}
	// Deliveries already made stay acquired and can still be settled; the
	// consumer only stops receiving. Those held for their acquires event
	// go back (acquire.go).
	con.credit = 0
	s.unholdAll(con)
	s.detach(con)
	if len(con.unacked) == 0 {
		// Nothing left to settle: forget it now, not at session end.
		delete(s.consumers, consumerKey{cn.Sess, cn.ConsumerID})
		cn.Sess.consumerGone(cn.ConsumerID)
	}
	s.completeCmd(cn.Sess, cn.CmdID, nil, nil)
}

// detach removes a consumer from its queue's dispatch list.
func (s *Shard) detach(con *Consumer) {
	q := con.queue
	for i, x := range q.consumers {
		if x == con {
			copy(q.consumers[i:], q.consumers[i+1:])
			q.consumers[len(q.consumers)-1] = nil
			q.consumers = q.consumers[:len(q.consumers)-1]
			s.pool.totals.Consumers--
			break
		}
	}
	if int(q.rr) >= len(q.consumers) {
		q.rr = 0
	}
	if len(q.consumers) == 0 && q.Options.AutoDelete && q.everConsumed && !q.deleted {
		s.broker.autoDelete(q)
	}
}

func (s *Shard) settle(st *Settle) {
	con := s.consumers[consumerKey{st.Sess, st.ConsumerID}]
	if con == nil {
		if st.Last {
			s.completeCmd(st.Sess, st.CmdID, nil, Errorf(wire.CodeNotFound, "no consumer %d", st.ConsumerID))
		}
		return
	}
	q := con.queue
	// Whether this settle's removals are stamped is decided once: the
	// broker's mastership may change under it (Replicator.IsMaster is
	// read live), and a settle whose removals went one way must wait for
	// them that way (own.go).
	stampedSettle := q.replicated && s.stamped(q)
	s.localAcq, s.localStamped = true, stampedSettle
	defer func() { s.localAcq, s.localStamped = false, false }()
	settleOne := func(tag uint64) {
		seq, ok := con.unacked[tag]
		if !ok {
			if _, void := con.voided[tag]; void {
				delete(con.voided, tag)
				con.voidHit = true
			}
			return // settled already or unknown: settles are idempotent
		}
		delete(con.unacked, tag)
		ev := Event{Seq: seq}
		switch st.Kind {
		case SettleAccept:
			ev.Kind = EvDequeue
			s.stats.Accepted++
		case SettleRelease:
			// Not as a settle of this owner's: a release that reaches
			// the delivery limit is the master's to dead-letter.
			s.localAcq = false
			s.release(q, seq)
			s.localAcq = true
			return
		case SettleReject:
			ev.Kind = EvReject
		}
		_ = q.Apply(&ev, s)
	}
	for i := 0; i < int(st.NRanges); i++ {
		r := st.Ranges[i]
		// Tags past the consumer's last delivery were never handed out:
		// a flood of settles for them costs a comparison each.
		if r.First > con.nextTag || len(con.unacked) == 0 && len(con.voided) == 0 {
			continue
		}
		r.Last = min(r.Last, con.nextTag)
		if r.Last-r.First >= uint64(len(con.unacked)+len(con.voided)) {
			// A wide range: walk what is acquired (and void), not the
			// range.
			for tag := range con.unacked {
				if tag >= r.First && tag <= r.Last {
					settleOne(tag)
				}
			}
			for tag := range con.voided {
				if tag >= r.First && tag <= r.Last {
					settleOne(tag)
				}
			}
			continue
		}
		for tag := r.First; ; tag++ {
			settleOne(tag)
			if tag == r.Last {
				break
			}
		}
	}
	if st.Kind != SettleAccept {
		s.markDirty(q)
	}
	if con.queue.deleted || (len(con.unacked) == 0 && !containsConsumer(q.consumers, con)) {
		// A cancelled consumer with nothing left to settle is gone.
		delete(s.consumers, consumerKey{con.Session, con.ID})
		con.Session.consumerGone(con.ID)
	}
	if st.Last {
		var voidErr error
		if con.voidHit && st.Kind != SettleRelease {
			// A delivery whose acquisition the reset voided: the message
			// went back to the queue, so this settle did not take it.
			voidErr = Errorf(wire.CodeOutcomeUnknown, "queue %q's group was applied again on this broker with the delivery held (it lost the queue or its mastership); the message was requeued and this settle did not take it", q.Name)
		}
		con.voidHit = false
		if q.replicated {
			// An accept completes once its removes committed (an owner
			// that is not the master: once it applied them, own.go).
			sess, id := st.Sess, st.CmdID
			propose := s.proposeRemoves
			if stampedSettle {
				propose = s.proposeRemovesBy
			}
			if err := propose(q, func(err error) {
				if voidErr != nil {
					err = voidErr
				}
				s.pushCompletion(sess, id, nil, err)
			}); err != nil {
				if voidErr != nil {
					err = voidErr
				}
				s.completeCmd(sess, id, nil, err)
			}
			return
		}
		// An accept completes once its dequeues are durable.
		s.completeAfterJournal(st.Sess, st.CmdID)
	}
}

// release puts an acquired message back and journals its new delivery
// count.
func (s *Shard) release(q *Queue, seq uint64) {
	e := q.Acquired(seq)
	if e == nil {
		return
	}
	pos := e.JournalPos
	ev := Event{Kind: EvRelease, Seq: seq}
	_ = q.Apply(&ev, s)
	if q.replicated && (s.masters(q) || s.stamped(q)) {
		// Its followers put it back too (acquire.go); if the release
		// dead-lettered it, its removal goes first and this does nothing.
		s.noteRelease(q, seq, false)
	}
	if pos != 0 && e.JournalPos == pos && s.journal != nil {
		s.appendCount(q, journal.Pos(pos), e.DeliveryCount)
	}
}

func containsConsumer(cs []*Consumer, c *Consumer) bool {
	for _, x := range cs {
		if x == c {
			return true
		}
	}
	return false
}

// sessionClosed requeues everything the session acquired on this shard and
// drops its consumers (guarantee 6).
func (s *Shard) sessionClosed(sess *Session) {
	for key, con := range s.consumers {
		if key.sess != sess {
			continue
		}
		s.unholdAll(con)
		s.requeueAll(con)
		if containsConsumer(con.queue.consumers, con) {
			s.detach(con)
		}
		delete(s.consumers, key)
	}
	delete(s.outs, sess)
}

func (s *Shard) requeueAll(con *Consumer) {
	q := con.queue
	// Requeue in delivery order, so positions come back as they were.
	tags := make([]uint64, 0, len(con.unacked))
	for tag := range con.unacked {
		tags = append(tags, tag)
	}
	slices.Sort(tags)
	for _, tag := range tags {
		seq := con.unacked[tag]
		delete(con.unacked, tag)
		s.release(q, seq)
	}
	s.markDirty(q)
}

// noteExpiry runs after an enqueue to q of a message that expires at
// expiresAt (0: never). Whether or not it has a TTL, the enqueue may have
// changed q's head (a first message, a higher priority, a drop-head), so
// it watches the head (watchHead).
func (s *Shard) noteExpiry(q *Queue, expiresAt int64) { s.watchHead(q) }

// watchHead keeps the expiry index's promise for q after a change that
// may have given q a new head: if the head has a TTL, q is in the index
// under that time or earlier. It costs a look at the head, and a heap
// push only when the head expires before anything q is indexed under.
// Messages behind the head are not indexed: a message expires from the
// head (EvExpire), and whatever makes it the head calls watchHead.
func (s *Shard) watchHead(q *Queue) {
	h := q.peek()
	if h == nil || h.ExpiresAt == 0 || (q.busy.expireAt != 0 && q.busy.expireAt <= h.ExpiresAt) {
		return // (a queue with a head has its busy part)
	}
	q.busy.expireAt = h.ExpiresAt
	s.expiry = heapPush(s.expiry, timerEntry{at: h.ExpiresAt, q: q}, timerLess)
}

// tick expires the heads that came due (the expiry index), promotes the
// delayed messages that came due, and retries deferred dead letters.
func (s *Shard) tick() {
	s.expireDue()
	s.fireTimers()
	s.retryDeferred()
	s.retryAcquiring()
	s.tickAcquires()
	s.tickOwnership()
}

// expireDue expires the heads of the queues whose index entries came due
// as of s.now. An entry left stale (its queue was indexed again under an
// earlier time, or dropped) is skipped.
func (s *Shard) expireDue() {
	for len(s.expiry) > 0 && s.expiry[0].at <= s.now {
		var te timerEntry
		te, s.expiry = heapRemove(s.expiry, 0, timerLess)
		q := te.q
		if q.deleted || te.at != q.busy.expireAt {
			continue
		}
		q.busy.expireAt = 0
		if !s.expires(q) {
			// A follower's copy of a replicated queue: only the group's
			// master expires it, dead-letters what expired and proposes
			// the removal, which drops the copy here when it commits.
			// Expired here too, each member would dead-letter it. The
			// next change of the head indexes the queue again (watchHead),
			// and a broker that becomes master dispatches the queue
			// (GroupMastered), which expires its head. A master that
			// does not hold its lease (Replicator.Delivering) waits the
			// same way, as it does with deliveries: one the controller
			// replaced must not dead-letter what its successor expires
			// too; it dispatches the queue again when its lease comes
			// back (GroupDelivering).
			continue
		}
		ev := Event{Kind: EvExpire, Now: s.now}
		_ = q.Apply(&ev, s)
		s.watchHead(q)
	}
}

// masters reports whether this broker decides for q: q is not
// replicated, or this broker is its group's master and this shard has
// applied what it inherited (Shard.mastered). Only that broker
// dead-letters q's messages and proposes their removals.
func (s *Shard) masters(q *Queue) bool {
	if !q.replicated {
		return true
	}
	r := s.broker.loadReplicator()
	return r != nil && s.hasMastered(q.group) && r.IsMaster(q.group)
}

// delivers reports whether this broker hands out q's messages now: q is
// not replicated, or this broker owns it (own.go) and is not handing it
// over, and then: as the group's master, once this shard applied what it
// inherited (Shard.mastered) and under its lease
// (Replicator.Delivering); as another member, while it hears from the
// master (Replicator.Owning).
func (s *Shard) delivers(q *Queue) bool {
	if !q.replicated {
		return true
	}
	r := s.broker.loadReplicator()
	if r == nil {
		return false
	}
	if rs := q.rare; rs != nil && rs.handing {
		return false
	}
	return s.leased(q)
}

// leased is delivers but for a handover under way: this broker owns q
// and holds the lease it owns it under.
func (s *Shard) leased(q *Queue) bool {
	if !q.replicated {
		return true
	}
	r := s.broker.loadReplicator()
	if r == nil {
		return false
	}
	rs := q.rare
	if rs == nil || rs.ownedBy == 0 {
		return s.hasMastered(q.group) && r.Delivering(q.group)
	}
	if rs.ownedBy != r.Self() {
		return false
	}
	if s.hasMastered(q.group) {
		return r.Delivering(q.group)
	}
	return !r.IsMaster(q.group) && r.Owning(q.group)
}

// expires reports whether this broker expires q's messages: q is not
// replicated, or this broker is its group's master (whoever owns the
// queue), has applied what it inherited, and holds its lease.
func (s *Shard) expires(q *Queue) bool {
	if !q.replicated {
		return true
	}
	r := s.broker.loadReplicator()
	return r != nil && s.hasMastered(q.group) && r.Delivering(q.group)
}

func (s *Shard) hasMastered(g uint32) bool {
	return int(g) < len(s.mastered) && s.mastered[g]
}

// setMastered sets Shard.mastered[g].
func (s *Shard) setMastered(g uint32, on bool) {
	if int(g) >= len(s.mastered) {
		if !on {
			return
		}
		s.mastered = append(s.mastered, make([]bool, int(g)+1-len(s.mastered))...)
	}
	s.mastered[g] = on
}

// dispatchDirty hands ready messages to consumers with credit, round robin.
func (s *Shard) dispatchDirty() {
	for _, q := range s.dirtyQs {
		delete(s.qDirty, q)
		s.dispatch(q)
		s.watchHead(q) // a delivery, release or expiry changed the head
	}
	s.dirtyQs = s.dirtyQs[:0]
}

func (s *Shard) dispatch(q *Queue) {
	// Only the group's master delivers, once its shards applied what it
	// inherited, and only under its lease (a master the controller
	// replaced may not know it yet); a follower holds the messages for
	// when it becomes master.
	if !s.delivers(q) {
		if q.replicated && len(q.consumers) > 0 {
			s.watchOwnership(q) // this broker may want it (own.go)
		}
		return
	}
	for {
		ev, ok := q.NextDelivery(s.now)
		if !ok {
			return // nothing ready, not durable yet (journalDone dispatches again), or no credit
		}
		if ev.Kind == EvExpire || ev.Kind == EvPromote {
			_ = q.Apply(&ev, s)
			continue
		}
		h := q.Head()
		if h.Body == nil && !s.pageIn(q) {
			return // a failed read: the queue waits, nothing is lost
		}
		con := ev.Consumer
		flags := uint8(0)
		if h.DeliveryCount > 0 {
			flags |= wire.MsgRedelivered
		}
		if h.Body.Persistent {
			flags |= wire.MsgPersistent
		}
		h.Body.Ref()
		d := Delivery{Tag: ev.Tag, DeliveryCount: h.DeliveryCount, Flags: flags, Body: h.Body}
		size := int64(h.size())
		if err := q.Apply(&ev, s); err != nil {
			panic("shards: acquire of the head failed: " + err.Error())
		}
		s.stats.Delivered++
		if q.replicated && !s.sendAtOnce(q, ev.Seq) {
			// Out once its acquires event commits (acquire.go).
			if !con.ackNone {
				con.unacked[ev.Tag] = ev.Seq
			}
			s.hold(q, con, d, ev.Seq, size)
			continue
		}
		con.pending = append(con.pending, d)
		con.pendingBytes += size
		if con.ackNone {
			ev = Event{Kind: EvDequeue, Seq: ev.Seq}
			s.localAcq, s.localStamped = true, q.replicated && s.stamped(q)
			_ = q.Apply(&ev, s)
			s.localAcq, s.localStamped = false, false
		} else {
			con.unacked[ev.Tag] = ev.Seq
		}
		o := s.out(con.Session)
		if len(con.pending) == 1 {
			o.consumers = append(o.consumers, con)
		}
	}
}

// DeadLetter implements Effects: route the message to the queue's
// dead-letter exchange.
func (s *Shard) DeadLetter(q *Queue, e *Entry, reason DeadLetterReason) {
	if !s.masters(q) && !(s.localAcq && reason == ReasonRejected) {
		// (An owner that is not the master dead-letters what its own
		// consumers reject; the master, what reaches the delivery limit.)
		// A follower drops a replicated message for the same reason as
		// its master (a drop-head applied from the log): the master
		// dead-letters it, once for the group.
		return
	}
	s.stats.DeadLettered++
	dlx := q.Options.DeadLetterExchange
	if dlx == "" && q.Options.DeadLetterKey == "" {
		return
	}
	if !s.withBody(q, e) {
		return
	}
	key := e.Body.RoutingKey
	if q.Options.DeadLetterKey != "" {
		key = []byte(q.Options.DeadLetterKey)
	}
	var buf [8]*Queue
	targets, err := s.broker.hooks.Router.Route([]byte(dlx), key, buf[:0])
	if err != nil {
		return
	}
	// A journaled message dead-lettered to queues on other shards: those
	// shards journal the enqueues, this one the dequeue, in two journals
	// with no order between them, so a crash could keep the dequeue and
	// lose the enqueues. The dequeue waits instead: the other shards'
	// publishes share a Fanout that, once all are durable, sends the
	// dequeue back here (opDeadLettered); Removed skips it meanwhile. A
	// crash before then brings the message back in this queue (at least
	// once, never lost), as does a target that fails to journal it.
	// Same-shard targets need nothing: their enqueue records precede the
	// dequeue in this journal.
	var fan *Fanout
	if q.replicated {
		// The removal of a replicated message is proposed once every
		// target took the dead letter (deadLettered), not now: a master
		// that dies in between leaves the message in the group's log, and
		// the next master dead-letters it again (at least once).
		n := 0
		for _, t := range targets {
			if t != q {
				n++
			}
		}
		if n > 0 {
			fan = NewFanout(n)
			fan.held = deadLettered{queue: q, seq: e.Seq}
			s.dlHeld = e // Removed, called next for e, leaves it to deadLettered
		}
	} else if e.JournalPos != 0 && s.journal != nil {
		cross := 0
		for _, t := range targets {
			if t != q && t.Shard() != s.idx {
				cross++
			}
		}
		if cross > 0 {
			fan = NewFanout(cross)
			fan.held = deadLettered{queue: q, journalPos: journal.Pos(e.JournalPos)}
			s.holdForDeadLetter(q, e)
			e.JournalPos = 0
		}
	}
	for _, t := range targets {
		if t == q {
			continue // never dead-letter a queue into itself
		}
		e.Body.Ref()
		body := e.Body
		if q.Options.DeadLetterKey != "" {
			// The dead letter carries its new routing key.
			e.Body.Unref()
			body = NewBody(e.Body.Exchange, key, e.Body.Props, e.Body.Payload, e.Body.Persistent)
		}
		p := Publish{Queue: t, Body: body, Now: s.now}
		if t.Shard() == s.idx {
			if q.replicated {
				p.Fanout = fan
			}
			s.publish(&p)
			continue
		}
		p.Fanout = fan
		if cmd := p.Command(); !s.broker.shards[t.shard].TryPush(cmd) {
			if len(s.deferred) >= deferredMax {
				body.Unref()
				s.stats.DroppedDeadLetters++
				// The source keeps its record: the message comes back
				// at the next start rather than being lost.
				s.completeCmd(nil, 0, fan, Errorf(wire.CodeResourceLimit, "dead letter dropped"))
				continue
			}
			s.deferred = append(s.deferred, cmd)
		}
	}
}

// Removed implements Effects. A journaled message leaves by a dequeue
// record.
func (s *Shard) Removed(q *Queue, e *Entry) {
	if q.replicated {
		// On the master the removal goes to the group log; a follower's
		// own removals (a drop-head applied from the log) are not
		// proposed, and its copy is made right by the master's remove
		// when it commits.
		switch {
		case s.dlHeld == e:
			s.dlHeld = nil // its dead letter is on the way (DeadLetter)
		case s.fromLog:
		case s.localAcq && (s.localStamped || s.acqByMine(q, e.Seq)):
			// Its stamped removal ends the log's record of who holds it
			// (acqBy), when it applies (own.go).
			s.noteRemovedBy(q, e.Seq)
		case s.masters(q):
			s.noteRemoved(q, e.Seq)
			if rs := q.rare; rs != nil && rs.acqBy != nil {
				delete(rs.acqBy, e.Seq)
			}
		default:
			if rs := q.rare; rs != nil && rs.acqBy != nil && !s.localAcq {
				delete(rs.acqBy, e.Seq)
			}
		}
	}
	if e.JournalPos != 0 && s.journal != nil {
		s.appendDequeue(q, journal.Pos(e.JournalPos), nil, 0)
	}
	s.forget(q, e)
	if e.Body != nil {
		e.Body.Unref()
	}
}

// deadLettered runs when every other target of a dead letter from
// d.queue finished its publish: with no error, the queue's shard removes
// the source message now (opDeadLettered).
func (s *Shard) deadLettered(d deadLettered, err error) {
	src := d.queue
	if err != nil {
		s.log.Warn("shards: a dead letter was not stored by every target; the source keeps it and brings it back at the next start (a replicated one at its group's next master change)",
			"queue", src.Name, "err", err)
		return
	}
	cmd := d.command()
	if src.Shard() == s.idx {
		s.handle(&cmd)
		return
	}
	if !s.broker.shards[src.shard].TryPush(cmd) {
		if len(s.deferred) >= deferredMax {
			s.stats.DroppedDeadLetters++
			return // the source record stays: a duplicate at the next start, not a loss
		}
		s.deferred = append(s.deferred, cmd)
	}
}

func (s *Shard) retryDeferred() {
	kept := s.deferred[:0]
	for _, cmd := range s.deferred {
		if !s.broker.shards[cmd.queue.shard].TryPush(cmd) {
			kept = append(kept, cmd)
		}
	}
	for i := len(kept); i < len(s.deferred); i++ {
		s.deferred[i] = Command{}
	}
	s.deferred = kept
}

// flush sends every session what this cycle produced for it.
func (s *Shard) flush() {
	for _, o := range s.dirtyOuts {
		o.queued = false
		if o.sess.Closed() {
			s.dropOut(o)
			continue
		}
		if o.done != 0 {
			o.sess.Inflight.Add(-o.done)
			o.done = 0
		}
		ob := getOutBatch()
		if len(o.ranges) > 0 {
			ob.Buf = o.sess.appendCompletes(ob.Buf, o.ranges)
			o.ranges = o.ranges[:0]
		}
		ob.Buf = append(ob.Buf, o.errs...)
		o.errs = o.errs[:0]
		for _, con := range o.consumers {
			ob = s.appendDeliver(ob, o.sess, con)
		}
		for i := range o.consumers {
			o.consumers[i] = nil
		}
		o.consumers = o.consumers[:0]
		submit(o.sess, ob)
	}
	for i := range s.dirtyOuts {
		s.dirtyOuts[i] = nil
	}
	s.dirtyOuts = s.dirtyOuts[:0]
}

func (s *Shard) dropOut(o *sessOut) {
	o.ranges = o.ranges[:0]
	o.errs = o.errs[:0]
	for _, con := range o.consumers {
		for i := range con.pending {
			con.pending[i].Body.Unref()
			con.pending[i] = Delivery{}
		}
		con.pending = con.pending[:0]
		con.pendingBytes = 0
	}
	o.consumers = o.consumers[:0]
}

// IovecsMax bounds the write vector of one batch, under the kernel's
// IOV_MAX of 1024: a batch goes out in a single writev so that frames from
// different shards never interleave on a connection.
const IovecsMax = 960

func submit(sess *Session, ob *outBatch) {
	ob.build()
	if len(ob.vec) == 0 {
		ob.release()
		return
	}
	if err := sess.Out.WriteAsync(ob.vec, ob.done); err != nil {
		ob.release()
	}
}

// deliverRoomMin is the least room for payloads (Frames.PayloadRoom) a
// batch must have for a consumer's deliveries to go into it; one with less
// is sent first, so that they are not cut into short frames for want of
// room.
const deliverRoomMin = 16

// appendDeliver writes a consumer's pending deliveries in the session's
// protocol (Session.Encoder) and keeps a reference to each body until the
// write is done. When the batch's vector would grow past IovecsMax (less
// than deliverRoomMin left, or the encoder found no room for the next
// delivery) it submits the batch and carries on in a new one, which it
// returns. This is the one place where a batch is cut for room.
func (s *Shard) appendDeliver(ob *outBatch, sess *Session, con *Consumer) *outBatch {
	p := con.pending
	for len(p) > 0 {
		n := 0
		if ob.PayloadRoom() >= deliverRoomMin {
			n = sess.appendDeliveries(&ob.Frames, con.ID, p)
		}
		if n < 0 || n > len(p) {
			panic("shards: the session's encoder counted deliveries it was not given")
		}
		if n == 0 {
			if ob.PayloadRoom() == PayloadsMax {
				panic("shards: the session's encoder wrote no delivery into an empty batch")
			}
			submit(sess, ob)
			ob = getOutBatch()
			continue
		}
		for i := range p[:n] {
			ob.bodies = append(ob.bodies, p[i].Body)
		}
		p = p[n:]
	}
	for i := range con.pending {
		con.pending[i] = Delivery{}
	}
	con.pending = con.pending[:0]
	con.pendingBytes = 0
	return ob
}
