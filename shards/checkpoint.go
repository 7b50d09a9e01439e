package shards

import (
	"cmp"
	"encoding/binary"
	"errors"
	"fmt"
	"runtime"
	"slices"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/berthmq/berth/journal"
)

// Checkpoints of the durable queues (issue 12). A restart used to replay
// every record of the shard's journal and read every body; with a
// checkpoint it reads the journal's index and this state as of one
// position (journal/checkpoint.go), then replays only the records after
// it, and leaves the bodies of the checkpointed messages on disk, paged,
// to be read back by position when delivered (memory.go).
//
// The state is what a replay of the journal up to that position would
// give: for each durable queue of the shard, the messages whose enqueue
// record has no dequeue record yet, in position order, each with its
// expiry, delivery count as journaled, priority level, deliver-at time
// and size, and the queue's producer table (dedup.go); the records of
// dead letters still held for other shards (their dequeue waits); and
// the records whose dequeue is appended but not yet durable, which the
// journal still counts live and recovery must free.
//
// It is cut on the shard goroutine (every checkpointEvery records, at
// least every checkpointInterval while records come, and at a clean
// stop), then merged, encoded and written on another goroutine after the
// journal is durable up to its position, one at a time (see "Taking a
// checkpoint without holding the shard" below).
//
// A delayed message keeps the deliver-at time of its record, due or not,
// as a replay does; the first dispatch after a start makes the due ones
// ready.
//
// Owner section format (journal.EncodeCheckpoint frames it):
//
//	version u8 | queues uvarint, each: name (uvarint length, bytes),
//	producer clock uvarint, producers uvarint, each: id, seq, lastUsed
//	uvarint; entries uvarint, each: pos delta uvarint, flags u8
//	(ckExp, ckCount, ckLevel, ckAt), then the fields flagged: expiry
//	uvarint, count uvarint, level u8, deliver-at uvarint; size uvarint |
//	frees uvarint, each a position delta uvarint
const (
	ckOwnerVersion = 1

	ckExp   = 1
	ckCount = 2
	ckLevel = 4
	ckAt    = 8

	// checkpointEvery: a checkpoint is taken after this many journal
	// records, or a quarter of the messages of the last one if more (so
	// that the time spent taking them stays a small share of the
	// shard's, about 5% while a deep queue fills).
	checkpointEvery = 1 << 18
	// checkpointInterval: and at least this often while records come.
	checkpointInterval = 30 * time.Second
)

// ckRec is one message in a checkpoint.
type ckRec struct {
	pos     uint64
	exp, at int64
	count   uint32
	size    uint32
	level   uint8
}

// ckHeld is a dead letter's source record held until its other-shard
// targets have it (Shard.DeadLetter).
type ckHeld struct {
	q   *Queue
	rec ckRec
}

// ckShard is a shard journal's checkpoint state. Shard goroutine only.
type ckShard struct {
	appends  int // records appended since the last checkpoint
	every    int // records between checkpoints
	lastLive int // messages in the last checkpoint
	last     time.Time
	inFlight bool
	done     chan ckDone
	// The logs of what the records appended since the last capture
	// changed, per queue (logOn once the journal is open).
	logOn     bool
	logs      map[*Queue]*ckQLog
	lastQ     *Queue
	lastLog   *ckQLog
	spareLogs []*ckQLog
	owner     *ckOwner // nil while a checkpoint is in flight
	// ownerBytes is what owner held when the shard last had it (the last
	// checkpoint, kept to merge the next into, and its scratch space),
	// counted against the memory budget; ownerPub is it for Memory().
	ownerBytes int64
	ownerPub   atomic.Int64
	held       map[uint64]ckHeld
	// loaded: this shard recovered from a checkpoint. noFinal: a test
	// stops the shard as a crash would, with no checkpoint at the stop.
	loaded, noFinal bool
	// Stats: checkpoints written, failed, and the last one's size, how
	// long its capture held the shard and how long the writer took to
	// encode it.
	written, failed int
	lastBytes       int
	lastCapture     time.Duration
	lastEncode      time.Duration
}

type ckDone struct {
	owner  *ckOwner
	logs   []*ckQLog
	bytes  int
	live   int
	encode time.Duration
	err    error
}

