package shards

import (
	"cmp"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/berthmq/berth/journal"
	"github.com/berthmq/berth/ring"
	"github.com/berthmq/berth/wire"
)

// Journal record kinds. The journal itself knows nothing of them.
const (
	recEnqueue uint8 = 1 // plain record: a persistent message on a durable queue
	recDequeue uint8 = 2 // ref to an enqueue: the message is gone (accept, reject, expiry, purge)
	recCount   uint8 = 3 // ref to an enqueue: the message's delivery count changed
	// recEnqueueAt is recEnqueue for a message with a priority or a
	// deliver-at time: both follow the delivery count. Plain messages keep
	// writing recEnqueue, so their records stay as they were.
	recEnqueueAt uint8 = 4
)

// jdoneRingSize bounds journal completions waiting for the shard in its
// ring; an overflow list catches the rest rather than block the
// journal's writer. (The journal's pending-byte bound does not bound its
// records: 5 million 1 KiB messages consumed in ack mode none write a
// dequeue record of a few bytes each, and filled the ring.)
const jdoneRingSize = 1 << 18

// journalSegmentBytesDefault is the shard journals' segment size. Freed
// records stay in the journal's index until their segment goes, so small
// segments keep the index small and cache-friendly: measured on the
// 2-core machine, durable publish+consume ran 200k msgs/s with 64 MiB
// segments, 245k with 16, 380k with 4, 485k with 2 and 527k with 1. Each
// segment holds an open file, so a deep queue of 10 GiB costs about 5,000
// descriptors per shard at this size.
const journalSegmentBytesDefault = 2 << 20

// journalPendingBytesMax is the journal's backpressure bound per shard.
const journalPendingBytesMax = 8 << 20

// jctx is what the shard must do when a journal record completes. They
// are queued in append order, as completions arrive.
type jctx struct {
	pos   journal.Pos // 0: a marker that completes with the record before it
	sess  *Session
	cmdID uint64
	fan   *Fanout
	free  journal.Pos // enqueue record to free once this dequeue is durable
	// An enqueue record: the message q's seq becomes deliverable once the
	// record is durable.
	q   *Queue
	seq uint64
}

type jdone struct {
	pos journal.Pos
	err error
}

// jqueue is a growable FIFO of jctx.
type jqueue struct {
	buf        []jctx
	head, size int
}

func (q *jqueue) push(c jctx) {
	if q.size == len(q.buf) {
		n := max(2*len(q.buf), 64)
		nb := make([]jctx, n)
		for i := 0; i < q.size; i++ {
			nb[i] = q.buf[(q.head+i)%len(q.buf)]
		}
		q.buf, q.head = nb, 0
	}
	q.buf[(q.head+q.size)%len(q.buf)] = c
	q.size++
}

func (q *jqueue) front() *jctx {
	if q.size == 0 {
		return nil
	}
	return &q.buf[q.head]
}

func (q *jqueue) pop() {
	q.buf[q.head] = jctx{}
	q.head = (q.head + 1) % len(q.buf)
	q.size--
}

// shardJournal is a shard's handle on its journal.
type shardJournal struct {
	j       *journal.Journal
	done    *ring.SPSC[jdone]
	pending jqueue
	scratch []byte
	doneBuf []jdone
	onDone  journal.Completion
	ck      ckShard // checkpoint.go

	overflow struct {
		sync.Mutex // only taken when the done ring is full
		list       []jdone
		// on: the list holds completions; until the shard takes them,
		// later ones join the list rather than the ring, whose
		// completions the shard handles first. Completions arrive in
		// position order, and the shard handles them in that order.
		on atomic.Bool
	}
}

// complete hands the shard a journal completion (the journal's
// Completion, from its writer: one goroutine, in position order).
func (sj *shardJournal) complete(d jdone, sig *ring.Signal) {
	if !sj.overflow.on.Load() && sj.done.TryPush(d) {
		return
	}
	sj.overflow.Lock()
	sj.overflow.list = append(sj.overflow.list, d)
	sj.overflow.on.Store(true)
	sj.overflow.Unlock()
	sig.Notify()
}

// drain passes the waiting completions to f in the order they came. It
// reports whether there were any.
//
// The ring's come first. Once the overflow list is in use (on), the
// writer pushes nothing more to the ring until the shard takes the
// list, so everything in the ring came before the list's first. But a
// ring found empty here may only look empty: the writer may have filled
// it, and started the list, since. So with on seen set, the ring is
// drained again (on's store made those pushes visible) before the list
// is taken.
func (sj *shardJournal) drain(f func(jdone)) bool {
	got := sj.popRing(f)
	if got || !sj.overflow.on.Load() {
		return got
	}
	for sj.popRing(f) {
	}
	sj.overflow.Lock()
	list := sj.overflow.list
	sj.overflow.list = nil
	sj.overflow.on.Store(false)
	sj.overflow.Unlock()
	for _, d := range list {
		f(d)
	}
	return true
}

