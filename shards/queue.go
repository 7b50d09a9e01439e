package shards

import (
	"container/heap"
	"errors"
	"math/bits"

	"github.com/berthmq/berth/wire"
)

// QueueOptions are fixed when a queue is declared (one type for the wire,
// the shards, the wiring and the controller).
type QueueOptions = wire.QueueOptions

// Errors of the queue state machine.
var (
	ErrQueueFull     = errors.New("shards: queue is full")
	ErrNoSuchMessage = errors.New("shards: no such message")
	ErrNoCredit      = errors.New("shards: consumer has no credit")
)

// EventKind names a change to a queue's state.
type EventKind uint8

const (
	// EvEnqueue adds a message at the tail of its priority level (Seq,
	// Body, ExpiresAt, DeliveryCount, Priority), or, with a DeliverAt, to
	// the delayed messages until an EvPromote at or after that time.
	EvEnqueue EventKind = iota + 1
	// EvAcquire hands the ready message Seq to Consumer under Tag.
	EvAcquire
	// EvRelease puts the acquired message Seq back at its old position and
	// counts a delivery (Redelivered false: not delivered, as on cancel of a
	// write that never left).
	EvRelease
	// EvReject dead-letters or discards the acquired message Seq.
	EvReject
	// EvDequeue forgets the acquired message Seq (accept).
	EvDequeue
	// EvExpire removes expired messages from the head, as of Now.
	EvExpire
	// EvPurge removes every ready and every delayed message.
	EvPurge
	// EvRemove drops the message Seq wherever it is (ready or acquired),
	// without dead-lettering it, and does nothing if the queue no longer
	// holds it: a replicated queue's member applies it when the group's
	// master removed the message (accepted, rejected, expired, dropped).
	EvRemove
	// EvPromote makes the delayed messages due as of Now ready: each takes
	// its place by Seq in its level, as a released message does.
	EvPromote
)

func (k EventKind) String() string {
	switch k {
	case EvEnqueue:
		return "enqueue"
	case EvAcquire:
		return "acquire"
	case EvRelease:
		return "release"
	case EvReject:
		return "reject"
	case EvDequeue:
		return "dequeue"
	case EvExpire:
		return "expire"
	case EvPurge:
		return "purge"
	case EvRemove:
		return "remove"
	case EvPromote:
		return "promote"
	}
	return "unknown"
}

// Event is one change to a queue. Events carry everything apply needs,
// the time included, so applying the same events in the same order gives
// the same state on every broker and on every replay of the journal.
type Event struct {
	Kind          EventKind
	Seq           uint64
	Body          *Body // EvEnqueue; the queue takes over the caller's reference
	ExpiresAt     int64 // EvEnqueue; unix nanoseconds, 0 = never
	DeliveryCount uint32
	Consumer      *Consumer // EvAcquire
	Tag           uint64    // EvAcquire
	Cursor        int       // EvAcquire: the round-robin cursor after it
	Now           int64     // EvExpire, EvPromote
	// Priority is an EvEnqueue's message priority; a queue without
	// MaxPriority ignores it, one with caps it there.
	Priority uint8
	// DeliverAt (EvEnqueue, unix nanoseconds, 0 = at once) delays the
	// message: it is held apart, counted in Delayed, until an EvPromote
	// whose Now reaches it.
	DeliverAt  int64
	JournalPos uint64 // EvEnqueue of a journaled message
	// Size is the content size (Body.Size) of an EvEnqueue whose Body is
	// nil: a recovered message left on disk to stay within the memory
	// budget (memory.go).
	Size uint32
}

// DeadLetterReason says why a message left its queue without an accept.
type DeadLetterReason uint8

const (
	ReasonRejected DeadLetterReason = iota + 1
	ReasonExpired
	ReasonMaxLength
	ReasonMaxDeliveries
)

// Effects receives what applying an event does beyond the queue itself.
// It is implemented by the shard; the queue does no I/O.
type Effects interface {
	// DeadLetter is called for a message that leaves the queue for its
	// dead-letter exchange. The effect owns the entry's body reference
	// only for the duration of the call; Ref it to keep it.
	DeadLetter(q *Queue, e *Entry, reason DeadLetterReason)
	// Removed is called for every entry that leaves the queue, after
	// DeadLetter if any. The entry is recycled afterwards.
	Removed(q *Queue, e *Entry)
}