// ckRecOf is e's checkpoint record (a held dead letter's source, whose
// position frees lists when its queue is gone); at is its deliver-at
// time if it is still delayed.
func ckRecOf(e *Entry, at int64) ckRec {
	return ckRec{pos: e.JournalPos, exp: e.ExpiresAt, at: at, count: e.DeliveryCount, size: uint32(e.size()), level: uint8(e.level())}
}

func appendCkRec(buf []byte, r *ckRec, prev uint64) []byte {
	buf = binary.AppendUvarint(buf, r.pos-prev)
	flags := byte(0)
	if r.exp != 0 {
		flags |= ckExp
	}
	if r.count != 0 {
		flags |= ckCount
	}
	if r.level != 0 {
		flags |= ckLevel
	}
	if r.at != 0 {
		flags |= ckAt
	}
	buf = append(buf, flags)
	if r.exp != 0 {
		buf = binary.AppendUvarint(buf, uint64(r.exp))
	}
	if r.count != 0 {
		buf = binary.AppendUvarint(buf, uint64(r.count))
	}
	if r.level != 0 {
		buf = append(buf, r.level)
	}
	if r.at != 0 {
		buf = binary.AppendUvarint(buf, uint64(r.at))
	}
	return binary.AppendUvarint(buf, uint64(r.size))
}

// noProducers stands for the producer table of a queue that has none; it
// is only read.
var noProducers producerTable

// checkpointable says whether q's messages go to this shard's journal.
func (s *Shard) checkpointable(q *Queue) bool {
	return q.Options.Durable && !q.replicated && !q.deleted && q.Shard() == s.idx
}

// Taking a checkpoint without holding the shard. The capture used to walk
// every message of the shard's durable queues on the shard goroutine: at
// 2.2M to 4.6M messages it held a shard 0.3 to 1.6 s, and everything
// else on it waited. Instead the shard logs, per queue, what its journal
// records change (ckQLog: the messages enqueued, encoded as in a
// checkpoint, and the positions dequeued or given a new delivery count),
// which costs a few ns a record; a capture hands the logs over and takes
// fresh ones (beginCheckpoint, the only part on the shard, about the
// queues' and producers' number); and the checkpoint writer merges them,
// off the shard, into each queue's part of the last checkpoint (ckBase),
// which gives the replay of the journal up to the new position by
// construction: the state is built from the very records a replay reads.
//
// Recovery logs what it restores: the loaded checkpoint's queues are the
// bases, the tail's messages and its dequeues and counts of checkpointed
// ones are logged; after a full replay every message restored is.

// ckQLog is what q's journal records changed since the last capture.
type ckQLog struct {
	adds    []byte // enqueued messages, encoded, in position order
	nAdds   int
	addPrev uint64
	addsX   []ckRec // enqueued out of position order (recovery)
	rm      []uint64
	counts  []ckNewCount
}

type ckNewCount struct {
	pos   uint64
	count uint32
}

func (l *ckQLog) clear() {
	*l = ckQLog{adds: l.adds[:0], addsX: l.addsX[:0], rm: l.rm[:0], counts: l.counts[:0]}
}

func (l *ckQLog) add(r *ckRec) {
	if r.pos <= l.addPrev {
		l.addsX = append(l.addsX, *r)
		return
	}
	l.adds = appendCkRec(l.adds, r, l.addPrev)
	l.addPrev = r.pos
	l.nAdds++
}

// qlog returns q's log, or nil when the shard keeps none.
func (c *ckShard) qlog(q *Queue) *ckQLog {
	if !c.logOn {
		return nil
	}
	if c.lastQ == q {
		return c.lastLog
	}
	l := c.logs[q]
	if l == nil {
		if n := len(c.spareLogs); n > 0 {
			l, c.spareLogs = c.spareLogs[n-1], c.spareLogs[:n-1]
		} else {
			l = &ckQLog{}
		}
		if c.logs == nil {
			c.logs = map[*Queue]*ckQLog{}
		}
		c.logs[q] = l
	}
	c.lastQ, c.lastLog = q, l
	return l
}

