package shards

import (
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"time"

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
// It is taken on the shard goroutine (every checkpointEvery records, at
// least every checkpointInterval while records come, and at a clean stop)
// and written on another goroutine after the journal is durable up to
// its position, one at a time.
//
// A delayed message keeps its deliver-at time; one that came due is
// checkpointed as ready (ckRecOf), which is where a replay puts it after
// the first dispatch.
//
// Owner section format (journal.BeginCheckpoint frames it):
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
	buf      []byte
	recs     []ckRec
	inFlight bool
	done     chan ckDone
	held     map[uint64]ckHeld
	// loaded: this shard recovered from a checkpoint. noFinal: a test
	// stops the shard as a crash would, with no checkpoint at the stop.
	loaded, noFinal bool
	// Stats: checkpoints written, failed, and the last one's size and
	// how long its capture held the shard.
	written, failed int
	lastBytes       int
	lastCapture     time.Duration
}

type ckDone struct {
	buf []byte
	err error
}

// ckRecOf is e's checkpoint record; at is its deliver-at time if it is
// still delayed. A message that was delayed and came due is kept without
// its time: replay would delay it again only until the first dispatch,
// which puts it back among the ready ones by Seq, where it is anyway. (Not
// reading the body's time saves a cache miss per message.)
func ckRecOf(e *Entry, at int64) ckRec {
	return ckRec{pos: e.JournalPos, exp: e.ExpiresAt, at: at, count: e.DeliveryCount, size: uint32(e.size()), level: uint8(e.level())}
}