// Entry is one message in one queue: the compact index entry that stays
// in memory when the body is paged out (48 bytes, plus 8 for its slot in
// the queue's ring, or 16 for its slot among the delayed messages;
// TestEntrySize holds it there).
type Entry struct {
	Seq       uint64
	Body      *Body // nil while paged out (memory.go)
	ExpiresAt int64
	// JournalPos is the message's enqueue record in the shard journal, 0
	// for a message that is not journaled. A paged-out journaled message
	// is read back from there.
	JournalPos uint64
	// page locates a paged-out transient message in the shard's paging
	// file (pageLoc); 0 when the body is in memory or in the journal.
	page          uint64
	DeliveryCount uint32
	// sizeLevel is Body.Size() (low 28 bits: a message fits in a 64 MiB
	// frame) and the message's priority level (high 4 bits), both kept
	// here because the body may be paged out. Packed so that priorities
	// cost no index memory.
	sizeLevel uint32
}

const (
	entrySizeBits = 28
	entrySizeMask = 1<<entrySizeBits - 1
)

// size is the message's content size (Body.Size).
func (e *Entry) size() uint64 { return uint64(e.sizeLevel & entrySizeMask) }

// level is the message's priority level in its queue.
func (e *Entry) level() int { return int(e.sizeLevel >> entrySizeBits) }

func (e *Entry) setSizeLevel(size uint64, level int) {
	e.sizeLevel = uint32(size)&entrySizeMask | uint32(level)<<entrySizeBits
}

// Level is the message's priority level: its priority capped at the
// queue's MaxPriority, 0 in a queue without priorities.
func (e *Entry) Level() int { return e.level() }

// level holds one priority level's ready messages.
type level struct {
	ready deque // in Seq order
	// released holds released messages and delayed ones that came due,
	// by Seq: each goes back to its place among the ready ones.
	released releaseHeap
}

func (l *level) len() int { return l.ready.len() + len(l.released) }

// peek returns the level's ready message with the lowest Seq.
func (l *level) peek() *Entry {
	h := l.ready.front()
	if len(l.released) > 0 {
		if r := l.released[0]; h == nil || r.Seq < h.Seq {
			return r
		}
	}
	return h
}

// Queue is a queue's state. It is owned by one shard goroutine; nothing
// else reads or writes it.
//
// A broker may hold a million queues that sit idle, so an idle queue is
// one 160-byte allocation and nothing else (TestIdleQueueSize and
// TestIdleQueueBytes hold it there): its priority levels, counters,
// delayed messages, expiry time and map of acquired messages are made by
// the first message (busy; the map by the first delivery), its options
// are shared with every queue declared alike (internOptions), and what
// only replicated, deduplicating or delaying queues use sits behind a
// pointer (rare).
type Queue struct {
	Name string
	// Options point to the queue's options, which never change: shared by
	// the queues declared with equal options. Never write through it.
	Options *QueueOptions
	shard   int32
	// group is the replication group of a replicated queue's events
	// (replicated.go). Fixed at AddQueue.
	group uint32

	// levels holds the ready messages, one level per priority (0 to
	// Options.MaxPriority); a plain queue has one. nonEmpty has bit i set
	// while level i holds a message, so the head is found without a scan.
	// Nil until the first message.
	levels   []level
	nonEmpty uint16

	deleted      bool
	everConsumed bool
	// replicated: the queue's events go through replication group
	// group's log (replicated.go). Fixed at AddQueue.
	replicated bool

	rr int32 // round-robin cursor over consumers
	// Consumers see only messages the broker cannot forget. A persistent
	// message on a durable queue is enqueued at once (so order, limits and
	// TTL hold) but becomes deliverable only when its journal record is
	// durable: unsafe counts enqueue records in flight, and while it is
	// not zero only messages up to safeSeq are deliverable. A transient
	// message behind an unsafe one waits with it, so FIFO order holds.
	unsafe  int32
	safeSeq uint64

	nextSeq uint64

	readyBytes uint64
	totalBytes uint64

	consumers []*Consumer
	owner     *Session // exclusive owner, or nil
	free      *entryPool
	// rare holds what few queues use: nil until the first use.
	rare *queueRare

	// busy is made by the first enqueue, with the levels: an idle queue
	// has counted nothing (Counters) and holds no delayed message.
	busy *queueBusy
}