// logEnqueue, logDequeue and logCount note a record appended for q.
func (s *Shard) logEnqueue(q *Queue, pos journal.Pos, e *Entry) {
	if l := s.journal.ck.qlog(q); l != nil {
		b := e.Body
		r := ckRec{pos: uint64(pos), exp: e.ExpiresAt, at: b.DeliverAt, count: e.DeliveryCount,
			size: uint32(len(b.Props) + len(b.Payload)), level: uint8(q.levelOf(b.Priority))}
		l.add(&r)
	}
}

func (s *Shard) logDequeue(q *Queue, pos journal.Pos) {
	if l := s.journal.ck.qlog(q); l != nil {
		l.rm = append(l.rm, uint64(pos))
	}
}

func (s *Shard) logCount(q *Queue, pos journal.Pos, count uint32) {
	if l := s.journal.ck.qlog(q); l != nil {
		l.counts = append(l.counts, ckNewCount{uint64(pos), count})
	}
}

// ckBase is a queue's messages in the last checkpoint: their encoded
// records, number and last position.
type ckBase struct {
	recs []byte
	n    int
	last uint64
	gen  uint64
}

// ckOwner is the state the checkpoint writer merges into. It belongs to
// the shard while no checkpoint is in flight, and to the writer while
// one is.
type ckOwner struct {
	bases   map[*Queue]ckBase
	gen     uint64
	bufs    [2][]byte // the last checkpoint (holding the bases) and a spare
	cur     int
	scratch []byte
	tmp     []byte
	recs    []ckRec
}

// ckBaseEntryBytes is about what one queue's entry in ckOwner.bases
// costs beyond its records (which alias the checkpoint buffer): the map
// slot's key and value and its share of the map's overhead.
const ckBaseEntryBytes = 96

// heldBytes is the memory the owner holds: its two checkpoint buffers,
// scratch space and the bases' map.
func (o *ckOwner) heldBytes() int64 {
	return int64(cap(o.bufs[0]) + cap(o.bufs[1]) + cap(o.scratch) + cap(o.tmp) +
		cap(o.recs)*int(unsafe.Sizeof(ckRec{})) + len(o.bases)*ckBaseEntryBytes)
}

// ckCut is a capture handed to the writer.
type ckCut struct {
	j     *journal.CheckpointCut
	heads []byte // each queue's name and producers, encoded
	qs    []ckCutQueue
	frees []uint64
	// sizing, from the last checkpoint
	lastBytes int
}

type ckCutQueue struct {
	q    *Queue
	head int // end of its part of heads
	log  *ckQLog
}

// captureCheckpoint begins a checkpoint: the shard's part of taking one.
func (s *Shard) captureCheckpoint() *ckCut {
	sj := s.journal
	start := time.Now()
	c := &ckCut{j: sj.j.BeginCheckpoint(), lastBytes: sj.ck.lastBytes}
	for q := range s.queues.all() {
		if !s.checkpointable(q) {
			continue
		}
		c.heads = binary.AppendUvarint(c.heads, uint64(len(q.Name)))
		c.heads = append(c.heads, q.Name...)
		t := &noProducers
		if q.rare != nil {
			t = &q.rare.producers
		}
		c.heads = binary.AppendUvarint(c.heads, t.clock)
		c.heads = binary.AppendUvarint(c.heads, uint64(len(t.m)))
		for id, st := range t.m {
			c.heads = binary.AppendUvarint(c.heads, id)
			c.heads = binary.AppendUvarint(c.heads, st.seq)
			c.heads = binary.AppendUvarint(c.heads, st.lastUsed)
		}
		l := sj.ck.logs[q]
		if l != nil {
			delete(sj.ck.logs, q)
		}
		c.qs = append(c.qs, ckCutQueue{q: q, head: len(c.heads), log: l})
	}
	// The logs left are of queues no longer checkpointed.
	for q, l := range sj.ck.logs {
		l.clear()
		sj.ck.spareLogs = append(sj.ck.spareLogs, l)
		delete(sj.ck.logs, q)
	}
	sj.ck.lastQ, sj.ck.lastLog = nil, nil
	// Records whose dequeue is appended but not yet durable: the journal
	// frees them at completion, which a crash may prevent.
	for i := 0; i < sj.pending.size; i++ {
		if p := &sj.pending.buf[(sj.pending.head+i)%len(sj.pending.buf)]; p.free != 0 {
			c.frees = append(c.frees, uint64(p.free))
		}
	}
	for _, h := range sj.ck.held {
		if !s.checkpointable(h.q) {
			c.frees = append(c.frees, h.rec.pos)
		}
	}
	sj.ck.appends = 0
	sj.ck.last = time.Now()
	sj.ck.lastCapture = time.Since(start)
	return c
}

