package shards

import (
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/berthmq/berth/journal"
	"github.com/berthmq/berth/replication/group"
	"github.com/berthmq/berth/wire"
)

// The memory budget. Each shard gets an equal share of Config.MemoryLimit
// and counts, on its own goroutine, what it holds for messages:
//
//   - every message in its queues costs EntryBytes (the Entry and its slot
//     in the queue's ring, 48 + 8 bytes), paged out or not, and a
//     replicated one logEntryBytes more (its 4-byte slot in the group log
//     and the node's 4-byte journal position for it): 64 bytes a paged
//     replicated message;
//   - a body in memory costs its buffer's capacity plus the Body header,
//     once per queue entry that holds it (a body routed to two queues of
//     one shard is counted twice: the count errs high).
//
//   - a replicated publish waiting for its event to commit and apply
//     (replicatedPublish): its body's bytes, which the group log holds
//     meanwhile;
//
//   - the bytes waiting on client connections (gnet's outbound buffers,
//     the TLS writers' queues), which the server sums every heartbeat
//     scan (Broker.SetOutbound) and each shard counts an equal part of,
//     read once per loop (chargeOutbound); each connection's part is
//     capped by the server's -outbound-max.
//
//   - the shard journal's in-memory index (journal.IndexBytes: 24 bytes a
//     slot, a power of two of them, and the entries spilled to its map),
//     read once per loop (chargeOutbound);
//
//   - what the replication holds outside the group logs
//     (Replicator.MemoryBytes: the group journal's index and the frames
//     queued for peers, up to 32 MiB a peer), which each shard counts an
//     equal part of, read once per loop (chargeOutbound);
//
//   - what the shard's checkpoint writer keeps between checkpoints: the
//     last checkpoint, which the next merges its changes into (about 13
//     bytes a message), read once per loop while the shard holds it.
//
//     These three count together up to outsideMaxFraction of the share.
//     Throttling cannot always bring them down: a journal keeps a freed
//     record in its index until compaction deletes its segment, which
//     takes new writes to seal it, and the frames for a peer that is down
//     wait for it. Counted whole, they could hold the publishers
//     throttled for good with every queue empty; capped, the queues keep
//     the rest of the share, and draining them always ends a throttle.
//     /v1/status reports them whole.
//
// Not counted: bodies in outbound writes not yet taken by a connection
// after their entry is gone (ack mode none), the journals' pending bytes
// and batch arrays, inbound connection buffers, and the runtime's slack;
// RSS is therefore above the count, and the process test bounds RSS, not
// the count.
//
// Above the high watermark (memoryHighFraction of the share) each newly
// enqueued message is paged out unless it is among the first
// residentHeadMin of its queue: a persistent message on a durable queue
// just drops its body (the journal has it, read back by position), a
// transient one is written to the shard's paging file. Delivery reads
// paged bodies back in batches ahead of the consumers (pageIn).
//
// Replicated queues page too, on the master and on the followers. A
// replicated message's body aliases its enqueue event's data in the group
// log (replication/replicate.go), so the bytes go only when both let go:
//
//   - the log is the group node's (replication/groups, one goroutine), the
//     body the shard's. Neither takes a lock or waits for the other on
//     the publish path. The shard publishes "above the high watermark"
//     once per loop (Paging, an atomic). The node, applying a committed
//     enqueue, reads it: if set, it drops the event's data from its log
//     (group.Member.Page) and hands the shard the body with the event's
//     position in the group journal (ApplyEnqueue's logPos, kept in
//     Entry.page with pageGroupLog set). The body is then the bytes' only
//     holder, and admit pages it out by the usual rule (not among the
//     first residentHeadMin), uncounting it; without a logPos the log
//     still holds the bytes and the body stays counted.
//   - reads back go straight to the group journal, whose Read is safe
//     from any goroutine: the shard, delivering, reads the record by
//     position (Replicator.ReadEnqueue) in the same read-ahead batches as
//     a durable queue's; the node, needing a paged entry's data to send
//     it to a follower that lacks it or to apply it again after a
//     step-down (Reapply), reads it through group.Config.Load on its own
//     goroutine. Nothing else reads an applied entry's data.
//   - a paged entry keeps its effect, so the log is not compacted past
//     it and its journal record is not freed while the message is in a
//     queue (it is freed once the message's removal is applied).
//
// The flag lags the shard by up to one loop, and the two decisions (the
// node's to drop, the shard's to page out) are made at different times:
// a body handed over with a logPos below the watermark just stays in
// memory, counted; one handed over without a logPos above it stays
// counted as it stays held by the log.
//
// Above the share itself the shard raises its throttle flag, which the
// event loops read before they push a publish to it (server/handler.go):
// the connection stops reading publishes, its publishes stop completing,
// and its window then stops the producer. Consumers are served all along;
// once the count is below memoryResumeFraction of the share the flag drops
// and the publishers carry on. Commands already in the ring still land:
// the overshoot is bounded by the ring's size.