// queueBusy is the part of a queue that only a queue that has held a
// message needs. Keeping it out of Queue keeps an idle queue, of which a
// broker may hold millions, within one 160-byte allocation
// (TestIdleQueueSize); a queue that holds messages pays what it paid when
// these fields were Queue's (160 + 96 bytes against 208 + 48).
type queueBusy struct {
	QueueCounters
	// tail is the entry the last enqueue added (for the memory budget).
	tail *Entry
	// delayed holds the messages whose deliver-at time is still to come,
	// earliest first; EvPromote moves the due ones to their levels.
	delayed delayHeap
	// acquired holds the messages handed to consumers; nil until the first.
	acquired map[uint64]*Entry
	// expireAt is the time under which the shard's expiry index holds
	// the queue, 0 when it does not (Shard.watchHead): only a queue with
	// a message has a head with a TTL.
	expireAt int64
	// sweepFrom is the lowest Seq of the bodies admitted in memory past
	// the sweep's reach (memory.go), not yet swept; 0 for none. While it
	// is set the queue is on its shard's sweep list.
	sweepFrom uint64
}

// acquiredMap returns q's acquired messages (nil for a queue that never
// held a message). Writers go through q.busy: a message was placed.
func (q *Queue) acquiredMap() map[uint64]*Entry {
	if q.busy == nil {
		return nil
	}
	return q.busy.acquired
}

// delayedHeap returns q's delayed messages (nil for a queue that never
// held a message). Writers go through q.busy, which place makes.
func (q *Queue) delayedHeap() delayHeap {
	if q.busy == nil {
		return nil
	}
	return q.busy.delayed
}

// QueueCounters count what happened to a queue's messages.
type QueueCounters struct {
	Enqueued, Delivered, Acked, DeadLettered, Expired uint64
	// Recovered counts the enqueues that were journal replay at start,
	// not publishes.
	Recovered uint64
}

// Counters returns q's counters. Read them on q's shard (or inside a
// Broker.Call), as every other part of q's state.
func (q *Queue) Counters() QueueCounters {
	if q.busy == nil {
		return QueueCounters{}
	}
	return q.busy.QueueCounters
}

// queueRare is the part of a queue that most queues never use.
type queueRare struct {
	// removing holds the seqs of messages removed on this master and not
	// yet proposed to the group (Shard.noteRemoved), or not taken by it
	// yet (Shard.proposeRemoves).
	removing []uint64
	// removeRefused: the group refused the last proposal of removing
	// (logged once until one is taken).
	removeRefused bool
	// acquiring holds the seqs of messages acquired on this master whose
	// deliveries wait for an acquires event not proposed yet (acquire.go),
	// and acqGen counts the events proposed: a held delivery waits for
	// event acqGen+1 of its time. acquireRefused: the group refused the
	// last proposal (logged once until one is taken).
	acquiring      []uint64
	acqGen         uint64
	acquireRefused bool
	// releasing and returning hold the seqs of acquired messages this
	// master put back, for the next releases events: a consumer's
	// release or end, and held deliveries given back unseen (acquire.go).
	// acqListed: the queue is on Shard.acquiring.
	// releasesInFlight counts its releases events proposed and not
	// committed yet, which its acquires wait for.
	releasing, returning []uint64
	acqListed            bool
	releasesInFlight     int
	// acquiresInFlight counts its acquires events proposed and not
	// committed yet (acquiresInFlightMax).
	acquiresInFlight int
	// The window (acquire.go): on this master, that of its last
	// committed acquires event, and those of its events in flight, in
	// order; on a follower, that of the last acquires event applied.
	// uncovered counts deliveries sent at once whose events have not
	// committed, sentNow the seqs of those in acquiring. idleTicks
	// counts ticks with nothing sent (tickAcquires); windowed: the queue
	// is on Shard.windowed. term counts this broker's step-downs from
	// the group (resetGroup): an outcome of an event proposed before the
	// last one is ignored.
	// held counts its deliveries held (Consumer.held).
	window      uint32
	held        int
	winInFlight []uint32
	uncovered   int
	sentNow     []uint64
	idleTicks   uint8
	windowed    bool
	term        uint32
	// producers is the deduplication state of producer ids (dedup.go).
	producers producerTable
	// timerAt is the deliver-at time under which the shard's timers hold
	// this queue, 0 when they do not (Shard.schedule).
	timerAt int64

	// Ownership (own.go), as the group log has it: the owner broker (0:
	// the group's master), its ownership number, the brokers that want
	// the queue (sorted), and who holds each message acquired by a
	// broker that is not the master (acqBy; a master's are not in it).
	ownedBy uint32
	ownGen  uint64
	wanters []uint32
	acqBy   map[uint64]uint32
	// This broker's side: when it got the queue, whether it is handing
	// it over (it hands nothing out meanwhile), its own and want events
	// in flight, and its stamped removals pending (removingBy, with the
	// settles waiting for them, removeDone) and in flight.
	ownedAt         int64
	handing         bool
	ownInFlight     bool
	wantInFlight    int
	removingBy      []uint64
	removeDone      []func(error)
	removesInFlight int
	ownWatched      bool // on Shard.ownWatch
	// ownIndex is the log index of the own event in effect, wantIndex
	// that of this broker's want in effect: each stays in the group log
	// (compaction stops at it) until superseded, so their proposer
	// states them again once the log has moved on far (refreshOwnership).
	ownIndex, wantIndex uint64
	refreshListed       bool // on Shard.refresh
	// heldReady is the last acquires event of this owner that committed
	// while it was not delivering: its held deliveries wait for the
	// owner's lease (own.go).
	heldReady uint64
	// maybeAcq holds the messages of this owner's acquires events that
	// failed and may commit still (acquiresFailed): given back, each
	// needs a release event all the same.
	maybeAcq      map[uint64]struct{}
	foreignListed bool // on Shard.foreign
	// orphans: the log may hold messages as acquired by this broker that
	// none of its consumers holds any more (it applied the log again
	// after a step-down, or it restarted); checkOrphans looks.
	orphans bool
	// windowBy is the broker whose acquires event declared window (0:
	// a master): an own event that takes a lost owner's queue back
	// counts the window only if that owner declared it.
	windowBy uint32
}