// encode merges the cut into the owner state and encodes the checkpoint
// (the checkpoint writer's part).
func (o *ckOwner) encode(j *journal.Journal, c *ckCut) (buf []byte, live int) {
	next := o.cur ^ 1
	buf = o.bufs[next]
	// The buffers are sized at once from bounds: growing one of tens of
	// MiB is a copy the scheduler cannot preempt.
	want, most := j.CheckpointBound(c.j)+len(c.heads)+10*len(c.frees)+64, 0
	for _, cq := range c.qs {
		b := o.queueBound(cq)
		want += b + 10
		most = max(most, b)
	}
	if cap(buf) < want {
		buf = make([]byte, 0, want+want/8)
	}
	if cap(o.scratch) < most {
		o.scratch = make([]byte, 0, most+most/8)
	}
	buf = j.EncodeCheckpoint(c.j, buf)
	buf = append(buf, ckOwnerVersion)
	buf = binary.AppendUvarint(buf, uint64(len(c.qs)))
	if o.bases == nil {
		o.bases = map[*Queue]ckBase{}
	}
	o.gen++
	prev := 0
	for _, cq := range c.qs {
		buf = append(buf, c.heads[prev:cq.head]...)
		prev = cq.head
		b := o.bases[cq.q]
		var n int
		var last uint64
		o.scratch, n, last = o.mergeQueue(o.scratch[:0], b, cq.log)
		buf = binary.AppendUvarint(buf, uint64(n))
		at := len(buf)
		buf = appendYielding(buf, o.scratch)
		o.bases[cq.q] = ckBase{recs: buf[at:len(buf):len(buf)], n: n, last: last, gen: o.gen}
		live += n
	}
	for q, b := range o.bases {
		if b.gen != o.gen {
			delete(o.bases, q)
		}
	}
	slices.Sort(c.frees)
	buf = binary.AppendUvarint(buf, uint64(len(c.frees)))
	var last uint64
	for _, f := range c.frees {
		buf = binary.AppendUvarint(buf, f-last)
		last = f
	}
	o.bufs[next], o.cur = buf, next
	return buf, live
}

// ckRecMax bounds an encoded record: position delta, expiry, count,
// deliver-at and size uvarints, flags and level.
const ckRecMax = 10 + 10 + 5 + 10 + 5 + 2

// queueBound bounds the bytes of cq's merged records.
func (o *ckOwner) queueBound(cq ckCutQueue) int {
	n := len(o.bases[cq.q].recs)
	if l := cq.log; l != nil {
		// A count may lengthen a record by 6 bytes, and a removal the
		// position delta of the next one.
		n += len(l.adds) + ckRecMax*len(l.addsX) + 6*len(l.counts) + 10*len(l.rm) + ckRecMax
	}
	return n
}

