package shards

// Producer deduplication (protocol 1.2, wire.PublishProducer): a client that
// resends a publish whose outcome it did not learn (its connection broke)
// sends it with the same producer id and sequence number, and a queue that
// already enqueued that producer's message with an equal or higher
// sequence number skips it and completes it as a success.
//
// The decision is taken where the enqueue is applied, from state that only
// applied enqueues change, so every member of a replication group, which
// applies the same committed log in the same order, decides alike, and the
// state rebuilds itself when the log is applied again (after a restart or
// a step-down). Non-replicated durable queues keep the (producer, seq) in
// the enqueue's journal record and rebuild the state on replay; transient
// queues keep it in memory only.
//
// What the state is rebuilt from is what the log or journal still holds:
// a compacted group log (replication/groups) and a compacted journal keep only
// the enqueues of messages still in the queue, so a broker that restarts,
// a master that steps down and applies the log again, and a follower
// reset by an install forget the producers of messages already consumed.
// A member that applied the events live, as the follower that becomes the
// new master after a failover did, keeps all of it.
//
// A replicated queue's master (and a broker forwarding to it) checks the
// table before it proposes, so the resend of a publish it applied already
// completes without entering the group log. Otherwise the resend would
// stay in the log as an entry that members applying live skip, but that a
// member applying the compacted log again, with the first copy compacted
// away, would enqueue. Only a resend that reaches the master while its
// first copy is still uncommitted is written to the log; the members
// skip it, and forget why only if the log is compacted past the first
// copy but not past the resend and then applied again.
//
// The window: a queue remembers at most ProducersPerQueueMax producers.
// When a new one arrives at a full table, the producer whose last enqueue
// on this queue is the oldest is forgotten (least recently used, counted in
// applied enqueues, never by a clock, so members agree). A retry from a
// forgotten producer is enqueued again. Sequence numbers must grow per
// producer in the order a queue applies its enqueues; the Go client uses
// its command ids, which it keeps across reconnects, and resends what it
// has not seen completed before anything newer. Since a skip trusts the
// highest number, a client must never send a message again under its old
// number after a later one of the same producer may have been applied on
// that queue: the Go client does not resend a single refused publish
// (unavailable, for one) on a live connection, only everything without
// an answer, in order, on a new one.

// ProducersPerQueueMax bounds the producers one queue remembers. At about
// 40 bytes each, a queue's table stays under 64 KiB.
const ProducersPerQueueMax = 1024

type producerState struct {
	seq      uint64 // highest sequence number enqueued
	lastUsed uint64 // the table's clock at that enqueue
}

// producerTable is a queue's deduplication state; the zero value is empty.
// It belongs to the queue's shard goroutine.
type producerTable struct {
	m     map[uint64]producerState
	clock uint64
}

// duplicate reports whether the enqueue of (producer, seq) was applied
// already. Producer 0 means none.
func (t *producerTable) duplicate(producer, seq uint64) bool {
	if producer == 0 || t.m == nil {
		return false
	}
	st, ok := t.m[producer]
	return ok && seq <= st.seq
}

// note records an applied enqueue of (producer, seq). It allocates only
// when a producer joins a table that has not held that many before.
func (t *producerTable) note(producer, seq uint64) {
	if producer == 0 {
		return
	}
	t.clock++
	if t.m == nil {
		t.m = make(map[uint64]producerState)
	}
	st, ok := t.m[producer]
	if !ok && len(t.m) >= ProducersPerQueueMax {
		t.evictOldest()
	}
	st.seq = max(st.seq, seq)
	st.lastUsed = t.clock
	t.m[producer] = st
}

// evictOldest forgets the least recently used producer. It scans the
// table: it runs only when a new producer arrives at a full table.
func (t *producerTable) evictOldest() {
	var oldest uint64
	first := true
	var at uint64
	for p, st := range t.m {
		if first || st.lastUsed < at {
			oldest, at, first = p, st.lastUsed, false
		}
	}
	delete(t.m, oldest)
}

// reset forgets every producer (the queue's state is rebuilt from a log).
func (t *producerTable) reset() { t.m, t.clock = nil, 0 }

// Producers is how many producers q remembers. Shard goroutine only (or
// inside Broker.Call).
func (q *Queue) Producers() int {
	if q.rare == nil {
		return 0
	}
	return len(q.rare.producers.m)
}

// duplicate reports whether q applied the enqueue of (producer, seq)
// already (AdmitReplicated asks it for callers outside the package).
func (q *Queue) duplicate(producer, seq uint64) bool {
	return producer != 0 && q.rare != nil && q.rare.producers.duplicate(producer, seq)
}

// noteProducer records an applied enqueue of (producer, seq) on q.
func (q *Queue) noteProducer(producer, seq uint64) {
	if producer != 0 {
		q.rareState().producers.note(producer, seq)
	}
}

// resetProducers forgets q's producers.
func (q *Queue) resetProducers() {
	if q.rare != nil {
		q.rare.producers.reset()
	}
}
