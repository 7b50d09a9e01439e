package groups

import (
	"cmp"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/berthmq/berth/controlplane/ctlapi"
	"github.com/berthmq/berth/journal"
	"github.com/berthmq/berth/replication/group"
	"github.com/berthmq/berth/wire"
)

// Journal records of the group log. Truncations, epochs and bases are
// records too: the journal only appends, and a replay applies them in
// order.
//
// One journal for all of a broker's groups, not a log per group: a
// batch of every group's entries costs one fsync (as a shared WAL does in
// RabbitMQ's Ra). tidwall/wal's model (consecutive indexes, truncation at
// both ends) fits one group's log, but a log per group is an fsync per
// group: with 12 groups of 16 records each per round,
// BenchmarkGroupLogStores (journal) made 40-56k records/s durable with
// one tidwall/wal log per group, fsyncing side by side, and 178-276k with
// this shared journal. Epochs and bases are records here too, so a crash
// never leaves them out of step with the entries, as a second file could.
//
// Compaction: when a group's member drops a dead prefix of its log
// (group.Member.Compact), the node writes a base record; once that is
// durable it frees the records of the entries up to the base (and the
// records of entries truncated before it, and the previous base record),
// and the journal's own compaction reclaims their bytes. A replay may
// still see freed records whose segment was not rewritten yet: entries at
// or before the last base are skipped, and freed again.
const (
	recEntry    byte = 1 // group u32, epoch u32, index u64, data
	recTruncate byte = 2 // group u32, after u64
	recEpoch    byte = 3 // group u32, epoch u32
	recBase     byte = 4 // group u32, index u64, epoch u32, reset u8 (an install: what came before is gone)
)

// nodeTick is NodeConfig.Tick's default.
const nodeTick = 20 * time.Millisecond

// compactEveryDefault is NodeConfig.CompactEvery's default; a group
// tries to compact at least every compactTicks ticks anyway.
const (
	compactEveryDefault = 4096
	compactTicks        = 50
)

// NodeConfig configures a Node.
type NodeConfig struct {
	ID        uint32
	Dir       string // the journal's directory
	Fsync     journal.FsyncPolicy
	FS        journal.FS // nil: the OS
	Transport *Transport
	Groups    []uint32
	Replicas  []uint32 // the replica set of a group ReplicaSets does not name
	MinSync   int      // default a majority of Replicas
	LagTicks  int
	Tick      time.Duration // default 20ms
	// HandoverHolds: see group.Config.HandoverHolds.
	HandoverHolds func(data []byte) bool
	// CompactEvery is how many applied entries past a group's base make
	// it try to compact on a tick; default 4096 (it tries every 50 ticks
	// anyway). SegmentBytes is the journal's segment size (default the
	// journal's).
	CompactEvery int
	SegmentBytes int64
	// Apply is called, on the node's goroutine, with each committed entry
	// in log order. An error (an entry it cannot decode) stops this
	// member of the group, never skips the entry: the member applies
	// nothing more, steps down if it was master, answers its peers no
	// more (so its master drops it from the SyncStateSet) and reports
	// the error in its Status; the node's other groups go on.
	Apply func(group uint32, e wire.GroupEntry) error
	// OnAlter is called, on the node's goroutine, when a master asks the
	// controller to change its SyncStateSet.
	OnAlter func(group uint32, a group.AlterSet)
	// OnMaster is called, on the node's goroutine, when this broker
	// becomes the master of a group.
	OnMaster func(group uint32)
	// OnStepDown is called, on the node's goroutine, when this broker
	// stops being the master of a group, before the group's committed
	// entries are applied again from the first, and when a follower's log
	// is replaced by the master's base (an install): the applied state of
	// the group is to be dropped.
	OnStepDown func(group uint32)
	// Lease is how long the controller's confirmation of a mastership
	// (Granted) lets this broker deliver from a group, and how long a
	// new master waits after its election before it delivers
	// (group.Config.Lease); 0: no lease, a master delivers whenever it
	// serves.
	Lease time.Duration
	// OnDeliver is called, on the node's goroutine, when this broker
	// starts delivering from a group it masters again (Delivering turns
	// true): a fence passed, or a lease that lapsed was renewed.
	OnDeliver func(group uint32)
	Logger    *slog.Logger

	// ReplicaSets is each group's replica set, as the controller placed
	// it (MinSync's majority is of the group's own set).
	ReplicaSets map[uint32][]uint32

	// PagedReplay: the replay keeps no entry's data in memory; every
	// entry of the log starts paged (group.Config.PagedLog) and is read
	// back from the journal when it is applied or sent. A broker with a
	// memory budget sets it, so that a restart does not load its whole
	// backlog.
	PagedReplay bool
}

// inboxMax bounds the events waiting for the node's goroutine; peer
// messages past it are dropped (the protocol resends them).
const inboxMax = 1 << 16

// Node drives the replication groups of one broker on one goroutine.
type Node struct {
	cfg     NodeConfig
	log     *slog.Logger
	j       *journal.Journal
	members map[uint32]*member
	// groupIDs are the members' groups in increasing order (fixed at
	// New).
	groupIDs []uint32
	inbox    chan func()
	// lastTick is the time of the node's last tick, and ownAfter the
	// time before which it owns no queue (Owning), after a gap between
	// ticks.
	lastTick int64
	ownAfter atomic.Int64
	// props carries proposals by value, so that a proposal costs no
	// allocation of its own (inbox takes closures).
	props chan proposal
	// durable wakes the node when the journal has made records durable
	// (member.dur): the journal's writer never waits for the node.
	durable chan struct{}
	done    chan struct{}
	exited  chan struct{}
	scratch []byte // a journal record being built
	// dirty lists the members changed since their last Ready: the node
	// takes every event waiting (up to inboxBatch) before it carries out
	// any Ready, so a burst of proposals or messages becomes one batch of
	// journal writes and one Append per follower.
	dirty []*member
	// loadWin is the read-ahead window of the node's reads of paged
	// entries (load).
	loadWin journal.Window
	// start is the origin of the members' clock (now): monotonic.
	start time.Time
	// failed is the journal failure the node stopped on (fail); nil
	// while it works. Read from any goroutine.
	failed atomic.Pointer[error]
}