// EntryBytes is what a message costs in memory with its body paged out.
const EntryBytes = int64(unsafe.Sizeof(Entry{})) + int64(unsafe.Sizeof((*Entry)(nil)))

// logEntryBytes is what a replicated message costs in its group log
// beyond its body: the log's slot and the node's journal position
// (group.PositionBytes: an offset from its chunk's base). One whose
// event's data the log holds (not paged) also costs the log
// group.HeldBytes, not counted: its body is, and the two go together.
const logEntryBytes = group.SlotBytes + group.PositionBytes

// entryCost is what a message of q costs with its body paged out.
func entryCost(q *Queue) int64 {
	if q.replicated {
		return EntryBytes + logEntryBytes
	}
	return EntryBytes
}

const (
	bodyHeaderBytes      = int64(unsafe.Sizeof(Body{}))
	memoryHighFraction   = 0.5
	memoryResumeFraction = 0.9
	// outsideMaxFraction bounds what the journal's index and the
	// replication count of the share (chargeOutbound).
	outsideMaxFraction = 0.5
	// residentHeadMin: the first messages of a queue stay in memory, as
	// they are the next to go out.
	residentHeadMin = 64
	// readAheadMax and readAheadBytesMax bound one read-ahead batch.
	readAheadMax      = 512
	readAheadBytesMax = 4 << 20
)

// memory is a shard's share of the budget. The plain fields belong to the
// shard goroutine; the atomics are copies for other goroutines.
type memory struct {
	limit, high, resume int64 // bytes; limit 0 = no budget
	used                int64
	paged               int64 // messages whose body is on disk
	throttling          bool
	since               time.Time // throttling since

	pageOuts, pageIns, throttles, pageErrors uint64

	// sweepList: the queues whose sweepFrom is set (sweepResident), in
	// the order they were flagged; sweeps counts the queues swept. The
	// sweep of the first (sweepQ) is at priority level sweepLevel, from
	// Seq sweepSeq on.
	sweepList  []*Queue
	sweepQ     *Queue
	sweepLevel int
	sweepSeq   uint64
	sweeps     uint64

	outCharged int64 // the share of Broker.outbound in used
	// journalSeen, replSeen and ckSeen are the shard journal's index,
	// the shard's part of Replicator.MemoryBytes and what its checkpoint
	// writer keeps (the last checkpoint, to merge the next into), as last
	// read; used holds their sum up to outsideMax (outsideCharged).
	journalSeen, replSeen, ckSeen, outsideCharged int64

	pages    *pageFile // nil until the first transient page-out
	pageDir  string
	jscratch []byte

	usedPub      atomic.Int64
	pagedPub     atomic.Int64
	throttledPub atomic.Bool
	pagingPub    atomic.Bool
}

// outside is what used holds for memory outside the queues
// (chargeOutbound).
func (m *memory) outside() int64 { return m.outCharged + m.outsideCharged }

func bodyBytes(b *Body) int64 {
	n := len(b.Exchange) + len(b.RoutingKey) + len(b.Props) + len(b.Payload)
	return int64(max(cap(b.buf), n)) + bodyHeaderBytes
}

func (m *memory) setLimit(limit int64) {
	m.limit = limit
	m.high = int64(float64(limit) * memoryHighFraction)
	m.resume = int64(float64(limit) * memoryResumeFraction)
}