// rareState returns q.rare, making it first.
func (q *Queue) rareState() *queueRare {
	if q.rare == nil {
		q.rare = &queueRare{}
	}
	return q.rare
}

// Owner is the session an exclusive queue belongs to, or nil.
func (q *Queue) Owner() *Session { return q.owner }

// Deleted reports whether the queue was dropped. Read it on the queue's
// shard, or after a Call to it.
func (q *Queue) Deleted() bool { return q.deleted }

// NewQueue returns an empty queue.
func NewQueue(name string, opts QueueOptions, shard int, pool *entryPool) *Queue {
	if pool == nil {
		pool = &entryPool{}
	}
	return &Queue{Name: name, Options: internOptions(opts), shard: int32(shard), nextSeq: 1, free: pool}
}

// Options shared by every queue declared with them: most queues of a
// broker are declared alike, and a queue's options never change.
var (
	plainOptions   = QueueOptions{}
	durableOptions = QueueOptions{Durable: true}
)

// internOptions returns a pointer to options equal to opts, shared when
// they are common ones.
func internOptions(opts QueueOptions) *QueueOptions {
	switch opts {
	case plainOptions:
		return &plainOptions
	case durableOptions:
		return &durableOptions
	}
	o := new(QueueOptions) // not &opts: that would allocate for the shared ones too
	*o = opts
	return o
}

// levelState returns q.levels, making them at the first message.
func (q *Queue) levelState() []level {
	if q.levels == nil {
		q.levels = make([]level, int(min(q.Options.MaxPriority, PriorityMax))+1)
		q.busy = &queueBusy{}
	}
	return q.levels
}

// PriorityMax is the largest MaxPriority a queue may have.
const PriorityMax = wire.PriorityMax

// levelOf is the level of a message of priority prio.
func (q *Queue) levelOf(prio uint8) int { return int(min(prio, q.Options.MaxPriority, PriorityMax)) }

// Shard returns the index of the shard that owns the queue.
func (q *Queue) Shard() int { return int(q.shard) }

// Ready is the number of messages waiting for a consumer.
func (q *Queue) Ready() int {
	n := 0
	for i := range q.levels {
		n += q.levels[i].len()
	}
	return n
}

// Unacked is the number of acquired messages.
func (q *Queue) Unacked() int { return len(q.acquiredMap()) }

// Delayed is the number of messages whose deliver-at time is to come.
func (q *Queue) Delayed() int { return len(q.delayedHeap()) }

// NextDeliverAt is the earliest deliver-at time of a delayed message, or
// 0 when there is none.
func (q *Queue) NextDeliverAt() int64 {
	d := q.delayedHeap()
	if len(d) == 0 {
		return 0
	}
	return d[0].at
}

// Depth is every message the queue holds.
func (q *Queue) Depth() int { return q.Ready() + q.Unacked() + q.Delayed() }

// Consumers is the number of consumers.
func (q *Queue) Consumers() int { return len(q.consumers) }