// queueRecs collects q's journaled messages, in position order.
func (s *Shard) queueRecs(q *Queue, recs []ckRec) []ckRec {
	recs = recs[:0]
	for i := range q.levels {
		l := &q.levels[i]
		for k := 0; k < l.ready.len(); k++ {
			if e := l.ready.at(k); e.JournalPos != 0 {
				recs = append(recs, ckRecOf(e, 0))
			}
		}
		for _, e := range l.released {
			if e.JournalPos != 0 {
				recs = append(recs, ckRecOf(e, 0))
			}
		}
	}
	for _, d := range q.delayed {
		if d.e.JournalPos != 0 {
			recs = append(recs, ckRecOf(d.e, d.at))
		}
	}
	for _, e := range q.acquired {
		if e.JournalPos != 0 {
			recs = append(recs, ckRecOf(e, 0))
		}
	}
	for _, h := range s.journal.ck.held {
		if h.q == q {
			recs = append(recs, h.rec)
		}
	}
	cmp := func(a, b ckRec) int {
		if a.pos < b.pos {
			return -1
		}
		if a.pos > b.pos {
			return 1
		}
		return 0
	}
	if !slices.IsSortedFunc(recs, cmp) {
		slices.SortFunc(recs, cmp)
	}
	return recs
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

// captureCheckpoint begins a checkpoint and appends the shard's state.
func (s *Shard) captureCheckpoint() []byte {
	sj := s.journal
	start := time.Now()
	// Sized for the last checkpoint, or about 14 bytes a message: growing
	// a buffer of tens of MiB step by step cost a third of a capture.
	if want := max(sj.ck.lastBytes+sj.ck.lastBytes/8, 16*sj.ck.lastLive+1<<20); cap(sj.ck.buf) < want {
		sj.ck.buf = make([]byte, 0, want)
	}
	buf, _ := sj.j.BeginCheckpoint(sj.ck.buf)
	buf = append(buf, ckOwnerVersion)
	n := 0
	for q := range s.queues {
		if s.checkpointable(q) {
			n++
		}
	}
	buf = binary.AppendUvarint(buf, uint64(n))
	live := 0
	for q := range s.queues {
		if !s.checkpointable(q) {
			continue
		}
		buf = binary.AppendUvarint(buf, uint64(len(q.Name)))
		buf = append(buf, q.Name...)
		t := &noProducers
		if q.rare != nil {
			t = &q.rare.producers
		}
		buf = binary.AppendUvarint(buf, t.clock)
		buf = binary.AppendUvarint(buf, uint64(len(t.m)))
		for id, st := range t.m {
			buf = binary.AppendUvarint(buf, id)
			buf = binary.AppendUvarint(buf, st.seq)
			buf = binary.AppendUvarint(buf, st.lastUsed)
		}
		sj.ck.recs = s.queueRecs(q, sj.ck.recs)
		buf = binary.AppendUvarint(buf, uint64(len(sj.ck.recs)))
		var prev uint64
		for i := range sj.ck.recs {
			buf = appendCkRec(buf, &sj.ck.recs[i], prev)
			prev = sj.ck.recs[i].pos
		}
		live += len(sj.ck.recs)
	}
	// Records whose dequeue is appended but not yet durable: the journal
	// frees them at completion, which a crash may prevent.
	frees := sj.ck.recs[:0]
	for i := 0; i < sj.pending.size; i++ {
		if c := &sj.pending.buf[(sj.pending.head+i)%len(sj.pending.buf)]; c.free != 0 {
			frees = append(frees, ckRec{pos: uint64(c.free)})
		}
	}
	for _, h := range sj.ck.held {
		if !s.checkpointable(h.q) {
			frees = append(frees, ckRec{pos: h.rec.pos})
		}
	}
	slices.SortFunc(frees, func(a, b ckRec) int {
		if a.pos < b.pos {
			return -1
		}
		if a.pos > b.pos {
			return 1
		}
		return 0
	})
	buf = binary.AppendUvarint(buf, uint64(len(frees)))
	var prev uint64
	for _, f := range frees {
		buf = binary.AppendUvarint(buf, f.pos-prev)
		prev = f.pos
	}
	sj.ck.appends = 0
	sj.ck.lastLive = live
	sj.ck.last = time.Now()
	sj.ck.lastBytes = len(buf)
	sj.ck.lastCapture = time.Since(start)
	return buf
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
	if sj.ck.appends < max(sj.ck.every, sj.ck.lastLive/4) && time.Since(sj.ck.last) < checkpointInterval {
		return
	}
	if sj.j.Stats().Err != nil {
		return // records that failed are in memory only; a checkpoint would keep them
	}
	buf := s.captureCheckpoint()
	sj.ck.inFlight = true
	j, done := sj.j, sj.ck.done
	go func() {
		err := j.WriteCheckpoint(buf)
		done <- ckDone{buf, err}
	}()
}

func (s *Shard) checkpointDone(d ckDone) {
	sj := s.journal
	sj.ck.inFlight = false
	sj.ck.buf = d.buf[:0]
	if d.err != nil {
		sj.ck.failed++
		if !errors.Is(d.err, journal.ErrClosed) {
			s.log.Warn("shards: checkpoint not written; the next start replays more of the journal", "shard", s.idx, "err", d.err)
		}
		return
	}
	sj.ck.written++
	s.log.Debug("shards: checkpoint written", "shard", s.idx, "messages", sj.ck.lastLive, "bytes", sj.ck.lastBytes,
		"capture", sj.ck.lastCapture.String())
}

// waitCheckpoint waits for a checkpoint being written.
func (s *Shard) waitCheckpoint() {
	if sj := s.journal; sj != nil && sj.ck.inFlight {
		s.checkpointDone(<-sj.ck.done)
	}
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
	if sj.j.Stats().Err != nil {
		return
	}
	buf := s.captureCheckpoint()
	err := sj.j.WriteCheckpoint(buf)
	s.checkpointDone(ckDone{buf, err})
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
						continue
					}
					if ref.hasCount {
						r.count = ref.count
					}
				}
			}
			if suspect && !j.Contains(pos) {
				continue // gone from the journal: it died after the checkpoint
			}
			if !ok {
				j.Free(pos)
				dropped++
				continue
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
			q.counts.Recovered++
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
	LastCapture     time.Duration
}

// CheckpointStats returns the counters; shard goroutine or Broker.Call.
func (s *Shard) CheckpointStats() CheckpointStats {
	if s.journal == nil {
		return CheckpointStats{}
	}
	c := &s.journal.ck
	return CheckpointStats{Written: c.written, Failed: c.failed, LastBytes: c.lastBytes, LastMessages: c.lastLive, LastCapture: c.lastCapture}
}