// Failed reports the group journal's failure (wrapping ErrJournalFailed)
// once the node has stopped on it, or nil. Safe from any goroutine.
func (n *Node) Failed() error {
	if p := n.failed.Load(); p != nil {
		return *p
	}
	return nil
}

// fail stops every group of the node on the journal's failure: the
// journal is shared, so none of them can write any more. A master steps
// down at once (OnStepDown: what it applied is dropped, nothing is
// served from it), the proposals waiting end with an unknown outcome,
// and the members stop. The broker then leaves its groups: it stops
// heartbeating them to the controller (the server checks Failed), which
// elects other masters and elects none here. It runs on the node's
// goroutine.
func (n *Node) fail(err error) {
	if n.failed.Load() != nil {
		return
	}
	ferr := fmt.Errorf("%w: %w", ErrJournalFailed, err)
	n.failed.Store(&ferr)
	n.log.Error("groups: the group journal failed; this broker leaves its replication groups and serves none of them: the controller elects other masters. Restart the broker once the group journal's directory is writable again; it then catches up and rejoins",
		"dir", n.cfg.Dir, "err", err)
	for _, g := range n.groupIDs {
		n.halt(n.members[g], ferr)
	}
}

// halt stops mb on err (kept as mb.broken unless it stopped already):
// its waiting proposals end with an unknown outcome, it delivers no more,
// and a master steps down (OnStepDown drops what it applied). It runs on
// the node's goroutine.
func (n *Node) halt(mb *member, err error) {
	if mb.broken == nil {
		mb.broken = err
	}
	unknown := fmt.Errorf("%w (%w)", err, group.ErrNotMaster)
	for mb.waits.len() > 0 {
		w := mb.waits.pop()
		w.w.Committed(w.tag, unknown)
	}
	mb.deliverFrom.Store(0)
	mb.deliverUntil.Store(0)
	mb.delivering = false
	if mb.master.Load() {
		mb.master.Store(false)
		n.cfg.OnStepDown(mb.id)
	}
}

// ErrApplyFailed: a member met a committed entry it cannot apply (one
// it cannot decode) and stopped serving its group (NodeConfig.Apply).
var ErrApplyFailed = errors.New("groups: a committed entry could not be applied")

// stopMember stops mb, which could not apply its committed entry at
// index (err), on the node's goroutine. Applying the entries after it
// would leave this member's queues differing from the others' in
// silence, so it stops instead, as on a journal failure (fail) but
// alone: it steps down if master (OnStepDown drops what it applied),
// its waiting proposals end with an unknown outcome, it steps and
// readies no more, so it acknowledges nothing and its master drops it
// from the SyncStateSet, and it reports no log end to the controller,
// which so never elects it. The node's other groups go on.
func (n *Node) stopMember(mb *member, index uint64, err error) {
	g := mb.id
	mb.broken = fmt.Errorf("%w: group %d entry %d: %w", ErrApplyFailed, g, index, err)
	mb.stopped.Store(true)
	n.log.Error("groups: a committed entry of the group cannot be applied; this broker stops serving the group (it does not skip the entry). Upgrade the broker if the entry is of a newer format, then restart it to catch up",
		"group", g, "index", index, "err", err)
	n.halt(mb, mb.broken)
}

// Stopped reports whether this node's member of group g stopped on a
// committed entry it could not apply (NodeConfig.Apply). Safe from any
// goroutine.
func (n *Node) Stopped(g uint32) bool {
	mb := n.members[g] // the map does not change after OpenNode
	return mb != nil && mb.stopped.Load()
}

// now is the time the members' leases are counted in: nanoseconds since
// the node started, on the monotonic clock.
func (n *Node) now() int64 { return int64(time.Since(n.start)) }

// inboxBatch bounds the events taken before the Readies are carried out.
const inboxBatch = 1024

type member struct {
	id    uint32
	m     *group.Member
	gen   uint64 // bumped by each truncation: older completions are stale
	epoch uint32 // last epoch journaled
	// waits are the proposals of this member waiting for their
	// completion, in increasing index order (the order in which the
	// member completes them).
	waits deque[wait]

	// pos holds the journal position of each entry's record.
	pos positions
	// dead lists records that become garbage once a later base record is
	// durable: those of truncated entries, and the stale ones a replay
	// found.
	dead []journal.Pos
	// baseRec is the durable base record; base is a written one whose
	// durability frees base.frees (nil while none is pending).
	baseRec     journal.Pos
	base        *pendingBase
	compactTick int
	// master mirrors m.Serving() for other goroutines.
	master atomic.Bool
	// deliverFrom and deliverUntil mirror m.DeliverWindow() for the
	// shards (Delivering), which compare their own clock with it: a
	// lease ends on time even when the node's goroutine runs late.
	// delivering is what m.Delivering() said last, on the node's
	// goroutine (OnDeliver).
	deliverFrom, deliverUntil atomic.Int64
	delivering                bool
	// ownUntil is, on a follower, until when the queues it owns stay its
	// own (Owning): half the lag after it last heard from its master,
	// which gives their ownership up only after twice the lag of
	// silence (Live). silent is, on a master, the replicas silent for
	// twice the lag (group.Member.Silent), nil for none; replaced, not
	// changed, so that other goroutines read it whole.
	ownUntil atomic.Int64
	silent   atomic.Pointer[[]uint32]
	// applied mirrors m.Applied() for the shards (Applied).
	applied atomic.Uint64
	// resynced is the highest index of an entry at which this member
	// applied its log again for an ownership it lost (Resync).
	resynced uint64
	broken   error // a journal failure or an entry it could not apply: the member stops
	// stopped mirrors, for other goroutines, that the member stopped on
	// an entry it could not apply (stopMember).
	stopped atomic.Bool
	// loadErrs counts failed reads of paged entries (load).
	loadErrs uint64
	dirty    bool // listed in Node.dirty

	// dur is what the journal's writer reported durable, for the node's
	// goroutine to pass on.
	dur struct {
		sync.Mutex
		gen, index uint64
		set        bool
		err        error
		baseDone   journal.Pos // the last base record made durable
	}
}