// NextSeq is the Seq the next enqueue takes.
func (q *Queue) NextSeq() uint64 { return q.nextSeq }

// CheckEnqueue says whether an enqueue of size bytes is allowed now: under
// reject-publish a full queue refuses it. Drop-head always allows it.
func (q *Queue) CheckEnqueue(size int) error {
	o := q.Options
	if o.Overflow == 0 && q.full(1, uint64(size)) {
		return ErrQueueFull
	}
	return nil
}

func (q *Queue) full(extraCount, extraBytes uint64) bool {
	o := q.Options
	if o.MaxLength > 0 && uint64(q.Depth())+extraCount > o.MaxLength {
		return true
	}
	if o.MaxLengthBytes > 0 && q.totalBytes+extraBytes > o.MaxLengthBytes {
		return true
	}
	return false
}

// Apply applies one event. It never reads a clock and does no I/O.
func (q *Queue) Apply(ev *Event, fx Effects) error {
	switch ev.Kind {
	case EvEnqueue:
		return q.enqueue(ev, fx)
	case EvAcquire:
		return q.acquire(ev)
	case EvRelease:
		e, ok := q.acquiredMap()[ev.Seq]
		if !ok {
			return ErrNoSuchMessage
		}
		q.unacquire(e)
		e.DeliveryCount++
		if q.Options.MaxDeliveries > 0 && e.DeliveryCount >= q.Options.MaxDeliveries {
			q.remove(e, ReasonMaxDeliveries, fx)
			return nil
		}
		q.putBack(e)
		return nil
	case EvReject:
		e, ok := q.acquiredMap()[ev.Seq]
		if !ok {
			return ErrNoSuchMessage
		}
		q.unacquire(e)
		q.remove(e, ReasonRejected, fx)
		return nil
	case EvDequeue:
		e, ok := q.acquiredMap()[ev.Seq]
		if !ok {
			return ErrNoSuchMessage
		}
		q.unacquire(e)
		q.busy.Acked++
		q.remove(e, 0, fx)
		return nil
	case EvExpire:
		for {
			e := q.peek()
			if e == nil || e.ExpiresAt == 0 || e.ExpiresAt > ev.Now {
				return nil
			}
			q.pop()
			q.busy.Expired++
			q.remove(e, ReasonExpired, fx)
		}
	case EvRemove:
		if e, ok := q.acquiredMap()[ev.Seq]; ok {
			q.unacquire(e)
			q.remove(e, 0, fx)
			return nil
		}
		if e := q.takeReady(ev.Seq); e != nil {
			q.remove(e, 0, fx)
		} else if e := q.takeDelayed(ev.Seq); e != nil {
			q.remove(e, 0, fx)
		}
		return nil
	case EvPurge:
		for e := q.pop(); e != nil; e = q.pop() {
			q.remove(e, 0, fx)
		}
		for len(q.delayedHeap()) > 0 {
			var d delayedEntry
			d, q.busy.delayed = heapRemove(q.busy.delayed, 0, delayedLess)
			q.free.totals.Delayed--
			q.remove(d.e, 0, fx)
		}
		return nil
	case EvPromote:
		for h := q.delayedHeap(); len(h) > 0 && h[0].at <= ev.Now; h = q.busy.delayed {
			var d delayedEntry
			d, q.busy.delayed = heapRemove(h, 0, delayedLess)
			q.free.totals.Delayed--
			q.putBack(d.e)
		}
		return nil
	}
	panic("shards: unknown event kind")
}

func (q *Queue) enqueue(ev *Event, fx Effects) error {
	size := uint64(ev.Size)
	if ev.Body != nil {
		size = uint64(ev.Body.Size())
	}
	if q.full(1, size) {
		if q.Options.Overflow == 0 {
			return ErrQueueFull
		}
		// Drop head: make room from the front of the ready messages (the
		// oldest of the highest priority first), then from the delayed
		// ones due first, so that delayed messages cannot grow a queue
		// past its bound.
		for q.full(1, size) {
			e := q.pop()
			if e == nil && len(q.delayedHeap()) > 0 {
				var d delayedEntry
				d, q.busy.delayed = heapRemove(q.busy.delayed, 0, delayedLess)
				q.free.totals.Delayed--
				e = d.e
			}
			if e == nil {
				break // everything left is acquired; admit past the bound
			}
			q.remove(e, ReasonMaxLength, fx)
		}
	}
	q.place(ev, size)
	return nil
}

