// Package group is the replication-group state machine: one member's view
// of a group's totally ordered event log, replicated from the group's
// master to its followers and committed by the SyncStateSet rule.
//
// It is a pure core, in the manner of etcd raft's: a Member takes inputs
// (controller decisions, peer messages, disk completions, proposals, ticks)
// and returns what to do in a Ready (entries to write, messages to send,
// committed entries to apply, a SyncStateSet change to ask the controller
// for). It does no I/O, reads no clock and holds no goroutine, so a
// simulator drives it step by step (sim_test.go) and a broker drives it
// from its shard goroutine.
//
// # The protocol
//
//   - The controller elects one master per group under an epoch that only
//     grows, from the group's SyncStateSet, and tells the members
//     (BecomeMaster, BecomeFollower). A restarted member is nobody's master
//     until the controller says so again, under a new epoch.
//   - The master gives each proposal the next index in its epoch, writes it
//     to its own log and streams it to every follower in Append messages
//     that name the entry before them (PrevIndex, PrevEpoch). A follower
//     whose log does not hold that entry refuses and says where its log
//     diverges (the epoch of its entry there and that epoch's first index);
//     the master backs up to the end of that epoch in its own log and tries
//     again, so a follower truncates at most what the master lacks, by epoch
//     boundaries.
//   - A follower acknowledges an index once it is durable on its disk and
//     known to agree with the master's log (Match).
//   - An entry commits when every member of the SyncStateSet holds it
//     durably, and at least MinSync members do. The master's own copy
//     counts once its disk has it. Every member applies committed entries
//     in log order; the master completes a proposal when it applies it.
//   - The master asks the controller to shrink the SyncStateSet when a
//     follower has not acknowledged for LagTicks, and to grow it when a
//     follower has caught up to the commit index. A shrink takes effect when
//     the controller confirms it (SetSyncStateSet); a grow counts at once,
//     since a larger set only makes commits harder. So the controller's set
//     is always a subset of the one the master commits with, every member
//     the controller may elect holds every committed entry, and a master of
//     an old epoch cannot commit: the new master is in its set and refuses
//     its epoch.
//   - A member drops the prefix of its log whose entries are applied and
//     have no effect left (Forget, Retire, Compact). A follower that lacks
//     entries the master dropped gets an Install: the master's log starts
//     after its base, every entry up to there has no effect left, so the
//     follower drops its log and what it applied, and goes on from there.
//   - A member may drop the data of an applied entry that still has an
//     effect (Page) when its caller can read it back (Config.Load): a
//     broker over its memory budget keeps a replicated message's bytes
//     only in its group journal. The member reads a paged entry back,
//     synchronously, whenever it needs the data: to send it to a follower
//     that lacks it, and to apply it again after Reapply. Nothing else
//     reads an applied entry's data; Compact keeps paged entries.
//   - Every message carries the sender's epoch. A member refuses messages
//     of an epoch older than its own, and a master that sees a newer epoch
//     steps down: its pending proposals end with ErrNotMaster, their
//     outcome unknown to the client.
//   - Epochs fence commits, not what a master does with its applied
//     state: a master the controller replaced keeps believing it is
//     master until it hears of the new epoch, and would go on handing
//     out messages that its successor hands out too (an accepted message
//     delivered again). So a master delivers only while it holds a lease
//     (Delivering): the controller confirms, in answer to a request sent
//     at time t, that the member masters the group in its epoch
//     (Granted), and the lease runs until t + Config.Lease; the
//     controller never confirms an epoch it has replaced. A new master
//     waits out one lease after it learns of its election before it
//     delivers (the fence): whatever its predecessor was confirmed in was
//     asked before the election, so that lease has ended by then. The
//     caller tells the member the time (SetTime); the member never reads
//     a clock.
package group

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"unsafe"

	"github.com/berthmq/berth/wire"
)

// MemberID names a broker within a group: its broker id. 0 is nobody.
type MemberID = uint32

// Entry is one event of the group log.
type Entry = wire.GroupEntry

// Message is a peer message between members of one group, as the wire
// carries it. In an Append: the entry before the batch (PrevIndex,
// PrevEpoch), the batch, and the master's commit index. In a response:
// OK, Match (durable and agreeing with the master's log), Last (agreeing,
// maybe not durable), and on refusal HintEpoch (the epoch of the
// follower's entry where they diverge, 0 when it is only behind) and
// HintIndex (where that epoch starts in its log, or its end + 1).
type Message = wire.GroupMessage

// Message kinds.
const (
	MsgAppend     = wire.GroupAppend
	MsgAppendResp = wire.GroupAppendResp
	// MsgInstall tells a follower that lacks entries the master has
	// compacted away that the log starts after PrevIndex (of epoch
	// PrevEpoch): every entry up to there is committed and has no effect
	// left (see Compact).
	MsgInstall = wire.GroupInstall
)

// Base is where a member's log starts: every entry up to Index is
// committed, has no effect left, and is no longer kept; Epoch is the
// epoch of the entry at Index. The zero Base is an uncompacted log.
type Base struct {
	Index uint64
	Epoch uint32
}

// AlterSet asks the controller to make Set the SyncStateSet of the
// master's epoch.
type AlterSet struct {
	Epoch uint32
	Set   []MemberID
	// From is the set the master last heard from the controller; the
	// controller grants the request only while its set is still From.
	From []MemberID
}

// Ready is what a Member asks its caller to do, in this order: truncate
// the log after TruncateAfter (when Truncate), write Persist, send
// Messages, apply Apply, and send AlterSet to the controller.
type Ready struct {
	// Reapply: forget what was applied; Apply starts again from the first
	// entry of the log (Member.Reapply).
	Reapply bool
	// Install: the master has compacted away entries this follower lacks.
	// The follower's log was dropped whole and now starts after
	// Install.Index; what it applied is to be dropped too (nothing up to
	// Install.Index has an effect left), and Apply goes on from there. It
	// comes first: a Truncate or Persist in the same Ready follows it.
	Install       *Base
	Truncate      bool
	TruncateAfter uint64
	Persist       []Entry
	Messages      []Message
	Apply         []Entry
	Completed     []Completion
	AlterSet      *AlterSet
	// More: Apply stopped short of the commit index after reading back
	// applyLoadMax bytes of paged entries; call Ready again for the rest
	// (so a log applied again after a Reapply is not read into memory
	// whole).
	More bool
}

// applyLoadMax bounds the bytes of paged entries read back for the Apply
// of one Ready (a variable for the tests).
var applyLoadMax = 8 << 20