// popRing passes one batch from the ring to f, reporting whether there
// was any.
func (sj *shardJournal) popRing(f func(jdone)) bool {
	n := sj.done.PopBatch(sj.doneBuf)
	for i := 0; i < n; i++ {
		f(sj.doneBuf[i])
		sj.doneBuf[i] = jdone{}
	}
	return n > 0
}

// JournalConfig configures the shards' journals.
type JournalConfig struct {
	Dir          string // one subdirectory per shard
	Fsync        journal.FsyncPolicy
	SegmentBytes int64
	FS           journal.FS
	// CheckpointRecords is how many records a shard appends between two
	// checkpoints (checkpoint.go); 0 means checkpointEvery.
	CheckpointRecords int
}

// ErrStore wraps journal failures reported to clients.
var errStoreText = "journal write failed"

func (s *Shard) openJournal(cfg JournalConfig, log *slog.Logger) error {
	sj := &shardJournal{doneBuf: make([]jdone, 256)}
	sj.ck.owner = &ckOwner{}
	sj.ck.logOn = true // what recovery restores is logged for the first checkpoint
	sj.ck.done = make(chan ckDone, 1)
	sj.ck.last = time.Now()
	sj.ck.every = cmp.Or(cfg.CheckpointRecords, checkpointEvery)
	sj.done = ring.NewSPSCSignal[jdone](jdoneRingSize, s.sig)
	sj.onDone = func(pos journal.Pos, err error) { sj.complete(jdone{pos, err}, s.sig) }
	// Recovered messages, in position order (the order of replay), found by
	// binary search when a dequeue or count record refers to one; queue
	// names are interned. A map by position cost a third of recovery in
	// probing, and a pointer, a name and a body each per message in
	// allocations.
	type recovered struct {
		pos   journal.Pos
		body  *Body
		exp   int64
		count uint32
		size  uint32 // the body's Size, for a body left on disk (body nil)
		queue int32  // index into names
		dead  bool
		// producer and producerSeq: the publish's producer id, if any
		// (dedup.go).
		producer, producerSeq uint64
		prio                  uint8
		at                    int64 // deliver-at, unix nanoseconds
	}
	var msgs []recovered
	var names []string
	nameIdx := map[string]int32{}
	var slab bodySlab
	// Over the budget's high watermark, replay leaves the bodies in the
	// journal: a restart with a backlog deeper than memory must not load
	// it all. (The bodies of messages found dead later still count here,
	// so the estimate errs towards paging.)
	var slabBytes int64
	find := func(pos journal.Pos) *recovered {
		i, ok := slices.BinarySearchFunc(msgs, pos, func(m recovered, p journal.Pos) int { return cmp.Compare(m.pos, p) })
		if !ok {
			return nil
		}
		return &msgs[i]
	}
	var ck *ckLoaded
	ckRefs := map[journal.Pos]ckRef{}
	start := time.Now()
	lastLog := start
	records := 0
	replay := func(pos, ref journal.Pos, data []byte) error {
		records++
		if records%4096 == 0 && time.Since(lastLog) > 2*time.Second {
			lastLog = time.Now()
			log.Info("shards: replaying journal", "shard", s.idx, "records", records)
		}
		var r wire.Reader
		r.Reset(data)
		kind := r.U8()
		switch kind {
		case recEnqueue, recEnqueueAt:
			m := recovered{pos: pos}
			qname := r.Str(wire.NameLenMax)
			idx, ok := nameIdx[string(qname)]
			if !ok {
				idx = int32(len(names))
				names = append(names, string(qname))
				nameIdx[names[idx]] = idx
			}
			m.queue = idx
			m.exp = int64(r.U64())
			m.count = r.U32()
			if kind == recEnqueueAt {
				m.prio = r.U8()
				m.at = int64(r.U64())
			}
			flags := r.U8()
			ex := r.Str(wire.NameLenMax)
			key := r.Str(wire.RoutingKeyLenMax)
			props := r.Bytes(wire.PropsLenMax)
			payload := r.Bytes(journal.RecordBytesMax)
			if r.Remaining() == 16 {
				m.producer, m.producerSeq = r.U64(), r.U64()
			}
			if err := r.Done(); err != nil {
				return fmt.Errorf("shards: journal record %d: %w", pos, err)
			}
			m.size = uint32(len(props) + len(payload))
			if s.mem.limit == 0 || slabBytes <= s.mem.high {
				m.body = slab.newBody(ex, key, props, payload, flags&wire.MsgPersistent != 0)
				m.body.Priority, m.body.DeliverAt = m.prio, m.at
				slabBytes += bodyBytes(m.body)
			}
			msgs = append(msgs, m)
		case recDequeue, recCount:
			m := find(ref)
			if m == nil {
				if ck != nil && ref <= ck.upto {
					// A message of the checkpoint (checkpoint.go).
					c := ckRefs[ref]
					if kind == recDequeue {
						c.dead = true
					} else {
						c.count, c.hasCount = r.U32(), true
					}
					ckRefs[ref] = c
				}
				return nil
			}
			if kind == recDequeue {
				m.dead = true
			} else {
				m.count = r.U32()
			}
		default:
			return fmt.Errorf("shards: journal record %d has unknown kind %d", pos, kind)
		}
		return nil
	}
	j, err := journal.Open(journal.Options{
		Dir:             filepath.Join(cfg.Dir, fmt.Sprintf("shard-%03d", s.idx)),
		FS:              cfg.FS,
		SegmentBytes:    cmp.Or(cfg.SegmentBytes, journalSegmentBytesDefault),
		Fsync:           cfg.Fsync,
		PendingBytesMax: journalPendingBytesMax,
		Logger:          log,
		OnCheckpoint: func(upto journal.Pos, owner []byte) error {
			var err error
			ck, err = parseCheckpoint(upto, owner)
			return err
		},
	}, replay)
	if err != nil {
		for i := range msgs {
			if msgs[i].body != nil {
				msgs[i].body.Unref()
			}
		}
		return err
	}
	sj.j = j
	s.journal = sj
	byName := make(map[string]*Queue, s.queues.len())
	for q := range s.queues.all() {
		byName[q.Name] = q
	}
	live, dropped := 0, 0
	if ck != nil {
		sj.ck.loaded = true
		live, dropped = s.applyCheckpoint(ck, byName, ckRefs)
	}
	for i := range msgs {
		m := &msgs[i]
		pos := m.pos
		q := byName[names[m.queue]]
		if q != nil && q.Shard() == s.idx {
			// Dequeued messages count too: their publishes happened.
			q.noteProducer(m.producer, m.producerSeq)
		}
		if m.dead || q == nil || q.Shard() != s.idx || !q.Options.Durable {
			j.Free(pos)
			if m.body != nil {
				m.body.Unref()
			}
			if !m.dead {
				dropped++
			}
			continue
		}
		// A delayed message whose time passed while the broker was down
		// is promoted by the first dispatch or timer, in deliver-at order.
		ev := Event{Kind: EvEnqueue, Body: m.body, ExpiresAt: m.exp, DeliveryCount: m.count, JournalPos: uint64(pos), Size: m.size,
			Priority: m.prio, DeliverAt: m.at}
		if err := q.Apply(&ev, s); err != nil {
			// Over its bound after a restart with a smaller limit: keep it
			// anyway rather than lose a completed publish.
			q.place(&ev, uint64(m.size))
		}
		if m.body == nil {
			s.mem.paged++
		}
		if l := sj.ck.qlog(q); l != nil {
			l.add(&ckRec{pos: uint64(pos), exp: m.exp, at: m.at, count: m.count, size: m.size, level: uint8(q.levelOf(m.prio))})
		}
		s.admit(q)
		s.noteExpiry(q, m.exp)
		if m.at != 0 {
			s.schedule(q, m.at)
		}
		q.busy.Recovered++
		live++
	}
	// The records replayed count towards the next checkpoint, so a long
	// tail is not replayed again at the next start; the messages
	// recovered set its threshold, as a checkpoint's would, so that the
	// first deliveries do not wait for a capture at the first tick.
	sj.ck.appends = records
	sj.ck.lastLive = live
	s.meters.recovery = time.Since(start)
	s.meters.recovered = uint64(live)
	log.Info("shards: journal recovered", "shard", s.idx, "from_checkpoint", ck != nil, "records", records, "messages", live,
		"orphans_dropped", dropped, "dropped_bytes", j.Stats().DroppedBytes, "took", s.meters.recovery.String())
	return nil
}