// place adds the message of an enqueue event, of size bytes, whether or
// not the queue's bounds allow it.
func (q *Queue) place(ev *Event, size uint64) {
	e := q.free.get()
	e.Seq = ev.Seq
	if e.Seq == 0 {
		e.Seq = q.nextSeq
	}
	if e.Seq >= q.nextSeq {
		q.nextSeq = e.Seq + 1
	}
	e.Body = ev.Body
	e.ExpiresAt = ev.ExpiresAt
	e.DeliveryCount = ev.DeliveryCount
	e.JournalPos = ev.JournalPos
	e.setSizeLevel(size, q.levelOf(ev.Priority))
	q.totalBytes += size
	t := &q.free.totals
	t.Bytes += size
	levels := q.levelState() // tailDelayed looks at them for a delayed one too
	q.busy.tail = e
	q.busy.Enqueued++
	if ev.DeliverAt != 0 {
		q.busy.delayed = heapPush(q.busy.delayed, delayedEntry{at: ev.DeliverAt, e: e}, delayedLess)
		t.Delayed++
		return
	}
	lv := e.level()
	levels[lv].ready.push(e)
	t.Ready++
	q.nonEmpty |= 1 << lv
	q.readyBytes += size
}

// putBack returns e to its level at its place by Seq: a release, or a
// delayed message that came due.
func (q *Queue) putBack(e *Entry) {
	lv := e.level()
	heap.Push(&q.levelState()[lv].released, e)
	q.free.totals.Ready++
	q.nonEmpty |= 1 << lv
	q.readyBytes += e.size()
}

// tailDelayed reports whether the last enqueue went to the delayed
// messages.
func (q *Queue) tailDelayed() bool {
	e := q.busy.tail
	l := &q.levels[e.level()]
	return l.ready.back() != e
}

// acquire hands the head to a consumer: it takes one credit, the
// consumer's next tag, and moves the round-robin cursor past it.
func (q *Queue) acquire(ev *Event) error {
	e := q.peek()
	if e == nil || e.Seq != ev.Seq {
		return ErrNoSuchMessage
	}
	if con := ev.Consumer; con != nil {
		if con.credit == 0 {
			return ErrNoCredit
		}
		con.credit--
		con.nextTag = ev.Tag
		q.rr = int32(ev.Cursor)
	}
	q.pop()
	if q.busy.acquired == nil {
		q.busy.acquired = make(map[uint64]*Entry)
	}
	q.busy.acquired[e.Seq] = e
	q.free.totals.Unacked++
	q.busy.Delivered++
	return nil
}

// NextDelivery decides the queue's next delivery step at time now, without
// changing anything: the event to apply, or false when there is nothing to
// do. It is the whole delivery policy:
//   - delayed messages whose time came are made ready first (EvPromote);
//   - the head is the oldest message (lowest Seq) of the highest priority
//     level that holds any;
//   - a head whose TTL ran out is expired first (EvExpire);
//   - a head whose enqueue is not yet durable (or, in a cluster,
//     committed) is not delivered, and nothing behind it is: FIFO holds;
//   - otherwise the head goes to the first consumer with credit, starting
//     at the round-robin cursor (EvAcquire with that consumer, its next
//     tag, and the cursor just past it). A consumer whose session has more
//     bytes waiting on its connection than its cap (Session.OutMax) counts
//     as one without credit until the server resumes it (Resume).
//
// Applying the returned event and asking again delivers as long as there
// are messages and credit. A replica that applies the same events in the
// same order makes the same decisions: the choice depends only on the
// queue's state and now (and on the sessions' pending bytes, which only
// the delivering master reads: followers do not dispatch).
func (q *Queue) NextDelivery(now int64) (Event, bool) {
	if q.deleted {
		return Event{}, false
	}
	if d := q.delayedHeap(); len(d) > 0 && d[0].at <= now {
		return Event{Kind: EvPromote, Now: now}, true
	}
	h := q.peek()
	if h == nil {
		return Event{}, false
	}
	if h.ExpiresAt != 0 && h.ExpiresAt <= now {
		return Event{Kind: EvExpire, Now: now}, true
	}
	if !q.Deliverable(h) {
		return Event{}, false
	}
	n := len(q.consumers)
	for i := 0; i < n; i++ {
		at := (int(q.rr) + i) % n
		if c := q.consumers[at]; c.credit > 0 && !c.Session.overOut(now, c.pendingBytes+c.heldBytes) {
			return Event{Kind: EvAcquire, Seq: h.Seq, Consumer: c, Tag: c.nextTag + 1, Cursor: (at + 1) % n}, true
		}
	}
	return Event{}, false
}