// Completion is the outcome of a proposal this member took as master.
type Completion struct {
	Index uint64
	Epoch uint32
	Err   error // nil: committed and applied; ErrNotMaster: unknown
}

// Errors of Propose and of completions.
var (
	ErrNotMaster    = errors.New("group: not the master of the group")
	ErrNotEnoughSet = errors.New("group: fewer members in sync than min-sync-replicas")
	ErrBacklog      = errors.New("group: too many uncommitted entries")
	// ErrHandover: the master takes no proposals while it hands the
	// group over to another member (BeginHandover). Nothing was
	// proposed.
	ErrHandover = errors.New("group: the master is handing the group over to another member")
)

// inflightBatches bounds the Append batches sent to a follower ahead of
// its acknowledgements.
const inflightBatches = 16

// Config configures a member.
type Config struct {
	Group    uint32 // the group's number, put in every message
	ID       MemberID
	Replicas []MemberID // the group's replica set, this member included
	MinSync  int        // default: a majority of Replicas
	LagTicks int        // a follower silent this long leaves the set; default 5
	// MaxBatch bounds the entries of one Append; default 64.
	MaxBatch int
	// MaxUncommitted bounds the entries a master holds past its commit
	// index; Propose refuses past it. Default 1<<16.
	MaxUncommitted int
	// HandoverHolds reports whether a handover's pause (BeginHandover)
	// refuses a proposal of data; nil: it refuses every one. The broker
	// holds back only enqueues, whose publishers retry: consumers'
	// settles go on committing through a rebalance.
	HandoverHolds func(data []byte) bool
	// Load reads back the data of a paged entry (Page) from where the
	// caller keeps it, when the member needs it again: to send it to a
	// follower, or to apply it again (Reapply). An error stops that
	// send or that Apply at the entry; the member tries again later (the
	// next Tick resends, the next Ready applies). Nil: nothing is paged.
	Load func(index uint64) ([]byte, error)
	// PagedLog: the log given to New holds no data; every entry of it
	// is paged (Load reads it back).
	PagedLog bool
	// Lease is how long, in the units of SetTime, a confirmation of
	// mastership (Granted) lets a master deliver, and how long a new
	// master waits before it delivers (the fence). 0: no lease, a master
	// delivers whenever it is Serving.
	Lease int64
}

// Role is a member's role in its current epoch.
type Role uint8

const (
	RoleNone Role = iota // restarted or not yet told
	RoleFollower
	RoleMaster
)

// slot is an entry of the log, without its index (first + its place)
// or its epoch (Member.epochs): whether it is retired (applied, with no
// effect left on this member: Forget, Retire) or paged (its data dropped
// from memory and read back with Config.Load: Page), and, when its data
// is in memory, which element of Member.data holds it. A broker over its
// memory budget keeps millions of paged entries, which cost their slot
// alone.
type slot uint32

const (
	slotDead  slot = 1 << 31
	slotPaged slot = 1 << 30
	// slotRef is 1 + the index in Member.data of the entry's data, 0
	// when none is in memory.
	slotRef = slotPaged - 1
	// heldMax bounds the entries whose data is in memory (Member.data).
	heldMax = int(slotRef) - 1
)

// SlotBytes is what an entry of the log costs in memory without its
// data: its slot. Its epoch costs nothing more (an epoch's entries share
// one run), and an entry whose data is in memory costs HeldBytes more.
const SlotBytes = int64(unsafe.Sizeof(slot(0)))

// PositionBytes is what the node that drives a member keeps per entry
// beside its slot: the entry's position in the group journal, an offset
// from its chunk's base (replication/groups, which holds it to this:
// TestPositionBytes). It is declared here, with SlotBytes, so that the
// shards, which count a replicated message's cost, need not import the
// node.
const PositionBytes = 4

// HeldBytes is what an entry whose data is in memory costs beyond its
// slot and its data: its element of Member.data.
const HeldBytes = int64(unsafe.Sizeof([]byte(nil)))

// epochRun says that the entries of the log from first on, up to the
// next run's first, are of epoch: epochs only grow along a log, so a few
// runs hold every entry's epoch.
type epochRun struct {
	first uint64
	epoch uint32
}

// Page drops from memory the data of the applied entry at index, which
// the caller can read back (Config.Load): unlike Forget, the entry keeps
// its effect, and its data is read back whenever the member needs it. It
// reports whether the entry is paged (now or already); an entry without
// data, not applied or not in the log is not.
func (m *Member) Page(index uint64) bool {
	if m.cfg.Load == nil || index < m.first || index > m.lastIndex() || index > m.applied {
		return false
	}
	sl := &m.log[index-m.first]
	switch {
	case *sl&slotPaged != 0:
		return true
	case *sl&slotDead != 0 || *sl&slotRef == 0:
		return false
	}
	*sl = m.release(*sl) | slotPaged
	m.maybeRepack()
	return true
}

// dataOf is the data in memory of the entry whose slot is sl, nil if
// none is.
func (m *Member) dataOf(sl slot) []byte {
	if r := sl & slotRef; r != 0 {
		return m.data.at(int(r - 1))
	}
	return nil
}

// hold keeps data in memory and returns the slot of an entry holding it
// (0 for empty data). The caller has checked canHold.
func (m *Member) hold(data []byte) slot {
	if len(data) == 0 {
		return 0
	}
	var k int
	if n := len(m.free); n > 0 {
		k = int(m.free[n-1])
		m.free = m.free[:n-1]
	} else {
		k = m.data.grow()
	}
	m.data.set(k, data)
	return slot(k + 1)
}

// canHold reports whether one more entry's data may be kept in memory.
func (m *Member) canHold() bool { return len(m.free) > 0 || m.data.n < heldMax }

// release lets go of the data sl holds in memory, and returns sl without
// it.
func (m *Member) release(sl slot) slot {
	r := sl & slotRef
	if r == 0 {
		return sl
	}
	m.data.set(int(r-1), nil)
	m.free = append(m.free, uint32(r-1))
	return sl &^ slotRef
}

// repackMin is the size of Member.data below which it is not repacked.
const repackMin = 4096

// maybeRepack lets go of the arrays of data and free when most of data
// is unused (a burst held in memory and gone since): it moves the data
// held to a new array and renumbers the slots. The slots are walked, so
// it waits until data is at least an eighth of the log's length: the
// walk costs at most 8 slots for each of the 3/4 of data let go since
// the array was last packed. It runs after the changes to the slots,
// never during a walk of them.
func (m *Member) maybeRepack() {
	n := m.data.n
	if n <= repackMin || len(m.free) < n/4*3 || n < len(m.log)/8 {
		return
	}
	var data heldData
	if held := n - len(m.free); held > 0 {
		for i, sl := range m.log {
			if r := sl & slotRef; r != 0 {
				k := data.grow()
				data.set(k, m.data.at(int(r-1)))
				m.log[i] = sl&^slotRef | slot(k+1)
			}
		}
	}
	m.data, m.free = data, nil
}