// journaled reports whether a message on q goes to the journal.
func (s *Shard) journaled(q *Queue, b *Body) bool {
	return s.journal != nil && q.Options.Durable && b.Persistent
}

// appendEnqueue journals a message of q. A publish with a producer id
// (dedup.go) appends it and its sequence number after the payload, so
// replay rebuilds the queue's deduplication state; a message with a
// priority or a deliver-at time is a recEnqueueAt record.
func (s *Shard) appendEnqueue(q *Queue, e *Entry, producer, producerSeq uint64) journal.Pos {
	sj := s.journal
	b := e.Body
	buf := sj.scratch[:0]
	kind := recEnqueue
	if b.Priority != 0 || b.DeliverAt != 0 {
		kind = recEnqueueAt
	}
	buf = append(buf, kind)
	buf = wire.AppendStr(buf, q.Name)
	buf = binary.BigEndian.AppendUint64(buf, uint64(e.ExpiresAt))
	buf = binary.BigEndian.AppendUint32(buf, e.DeliveryCount)
	if kind == recEnqueueAt {
		buf = append(buf, b.Priority)
		buf = binary.BigEndian.AppendUint64(buf, uint64(b.DeliverAt))
	}
	flags := uint8(0)
	if b.Persistent {
		flags |= wire.MsgPersistent
	}
	buf = append(buf, flags)
	buf = wire.AppendStrBytes(buf, b.Exchange)
	buf = wire.AppendStrBytes(buf, b.RoutingKey)
	buf = wire.AppendBytes(buf, b.Props)
	buf = wire.AppendBytes(buf, b.Payload)
	if producer != 0 {
		buf = binary.BigEndian.AppendUint64(buf, producer)
		buf = binary.BigEndian.AppendUint64(buf, producerSeq)
	}
	sj.scratch = buf
	sj.ck.appends++
	pos := sj.j.Append(buf, sj.onDone)
	s.logEnqueue(q, pos, e)
	return pos
}