// mergeQueue appends to dst the queue's messages: b's with l's changes.
func (o *ckOwner) mergeQueue(dst []byte, b ckBase, l *ckQLog) ([]byte, int, uint64) {
	if l == nil {
		return appendYielding(dst, b.recs), b.n, b.last
	}
	slices.Sort(l.rm)
	slices.SortStableFunc(l.counts, func(a, b ckNewCount) int { return cmp.Compare(a.pos, b.pos) })
	var touch uint64 // the last position a removal or a count touches
	if n := len(l.rm); n > 0 {
		touch = l.rm[n-1]
	}
	if n := len(l.counts); n > 0 {
		touch = max(touch, l.counts[n-1].pos)
	}
	// In the base, only what touches it counts: a removal of a new
	// message must not make the untouched rest of the base be decoded
	// and encoded again rather than copied.
	var baseTouch uint64
	if i, _ := slices.BinarySearch(l.rm, b.last+1); i > 0 {
		baseTouch = l.rm[i-1]
	}
	if i, _ := slices.BinarySearchFunc(l.counts, b.last+1, func(c ckNewCount, p uint64) int { return cmp.Compare(c.pos, p) }); i > 0 {
		baseTouch = max(baseTouch, l.counts[i-1].pos)
	}
	m := ckMerge{rm: l.rm, counts: l.counts, touch: baseTouch}
	dst = m.recs(dst, b.recs, b.n, b.last)
	m.touch = touch
	adds, nAdds, addLast := l.adds, l.nAdds, l.addPrev
	if len(l.addsX) > 0 {
		recs := o.recs[:0]
		d := &ckDecoder{b: l.adds}
		var r ckRec
		var prev uint64
		for range l.nAdds {
			d.rec(&r, prev)
			prev = r.pos
			recs = append(recs, r)
		}
		recs = append(recs, l.addsX...)
		slices.SortStableFunc(recs, func(a, b ckRec) int { return cmp.Compare(a.pos, b.pos) })
		o.tmp = o.tmp[:0]
		prev = 0
		for i := range recs {
			o.tmp = appendCkRec(o.tmp, &recs[i], prev)
			prev = recs[i].pos
		}
		adds, nAdds, addLast = o.tmp, len(recs), prev
		o.recs = recs[:0]
	}
	dst = m.recs(dst, adds, nAdds, addLast)
	return dst, m.n, m.prev
}

// ckMerge walks encoded records in position order, dropping those
// removed and giving the others their last delivery count.
type ckMerge struct {
	rm     []uint64
	counts []ckNewCount
	touch  uint64
	ri, ci int
	n      int
	prev   uint64 // last position written
}

// recs appends src's n records (the last at position last).
func (m *ckMerge) recs(dst, src []byte, n int, last uint64) []byte {
	d := &ckDecoder{b: src}
	var r ckRec
	var sprev uint64
	for k := 0; k < n; k++ {
		d.rec(&r, sprev)
		sprev = r.pos
		if r.pos > m.touch {
			// Nothing changes past here: the rest is copied as it is,
			// after this record's delta from the one written before.
			dst = appendCkRec(dst, &r, m.prev)
			dst = appendYielding(dst, d.b)
			m.n += n - k
			m.prev = last
			return dst
		}
		for m.ri < len(m.rm) && m.rm[m.ri] < r.pos {
			m.ri++
		}
		if m.ri < len(m.rm) && m.rm[m.ri] == r.pos {
			continue
		}
		for m.ci < len(m.counts) && m.counts[m.ci].pos < r.pos {
			m.ci++
		}
		for m.ci < len(m.counts) && m.counts[m.ci].pos == r.pos {
			r.count = m.counts[m.ci].count
			m.ci++
		}
		dst = appendCkRec(dst, &r, m.prev)
		m.prev = r.pos
		m.n++
		if m.n%ckYieldEvery == 0 {
			runtime.Gosched()
		}
	}
	return dst
}

// The checkpoint writer shares the cores with the shards: it copies in
// slices and yields between them and every so many records it merges (a
// copy of tens of MiB cannot be preempted, and kept a shard waiting for
// a processor for 5 to 8 ms in BenchmarkCheckpointStall).
const (
	ckYieldBytes = 256 << 10
	ckYieldEvery = 1 << 14
)

func appendYielding(dst, src []byte) []byte {
	dst = slices.Grow(dst, len(src))
	for len(src) > ckYieldBytes {
		dst = append(dst, src[:ckYieldBytes]...)
		src = src[ckYieldBytes:]
		runtime.Gosched()
	}
	return append(dst, src...)
}

// startCheckpoint captures a checkpoint and has it encoded and written on
// another goroutine.
func (s *Shard) startCheckpoint() {
	sj := s.journal
	c := s.captureCheckpoint()
	o := sj.ck.owner
	sj.ck.owner = nil
	sj.ck.inFlight = true
	j, done := sj.j, sj.ck.done
	go func() {
		done <- writeCheckpoint(j, o, c)
	}()
}

func writeCheckpoint(j *journal.Journal, o *ckOwner, c *ckCut) ckDone {
	start := time.Now()
	buf, live := o.encode(j, c)
	encoded := time.Since(start)
	err := j.WriteCheckpoint(buf)
	var logs []*ckQLog
	for _, cq := range c.qs {
		if cq.log != nil {
			cq.log.clear()
			logs = append(logs, cq.log)
		}
	}
	return ckDone{owner: o, logs: logs, bytes: len(buf), live: live, encode: encoded, err: err}
}