// Throttled reports whether the shard is over its memory share and
// publishers to it should wait. Safe from any goroutine; event loops call
// it before pushing a publish.
func (s *Shard) Throttled() bool { return s.mem.throttledPub.Load() }

// charge adds delta bytes to the shard's count and raises or drops the
// throttle flag.
func (s *Shard) charge(delta int64) {
	m := &s.mem
	m.used += delta
	if m.limit == 0 {
		return
	}
	switch {
	case !m.throttling && m.used > m.limit:
		m.throttling, m.since = true, time.Now()
		m.throttles++
		m.throttledPub.Store(true)
		s.log.Warn("shards: memory limit reached, throttling publishers to this shard until consumers bring it down",
			"shard", s.idx, "used_bytes", m.used, "limit_bytes", m.limit, "paged_messages", m.paged)
	case m.throttling && m.used < m.resume:
		m.throttling = false
		m.throttledPub.Store(false)
		s.log.Info("shards: memory below the resume mark, publishers carry on",
			"shard", s.idx, "used_bytes", m.used, "limit_bytes", m.limit, "throttled_for", time.Since(m.since).String())
	}
}

// admit counts the message just enqueued at q's tail and, above the high
// watermark, pages its body out.
func (s *Shard) admit(q *Queue) {
	if s.mem.limit == 0 {
		return // no budget: nothing is counted, nothing is paged
	}
	e := q.busy.tail
	cost := entryCost(q)
	if e.Body != nil {
		cost += bodyBytes(e.Body)
	}
	s.charge(cost)
	m := &s.mem
	if m.used <= m.high && e.Body != nil && q.busy.sweepFrom == 0 && q.levels[e.level()].ready.len() > sweepSkip {
		// Resident for now; once the count passes the watermark the
		// sweep pages it out, and what came after it. (An entry's place
		// from its level's head only ever drops, so one admitted within
		// sweepSkip never qualifies.)
		q.busy.sweepFrom = e.Seq
		m.sweepList = append(m.sweepList, q)
	}
	if m.used <= m.high || e.Body == nil || q.replicated && e.page == 0 {
		// A replicated message's body aliases its event in the group
		// log. Unless the log dropped the event's data (it paged the
		// event: e.page holds its group-journal position, see
		// replicated.go), the log keeps the bytes whatever the shard
		// does: paging the body out would uncount bytes still held. It
		// stays counted, so the budget throttles its publishers.
		return
	}
	// A delayed message is not among the next to go out, whatever its
	// place.
	if !q.tailDelayed() && q.levels[e.level()].ready.len() <= residentHeadMin {
		return
	}
	s.pageOut(e)
}

// The sweep. admit pages out the messages that arrive above the
// watermark; those that arrived below it stayed in memory, and nothing
// paged them out when the count rose past it later. A backlog filled
// from an empty shard thus kept its first half-share of bodies resident
// for good, and as the entries and the journal's index of the paged
// messages behind them grew, the count reached the share with no
// consumer to bring it down: the publishers stayed throttled, with 4.5
// million 1 KiB messages of a 2 GiB budget's shard, 40% of the backlog
// the budget is meant to hold.
//
// So admit notes, per queue, the first message it keeps in memory past
// the sweep's reach while under the watermark (Queue.busy.sweepFrom; the
// queue joins the shard's sweep list), and above the watermark the shard
// pages out the bodies of that queue's ready messages from there to its
// tail, skipping each level's first sweepSkip (the read-ahead's reach: a
// consumer's next batch is read back there, and must not be paged out
// again). It works a slice at a time, sweepVisitMax entries or
// sweepBytesMax bytes paged per loop, so that commands keep their turn,
// and stops as soon as the count is back under the watermark; it goes on
// from where it stopped (the first Seq not yet swept) next time. Ready
// messages are in Seq order in each level, so the place to go on from
// is a binary search away, and a sweep visits each message at most once
// for each time the queue is flagged. The first version walked every
// queue from its head at each pass, so a queue hovering at the
// watermark with a long paged backlog was walked again and again.
const (
	sweepSkip     = readAheadMax
	sweepVisitMax = 4096
	sweepBytesMax = 8 << 20
)

// sweepDue reports whether the loop should run a slice of the sweep.
func (s *Shard) sweepDue() bool {
	m := &s.mem
	return len(m.sweepList) > 0 && m.limit != 0 && m.used > m.high
}