// heldChunk is the number of elements in one chunk of a heldData.
const heldChunk = 512

// heldData is an array of entries' data grown in chunks of heldChunk:
// a slice of them grown by append copied the whole array at each
// growth (a tenth of a follower's CPU with 200,000 entries held).
type heldData struct {
	chunks []*[heldChunk][]byte
	n      int // elements in use, the first n
}

func (h *heldData) at(k int) []byte        { return h.chunks[k/heldChunk][k%heldChunk] }
func (h *heldData) set(k int, data []byte) { h.chunks[k/heldChunk][k%heldChunk] = data }

// grow adds an element (nil) at the end and returns its place.
func (h *heldData) grow() int {
	if h.n == len(h.chunks)*heldChunk {
		h.chunks = append(h.chunks, new([heldChunk][]byte))
	}
	h.n++
	return h.n - 1
}

// appendEntry adds e at the log's end. The caller has checked canHold.
func (m *Member) appendEntry(e Entry) {
	m.log = append(m.log, m.hold(e.Data))
	if n := len(m.epochs); n == 0 || m.epochs[n-1].epoch != e.Epoch {
		m.epochs = append(m.epochs, epochRun{first: e.Index, epoch: e.Epoch})
	}
}

// entryAt is the log's entry at i, first <= i <= lastIndex; its data is
// nil when it is not in memory.
func (m *Member) entryAt(i uint64) Entry {
	return Entry{Epoch: m.epochAt(i), Index: i, Data: m.dataOf(m.log[i-m.first])}
}

// runOf is the place in m.epochs of the run holding the log's entry at
// i, first <= i <= lastIndex.
func (m *Member) runOf(i uint64) int {
	n := len(m.epochs)
	if m.epochs[n-1].first <= i {
		return n - 1
	}
	k, _ := slices.BinarySearchFunc(m.epochs, i, func(r epochRun, i uint64) int {
		switch {
		case r.first < i:
			return -1
		case r.first > i:
			return 1
		}
		return 0
	})
	if k == n || m.epochs[k].first > i {
		k--
	}
	return k
}

type follower struct {
	next    uint64 // next index to send
	match   uint64 // durable and agreeing
	last    uint64 // agreeing, maybe not durable
	lastAck int    // tick of the last accepting response in this epoch
	acked   bool   // it accepted an Append in this epoch
	// progress is the tick at which last last advanced or sending
	// went back to it: a Tick resends from last only after wait ticks
	// without progress (resendTicks, doubling up to maxResendTicks while
	// none comes).
	progress, wait int
	// sentAt is the tick of the last message sent to it, sentCommit the
	// commit index that message carried (heartbeat).
	sentAt     int
	sentCommit uint64
}

// resendTicks is how long the master waits for a follower to acknowledge
// what it sent before it sends it again from the follower's last
// agreeing entry. Resending at every tick sent a follower whose acks took
// longer than a tick (a big catch-up batch behind a busy disk) its whole
// window again each tick, which slowed it down further. A lost batch is
// also found sooner by the follower refusing the next Append or the
// empty one a tick sends.
const (
	resendTicks    = 5
	maxResendTicks = 40
)

// Member is one member's replication state for one group.
type Member struct {
	cfg Config

	// heard is the time (SetTime) this follower last took a message of
	// its master (HeardFromMaster).
	heard int64

	epoch  uint32
	role   Role
	master MemberID

	log   []slot // log[i] is the entry at first+i
	first uint64 // index of log[0]; 1 while nothing is compacted
	// epochs are the epochs of the log's entries: the first run holds
	// the entry at first, and the runs end with the log's last entry.
	epochs []epochRun
	// data holds the data in memory of the entries whose slot refers to
	// it; free lists its unused elements.
	data heldData
	free []uint32
	// baseEpoch is the epoch of the entry at first-1, compacted away.
	baseEpoch uint32
	durable   uint64 // the disk holds the log up to here
	// matched is the last index known to agree with the current master's
	// log (a follower's) or the log end (the master's own).
	matched uint64
	commit  uint64
	applied uint64

	// master state
	set     []MemberID // the SyncStateSet as the controller confirmed it
	growing []MemberID // added by a pending AlterSet: counted at once
	ctlSet  []MemberID // the set as the controller last said it
	alter   *AlterSet  // the pending request, if any
	alterAt int        // tick the pending request was last sent
	// inherited is the log end when this member became master: every
	// entry an earlier master may have committed is at or before it.
	inherited uint64
	peers     map[MemberID]*follower
	tick      int
	proposed  map[uint64]uint32 // index -> epoch of proposals awaiting commit
	// handoverTo is the member a handover goes to (0: none); until the
	// tick handoverEnd the master refuses proposals with ErrHandover.
	handoverTo  MemberID
	handoverEnd int
	// sendPending: proposals or a commit advance wait to go to the
	// followers; Ready sends them, so a burst of proposals travels in
	// full batches rather than one message per proposal.
	sendPending bool

	// The lease (Delivering), in the caller's time units: now is the
	// time SetTime last gave; a master delivers from fenceUntil on
	// (its election plus a lease) until grantUntil, while the
	// controller's last confirmation was of its epoch (grantEpoch).
	now        int64
	fenceUntil int64
	grantEpoch uint32
	grantUntil int64

	rd Ready
	// spare holds the arrays of the Ready handed out before the last:
	// the caller is done with them, and the next Ready reuses them.
	spare Ready
}

// New returns a member with the durable state it restarts with: where
// its log starts (the zero Base if it was never compacted), the log after
// that (every entry of it durable, the first at base.Index+1) and the last
// epoch it knew.
func New(cfg Config, base Base, log []Entry, epoch uint32) *Member {
	if cfg.MinSync <= 0 {
		cfg.MinSync = len(cfg.Replicas)/2 + 1
	}
	if cfg.LagTicks <= 0 {
		cfg.LagTicks = 5
	}
	if cfg.MaxBatch <= 0 {
		cfg.MaxBatch = 64
	}
	if cfg.MaxUncommitted <= 0 {
		cfg.MaxUncommitted = 1 << 16
	}
	m := &Member{cfg: cfg, epoch: epoch, first: base.Index + 1, baseEpoch: base.Epoch, log: make([]slot, 0, len(log))}
	paged := cfg.PagedLog && cfg.Load != nil
	for i, e := range log {
		if e.Index != m.first+uint64(i) {
			panic("group: the log does not go on from its base one index at a time")
		}
		if paged {
			e.Data = nil
		}
		m.appendEntry(e)
		if paged {
			m.log[i] |= slotPaged
		}
	}
	// What the base covers is committed and has nothing to apply.
	m.commit, m.applied = base.Index, base.Index
	m.durable = m.lastIndex()
	return m
}