// maybeCheckpoint takes a checkpoint when enough has been appended since
// the last one (called from the shard's tick).
func (s *Shard) maybeCheckpoint() {
	sj := s.journal
	if sj == nil {
		return
	}
	if sj.ck.inFlight {
		select {
		case d := <-sj.ck.done:
			s.checkpointDone(d)
		default:
			return
		}
	}
	if sj.ck.appends == 0 {
		return
	}
	if sj.ck.logOn && sj.j.Stats().Err != nil {
		// Records that failed are in memory only; a checkpoint would
		// keep them. None is taken again in this run: the logs go.
		s.dropCheckpointLogs()
	}
	if !sj.ck.logOn {
		return
	}
	if sj.ck.appends < max(sj.ck.every, sj.ck.lastLive/4) && time.Since(sj.ck.last) < checkpointInterval {
		return
	}
	s.startCheckpoint()
}

func (s *Shard) checkpointDone(d ckDone) {
	sj := s.journal
	sj.ck.inFlight = false
	sj.ck.owner = d.owner
	sj.ck.spareLogs = append(sj.ck.spareLogs, d.logs...)
	sj.ck.lastLive = d.live
	sj.ck.lastBytes = d.bytes
	sj.ck.lastEncode = d.encode
	if d.err != nil {
		sj.ck.failed++
		if !errors.Is(d.err, journal.ErrClosed) {
			s.log.Warn("shards: checkpoint not written; the next start replays more of the journal", "shard", s.idx, "err", d.err)
		}
		return
	}
	sj.ck.written++
	s.log.Debug("shards: checkpoint written", "shard", s.idx, "messages", sj.ck.lastLive, "bytes", sj.ck.lastBytes,
		"capture", sj.ck.lastCapture.String(), "encode", d.encode.String())
}

// dropCheckpointLogs stops the logs for good (the journal failed).
func (s *Shard) dropCheckpointLogs() {
	c := &s.journal.ck
	c.logOn = false
	c.logs, c.lastQ, c.lastLog, c.spareLogs = nil, nil, nil, nil
}

// waitCheckpoint waits for a checkpoint being written.
func (s *Shard) waitCheckpoint() {
	if sj := s.journal; sj != nil && sj.ck.inFlight {
		s.checkpointDone(<-sj.ck.done)
	}
}

// checkpointNow takes and writes a checkpoint, waiting for it.
func (s *Shard) checkpointNow() {
	s.waitCheckpoint()
	s.startCheckpoint()
	s.waitCheckpoint()
}

// finalCheckpoint writes a checkpoint at a clean stop, so the next start
// reads no journal record at all.
func (s *Shard) finalCheckpoint() {
	sj := s.journal
	if sj == nil {
		return
	}
	s.waitCheckpoint()
	if sj.ck.noFinal || sj.ck.appends == 0 && sj.ck.written > 0 {
		return
	}
	if !sj.ck.logOn || sj.j.Stats().Err != nil {
		return
	}
	s.checkpointNow()
}

// holdForDeadLetter notes a source record held for a dead letter.
func (s *Shard) holdForDeadLetter(q *Queue, e *Entry) {
	sj := s.journal
	if sj.ck.held == nil {
		sj.ck.held = map[uint64]ckHeld{}
	}
	sj.ck.held[e.JournalPos] = ckHeld{q: q, rec: ckRecOf(e, 0)}
}

// releaseHeld forgets a held record: its dequeue is appended.
func (s *Shard) releaseHeld(pos uint64) {
	if sj := s.journal; sj != nil && sj.ck.held != nil {
		delete(sj.ck.held, pos)
	}
}

// ckQueue is a queue's part of a checkpoint being recovered.
type ckQueue struct {
	name      string
	clock     uint64
	producers []struct{ id, seq, lastUsed uint64 }
	recs      []byte // the encoded entries, count first
	// body is recs without the count; n and last their number and last
	// position.
	body []byte
	n    int
	last uint64
}

// ckLoaded is a checkpoint's owner section, parsed.
type ckLoaded struct {
	upto   journal.Pos
	queues []ckQueue
	frees  []journal.Pos
}