// sweepResident runs one slice of the sweep.
func (s *Shard) sweepResident() {
	m := &s.mem
	visited, freed := 0, int64(0)
	for len(m.sweepList) > 0 {
		q := m.sweepList[0]
		if q.busy == nil || q.busy.sweepFrom == 0 || !s.queues.has(q) {
			// Deleted, or swept already.
			m.popSweep()
			continue
		}
		if m.sweepQ != q {
			m.sweepQ, m.sweepLevel, m.sweepSeq = q, 0, q.busy.sweepFrom
		}
		for ; m.sweepLevel < len(q.levels); m.sweepLevel, m.sweepSeq = m.sweepLevel+1, q.busy.sweepFrom {
			d := &q.levels[m.sweepLevel].ready
			n := d.len()
			from := m.sweepSeq
			for i := max(sweepSkip, sort.Search(n, func(i int) bool { return d.at(i).Seq >= from })); i < n; i++ {
				e := d.at(i)
				if visited >= sweepVisitMax || freed >= sweepBytesMax || m.used <= m.high {
					m.sweepSeq = e.Seq // go on from here next time
					return
				}
				visited++
				if e.Body == nil || q.replicated && e.page == 0 {
					continue // paged already, or held by its group log too
				}
				b := bodyBytes(e.Body)
				s.pageOut(e)
				if e.Body == nil {
					freed += b
				}
			}
		}
		q.busy.sweepFrom = 0
		m.popSweep()
		m.sweeps++
	}
}

// popSweep takes the first queue off the sweep list.
func (m *memory) popSweep() {
	m.sweepList[0] = nil
	m.sweepList = m.sweepList[1:]
	m.sweepQ = nil
	if len(m.sweepList) == 0 {
		m.sweepList = nil // let a long list's array go
	}
}

// pageOut drops e's body from memory, writing it to the paging file
// unless the journal holds it.
func (s *Shard) pageOut(e *Entry) {
	m := &s.mem
	if e.JournalPos == 0 && e.page == 0 {
		if m.pages == nil {
			m.pages = newPageFile(m.pageDir)
		}
		loc, err := m.pages.write(e.Body)
		if err != nil {
			m.pageErrors++
			if m.pageErrors == 1 {
				s.log.Error("shards: paging out failed; bodies stay in memory and the budget throttles publishers instead",
					"shard", s.idx, "err", err)
			}
			return
		}
		e.page = loc
	}
	s.charge(-bodyBytes(e.Body))
	e.Body.Unref()
	e.Body = nil
	m.paged++
	m.pageOuts++
}

// forget uncounts e, which leaves q (Removed).
func (s *Shard) forget(q *Queue, e *Entry) {
	if s.mem.limit == 0 {
		return
	}
	cost := entryCost(q)
	if e.Body != nil {
		cost += bodyBytes(e.Body)
	} else {
		m := &s.mem
		if e.page != 0 && e.page&pageGroupLog == 0 {
			m.pages.release(e.page)
			e.page = 0
		}
		m.paged--
	}
	s.charge(-cost)
}

// loadBody reads e, q's message, back from the group journal, the paging
// file or the shard's journal.
func (s *Shard) loadBody(q *Queue, e *Entry) error {
	m := &s.mem
	var b *Body
	switch {
	case e.page&pageGroupLog != 0:
		r := s.broker.loadReplicator()
		if r == nil {
			return fmt.Errorf("shards: queue %q has a message in a group log and no replicator", q.Name)
		}
		var err error
		if b, m.jscratch, err = r.ReadEnqueue(q, e.Seq, e.page&^pageGroupLog, m.jscratch[:0]); err != nil {
			return err
		}
		// e.page keeps the position: nothing pages the body out again,
		// but forget and pageOut tell a group-log message by it.
	case e.page != 0:
		var err error
		if b, err = m.pages.read(e.page); err != nil {
			return err
		}
		e.page = 0
	case e.JournalPos != 0 && s.journal != nil:
		data, err := s.journal.j.Read(journal.Pos(e.JournalPos), m.jscratch[:0])
		m.jscratch = data[:0]
		if err != nil {
			return err
		}
		if b, err = parseEnqueueBody(data); err != nil {
			return fmt.Errorf("shards: journal record %d: %w", e.JournalPos, err)
		}
	default:
		panic("shards: a paged-out message has no location")
	}
	e.Body = b
	m.paged--
	m.pageIns++
	s.charge(bodyBytes(b))
	return nil
}