func (q *Queue) unacquire(e *Entry) {
	delete(q.busy.acquired, e.Seq)
	q.free.totals.Unacked--
}

// remove drops e from the queue's accounting, dead-lettering it for a
// non-zero reason.
func (q *Queue) remove(e *Entry, reason DeadLetterReason, fx Effects) {
	q.totalBytes -= e.size()
	q.free.totals.Bytes -= e.size()
	if reason != 0 {
		q.busy.DeadLettered++
		fx.DeadLetter(q, e, reason)
	}
	fx.Removed(q, e)
	e.Body = nil
	q.free.put(e)
}

// topLevel is the highest level that holds a ready message, or -1.
func (q *Queue) topLevel() int { return bits.Len16(q.nonEmpty) - 1 }

// peek returns the head: the ready message with the lowest Seq in the
// highest level that holds one.
func (q *Queue) peek() *Entry {
	if q.nonEmpty == 0 {
		return nil
	}
	return q.levels[q.topLevel()].peek()
}

func (q *Queue) pop() *Entry {
	if q.nonEmpty == 0 {
		return nil
	}
	lv := q.topLevel()
	l := &q.levels[lv]
	e := l.peek()
	if len(l.released) > 0 && l.released[0] == e {
		heap.Pop(&l.released)
	} else {
		l.ready.popFront()
	}
	if l.len() == 0 {
		q.nonEmpty &^= 1 << lv
	}
	q.readyBytes -= e.size()
	q.free.totals.Ready--
	return e
}

// takeReady takes the ready message seq out of the queue, or returns nil.
// Replicated removes come in about the order the master consumed, so the
// message is near the front and the shift is short.
func (q *Queue) takeReady(seq uint64) *Entry {
	for lv := range q.levels {
		if e := q.levels[lv].take(seq); e != nil {
			if q.levels[lv].len() == 0 {
				q.nonEmpty &^= 1 << lv
			}
			q.readyBytes -= e.size()
			q.free.totals.Ready--
			return e
		}
	}
	return nil
}

// takeDelayed takes the delayed message seq out of the queue, or returns
// nil. It scans: a replicated remove rarely finds a message still delayed
// here (the master removes it after delivering it).
func (q *Queue) takeDelayed(seq uint64) *Entry {
	for i, d := range q.delayedHeap() {
		if d.e.Seq == seq {
			q.busy.delayed, _ = heapRemoveAt(q.busy.delayed, i)
			q.free.totals.Delayed--
			return d.e
		}
	}
	return nil
}

func (l *level) take(seq uint64) *Entry {
	for i, r := range l.released {
		if r.Seq == seq {
			heap.Remove(&l.released, i)
			return r
		}
	}
	d := &l.ready
	lo, hi := 0, d.size
	for lo < hi {
		mid := (lo + hi) / 2
		if d.at(mid).Seq < seq {
			lo = mid + 1
		} else {
			hi = mid
		}
	}
	if lo == d.size || d.at(lo).Seq != seq {
		return nil
	}
	e := d.at(lo)
	// Shift the entries before it one place towards the back.
	for i := lo; i > 0; i-- {
		d.buf[(d.head+i)&(len(d.buf)-1)] = d.at(i - 1)
	}
	d.popFront()
	return e
}

// Head returns the next message a consumer would get, or nil.
// Deliverable reports whether e, a ready message of q, may be delivered:
// every enqueue record up to it is durable.
func (q *Queue) Deliverable(e *Entry) bool { return q.unsafe == 0 || e.Seq <= q.safeSeq }

// enqueueUnsafe notes that the message enqueued with seq waits for its
// enqueue record to be durable.
func (q *Queue) enqueueUnsafe(seq uint64) {
	if q.unsafe == 0 {
		q.safeSeq = seq - 1
	}
	q.unsafe++
}

// enqueueSafe notes that the enqueue record of the message seq is durable.
// Records complete in append order, which is seq order within a queue.
func (q *Queue) enqueueSafe(seq uint64) {
	q.unsafe--
	if q.unsafe == 0 {
		q.safeSeq = q.nextSeq - 1
	} else if seq > q.safeSeq {
		q.safeSeq = seq
	}
}

func (q *Queue) Head() *Entry { return q.peek() }