type ckDecoder struct {
	b   []byte
	err error
}

func (d *ckDecoder) uvarint() uint64 {
	if d.err != nil {
		return 0
	}
	v, n := binary.Uvarint(d.b)
	if n <= 0 {
		d.err = errors.New("shards: checkpoint state truncated")
		return 0
	}
	d.b = d.b[n:]
	return v
}

func (d *ckDecoder) byte() byte {
	if d.err != nil {
		return 0
	}
	if len(d.b) == 0 {
		d.err = errors.New("shards: checkpoint state truncated")
		return 0
	}
	c := d.b[0]
	d.b = d.b[1:]
	return c
}

func (d *ckDecoder) bytes(n uint64) []byte {
	if d.err != nil {
		return nil
	}
	if uint64(len(d.b)) < n {
		d.err = errors.New("shards: checkpoint state truncated")
		return nil
	}
	b := d.b[:n]
	d.b = d.b[n:]
	return b
}

func (d *ckDecoder) rec(r *ckRec, prev uint64) {
	r.pos = prev + d.uvarint()
	flags := d.byte()
	*r = ckRec{pos: r.pos}
	if flags&^(ckExp|ckCount|ckLevel|ckAt) != 0 && d.err == nil {
		d.err = fmt.Errorf("shards: checkpoint entry flags %#x", flags)
	}
	if flags&ckExp != 0 {
		r.exp = int64(d.uvarint())
	}
	if flags&ckCount != 0 {
		r.count = uint32(d.small(1<<32 - 1))
	}
	if flags&ckLevel != 0 {
		if r.level = d.byte(); r.level > 15 && d.err == nil {
			d.err = fmt.Errorf("shards: checkpoint entry level %d", r.level)
		}
	}
	if flags&ckAt != 0 {
		r.at = int64(d.uvarint())
	}
	r.size = uint32(d.small(entrySizeMask))
}

// small reads a uvarint that must not exceed limit.
func (d *ckDecoder) small(limit uint64) uint64 {
	v := d.uvarint()
	if v > limit && d.err == nil {
		d.err = fmt.Errorf("shards: checkpoint value %d over %d", v, limit)
	}
	return v
}

// parseCheckpoint checks the whole owner section and returns it parsed
// down to each queue's encoded entries, which recovery decodes as it
// applies them.
func parseCheckpoint(upto journal.Pos, b []byte) (*ckLoaded, error) {
	d := &ckDecoder{b: b}
	if v := d.byte(); v != ckOwnerVersion {
		return nil, fmt.Errorf("shards: checkpoint state version %d, this build reads %d", v, ckOwnerVersion)
	}
	ck := &ckLoaded{upto: upto}
	nq := d.uvarint()
	for i := uint64(0); i < nq && d.err == nil; i++ {
		var cq ckQueue
		cq.name = string(d.bytes(d.uvarint()))
		cq.clock = d.uvarint()
		np := d.uvarint()
		if np > ProducersPerQueueMax {
			return nil, fmt.Errorf("shards: checkpoint queue %q has %d producers", cq.name, np)
		}
		for k := uint64(0); k < np && d.err == nil; k++ {
			cq.producers = append(cq.producers, struct{ id, seq, lastUsed uint64 }{d.uvarint(), d.uvarint(), d.uvarint()})
		}
		start := d.b
		n := d.uvarint()
		body := d.b
		var r ckRec
		var prev uint64
		for k := uint64(0); k < n && d.err == nil; k++ {
			d.rec(&r, prev)
			if d.err == nil && (r.pos <= prev || r.pos > uint64(upto)) {
				d.err = fmt.Errorf("shards: checkpoint queue %q: position %d out of order", cq.name, r.pos)
			}
			prev = r.pos
		}
		cq.recs = start[:len(start)-len(d.b)]
		cq.body, cq.n, cq.last = body[:len(body)-len(d.b)], int(n), prev
		ck.queues = append(ck.queues, cq)
	}
	nf := d.uvarint()
	var pos journal.Pos
	for i := uint64(0); i < nf && d.err == nil; i++ {
		pos += journal.Pos(d.uvarint())
		ck.frees = append(ck.frees, pos)
	}
	if d.err == nil && len(d.b) != 0 {
		d.err = fmt.Errorf("shards: checkpoint state has %d bytes too many", len(d.b))
	}
	if d.err != nil {
		return nil, d.err
	}
	return ck, nil
}