// Epoch, Role, Master, Commit, Applied, LastIndex and Durable report the
// member's state.
func (m *Member) Epoch() uint32     { return m.epoch }
func (m *Member) Role() Role        { return m.role }
func (m *Member) Master() MemberID  { return m.master }
func (m *Member) Commit() uint64    { return m.commit }
func (m *Member) Applied() uint64   { return m.applied }
func (m *Member) LastIndex() uint64 { return m.lastIndex() }
func (m *Member) Durable() uint64   { return m.durable }

// Base reports where the log starts (Compact).
func (m *Member) Base() Base { return Base{Index: m.first - 1, Epoch: m.baseEpoch} }

// Compact drops the longest prefix of the log whose entries are applied
// and have no effect left (forgotten, retired, or empty), and reports whether the
// base moved. A follower that still lacks what was dropped gets an
// MsgInstall from the master instead of the entries. Entries after the
// first one with an effect stay until it is forgotten: a log whose oldest
// message is never consumed keeps everything after it.
func (m *Member) Compact() bool {
	k := m.first
	for k <= m.applied && k <= m.lastIndex() {
		sl := m.log[k-m.first]
		if sl&slotDead == 0 && (sl&slotRef != 0 || sl&slotPaged != 0) {
			break
		}
		k++
	}
	if k == m.first {
		return false
	}
	m.baseEpoch = m.epochAt(k - 1)
	drop := int(k - m.first)
	for i, sl := range m.log[:drop] {
		m.log[i] = m.release(sl)
	}
	if drop > len(m.log)/2 {
		m.log = slices.Clone(m.log[drop:]) // let the old array go
	} else {
		m.log = m.log[drop:]
	}
	m.first = k
	if len(m.log) == 0 {
		m.epochs = m.epochs[:0]
	} else {
		j := m.runOf(k)
		m.epochs = m.epochs[j:]
		m.epochs[0].first = k
	}
	m.maybeRepack()
	return true
}

// Serving reports whether this member is master and has applied every
// entry it inherited from earlier epochs. Until then its applied state may
// lack events an earlier master committed (the commit index is not
// durable, so a new master learns it again by committing), and it must not
// act on that state: deliver, or answer from it.
func (m *Member) Serving() bool {
	return m.role == RoleMaster && m.applied >= m.inherited
}

// SetTime tells the member the time, in the units of Config.Lease, from
// a clock that never goes back; earlier times are ignored. The caller
// sets it before each input that a lease depends on (BecomeMaster, and
// before asking Delivering).
func (m *Member) SetTime(now int64) { m.now = max(m.now, now) }

// Granted tells the member that the controller, answering a request sent
// at sentAt, confirmed it as the master of epoch: the member may deliver
// until sentAt + Config.Lease, if it masters that epoch. A confirmation
// of a newer epoch than the member knows waits for its BecomeMaster.
func (m *Member) Granted(epoch uint32, sentAt int64) {
	until := sentAt + m.cfg.Lease
	switch {
	case epoch > m.grantEpoch:
		m.grantEpoch, m.grantUntil = epoch, until
	case epoch == m.grantEpoch:
		m.grantUntil = max(m.grantUntil, until)
	}
}

// Revoked tells the member that the controller's answer did not confirm
// it as the group's master: whatever lease it held ends now.
func (m *Member) Revoked() { m.grantUntil = 0 }

// Delivering reports whether the member may hand out messages from its
// applied state now: it is Serving, the fence after its election has
// passed, and it holds a lease of its epoch (always Serving without a
// Config.Lease).
func (m *Member) Delivering() bool {
	from, until := m.DeliverWindow()
	return m.now >= from && m.now < until
}

// DeliverWindow is the span of time in which the member delivers, as
// things stand: from <= now < until (empty when it does not). A caller
// on another goroutine compares its own clock with it, so that a lease
// ends on time even when the member's goroutine is late.
func (m *Member) DeliverWindow() (from, until int64) {
	switch {
	case !m.Serving():
		return 0, 0
	case m.cfg.Lease == 0:
		return math.MinInt64, math.MaxInt64
	case m.grantEpoch != m.epoch:
		return 0, 0
	}
	return m.fenceUntil, m.grantUntil
}

// HeardFromMaster is when this member, a follower, last took an Append
// or Install of its epoch's master (SetTime's clock), 0 if it is not a
// follower or has taken none in the epoch. A queue owner that is not
// the master owns only while it hears from it (shards/own.go).
func (m *Member) HeardFromMaster() int64 {
	if m.role != RoleFollower {
		return 0
	}
	return m.heard
}

// Silent lists, on a master, the replicas that have not acknowledged for
// more than ticks ticks (counted from its election at the earliest), in
// increasing order; nil if none or if this member is not master.
func (m *Member) Silent(ticks int) []MemberID {
	if m.role != RoleMaster {
		return nil
	}
	var out []MemberID
	for id, f := range m.peers {
		if m.tick-f.lastAck > ticks {
			out = append(out, id)
		}
	}
	slices.Sort(out)
	return out
}

// Reapply makes the member hand out every committed entry again, from
// the first, in the next Ready (with Reapply set). A broker that stopped
// being master calls it: its applied state may hold effects it took ahead
// of the log (a queue's acquires, removals not committed), and the log is
// what every member must agree on.
func (m *Member) Reapply() {
	m.applied = m.first - 1
	m.rd.Apply = m.rd.Apply[:0]
	m.rd.Reapply = true
}

// Paged reports whether the entry at index is paged (Page).
func (m *Member) Paged(index uint64) bool {
	return index >= m.first && index <= m.lastIndex() && m.log[index-m.first]&slotPaged != 0
}