// parseEnqueueBody reads the body out of an enqueue record (appendEnqueue).
func parseEnqueueBody(data []byte) (*Body, error) {
	var r wire.Reader
	r.Reset(data)
	kind := r.U8()
	if kind != recEnqueue && kind != recEnqueueAt {
		return nil, fmt.Errorf("not an enqueue record (kind %d)", kind)
	}
	r.Str(wire.NameLenMax) // queue
	r.U64()                // expiry
	r.U32()                // delivery count
	var prio uint8
	var at int64
	if kind == recEnqueueAt {
		prio, at = r.U8(), int64(r.U64())
	}
	// The journal's flags hold MsgPersistent alone, so parseBody reads no
	// priority or time of its own here; a producer id and sequence number
	// may follow the payload (dedup.go).
	b, err := parseBody(&r, journal.RecordBytesMax, 16)
	if b != nil {
		b.Priority, b.DeliverAt = prio, at
	}
	return b, err
}

// pageIn reads back the head's body and the paged bodies at the front of
// its level, in one batch of sequential reads ahead of the consumers. It
// reports whether the head has its body.
func (s *Shard) pageIn(q *Queue) bool {
	h := q.Head()
	if h.Body == nil {
		// A released or promoted head (out of the ring's order) is read
		// alone.
		if err := s.loadBody(q, h); err != nil {
			s.mem.pageErrors++
			s.log.Error("shards: reading a paged message back failed; the queue waits", "shard", s.idx, "queue", q.Name, "err", err)
			return false
		}
	}
	d := &q.levels[h.level()].ready
	n := min(d.len(), readAheadMax)
	bytes := 0
	for i := 0; i < n && bytes < readAheadBytesMax; i++ {
		e := d.at(i)
		if e.Body != nil {
			continue
		}
		if err := s.loadBody(q, e); err != nil {
			s.mem.pageErrors++
			s.log.Error("shards: reading a paged message ahead failed", "shard", s.idx, "queue", q.Name, "err", err)
			break
		}
		bytes += int(e.size())
	}
	return true
}

// withBody makes sure e has its body (for dead-lettering a paged message).
func (s *Shard) withBody(q *Queue, e *Entry) bool {
	if e.Body != nil {
		return true
	}
	if err := s.loadBody(q, e); err != nil {
		s.mem.pageErrors++
		s.log.Error("shards: reading a paged message back failed", "shard", s.idx, "err", err)
		return false
	}
	return true
}

// SetOutbound records the bytes waiting on all client connections; the
// server calls it every heartbeat scan. Safe from any goroutine.
func (b *Broker) SetOutbound(n int64) { b.outbound.Store(n) }

// chargeOutbound counts against the shard's share what the broker holds
// outside its queues: the shard's part of the bytes waiting on client
// connections, its journal's index, and its part of what the replication
// holds (Replicator.MemoryBytes). Once per loop: a few atomic loads.
func (s *Shard) chargeOutbound() {
	m := &s.mem
	if m.limit == 0 {
		return
	}
	shards := int64(len(s.broker.shards))
	part := s.broker.outbound.Load() / shards
	if d := part - m.outCharged; d != 0 {
		m.outCharged = part
		s.charge(d)
	}
	if s.journal != nil {
		m.journalSeen = s.journal.j.IndexBytes()
		if ck := &s.journal.ck; ck.owner != nil {
			// While a checkpoint is in flight the writer has it: the
			// last figure stands.
			if n := ck.owner.heldBytes(); n != ck.ownerBytes {
				ck.ownerBytes = n
				ck.ownerPub.Store(n)
			}
		}
		m.ckSeen = s.journal.ck.ownerBytes
	}
	if r := s.broker.loadReplicator(); r != nil {
		m.replSeen = r.MemoryBytes() / shards
	}
	n := min(m.journalSeen+m.replSeen+m.ckSeen, int64(float64(m.limit)*outsideMaxFraction))
	if d := n - m.outsideCharged; d != 0 {
		m.outsideCharged = n
		s.charge(d)
	}
}