// ckRef is what the journal's tail said of a checkpointed message.
type ckRef struct {
	dead     bool
	count    uint32
	hasCount bool
}

// applyCheckpoint rebuilds the shard's durable queues from a checkpoint,
// with what the tail of the journal said of its messages (refs). It
// returns the messages restored and those dropped (their queue is gone).
func (s *Shard) applyCheckpoint(ck *ckLoaded, byName map[string]*Queue, refs map[journal.Pos]ckRef) (live, dropped int) {
	j := s.journal.j
	suspect := j.CheckpointSuspect()
	o := s.journal.ck.owner
	if o.bases == nil {
		o.bases = map[*Queue]ckBase{}
	}
	for i := range ck.queues {
		cq := &ck.queues[i]
		q := byName[cq.name]
		ok := q != nil && q.Shard() == s.idx && q.Options.Durable
		if ok && (cq.clock != 0 || len(cq.producers) > 0) {
			pt := &q.rareState().producers
			pt.clock = max(pt.clock, cq.clock)
			for _, p := range cq.producers {
				if pt.m == nil {
					pt.m = make(map[uint64]producerState, len(cq.producers))
				}
				pt.m[p.id] = producerState{seq: p.seq, lastUsed: p.lastUsed}
			}
		}
		// The queue's part of the checkpoint is the base the next one
		// merges into; what the tail changed of it is logged.
		var l *ckQLog
		if ok {
			o.bases[q] = ckBase{recs: cq.body, n: cq.n, last: cq.last}
			l = s.journal.ck.qlog(q)
		}
		reserve := ok && q.Options.MaxPriority == 0
		d := &ckDecoder{b: cq.recs}
		n := d.uvarint()
		var r ckRec
		var prev uint64
		for k := uint64(0); k < n && d.err == nil; k++ {
			d.rec(&r, prev)
			prev = r.pos
			pos := journal.Pos(r.pos)
			if len(refs) > 0 {
				if ref, found := refs[pos]; found {
					if ref.dead {
						j.Free(pos)
						if l != nil {
							l.rm = append(l.rm, r.pos)
						}
						continue
					}
					if ref.hasCount {
						r.count = ref.count
						if l != nil {
							l.counts = append(l.counts, ckNewCount{r.pos, r.count})
						}
					}
				}
			}
			if suspect && !j.Contains(pos) {
				if l != nil {
					l.rm = append(l.rm, r.pos)
				}
				continue // gone from the journal: it died after the checkpoint
			}
			if !ok {
				j.Free(pos)
				dropped++
				continue
			}
			if reserve {
				// Room for the rest at once, made by the first message
				// restored (a queue that gets none has no levels, as
				// after a replay).
				q.levelState()[0].ready.reserve(int(n - k))
				reserve = false
			}
			ev := Event{Kind: EvEnqueue, ExpiresAt: r.exp, DeliveryCount: r.count, JournalPos: r.pos, Size: r.size,
				Priority: r.level, DeliverAt: r.at}
			if err := q.Apply(&ev, s); err != nil {
				q.place(&ev, uint64(r.size))
			}
			s.mem.paged++
			s.admit(q)
			s.noteExpiry(q, r.exp)
			if r.at != 0 {
				s.schedule(q, r.at)
			}
			q.busy.Recovered++
			live++
		}
	}
	for _, pos := range ck.frees {
		j.Free(pos)
	}
	return live, dropped
}

// CheckpointStats is a shard's checkpoint counters.
type CheckpointStats struct {
	Written, Failed int
	LastBytes       int
	LastMessages    int
	LastCapture     time.Duration // how long the capture held the shard
	LastEncode      time.Duration // how long the writer took to encode it
}

// CheckpointStats returns the counters; shard goroutine or Broker.Call.
func (s *Shard) CheckpointStats() CheckpointStats {
	if s.journal == nil {
		return CheckpointStats{}
	}
	c := &s.journal.ck
	return CheckpointStats{Written: c.written, Failed: c.failed, LastBytes: c.lastBytes, LastMessages: c.lastLive, LastCapture: c.lastCapture, LastEncode: c.lastEncode}
}