// Forget drops the data of the applied entry at index, keeping its epoch
// and index: the caller knows its effect is gone for good (a message that
// was enqueued and then removed, or the removal itself). A member that is
// sent the entry later, or applies it again, gets it with no data and
// skips it; since the entry is committed, every member reaches the same
// state. It keeps the log's memory to its 4-byte slot per event once the
// events' effects are gone; the log is not compacted otherwise.
func (m *Member) Forget(index uint64) {
	if index >= m.first && index <= m.lastIndex() && index <= m.applied {
		sl := &m.log[index-m.first]
		*sl = m.release(*sl)&^slotPaged | slotDead
		m.maybeRepack()
	}
}

// Retire marks the applied entry at index as having no effect left on
// this member, but keeps its data for members that lack it: a removal
// must still reach a follower that holds the message, while the message's
// own entry (Forget) need not reach one that lacks it. Compact drops
// retired entries like forgotten ones.
func (m *Member) Retire(index uint64) {
	if index >= m.first && index <= m.lastIndex() && index <= m.applied {
		m.log[index-m.first] |= slotDead
	}
}

// SyncStateSet is the set the master commits with: the confirmed set and
// any member a pending request adds.
func (m *Member) SyncStateSet() []MemberID { return m.effectiveSet() }

// LogEnd is the epoch and index of the last durable entry, which a member
// reports to the controller for elections.
func (m *Member) LogEnd() (epoch uint32, index uint64) {
	return m.epochAt(m.durable), m.durable
}

func (m *Member) lastIndex() uint64 { return m.first + uint64(len(m.log)) - 1 }

// epochAt is the epoch of the entry at i, the base's included; 0 for
// index 0, before the base or beyond the log.
func (m *Member) epochAt(i uint64) uint32 {
	if i > 0 && i == m.first-1 {
		return m.baseEpoch
	}
	if i == 0 || i < m.first || i > m.lastIndex() {
		return 0
	}
	return m.epochs[m.runOf(i)].epoch
}

// Ready returns what to do since the last call and clears it. Its slices
// are valid until the next call, which reuses their arrays.
func (m *Member) Ready() Ready {
	if m.sendPending {
		m.sendPending = false
		m.broadcast()
	}
	m.advanceApply()
	rd := m.rd
	clear(m.spare.Messages) // drop their entries' data
	clear(m.spare.Apply)
	m.rd = Ready{Persist: m.spare.Persist[:0], Messages: m.spare.Messages[:0], Apply: m.spare.Apply[:0], Completed: m.spare.Completed[:0]}
	m.spare = rd
	return rd
}

// BecomeMaster makes this member the master of epoch with the controller's
// SyncStateSet. An epoch not newer than the member's is ignored.
//
// The epoch must be newer than any the member knew: a member that learned
// an epoch from another was not elected in it, and one restarted with its
// old epoch must never be master of it again (its log may have lost the
// tail it wrote in that epoch, and an index must name one entry per epoch).
func (m *Member) BecomeMaster(epoch uint32, set []MemberID) {
	if epoch <= m.epoch {
		return
	}
	m.stepDown()
	m.epoch, m.role, m.master = epoch, RoleMaster, m.cfg.ID
	m.set = slices.Sorted(slices.Values(set))
	m.ctlSet = slices.Clone(m.set)
	m.growing, m.alter = nil, nil
	m.peers = map[MemberID]*follower{}
	for _, r := range m.cfg.Replicas {
		if r != m.cfg.ID {
			m.peers[r] = &follower{next: m.lastIndex() + 1, lastAck: m.tick}
		}
	}
	m.matched = m.lastIndex()
	m.inherited = m.lastIndex()
	m.proposed = map[uint64]uint32{}
	// An earlier master may hold a lease it was confirmed in before this
	// election; it has run out one lease from now.
	m.fenceUntil = m.now + m.cfg.Lease
	m.broadcast()
}

// BecomeFollower makes this member a follower of master in epoch. An
// older epoch is ignored.
func (m *Member) BecomeFollower(epoch uint32, master MemberID) {
	if epoch < m.epoch || (epoch == m.epoch && m.role == RoleMaster) {
		return
	}
	if epoch > m.epoch || m.role != RoleFollower {
		m.stepDown()
		m.matched = 0
		m.heard = 0
	}
	m.epoch, m.role, m.master = epoch, RoleFollower, master
}

// The set a master commits with must always hold every member of the
// controller's SyncStateSet, since the controller may elect any of them.
// So within an epoch it loses a member only by AlterGranted, the answer
// to its own request to drop it; restatements of the controller's set
// (SetSyncStateSet), which may have been read before a change the master
// has seen since, only add members; and a member that a refused or
// unanswered request tried to add stays counted, since a copy of the
// request may still be granted. A request carries the set the master
// last heard from the controller (AlterSet.From), and the controller
// grants it only while its set is still that, so a late copy of an old
// request cannot undo a later change.

// SetSyncStateSet is the controller's set for epoch as it last read it.
func (m *Member) SetSyncStateSet(epoch uint32, set []MemberID) {
	if m.role != RoleMaster || epoch != m.epoch {
		return
	}
	m.ctlSet = slices.Sorted(slices.Values(set))
	for _, id := range m.ctlSet {
		if !slices.Contains(m.set, id) {
			m.set = append(m.set, id)
		}
	}
	slices.Sort(m.set)
	m.maybeCommit()
}

// AlterGranted tells the master that the controller granted its request
// for set in epoch. An answer to anything but the pending request is
// taken as a restatement.
func (m *Member) AlterGranted(epoch uint32, set []MemberID) {
	if m.role != RoleMaster || epoch != m.epoch {
		return
	}
	set = slices.Sorted(slices.Values(set))
	if m.alter == nil || !slices.Equal(set, m.alter.Set) {
		m.SetSyncStateSet(epoch, set)
		return
	}
	m.set, m.ctlSet = set, slices.Clone(set)
	m.growing, m.alter = nil, nil
	m.maybeCommit()
}

// AlterRefused tells the master that the controller refused its request,
// or that its outcome is unknown (the epoch moved on, the set it was made
// from changed, no answer); it may ask again. The members it would have
// added stay counted.
func (m *Member) AlterRefused(epoch uint32) {
	if epoch > m.epoch {
		m.stepDown() // the epoch itself is learned from the controller or the new master
		return
	}
	if m.role == RoleMaster {
		m.set = m.effectiveSet()
		slices.Sort(m.set)
	}
	m.alter, m.growing = nil, nil
}