// publishMemory copies the counts for other goroutines (Broker.Memory).
// The shard calls it once per loop, not per message: an atomic store is
// a locked instruction, and two per message cost the hot path 10%.
func (s *Shard) publishMemory() {
	m := &s.mem
	if m.usedPub.Load() != m.used {
		m.usedPub.Store(m.used)
	}
	if m.pagedPub.Load() != m.paged {
		m.pagedPub.Store(m.paged)
	}
	if p := m.limit != 0 && m.used > m.high; m.pagingPub.Load() != p {
		m.pagingPub.Store(p)
	}
}

// Paging reports whether the shard is above its high watermark, where
// it pages bodies out: the group node then drops the data of the
// replicated enqueues it applies to the shard's queues (replicated.go).
// Safe from any goroutine; it lags the shard by at most one loop.
func (s *Shard) Paging() bool { return s.mem.pagingPub.Load() }

func (s *Shard) closePages() {
	if s.mem.pages != nil {
		s.mem.pages.close()
	}
}

// MemoryStatus is the budget at one moment, for /v1/status.
type MemoryStatus struct {
	LimitBytes      int64 `json:"limit_bytes"` // 0: no budget
	UsedBytes       int64 `json:"used_bytes"`  // what the shards count (see memory.go)
	PagedMessages   int64 `json:"paged_messages"`
	EntryBytes      int64 `json:"index_bytes_per_message"`
	ThrottledShards []int `json:"throttled_shards"`
	// OutboundBytes is what waits on client connections, counted in
	// UsedBytes.
	OutboundBytes int64 `json:"outbound_bytes"`
	// JournalIndexBytes is the shard journals' in-memory indexes, and
	// ReplicationBytes what the replication holds outside the group logs
	// (the group journal's index, frames queued for peers); both
	// counted in UsedBytes.
	JournalIndexBytes int64 `json:"journal_index_bytes"`
	ReplicationBytes  int64 `json:"replication_bytes"`
	// CheckpointBytes is what the shards' checkpoint writers keep between
	// checkpoints (the last one, merged into the next), counted in
	// UsedBytes with the two above.
	CheckpointBytes int64 `json:"checkpoint_bytes"`
}

// Memory reads the budget's counters; safe from any goroutine.
func (b *Broker) Memory() MemoryStatus {
	st := MemoryStatus{LimitBytes: b.cfg.MemoryLimit, EntryBytes: EntryBytes, ThrottledShards: []int{},
		OutboundBytes: b.outbound.Load()}
	if r := b.loadReplicator(); r != nil {
		st.ReplicationBytes = r.MemoryBytes()
	}
	for _, s := range b.shards {
		if s.journal != nil {
			st.JournalIndexBytes += s.journal.j.IndexBytes()
			st.CheckpointBytes += s.journal.ck.ownerPub.Load()
		}
		st.UsedBytes += s.mem.usedPub.Load()
		st.PagedMessages += s.mem.pagedPub.Load()
		if s.mem.throttledPub.Load() {
			st.ThrottledShards = append(st.ThrottledShards, s.idx)
		}
	}
	return st
}

// setupPaging gives each shard its share and its paging directory, and
// removes what an earlier run paged. Without a configured directory the
// pages go to a temporary one, removed at Stop.
func (b *Broker) setupPaging() error {
	if b.cfg.MemoryLimit <= 0 {
		return nil
	}
	dir := b.cfg.PagingDir
	if dir == "" {
		tmp, err := os.MkdirTemp("", "berth-paging-")
		if err != nil {
			return fmt.Errorf("shards: paging directory: %w", err)
		}
		dir, b.pagingTemp = tmp, tmp
	}
	share := b.cfg.MemoryLimit / int64(len(b.shards))
	for _, s := range b.shards {
		s.mem.setLimit(share)
		s.mem.pageDir = filepath.Join(dir, fmt.Sprintf("shard-%03d", s.idx))
		if err := resetPagingDir(s.mem.pageDir); err != nil {
			return err
		}
	}
	return nil
}