// appendDequeue journals that the message at pos is gone. The enqueue is
// freed once the dequeue is durable.
func (s *Shard) appendDequeue(q *Queue, pos journal.Pos, sess *Session, cmdID uint64) {
	sj := s.journal
	s.logDequeue(q, pos)
	sj.scratch = append(sj.scratch[:0], recDequeue)
	sj.ck.appends++
	p := sj.j.AppendRef(sj.scratch, pos, sj.onDone)
	sj.pending.push(jctx{pos: p, sess: sess, cmdID: cmdID, free: pos})
}

func (s *Shard) appendCount(q *Queue, pos journal.Pos, count uint32) {
	sj := s.journal
	s.logCount(q, pos, count)
	sj.scratch = append(sj.scratch[:0], recCount)
	sj.ck.appends++
	sj.scratch = binary.BigEndian.AppendUint32(sj.scratch, count)
	p := sj.j.AppendRef(sj.scratch, pos, sj.onDone)
	sj.pending.push(jctx{pos: p})
}

// completeAfterJournal completes a command once every journal record
// appended before it is durable.
func (s *Shard) completeAfterJournal(sess *Session, cmdID uint64) {
	if s.journal == nil || s.journal.pending.size == 0 {
		s.completeCmd(sess, cmdID, nil, nil)
		return
	}
	s.journal.pending.push(jctx{sess: sess, cmdID: cmdID})
}

// drainJournal handles completions from the journal. It reports whether
// there were any.
func (s *Shard) drainJournal() bool {
	sj := s.journal
	if sj == nil {
		return false
	}
	return sj.drain(s.journalDone)
}

func (s *Shard) journalDone(d jdone) {
	sj := s.journal
	c := sj.pending.front()
	if c == nil || c.pos != d.pos {
		panic(fmt.Sprintf("shards: journal completion %d out of order", d.pos))
	}
	var err error
	if d.err != nil {
		s.stats.StoreErrors++
		if s.stats.StoreErrors == 1 || errors.Is(d.err, journal.ErrFailed) == false {
			s.log.Error("shards: journal write failed", "shard", s.idx, "err", d.err)
		}
		err = Errorf(wire.CodeStore, "%s: %v", errStoreText, d.err)
	}
	if c.free != 0 && d.err == nil {
		sj.j.Free(c.free)
	}
	if q := c.q; q != nil {
		// A failed write still releases the message: it is in memory and
		// its publisher was told the write failed, so a delivery is at
		// least once, as a retry of the publish would be.
		q.enqueueSafe(c.seq)
		if len(q.consumers) > 0 {
			s.markDirty(q)
		}
	}
	if c.sess != nil || c.fan != nil {
		s.completeCmd(c.sess, c.cmdID, c.fan, err)
	}
	sj.pending.pop()
	// Markers behind a record complete with it.
	for c = sj.pending.front(); c != nil && c.pos == 0; c = sj.pending.front() {
		s.completeCmd(c.sess, c.cmdID, c.fan, err)
		sj.pending.pop()
	}
}

func (sj *shardJournal) overflowed() bool { return sj.overflow.on.Load() }

// JournalStats returns the shard journal's counters, or false.
func (s *Shard) JournalStats() (journal.Stats, bool) {
	if s.journal == nil {
		return journal.Stats{}, false
	}
	return s.journal.j.Stats(), true
}

// JournalErr is the I/O error the shard's journal failed on (it refuses
// records since), or nil; safe from any goroutine.
func (s *Shard) JournalErr() error {
	if s.journal == nil {
		return nil
	}
	return s.journal.j.Err()
}

func (s *Shard) closeJournal() error {
	if s.journal == nil {
		return nil
	}
	s.waitCheckpoint()
	err := s.journal.j.Close()
	s.drainJournal()
	return err
}