// stepDown ends this member's mastership: proposals not yet committed end
// with an unknown outcome.
func (m *Member) stepDown() {
	if m.role == RoleMaster {
		idx := make([]uint64, 0, len(m.proposed))
		for i := range m.proposed {
			idx = append(idx, i)
		}
		slices.Sort(idx)
		for _, i := range idx {
			m.rd.Completed = append(m.rd.Completed, Completion{Index: i, Epoch: m.proposed[i], Err: ErrNotMaster})
		}
		m.proposed = nil
		m.peers = nil
		m.set, m.growing, m.alter, m.ctlSet = nil, nil, nil, nil
	}
	m.handoverTo = 0
	m.role, m.master = RoleNone, 0
}

// BeginHandover starts handing the group over to member to, which must
// be in the SyncStateSet the controller confirmed: for at most ticks
// ticks (or until EndHandover, or a step-down) the master refuses new
// proposals with ErrHandover, so that to can catch up with a log that
// stops growing. The controller is then asked to elect to
// (HandoverReady says when); its new epoch ends the pause here.
func (m *Member) BeginHandover(to MemberID, ticks int) error {
	switch {
	case m.role != RoleMaster:
		return ErrNotMaster
	case to == m.cfg.ID || m.peers[to] == nil || !slices.Contains(m.set, to):
		return fmt.Errorf("group: member %d is not another member of the SyncStateSet %v", to, m.set)
	case ticks <= 0:
		return fmt.Errorf("group: a handover needs a positive bound, not %d ticks", ticks)
	}
	m.handoverTo, m.handoverEnd = to, m.tick+ticks
	return nil
}

// HandoverReady reports, during a handover, whether everything in the
// log is committed and the target holds it durably, with the log end:
// what the controller elects the target from.
func (m *Member) HandoverReady() (ok bool, epoch uint32, index uint64) {
	if m.role != RoleMaster || m.handoverTo == 0 {
		return false, 0, 0
	}
	last := m.lastIndex()
	f := m.peers[m.handoverTo]
	return f != nil && f.match >= last && m.commit >= last, m.epochAt(last), last
}

// EndHandover ends a handover that did not happen: proposals are taken
// again.
func (m *Member) EndHandover() { m.handoverTo = 0 }

// HandingOver reports whether a handover pauses the master's proposals.
func (m *Member) HandingOver() bool { return m.handoverTo != 0 }

// Propose appends data as the next entry of the master's epoch and returns
// its index. Its completion comes in a later Ready.
func (m *Member) Propose(data []byte) (uint64, error) {
	if m.role != RoleMaster {
		return 0, ErrNotMaster
	}
	if m.handoverTo != 0 && (m.cfg.HandoverHolds == nil || m.cfg.HandoverHolds(data)) {
		return 0, ErrHandover
	}
	if len(m.effectiveSet()) < m.cfg.MinSync {
		return 0, ErrNotEnoughSet
	}
	if m.lastIndex()-m.commit >= uint64(m.cfg.MaxUncommitted) || !m.canHold() {
		return 0, ErrBacklog
	}
	e := Entry{Epoch: m.epoch, Index: m.lastIndex() + 1, Data: data}
	m.appendEntry(e)
	m.matched = e.Index
	m.rd.Persist = append(m.rd.Persist, e)
	m.proposed[e.Index] = m.epoch
	m.sendPending = true
	return e.Index, nil
}

// Persisted reports that the disk holds the log up to index.
func (m *Member) Persisted(index uint64) {
	index = min(index, m.lastIndex())
	if index <= m.durable {
		return
	}
	m.durable = index
	switch m.role {
	case RoleMaster:
		m.maybeCommit()
	case RoleFollower:
		m.respond(true, 0, 0)
	}
}

// Tick advances the member's time: the master resends what followers lack
// and shrinks the set past a follower that stays silent.
func (m *Member) Tick() {
	m.tick++
	if m.role != RoleMaster {
		return
	}
	if m.handoverTo != 0 && m.tick >= m.handoverEnd {
		m.handoverTo = 0 // the controller did not move the group in time
	}
	if m.alter != nil && m.tick-m.alterAt > m.cfg.LagTicks {
		// Unanswered: the request or its answer may be lost. Asking
		// again for the same set is harmless.
		m.alterAt = m.tick
		m.rd.AlterSet = m.alter
	}
	// Resend what is not known to have arrived when it stays
	// unacknowledged: messages may be lost.
	for _, f := range m.peers {
		if f.wait == 0 {
			f.wait = resendTicks
		}
		if f.next > f.last+1 && m.tick-f.progress >= f.wait {
			f.next = f.last + 1
			f.progress = m.tick
			f.wait = min(2*f.wait, maxResendTicks)
		}
	}
	m.heartbeat()
	m.maybeAlter()
}

// heartbeat is a Tick's broadcast: a follower that has been sent every
// entry and the current commit index gets an empty Append only every
// LagTicks/5 ticks (100 ms by default), not every tick. That is still five
// acknowledgements within the lag that would take it out of the
// SyncStateSet, and an idle group no longer costs each follower fifty
// messages and answers a second.
func (m *Member) heartbeat() {
	if m.role != RoleMaster {
		return
	}
	every := max(1, m.cfg.LagTicks/5)
	m.sendEach(func(f *follower) bool {
		return f.next <= m.lastIndex() || f.sentCommit != m.commit || m.tick-f.sentAt >= every
	})
}

// Step takes one peer message.
func (m *Member) Step(msg Message) {
	if msg.To != m.cfg.ID || msg.From == m.cfg.ID {
		return
	}
	if msg.Epoch < m.epoch {
		if msg.Kind == MsgAppend {
			// Tell the stale master about the newer epoch.
			m.rd.Messages = append(m.rd.Messages, Message{Group: m.cfg.Group, Kind: MsgAppendResp, From: m.cfg.ID, To: msg.From, Epoch: m.epoch})
		}
		return
	}
	switch msg.Kind {
	case MsgAppend, MsgInstall:
		if msg.Epoch > m.epoch || m.role != RoleFollower || m.master != msg.From {
			// Only the master the controller elected for an epoch sends
			// Appends in it.
			if msg.Epoch == m.epoch && m.role == RoleMaster {
				return // cannot happen: one master per epoch
			}
			m.BecomeFollower(msg.Epoch, msg.From)
		}
		m.heard = m.now // the epoch's master: the queues it lets this member own stay owned (HeardFromMaster)
		if msg.Kind == MsgInstall {
			m.stepInstall(msg)
			return
		}
		m.stepAppend(msg)
	case MsgAppendResp:
		if msg.Epoch > m.epoch {
			m.stepDown() // the epoch itself is learned from the controller or the new master
			return
		}
		if m.role != RoleMaster {
			return
		}
		m.stepAppendResp(msg)
	}
}