// Acquired returns the acquired entry Seq, or nil.
func (q *Queue) Acquired(seq uint64) *Entry { return q.acquiredMap()[seq] }

// deque is a growable ring of entries.
type deque struct {
	buf        []*Entry
	head, size int
}

func (d *deque) len() int { return d.size }

func (d *deque) push(e *Entry) {
	if d.size == len(d.buf) {
		d.grow(max(len(d.buf)*2, 16))
	}
	d.buf[(d.head+d.size)&(len(d.buf)-1)] = e
	d.size++
}

// grow moves the entries to a ring of n slots, a power of two.
func (d *deque) grow(n int) {
	nb := make([]*Entry, n)
	k := copy(nb, d.buf[d.head:min(d.head+d.size, len(d.buf))])
	copy(nb[k:d.size], d.buf)
	d.buf, d.head = nb, 0
}

// reserve makes room for n more entries at once (a restart knows how
// many a queue gets: doubling up to millions cost a third of placing
// them).
func (d *deque) reserve(n int) {
	c := max(len(d.buf), 16)
	for c < d.size+n {
		c *= 2
	}
	if c != len(d.buf) {
		d.grow(c)
	}
}

func (d *deque) front() *Entry {
	if d.size == 0 {
		return nil
	}
	return d.buf[d.head]
}

// at returns the i-th entry from the front; i < len. The ring's length is
// a power of two (16, doubled).
func (d *deque) at(i int) *Entry { return d.buf[(d.head+i)&(len(d.buf)-1)] }

// back returns the newest entry, or nil.
func (d *deque) back() *Entry {
	if d.size == 0 {
		return nil
	}
	return d.at(d.size - 1)
}

func (d *deque) popFront() *Entry {
	if d.size == 0 {
		return nil
	}
	e := d.buf[d.head]
	d.buf[d.head] = nil
	d.head = (d.head + 1) % len(d.buf)
	d.size--
	if d.size == 0 {
		d.head = 0
	}
	return e
}

// delayedEntry is a delayed message and its deliver-at time.
type delayedEntry struct {
	at int64
	e  *Entry
}

// delayHeap is a min-heap (heap.go) of delayed messages by deliver-at
// time, then Seq.
type delayHeap []delayedEntry

func delayedLess(a, b delayedEntry) bool { return a.at < b.at || a.at == b.at && a.e.Seq < b.e.Seq }

// heapRemoveAt removes element i of a delay heap.
func heapRemoveAt(h delayHeap, i int) (delayHeap, delayedEntry) {
	d, h := heapRemove(h, i, delayedLess)
	return h, d
}

// releaseHeap orders released messages by Seq, so a release puts a message
// back at its old position.
type releaseHeap []*Entry

func (h releaseHeap) Len() int           { return len(h) }
func (h releaseHeap) Less(i, j int) bool { return h[i].Seq < h[j].Seq }
func (h releaseHeap) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *releaseHeap) Push(x any)        { *h = append(*h, x.(*Entry)) }
func (h *releaseHeap) Pop() any {
	old := *h
	e := old[len(old)-1]
	old[len(old)-1] = nil
	*h = old[:len(old)-1]
	return e
}

// entryPool recycles entries. It belongs to one shard goroutine.
//
// Every queue of the shard points to it (Queue.free), so it also holds
// the shard's running totals over its queues (the counts Metrics
// reports): each place that changes a queue's ready, acquired or delayed
// messages, its bytes or its consumers changes them too, and a scrape
// reads them without visiting a queue. A queue reaches them without a
// field of its own. TestQueueTotalsMatchWalk holds them to a walk.
type entryPool struct {
	free   []*Entry
	totals QueueTotals
}

const entryPoolMax = 1 << 16

// entrySlab is how many entries an empty pool allocates at once: a growing
// queue (a burst, a recovery) costs one allocation per entrySlab messages.
// 255 and not 256: a slab holds pointers, so the allocator adds an 8-byte
// header, and 256 entries (12,288 bytes) would take a 13,568-byte block,
// 53 bytes an entry.
const entrySlab = 255

func (p *entryPool) get() *Entry {
	if len(p.free) == 0 {
		slab := make([]Entry, entrySlab)
		for i := range slab {
			p.free = append(p.free, &slab[i])
		}
	}
	n := len(p.free)
	e := p.free[n-1]
	p.free = p.free[:n-1]
	return e
}

func (p *entryPool) put(e *Entry) {
	*e = Entry{}
	if len(p.free) < entryPoolMax {
		p.free = append(p.free, e)
	}
}