type pendingBase struct {
	rec   journal.Pos
	frees []journal.Pos
}

// noCompletion is the completion of records whose durability a later
// record's completion reports (records complete in order).
var noCompletion journal.Completion = func(journal.Pos, error) {}

// ErrClosed is returned by calls on a closed node.
var ErrClosed = errors.New("groups: node closed")

// ErrJournalFailed: the broker's group journal failed on an I/O error
// (Node.Failed); the broker has left its groups and takes no proposal.
// A proposal waiting when it failed ends with it wrapped together with
// group.ErrNotMaster: it may have reached the followers, and a new
// master may commit it, so its outcome is unknown.
var ErrJournalFailed = errors.New("groups: the group journal failed")

// ErrNotProposed is wrapped, with the member's reason (group.ErrNotMaster,
// ErrNotEnoughSet, ...), by the outcome of a proposal the group's member
// refused: nothing entered the log. group.ErrNotMaster without it means
// the node stepped down with the proposal in the log, uncommitted: its
// outcome is unknown.
var ErrNotProposed = errors.New("groups: not proposed")

// OpenNode replays the journal in cfg.Dir and starts the node.
func OpenNode(cfg NodeConfig) (*Node, error) {
	if cfg.LagTicks <= 0 {
		cfg.LagTicks = 5 // group.Config's default, which Owning and Live count with
	}
	if cfg.Tick <= 0 {
		cfg.Tick = nodeTick
	}
	if cfg.CompactEvery <= 0 {
		cfg.CompactEvery = compactEveryDefault
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Apply == nil {
		cfg.Apply = func(uint32, wire.GroupEntry) error { return nil }
	}
	if cfg.OnAlter == nil {
		cfg.OnAlter = func(uint32, group.AlterSet) {}
	}
	if cfg.OnMaster == nil {
		cfg.OnMaster = func(uint32) {}
	}
	if cfg.OnStepDown == nil {
		cfg.OnStepDown = func(uint32) {}
	}
	if cfg.OnDeliver == nil {
		cfg.OnDeliver = func(uint32) {}
	}
	logs := map[uint32]*replayLog{}
	lg := func(g uint32) *replayLog {
		l := logs[g]
		if l == nil {
			l = &replayLog{first: 1}
			logs[g] = l
		}
		return l
	}
	epochs := map[uint32]uint32{}
	replay := func(pos journal.Pos, _ journal.Pos, data []byte) error {
		if len(data) < 5 {
			return fmt.Errorf("groups: journal record of %d bytes", len(data))
		}
		g := binary.BigEndian.Uint32(data[1:])
		switch data[0] {
		case recEntry:
			if len(data) < 17 {
				return errors.New("groups: short entry record")
			}
			e := group.Entry{Epoch: binary.BigEndian.Uint32(data[5:]), Index: binary.BigEndian.Uint64(data[9:])}
			if !cfg.PagedReplay {
				e.Data = slices.Clone(data[17:])
			}
			return lg(g).entry(e, pos)
		case recTruncate:
			if len(data) < 13 {
				return errors.New("groups: short truncate record")
			}
			lg(g).truncate(binary.BigEndian.Uint64(data[5:]))
		case recEpoch:
			if len(data) < 9 {
				return errors.New("groups: short epoch record")
			}
			epochs[g] = max(epochs[g], binary.BigEndian.Uint32(data[5:]))
		case recBase:
			if len(data) < 18 {
				return errors.New("groups: short base record")
			}
			lg(g).setBase(group.Base{Index: binary.BigEndian.Uint64(data[5:]), Epoch: binary.BigEndian.Uint32(data[13:])}, data[17] != 0, pos)
		default:
			return fmt.Errorf("groups: journal record of unknown kind %d", data[0])
		}
		return nil
	}
	j, err := journal.Open(journal.Options{Dir: cfg.Dir, Fsync: cfg.Fsync, FS: cfg.FS, Logger: cfg.Logger, SegmentBytes: cfg.SegmentBytes}, replay)
	if err != nil {
		return nil, err
	}
	n := &Node{cfg: cfg, log: cfg.Logger, j: j, members: map[uint32]*member{}, start: time.Now(),
		inbox: make(chan func(), inboxMax), props: make(chan proposal, inboxMax), durable: make(chan struct{}, 1), done: make(chan struct{}), exited: make(chan struct{})}
	for g, l := range logs {
		if err := l.check(); err != nil {
			j.Close()
			return nil, fmt.Errorf("groups: group %d: %w", g, err)
		}
	}
	for _, g := range cfg.Groups {
		l := lg(g)
		epochs[g] = max(epochs[g], l.base.Epoch)
		for _, e := range l.log {
			epochs[g] = max(epochs[g], e.Epoch)
		}
		replicas := cfg.Replicas
		if set, ok := cfg.ReplicaSets[g]; ok {
			replicas = set
		}
		mb := &member{id: g, epoch: epochs[g], baseRec: l.baseRec}
		mb.pos.reset(l.base.Index + 1)
		for _, p := range l.pos {
			mb.pos.push(p)
		}
		mb.m = group.New(group.Config{Group: g, ID: cfg.ID, Replicas: replicas, MinSync: cfg.MinSync, LagTicks: cfg.LagTicks,
			Load: func(i uint64) ([]byte, error) { return n.load(mb, i) }, PagedLog: cfg.PagedReplay, HandoverHolds: cfg.HandoverHolds,
			Lease: int64(cfg.Lease)}, l.base, l.log, epochs[g])
		n.members[g] = mb
		// Records freed before the restart and not reclaimed yet: free
		// them again.
		for _, p := range l.stale {
			j.Free(p)
		}
	}
	n.groupIDs = n.sortedGroups()
	go n.run()
	return n, nil
}

func (n *Node) run() {
	defer close(n.exited)
	t := time.NewTicker(n.cfg.Tick)
	defer t.Stop()
	for {
		select {
		case f := <-n.inbox:
			f()
			for k := 0; k < inboxBatch && len(n.inbox) > 0; k++ {
				(<-n.inbox)()
			}
		case p := <-n.props:
			n.propose(p)
			for k := 0; k < inboxBatch && len(n.props) > 0; k++ {
				n.propose(<-n.props)
			}
		case <-n.durable:
			for _, g := range n.groupIDs {
				n.takeDurable(n.members[g])
			}
		case <-t.C:
			now := n.now()
			if gap := now - n.lastTick; n.lastTick != 0 && gap > int64(n.cfg.LagTicks)*int64(n.cfg.Tick)/4 {
				// The node did not run for a while (the process was
				// stopped, or starved): what it reads next may be old,
				// and it may have lost the queues it owned meanwhile
				// without knowing yet. It owns nothing until it has
				// heard and applied for a whole lag (Owning).
				n.ownAfter.Store(now + int64(n.cfg.LagTicks)*int64(n.cfg.Tick))
				n.log.Warn("groups: the node did not run for a while; the queues this broker owns wait until it has caught up", "gap", time.Duration(gap))
			}
			n.lastTick = now
			for _, g := range n.groupIDs {
				mb := n.members[g]
				if mb.broken == nil {
					mb.m.SetTime(n.now())
					mb.m.Tick()
					n.maybeCompact(mb)
					n.touch(mb)
				}
			}
		case <-n.done:
			return
		}
		// A Ready may mark its member again (a step-down reapplies the
		// log): the loop runs until none is left.
		for i := 0; i < len(n.dirty); i++ {
			mb := n.dirty[i]
			mb.dirty = false
			n.ready(mb)
		}
		clear(n.dirty)
		n.dirty = n.dirty[:0]
	}
}

func (n *Node) sortedGroups() []uint32 {
	gs := make([]uint32, 0, len(n.members))
	for g := range n.members {
		gs = append(gs, g)
	}
	slices.Sort(gs)
	return gs
}

// do runs f on the node's goroutine and waits for it.
func (n *Node) do(f func()) error {
	ran := make(chan struct{})
	select {
	case n.inbox <- func() { f(); close(ran) }:
	case <-n.done:
		return ErrClosed
	}
	select {
	case <-ran:
		return nil
	case <-n.exited:
		return ErrClosed
	}
}

// Deliver hands a peer message to its group. It never blocks: past the
// inbox bound the message is dropped.
func (n *Node) Deliver(msg *wire.GroupMessage) {
	select {
	case n.inbox <- func() { n.step(msg) }:
	default:
	}
}

func (n *Node) step(msg *wire.GroupMessage) {
	mb := n.members[msg.Group]
	if mb == nil || mb.broken != nil {
		return
	}
	mb.m.SetTime(n.now())
	mb.m.Step(*msg)
	n.touch(mb)
}

// withMember runs f on group g's member, then carries out its Ready.
func (n *Node) withMember(g uint32, f func(*group.Member)) error {
	var err error
	if derr := n.do(func() {
		mb := n.members[g]
		if mb == nil {
			err = fmt.Errorf("groups: no group %d on this node", g)
			return
		}
		if mb.broken != nil {
			err = mb.broken
			return
		}
		mb.m.SetTime(n.now())
		f(mb.m)
		n.touch(mb)
	}); derr != nil {
		return derr
	}
	return err
}

// BecomeMaster, BecomeFollower, SetSyncStateSet and AlterRefused pass the
// controller's decisions to group g.
func (n *Node) BecomeMaster(g, epoch uint32, set []uint32) error {
	return n.withMember(g, func(m *group.Member) { m.BecomeMaster(epoch, set) })
}
func (n *Node) BecomeFollower(g, epoch, master uint32) error {
	return n.withMember(g, func(m *group.Member) { m.BecomeFollower(epoch, master) })
}
func (n *Node) SetSyncStateSet(g, epoch uint32, set []uint32) error {
	return n.withMember(g, func(m *group.Member) { m.SetSyncStateSet(epoch, set) })
}
func (n *Node) AlterGranted(g, epoch uint32, set []uint32) error {
	return n.withMember(g, func(m *group.Member) { m.AlterGranted(epoch, set) })
}
func (n *Node) AlterRefused(g, epoch uint32) error {
	return n.withMember(g, func(m *group.Member) { m.AlterRefused(epoch) })
}

// BeginHandover, HandoverReady and EndHandover drive a handover of group
// g, which this node masters, to member to (group.Member.BeginHandover):
// the pause lasts at most d. HandoverReady also reports the epoch the
// node masters g in and its log end.
func (n *Node) BeginHandover(g, to uint32, d time.Duration) error {
	ticks := max(1, int(d/n.cfg.Tick))
	var err error
	if werr := n.withMember(g, func(m *group.Member) { err = m.BeginHandover(to, ticks) }); werr != nil {
		return werr
	}
	return err
}
func (n *Node) HandoverReady(g uint32) (ok bool, epoch uint32, end ctlapi.LogEnd, err error) {
	err = n.withMember(g, func(m *group.Member) {
		epoch = m.Epoch()
		ok, end.Epoch, end.Index = m.HandoverReady()
	})
	return ok, epoch, end, err
}
func (n *Node) EndHandover(g uint32) {
	_ = n.withMember(g, func(m *group.Member) { m.EndHandover() })
}

// Groups lists the groups this node runs.
func (n *Node) Groups() []uint32 {
	var out []uint32
	_ = n.do(func() { out = n.sortedGroups() })
	return out
}

// Status is one group's state on this node.
type Status struct {
	Group     uint32     `json:"group"`
	Role      group.Role `json:"-"`
	RoleName  string     `json:"role"`
	Epoch     uint32     `json:"epoch"`
	Master    uint32     `json:"master"`
	Base      uint64     `json:"base"` // the log is compacted up to here
	LastIndex uint64     `json:"last_index"`
	Commit    uint64     `json:"commit"`
	Applied   uint64     `json:"applied"`
	Dur       uint64     `json:"durable"`
	Set       []uint32   `json:"sync_state_set,omitempty"` // a master's
	// Delivering: this broker masters the group, its fence after the
	// election has passed and it holds the controller's lease, so it
	// hands out messages (group.Member.Delivering).
	Delivering bool `json:"delivering"`
	// Failed: the member stopped on this error (the group journal
	// failed, or a committed entry could not be applied): it takes no
	// part in the group any more.
	Failed string `json:"failed,omitempty"`
}

// Status reports group g's state; that of a member stopped on a journal
// failure too.
func (n *Node) Status(g uint32) (Status, error) {
	var st Status
	var err error
	if derr := n.do(func() {
		mb := n.members[g]
		if mb == nil {
			err = fmt.Errorf("groups: no group %d on this node", g)
			return
		}
		m := mb.m
		st = Status{Group: g, Role: m.Role(), RoleName: [...]string{"none", "follower", "master"}[m.Role()], Epoch: m.Epoch(),
			Master: m.Master(), Base: m.Base().Index, LastIndex: m.LastIndex(), Commit: m.Commit(), Applied: m.Applied(), Dur: m.Durable(),
			Set: slices.Clone(m.SyncStateSet()), Delivering: m.Delivering()}
		if mb.broken != nil {
			st.Failed = mb.broken.Error()
			st.RoleName, st.Delivering, st.Set = "failed", false, nil
		}
	}); derr != nil {
		return st, derr
	}
	return st, err
}

// LogEnds reports every group's durable log end, for the heartbeats that
// the controller's elections are decided from.
func (n *Node) LogEnds() []ctlapi.GroupLogEnd {
	var out []ctlapi.GroupLogEnd
	_ = n.do(func() {
		for _, g := range n.sortedGroups() {
			if n.members[g].broken != nil {
				continue // stopped: no candidate for the group's master
			}
			e, i := n.members[g].m.LogEnd()
			out = append(out, ctlapi.GroupLogEnd{Group: g, LogEnd: ctlapi.LogEnd{Epoch: e, Index: i}})
		}
	})
	return out
}

// Forget drops the data of group g's applied entry at index
// (group.Member.Forget). It must be called from Apply, on the node's
// goroutine.
func (n *Node) Forget(g uint32, index uint64) {
	if mb := n.members[g]; mb != nil {
		mb.m.Forget(index)
	}
}

// ForgetLater is Forget from any goroutine: the node forgets the entry
// when it next runs its inbox, unless the member applied its log again
// from before index meanwhile (Forget ignores an entry not applied).
// It never blocks: with the inbox full it does nothing.
func (n *Node) ForgetLater(g uint32, index uint64) {
	select {
	case n.inbox <- func() { n.Forget(g, index) }:
	default:
	}
}

// Retire marks group g's applied entry at index as having no effect left
// here while keeping its data for members that lack it
// (group.Member.Retire). It must be called from Apply.
func (n *Node) Retire(g uint32, index uint64) {
	if mb := n.members[g]; mb != nil {
		mb.m.Retire(index)
	}
}

// Page drops from memory the data of group g's applied entry at index
// (group.Member.Page) when drop is set, and returns the journal position
// of the entry's record if the entry is paged (now or before), 0 if not:
// its data is then read back from there (ReadEntry) by whoever needs it.
// It must be called from Apply, on the node's goroutine.
func (n *Node) Page(g uint32, index uint64, drop bool) journal.Pos {
	mb := n.members[g]
	if mb == nil {
		return 0
	}
	pos, ok := mb.pos.at(index)
	if !ok {
		return 0
	}
	if drop {
		if !mb.m.Page(index) {
			return 0
		}
	} else if !mb.m.Paged(index) {
		return 0
	}
	return pos
}

// load reads back the data of mb's paged entry at index for its member,
// on the node's goroutine. The data is a new slice: the member hands it
// out in Messages and Apply.
func (n *Node) load(mb *member, index uint64) ([]byte, error) {
	pos, ok := mb.pos.at(index)
	if !ok {
		return nil, fmt.Errorf("groups: group %d has no journal record for entry %d", mb.id, index)
	}
	_, data, err := n.ReadEntry(mb.id, index, pos, &n.loadWin, nil)
	if err != nil {
		mb.loadErrs++
		if mb.loadErrs == 1 || mb.loadErrs%1000 == 0 {
			n.log.Error("groups: reading a paged entry back failed; the send or apply waits and tries again",
				"group", mb.id, "index", index, "err", err, "failures", mb.loadErrs)
		}
	}
	return data, err
}

// ReadEntry reads the data of group g's entry at index from its journal
// record at pos (Page), appending the record to dst (rec: dst with the
// record; data aliases it), through the read-ahead window w if not nil
// (journal.ReadAhead), which must be the calling goroutine's. Safe from
// any goroutine: a shard reads its paged replicated
// messages back with it. A record freed meanwhile (its entry's effect is
// gone and the log was compacted past it) is an error.
func (n *Node) ReadEntry(g uint32, index uint64, pos journal.Pos, w *journal.Window, dst []byte) (rec, data []byte, err error) {
	start := len(dst)
	rec, err = n.j.ReadAhead(pos, w, dst)
	if err != nil {
		return rec, nil, err
	}
	data = rec[start:]
	if len(data) < 17 || data[0] != recEntry || binary.BigEndian.Uint32(data[1:]) != g || binary.BigEndian.Uint64(data[9:]) != index {
		return rec, nil, fmt.Errorf("groups: journal record %d is not group %d's entry %d", pos, g, index)
	}
	return rec, data[17:], nil
}

// ErrBusy is returned when the node's inbox is full.
var ErrBusy = errors.New("groups: the group node is busy; retry")

// IsMaster reports whether this node is the master of group g and has
// applied everything earlier masters committed (group.Member.Serving).
// It is safe from any goroutine.
func (n *Node) IsMaster(g uint32) bool {
	mb := n.members[g] // the map does not change after OpenNode
	return mb != nil && mb.master.Load()
}

// Delivering reports whether this node may hand out group g's messages
// now: it is the group's master (IsMaster), the fence after its election
// has passed, and it holds a lease the controller confirmed
// (group.Member.Delivering). Safe from any goroutine; it reads the clock.
func (n *Node) Delivering(g uint32) bool {
	mb := n.members[g]
	if mb == nil || !mb.master.Load() {
		return false
	}
	now := n.now()
	return now >= mb.deliverFrom.Load() && now < mb.deliverUntil.Load()
}

// Applied is the index of the last entry of group g this node applied
// (as of its last step), 0 if it holds no replica. Safe from any
// goroutine.
func (n *Node) Applied(g uint32) uint64 {
	if mb := n.members[g]; mb != nil {
		return mb.applied.Load()
	}
	return 0
}

// Holds reports whether this node holds a replica of group g.
func (n *Node) Holds(g uint32) bool { return n.members[g] != nil }

// Owning reports whether this node, a follower of group g, may act as
// the owner of the queues of g it owns (shards/own.go): it heard from
// its master within half the lag. Safe from any goroutine.
func (n *Node) Owning(g uint32) bool {
	mb := n.members[g]
	now := n.now()
	return mb != nil && !mb.master.Load() && now < mb.ownUntil.Load() && now >= n.ownAfter.Load()
}

// Live reports whether broker b, a replica of group g, answered this
// node, g's master, within twice the lag: the master takes back the
// queues of one that did not (shards/own.go). It is true on a node that
// is not g's master. Safe from any goroutine.
func (n *Node) Live(g, b uint32) bool {
	mb := n.members[g]
	if mb == nil || !mb.master.Load() {
		return true
	}
	p := mb.silent.Load()
	return p == nil || !slices.Contains(*p, b)
}

// Resync makes this node drop what it applied of group g and apply g's
// committed log again, as a master that steps down does (OnStepDown):
// its shards applied the entry at index, by which the group took back
// the queues this broker owned, and what they did as owner ahead of
// the log is void. Once it applied the log again up to index it does
// nothing for that index, or an earlier one. Safe from any goroutine;
// with the inbox full it does nothing, and the caller asks again.
func (n *Node) Resync(g uint32, index uint64) bool {
	select {
	case n.inbox <- func() {
		mb := n.members[g]
		if mb == nil || mb.resynced >= index || mb.master.Load() {
			return
		}
		mb.resynced = index
		n.log.Warn("groups: this broker lost the queues it owned in the group (it was silent past its lease); it applies the group's log again", "group", g, "index", index)
		n.cfg.OnStepDown(g)
		mb.m.Reapply()
		n.touch(mb)
	}:
		return true
	default:
		return false
	}
}

// Granted passes on the controller's answer to a heartbeat sent at sent
// (ctlapi.HeartbeatReply): each group it names is confirmed as mastered
// here in the epoch it gives, until sent plus the lease; any other group
// loses its lease. An answer of a controller that predates the grants
// (not Known) confirms every group in its current epoch, as before the
// lease. It never blocks: with the inbox full the answer is dropped, and
// leases lapse rather than last longer.
func (n *Node) Granted(sent time.Time, r ctlapi.HeartbeatReply) {
	at := int64(sent.Sub(n.start))
	select {
	case n.inbox <- func() {
		for _, g := range n.groupIDs {
			mb := n.members[g]
			if mb.broken != nil {
				continue
			}
			mb.m.SetTime(n.now())
			if !r.Known {
				mb.m.Granted(mb.m.Epoch(), at)
			} else if i, ok := slices.BinarySearchFunc(r.Grants, g, func(x ctlapi.MasterGrant, g uint32) int { return cmp.Compare(x.Group, g) }); ok {
				mb.m.Granted(r.Grants[i].Epoch, at)
			} else {
				mb.m.Revoked()
			}
			n.touch(mb)
		}
	}:
	default:
	}
}

// A Waiter is told the outcome of a proposal: Committed(tag, err) runs on
// the node's goroutine and must not block. A pointer type implements it
// without allocating; FuncWaiter adapts a function.
type Waiter interface {
	Committed(tag uint64, err error)
}

// FuncWaiter is a Waiter that calls the function, ignoring the tag.
type FuncWaiter func(error)

// Committed calls f.
func (f FuncWaiter) Committed(_ uint64, err error) { f(err) }

type proposal struct {
	g    uint32
	data []byte
	w    Waiter
	tag  uint64
}

type wait struct {
	index uint64
	w     Waiter
	tag   uint64
}

// ProposeAsync appends data to group g's log through this node, which must
// be the group's master, without waiting: w.Committed(tag, err) is called
// on the node's goroutine with nil once the entry is committed and applied
// here, with group.ErrNotMaster when the node stops being master first
// (the outcome is unknown), or with why it was not proposed (wrapped with
// ErrNotProposed when the member refused it). ErrBusy
// (inbox full) and ErrClosed are returned at once and w is not called. It
// allocates nothing.
func (n *Node) ProposeAsync(g uint32, data []byte, w Waiter, tag uint64) error {
	select {
	case <-n.done:
		return ErrClosed
	default:
	}
	select {
	case n.props <- proposal{g: g, data: data, w: w, tag: tag}:
		return nil
	default:
		return ErrBusy
	}
}

// propose carries out a proposal on the node's goroutine.
func (n *Node) propose(p proposal) {
	mb := n.members[p.g]
	if mb == nil {
		p.w.Committed(p.tag, fmt.Errorf("groups: no group %d on this node", p.g))
		return
	}
	if mb.broken != nil {
		p.w.Committed(p.tag, mb.broken)
		return
	}
	idx, err := mb.m.Propose(p.data)
	if err != nil {
		p.w.Committed(p.tag, fmt.Errorf("%w: %w", ErrNotProposed, err))
		return
	}
	mb.waits.push(wait{index: idx, w: p.w, tag: p.tag})
	n.touch(mb)
}

// Propose is ProposeAsync that waits for the outcome, or for ctx (then
// the outcome is unknown).
func (n *Node) Propose(ctx context.Context, g uint32, data []byte) error {
	ch := make(chan error, 1)
	if err := n.ProposeAsync(g, data, FuncWaiter(func(err error) { ch <- err }), 0); err != nil {
		return err
	}
	select {
	case err := <-ch:
		return err
	case <-ctx.Done():
		return ctx.Err()
	case <-n.exited:
		return ErrClosed
	}
}

// touch marks mb for a Ready at the end of the current batch.
func (n *Node) touch(mb *member) {
	if !mb.dirty {
		mb.dirty = true
		n.dirty = append(n.dirty, mb)
	}
}

// ready carries out what a member asks for; a stopped member (broken)
// does nothing more.
func (n *Node) ready(mb *member) {
	if mb.broken != nil {
		return
	}
	mb.m.SetTime(n.now())
	rd := mb.m.Ready()
	g := mb.id
	if e := mb.m.Epoch(); e > mb.epoch {
		mb.epoch = e
		rec := binary.BigEndian.AppendUint32([]byte{recEpoch}, g)
		n.j.Append(binary.BigEndian.AppendUint32(rec, e), noCompletion)
	}
	if rd.Install != nil {
		// The master's base replaces this log: every record of it is
		// garbage once the base record is durable.
		mb.gen++
		b := *rd.Install
		frees := mb.pos.appendRange(mb.dead, 0, mb.pos.end())
		mb.dead = nil
		mb.pos.reset(b.Index + 1)
		n.writeBase(mb, b, true, frees, n.persisted(mb, mb.gen, b.Index))
		n.cfg.OnStepDown(g)
	}
	if rd.Truncate {
		mb.dead = mb.pos.appendRange(mb.dead, rd.TruncateAfter+1, mb.pos.end())
		mb.pos.truncate(rd.TruncateAfter + 1)
		mb.gen++
		gen, after := mb.gen, rd.TruncateAfter
		rec := binary.BigEndian.AppendUint32([]byte{recTruncate}, g)
		rec = binary.BigEndian.AppendUint64(rec, after)
		n.j.Append(rec, n.persisted(mb, gen, after))
	}
	for i, e := range rd.Persist {
		rec := n.scratch[:0] // the journal copies it
		rec = append(rec, recEntry)
		rec = binary.BigEndian.AppendUint32(rec, g)
		rec = binary.BigEndian.AppendUint32(rec, e.Epoch)
		rec = binary.BigEndian.AppendUint64(rec, e.Index)
		rec = append(rec, e.Data...)
		done := noCompletion
		if i == len(rd.Persist)-1 {
			// Records complete in order: the last one's completion covers
			// the batch.
			done = n.persisted(mb, mb.gen, e.Index)
		}
		if want := mb.pos.end(); e.Index != want && mb.broken == nil {
			// The member hands out entries in order after its base: this
			// is a bug, and the group stops rather than journal a hole.
			mb.broken = fmt.Errorf("groups: group %d persists index %d, expected %d", g, e.Index, want)
			n.log.Error("groups: group stopped", "group", g, "err", mb.broken)
		}
		if mb.broken != nil {
			break
		}
		mb.pos.push(n.j.Append(rec, done))
		n.scratch = rec[:0]
	}
	for i := range rd.Messages {
		n.cfg.Transport.Send(&rd.Messages[i])
	}
	for _, e := range rd.Apply {
		if err := n.cfg.Apply(g, e); err != nil {
			n.stopMember(mb, e.Index, err)
			return
		}
	}
	for _, c := range rd.Completed {
		// Completions come in increasing index order, one for each
		// proposal; a wait below the completion's index was skipped,
		// which the member never does, so its outcome is unknown.
		for mb.waits.len() > 0 && mb.waits.front().index <= c.Index {
			w := mb.waits.pop()
			if w.index == c.Index {
				w.w.Committed(w.tag, c.Err)
			} else {
				n.log.Error("groups: a proposal was passed over by its completions", "group", g, "index", w.index)
				w.w.Committed(w.tag, group.ErrNotMaster)
			}
		}
	}
	if isMaster := mb.m.Serving(); isMaster != mb.master.Load() {
		mb.master.Store(isMaster)
		if isMaster {
			n.cfg.OnMaster(g)
		} else {
			// What this broker applied as master may be ahead of the log
			// (acquires, removals never committed): drop it and apply the
			// committed log again.
			n.cfg.OnStepDown(g)
			mb.m.Reapply()
			n.touch(mb)
		}
	}
	n.publishLease(mb)
	if rd.AlterSet != nil {
		n.cfg.OnAlter(g, *rd.AlterSet)
	}
	if rd.More {
		n.touch(mb) // the rest of the paged entries to apply
	}
}

// publishLease mirrors mb's delivery window for the shards, and tells
// OnDeliver when the member starts delivering. Every tick readies every
// member, so a fence or a lease passing is seen within a tick here; the
// shards compare the window with their own clock meanwhile.
func (n *Node) publishLease(mb *member) {
	mb.applied.Store(mb.m.Applied())
	if h := mb.m.HeardFromMaster(); h != 0 {
		mb.ownUntil.Store(h + int64(n.cfg.LagTicks)*int64(n.cfg.Tick)/2)
	} else {
		mb.ownUntil.Store(0)
	}
	silent := mb.m.Silent(2 * n.cfg.LagTicks)
	if old := mb.silent.Load(); (old == nil) != (len(silent) == 0) || old != nil && !slices.Equal(*old, silent) {
		if len(silent) == 0 {
			mb.silent.Store(nil)
		} else {
			mb.silent.Store(&silent)
		}
	}
	from, until := mb.m.DeliverWindow()
	mb.deliverFrom.Store(from)
	mb.deliverUntil.Store(until)
	d := mb.m.Delivering()
	if d && !mb.delivering {
		n.cfg.OnDeliver(mb.id)
	}
	mb.delivering = d
}

// maybeCompact drops mb's dead log prefix, if it is worth a base record
// and none is pending.
func (n *Node) maybeCompact(mb *member) {
	mb.compactTick++
	if mb.base != nil || mb.broken != nil {
		return
	}
	if mb.m.Applied()-mb.m.Base().Index < uint64(n.cfg.CompactEvery) && mb.compactTick < compactTicks {
		return
	}
	mb.compactTick = 0
	if !mb.m.Compact() {
		return
	}
	b := mb.m.Base()
	frees := mb.pos.appendRange(mb.dead, 0, b.Index+1)
	mb.pos.dropBefore(b.Index + 1)
	mb.dead = nil
	n.writeBase(mb, b, false, frees, noCompletion)
}

// writeBase journals b as mb's base; once it is durable, frees and the
// previous base record are freed.
func (n *Node) writeBase(mb *member, b group.Base, reset bool, frees []journal.Pos, done journal.Completion) {
	rec := binary.BigEndian.AppendUint32([]byte{recBase}, mb.id)
	rec = binary.BigEndian.AppendUint64(rec, b.Index)
	rec = binary.BigEndian.AppendUint32(rec, b.Epoch)
	var r byte
	if reset {
		r = 1
	}
	rec = append(rec, r)
	if mb.base != nil {
		// An install while a compaction's base is pending: both free
		// once the later one is durable (records complete in order).
		frees = append(frees, mb.base.frees...)
		frees = append(frees, mb.base.rec)
	}
	pb := &pendingBase{frees: frees}
	mb.base = pb
	pb.rec = n.j.Append(rec, func(p journal.Pos, err error) {
		done(p, err)
		if err != nil {
			return // persisted reports it, or the next write does
		}
		mb.dur.Lock()
		mb.dur.baseDone = max(mb.dur.baseDone, p)
		mb.dur.Unlock()
		select {
		case n.durable <- struct{}{}:
		default:
		}
	})
}

// persisted returns the journal completion that tells mb its log is
// durable up to index, unless a truncation since (gen) makes it stale. It
// runs on the journal's writer and only records the news.
func (n *Node) persisted(mb *member, gen, index uint64) journal.Completion {
	return func(_ journal.Pos, err error) {
		mb.dur.Lock()
		if err != nil && mb.dur.err == nil {
			mb.dur.err = err
		}
		if gen >= mb.dur.gen {
			mb.dur.gen, mb.dur.index, mb.dur.set = gen, index, true
		}
		mb.dur.Unlock()
		select {
		case n.durable <- struct{}{}:
		default:
		}
	}
}

// takeDurable passes what the journal made durable to mb's state machine.
func (n *Node) takeDurable(mb *member) {
	mb.dur.Lock()
	gen, index, set, err := mb.dur.gen, mb.dur.index, mb.dur.set, mb.dur.err
	baseDone := mb.dur.baseDone
	mb.dur.set = false
	mb.dur.Unlock()
	if mb.base != nil && baseDone >= mb.base.rec {
		for _, p := range mb.base.frees {
			n.j.Free(p)
		}
		if mb.baseRec != 0 {
			n.j.Free(mb.baseRec)
		}
		mb.baseRec = mb.base.rec
		mb.base = nil
	}
	if err != nil {
		n.fail(err)
	}
	if set && gen == mb.gen && mb.broken == nil {
		mb.m.Persisted(index)
		n.touch(mb)
	}
}

// Close stops the node and closes its journal. Proposals waiting end with
// ErrClosed.
func (n *Node) Close() error {
	select {
	case <-n.done:
		return nil
	default:
	}
	close(n.done)
	<-n.exited
	return n.j.Close()
}

// replayLog is one group's log as a replay of the journal rebuilds it.
type replayLog struct {
	base    group.Base
	baseRec journal.Pos
	log     []group.Entry // contiguous from first
	pos     []journal.Pos
	first   uint64
	// stale are records the owner freed before the restart: entries at or
	// before the base, and older base records.
	stale []journal.Pos
}

func (l *replayLog) end() uint64 { return l.first + uint64(len(l.log)) }

func (l *replayLog) entry(e group.Entry, pos journal.Pos) error {
	switch {
	case e.Index <= l.base.Index:
		l.stale = append(l.stale, pos) // freed, not reclaimed yet
		return nil
	case len(l.log) > 0 && e.Index < l.end():
		return fmt.Errorf("groups: group entry %d after %d without a truncation", e.Index, l.end()-1)
	case len(l.log) > 0 && e.Index > l.end():
		// A gap: what came before it were freed records (their base
		// record comes later); check() refuses a gap that stays.
		l.stale = append(l.stale, l.pos...)
		l.log, l.pos = nil, nil
	}
	if len(l.log) == 0 {
		l.first = e.Index
	}
	l.log = append(l.log, e)
	l.pos = append(l.pos, pos)
	return nil
}

func (l *replayLog) truncate(after uint64) {
	switch {
	case after+1 < l.first:
		l.stale = append(l.stale, l.pos...)
		l.log, l.pos, l.first = nil, nil, after+1
	case after+1 < l.end():
		k := after + 1 - l.first
		l.stale = append(l.stale, l.pos[k:]...)
		l.log, l.pos = l.log[:k], l.pos[:k]
	}
}

func (l *replayLog) setBase(b group.Base, reset bool, pos journal.Pos) {
	if l.baseRec != 0 {
		l.stale = append(l.stale, l.baseRec)
	}
	l.base, l.baseRec = b, pos
	k := uint64(len(l.log))
	if !reset && b.Index+1 < l.end() {
		k = min(k, b.Index+1-min(b.Index+1, l.first))
	}
	l.stale = append(l.stale, l.pos[:k]...)
	l.log, l.pos = l.log[k:], l.pos[k:]
	l.first += k
	if len(l.log) == 0 {
		l.first = b.Index + 1
	}
}

// check reports a log that does not go on from its base.
func (l *replayLog) check() error {
	if len(l.log) > 0 && l.first != l.base.Index+1 {
		return fmt.Errorf("the log resumes at %d after its base %d: records are missing", l.first, l.base.Index)
	}
	l.log = slices.Clip(l.log)
	return nil
}

// MemoryBytes is what the node holds in memory outside its groups' logs:
// the group journal's index (journal.IndexBytes) and the frames queued
// for peers in its transport (Transport.QueuedBytes). Safe from any
// goroutine; the shards count it against the memory budget.
func (n *Node) MemoryBytes() int64 {
	b := n.j.IndexBytes()
	if t := n.cfg.Transport; t != nil {
		b += t.QueuedBytes()
	}
	return b
}

// JournalStats reports the group journal's statistics.
func (n *Node) JournalStats() journal.Stats { return n.j.Stats() }