func (m *Member) stepAppend(msg Message) {
	p := msg.PrevIndex
	if p > m.lastIndex() {
		// Behind: the master is to send from our end.
		m.respondHint(0, m.lastIndex()+1)
		return
	}
	if p+1 >= m.first && m.epochAt(p) != msg.PrevEpoch {
		// Diverged: our entry at p is of another epoch. Say which, and
		// where that epoch starts in our log, so the master can skip it
		// whole.
		he := m.epochAt(p)
		hi := p
		if p >= m.first {
			hi = m.epochs[m.runOf(p)].first
		}
		m.respondHint(he, hi)
		return
	}
	// The entries after p: keep what agrees, truncate at the first
	// conflict, append the rest.
	i := 0
	for ; i < len(msg.Entries); i++ {
		e := msg.Entries[i]
		if e.Index > m.lastIndex() {
			break
		}
		if e.Index < m.first {
			continue // compacted here: committed, so it agrees
		}
		if m.epochAt(e.Index) != e.Epoch {
			m.truncateAfter(e.Index - 1)
			break
		}
	}
	for ; i < len(msg.Entries); i++ {
		if !m.canHold() {
			break // the master sends the rest again
		}
		e := msg.Entries[i]
		m.appendEntry(e)
		m.rd.Persist = append(m.rd.Persist, e)
	}
	last := p + uint64(i)
	if last > m.matched {
		m.matched = last
	}
	if c := min(msg.Commit, m.matched); c > m.commit {
		m.commit = c
	}
	m.respond(true, 0, 0)
}

// stepInstall takes the master's word that its log starts after
// PrevIndex. A follower whose log holds that entry, or that compacted past
// it, goes on as after an empty Append; any other drops its log whole and
// starts after PrevIndex.
func (m *Member) stepInstall(msg Message) {
	b := msg.PrevIndex
	if b+1 < m.first || (b <= m.lastIndex() && m.epochAt(b) == msg.PrevEpoch) {
		m.stepAppend(Message{PrevIndex: b, PrevEpoch: msg.PrevEpoch, Commit: msg.Commit})
		return
	}
	// Every committed entry agrees with the master's log, so the entry at
	// b is past this member's commit index, and so is all it applied.
	m.log, m.epochs, m.data, m.free = m.log[:0:0], nil, heldData{}, nil
	m.first, m.baseEpoch = b+1, msg.PrevEpoch
	m.durable, m.matched, m.commit, m.applied = b, b, b, b
	m.rd.Install = &Base{Index: b, Epoch: msg.PrevEpoch}
	m.rd.Truncate, m.rd.TruncateAfter = false, 0
	m.rd.Persist = m.rd.Persist[:0]
	m.rd.Apply = m.rd.Apply[:0]
	m.rd.Reapply = false
	if c := min(msg.Commit, m.matched); c > m.commit {
		m.commit = c
	}
	m.respond(true, 0, 0)
}

// truncateAfter drops the log after index.
func (m *Member) truncateAfter(index uint64) {
	if index >= m.lastIndex() {
		return
	}
	if index < m.commit {
		panic("group: truncating committed entries")
	}
	tail := m.log[index+1-m.first:]
	for i, sl := range tail {
		tail[i] = m.release(sl)
	}
	m.log = m.log[:index+1-m.first]
	m.maybeRepack()
	for n := len(m.epochs); n > 0 && m.epochs[n-1].first > index; n-- {
		m.epochs = m.epochs[:n-1]
	}
	m.durable = min(m.durable, index)
	m.matched = min(m.matched, index)
	if !m.rd.Truncate || index < m.rd.TruncateAfter {
		m.rd.Truncate, m.rd.TruncateAfter = true, index
	}
	// Entries handed out for writing and now gone must not be written.
	kept := m.rd.Persist[:0]
	for _, e := range m.rd.Persist {
		if e.Index <= index {
			kept = append(kept, e)
		}
	}
	m.rd.Persist = kept
}

func (m *Member) respond(ok bool, hintEpoch uint32, hintIndex uint64) {
	if m.role != RoleFollower {
		return
	}
	if n := len(m.rd.Messages); ok && n > 0 {
		// Acceptances say how far this log agrees and is durable, both
		// only growing within one epoch: the latest replaces an earlier
		// one still waiting to go.
		if last := &m.rd.Messages[n-1]; last.Kind == MsgAppendResp && last.OK && last.To == m.master && last.Epoch == m.epoch {
			last.Match, last.Last = min(m.durable, m.matched), m.matched
			return
		}
	}
	m.rd.Messages = append(m.rd.Messages, Message{Group: m.cfg.Group, Kind: MsgAppendResp, From: m.cfg.ID, To: m.master, Epoch: m.epoch,
		OK: ok, Match: min(m.durable, m.matched), Last: m.matched, HintEpoch: hintEpoch, HintIndex: hintIndex})
}

func (m *Member) respondHint(epoch uint32, index uint64) { m.respond(false, epoch, index) }

func (m *Member) stepAppendResp(msg Message) {
	f := m.peers[msg.From]
	if f == nil {
		return
	}
	if !msg.OK {
		// Behind: send from its end. Diverged: skip its diverging epoch
		// whole, to just after our last entry of that epoch if we have
		// one, or to where the epoch starts in its log if we never had it.
		next := msg.HintIndex
		if msg.HintEpoch != 0 {
			if end, ok := m.lastOfEpoch(msg.HintEpoch); ok {
				next = end + 1
			}
		}
		f.next = min(max(next, 1), m.lastIndex()+1)
		f.last = min(f.last, f.next-1)
		f.progress = m.tick
		m.send(msg.From, f)
		return
	}
	f.lastAck, f.acked = m.tick, true
	f.match = max(f.match, msg.Match)
	if msg.Last > f.last {
		f.last = msg.Last
		f.progress, f.wait = m.tick, resendTicks
	}
	f.next = max(f.next, f.last+1)
	m.maybeCommit()
	m.maybeAlter()
	if f.next+uint64(m.cfg.MaxBatch) <= m.lastIndex()+1 && f.next-f.last <= uint64(inflightBatches*m.cfg.MaxBatch) {
		// A batch or more behind, with room in its window (catching
		// up): keep the pipeline full rather than wait for the next
		// tick. New proposals go out with the next Ready as before.
		m.send(msg.From, f)
	}
}

// lastOfEpoch is the last index of epoch e in this member's log.
func (m *Member) lastOfEpoch(e uint32) (uint64, bool) {
	for k := len(m.epochs) - 1; k >= 0; k-- {
		switch r := m.epochs[k]; {
		case r.epoch == e:
			if k+1 < len(m.epochs) {
				return m.epochs[k+1].first - 1, true
			}
			return m.lastIndex(), true
		case r.epoch < e:
			return 0, false
		}
	}
	if m.first > 1 && m.baseEpoch == e {
		return m.first - 1, true
	}
	return 0, false
}

func (m *Member) effectiveSet() []MemberID {
	if len(m.growing) == 0 {
		return m.set
	}
	out := slices.Clone(m.set)
	for _, g := range m.growing {
		if !slices.Contains(out, g) {
			out = append(out, g)
		}
	}
	return out
}

// maybeCommit advances the commit index to what every member of the set
// holds durably, if at least MinSync members are in it.
func (m *Member) maybeCommit() {
	set := m.effectiveSet()
	if len(set) < m.cfg.MinSync {
		return
	}
	c := m.durable
	for _, id := range set {
		if id == m.cfg.ID {
			continue
		}
		f := m.peers[id]
		if f == nil {
			return
		}
		c = min(c, f.match)
	}
	if !slices.Contains(set, m.cfg.ID) {
		return
	}
	if c > m.commit {
		m.commit = c
		m.sendPending = true
	}
}

// maybeAlter asks the controller to drop a silent follower from the set or
// to add one that caught up; one request at a time.
func (m *Member) maybeAlter() {
	if m.alter != nil {
		return
	}
	next := slices.Clone(m.set)
	changed := false
	for _, id := range m.cfg.Replicas {
		f := m.peers[id]
		if f == nil {
			continue
		}
		in := slices.Contains(next, id)
		// It holds durably all that this epoch committed and all that an
		// earlier one may have: the commit index itself is not durable,
		// so a master after a restart knows less of it than was
		// committed.
		caughtUp := f.acked && f.match >= max(m.commit, m.inherited) && m.tick-f.lastAck <= m.cfg.LagTicks
		switch {
		case in && m.tick-f.lastAck > m.cfg.LagTicks:
			next = slices.DeleteFunc(next, func(x MemberID) bool { return x == id })
			changed = true
		case !in && caughtUp:
			next = append(next, id)
			m.growing = append(m.growing, id)
			changed = true
		case in && caughtUp && !slices.Contains(m.ctlSet, id) && m.tick-m.alterAt > m.cfg.LagTicks:
			// Counted since a grow that the controller refused or never
			// answered (AlterRefused): the controller must learn it, or
			// it could never elect this member. Asked again once per
			// LagTicks at most.
			changed = true
		}
	}
	if !changed {
		return
	}
	slices.Sort(next)
	m.alter = &AlterSet{Epoch: m.epoch, Set: next, From: slices.Clone(m.ctlSet)}
	m.alterAt = m.tick
	m.rd.AlterSet = m.alter
}

// broadcast sends every follower what it lacks, or an empty Append that
// carries the commit index.
func (m *Member) broadcast() {
	if m.role != RoleMaster {
		return
	}
	m.sendEach(func(*follower) bool { return true })
}

// sendEach sends the followers that want says want something, in member
// order.
func (m *Member) sendEach(want func(*follower) bool) {
	ids := make([]MemberID, 0, len(m.peers))
	for id, f := range m.peers {
		if want(f) {
			ids = append(ids, id)
		}
	}
	slices.Sort(ids)
	for _, id := range ids {
		m.send(id, m.peers[id])
	}
}

func (m *Member) send(to MemberID, f *follower) {
	if f.next < m.first {
		// It lacks entries compacted away here: their effects are all
		// gone, so it only needs to know the log starts after them.
		f.sentAt, f.sentCommit = m.tick, m.commit
		m.rd.Messages = append(m.rd.Messages, Message{Group: m.cfg.Group, Kind: MsgInstall, From: m.cfg.ID, To: to, Epoch: m.epoch,
			PrevIndex: m.first - 1, PrevEpoch: m.baseEpoch, Commit: m.commit})
		f.next = m.first
		return
	}
	// Pipelined: batches go one after another, up to inflightBatches
	// ahead of what the follower has acknowledged; an empty Append
	// carries the commit index when there is nothing new.
	for k := 0; ; k++ {
		next := min(f.next, m.lastIndex()+1)
		prev := next - 1
		end := min(m.lastIndex(), next+uint64(m.cfg.MaxBatch)-1)
		// A full window gets an empty Append (the commit index) until
		// acknowledgements make room or a Tick resends.
		full := f.next-f.last > uint64(inflightBatches*m.cfg.MaxBatch)
		var ents []Entry
		if next <= end && !full {
			ents = make([]Entry, 0, end+1-next)
			for i := next; i <= end; i++ {
				e := m.entryAt(i)
				if m.log[i-m.first]&slotPaged != 0 {
					data, err := m.cfg.Load(i)
					if err != nil {
						// Send what precedes it; a Tick resends from
						// what the follower acknowledged.
						break
					}
					e.Data = data
				}
				ents = append(ents, e)
			}
			if len(ents) == 0 {
				return
			}
			end = next + uint64(len(ents)) - 1
			f.next = end + 1
		} else if k > 0 {
			return
		}
		f.sentAt, f.sentCommit = m.tick, m.commit
		m.rd.Messages = append(m.rd.Messages, Message{Group: m.cfg.Group, Kind: MsgAppend, From: m.cfg.ID, To: to, Epoch: m.epoch,
			PrevIndex: prev, PrevEpoch: m.epochAt(prev), Entries: ents, Commit: m.commit})
		if f.next > m.lastIndex() || f.next-f.last > uint64(inflightBatches*m.cfg.MaxBatch) {
			return
		}
	}
}

// advanceApply hands committed entries to Apply, and completes this
// master's proposals among them.
func (m *Member) advanceApply() {
	loaded := 0
	for m.applied < m.commit && m.applied < m.lastIndex() {
		e := m.entryAt(m.applied + 1)
		if m.log[e.Index-m.first]&slotPaged != 0 {
			if loaded >= applyLoadMax {
				m.rd.More = true
				return
			}
			// Applied again after a Reapply: read back. A failure stops
			// here; the next Ready tries again.
			data, err := m.cfg.Load(e.Index)
			if err != nil {
				return
			}
			e.Data = data
			loaded += len(data)
		}
		m.applied++
		m.rd.Apply = append(m.rd.Apply, e)
		if ep, ok := m.proposed[e.Index]; ok {
			delete(m.proposed, e.Index)
			m.rd.Completed = append(m.rd.Completed, Completion{Index: e.Index, Epoch: ep})
		}
	}
}
