package groups

import (
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
	"github.com/berthmq/berth/shards/group"
	"github.com/berthmq/berth/wire"
)

// Journal records of the group log. Truncations and epochs are records
// too: the journal only appends, and a replay applies them in order.
const (
	recEntry    byte = 1 // group u32, epoch u32, index u64, data
	recTruncate byte = 2 // group u32, after u64
	recEpoch    byte = 3 // group u32, epoch u32
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
	// Apply is called, on the node's goroutine, with each committed entry
	// in log order.
	Apply func(group uint32, e wire.GroupEntry)
	// OnAlter is called, on the node's goroutine, when a master asks the
	// controller to change its SyncStateSet.
	OnAlter func(group uint32, a group.AlterSet)
	// OnMaster is called, on the node's goroutine, when this broker
	// becomes the master of a group.
	OnMaster func(group uint32)
	// OnStepDown is called, on the node's goroutine, when this broker
	// stops being the master of a group, before the group's committed
	// entries are applied again from the first: the applied state of the
	// group is to be dropped.
	OnStepDown func(group uint32)
	Logger     *slog.Logger

	// ReplicaSets is each group's replica set, as the controller placed
	// it (MinSync's majority is of the group's own set).
	ReplicaSets map[uint32][]uint32
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
	inbox   chan func()
	// durable wakes the node when the journal has made records durable
	// (member.dur): the journal's writer never waits for the node.
	durable chan struct{}
	done    chan struct{}
	exited  chan struct{}
	// dirty lists the members changed since their last Ready: the node
	// takes every event waiting (up to inboxBatch) before it carries out
	// any Ready, so a burst of proposals or messages becomes one batch of
	// journal writes and one Append per follower.
	dirty []*member
}

// inboxBatch bounds the events taken before the Readies are carried out.
const inboxBatch = 1024

type member struct {
	id    uint32
	m     *group.Member
	gen   uint64 // bumped by each truncation: older completions are stale
	epoch uint32 // last epoch journaled
	waits map[uint64]func(error)
	// master mirrors m.Role() == RoleMaster for other goroutines.
	master atomic.Bool
	broken error // a journal failure: the member stops
	dirty  bool  // listed in Node.dirty

	// dur is what the journal's writer reported durable, for the node's
	// goroutine to pass on.
	dur struct {
		sync.Mutex
		gen, index uint64
		set        bool
		err        error
	}
}

// noCompletion is the completion of records whose durability a later
// record's completion reports (records complete in order).
var noCompletion journal.Completion = func(journal.Pos, error) {}

// ErrClosed is returned by calls on a closed node.
var ErrClosed = errors.New("groups: node closed")

// OpenNode replays the journal in cfg.Dir and starts the node.
func OpenNode(cfg NodeConfig) (*Node, error) {
	if cfg.Tick <= 0 {
		cfg.Tick = 20 * time.Millisecond
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Apply == nil {
		cfg.Apply = func(uint32, wire.GroupEntry) {}
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
	logs := map[uint32][]group.Entry{}
	epochs := map[uint32]uint32{}
	replay := func(_ journal.Pos, _ journal.Pos, data []byte) error {
		if len(data) < 5 {
			return fmt.Errorf("groups: journal record of %d bytes", len(data))
		}
		g := binary.BigEndian.Uint32(data[1:])
		switch data[0] {
		case recEntry:
			if len(data) < 17 {
				return errors.New("groups: short entry record")
			}
			e := group.Entry{Epoch: binary.BigEndian.Uint32(data[5:]), Index: binary.BigEndian.Uint64(data[9:]), Data: slices.Clone(data[17:])}
			l := logs[g]
			if want := uint64(len(l)) + 1; e.Index != want {
				return fmt.Errorf("groups: group %d entry %d after %d", g, e.Index, len(l))
			}
			logs[g] = append(l, e)
		case recTruncate:
			if len(data) < 13 {
				return errors.New("groups: short truncate record")
			}
			after := binary.BigEndian.Uint64(data[5:])
			if l := logs[g]; after < uint64(len(l)) {
				logs[g] = l[:after]
			}
		case recEpoch:
			if len(data) < 9 {
				return errors.New("groups: short epoch record")
			}
			epochs[g] = max(epochs[g], binary.BigEndian.Uint32(data[5:]))
		default:
			return fmt.Errorf("groups: journal record of unknown kind %d", data[0])
		}
		return nil
	}
	j, err := journal.Open(journal.Options{Dir: cfg.Dir, Fsync: cfg.Fsync, FS: cfg.FS, Logger: cfg.Logger}, replay)
	if err != nil {
		return nil, err
	}
	n := &Node{cfg: cfg, log: cfg.Logger, j: j, members: map[uint32]*member{},
		inbox: make(chan func(), inboxMax), durable: make(chan struct{}, 1), done: make(chan struct{}), exited: make(chan struct{})}
	for _, g := range cfg.Groups {
		for _, e := range logs[g] {
			epochs[g] = max(epochs[g], e.Epoch)
		}
		replicas := cfg.Replicas
		if set, ok := cfg.ReplicaSets[g]; ok {
			replicas = set
		}
		m := group.New(group.Config{Group: g, ID: cfg.ID, Replicas: replicas, MinSync: cfg.MinSync, LagTicks: cfg.LagTicks}, logs[g], epochs[g])
		n.members[g] = &member{id: g, m: m, epoch: epochs[g], waits: map[uint64]func(error){}}
	}
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
		case <-n.durable:
			for _, g := range n.sortedGroups() {
				n.takeDurable(n.members[g])
			}
		case <-t.C:
			for _, g := range n.sortedGroups() {
				mb := n.members[g]
				if mb.broken == nil {
					mb.m.Tick()
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
func (n *Node) AlterRefused(g, epoch uint32) error {
	return n.withMember(g, func(m *group.Member) { m.AlterRefused(epoch) })
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
	LastIndex uint64     `json:"last_index"`
	Commit    uint64     `json:"commit"`
	Applied   uint64     `json:"applied"`
	Dur       uint64     `json:"durable"`
	Set       []uint32   `json:"sync_state_set,omitempty"` // a master's
}

// Status reports group g's state.
func (n *Node) Status(g uint32) (Status, error) {
	var st Status
	err := n.withMember(g, func(m *group.Member) {
		st = Status{Group: g, Role: m.Role(), RoleName: [...]string{"none", "follower", "master"}[m.Role()], Epoch: m.Epoch(),
			Master: m.Master(), LastIndex: m.LastIndex(), Commit: m.Commit(), Applied: m.Applied(), Dur: m.Durable(),
			Set: slices.Clone(m.SyncStateSet())}
	})
	return st, err
}

// LogEnds reports every group's durable log end, for the heartbeats that
// the controller's elections are decided from.
func (n *Node) LogEnds() []ctlapi.GroupLogEnd {
	var out []ctlapi.GroupLogEnd
	_ = n.do(func() {
		for _, g := range n.sortedGroups() {
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

// ErrBusy is returned when the node's inbox is full.
var ErrBusy = errors.New("groups: the group node is busy; retry")

// IsMaster reports whether this node is the master of group g and has
// applied everything earlier masters committed (group.Member.Serving).
// It is safe from any goroutine.
func (n *Node) IsMaster(g uint32) bool {
	mb := n.members[g] // the map does not change after OpenNode
	return mb != nil && mb.master.Load()
}

// ProposeAsync appends data to group g's log through this node, which must
// be the group's master, without waiting: done is called on the node's
// goroutine with nil once the entry is committed and applied here, with
// group.ErrNotMaster when the node stops being master first (the outcome
// is unknown), or with why it was not proposed. ErrBusy (inbox full) and
// ErrClosed are returned at once and done is not called.
func (n *Node) ProposeAsync(g uint32, data []byte, done func(error)) error {
	f := func() {
		mb := n.members[g]
		if mb == nil {
			done(fmt.Errorf("groups: no group %d on this node", g))
			return
		}
		if mb.broken != nil {
			done(mb.broken)
			return
		}
		idx, err := mb.m.Propose(data)
		if err != nil {
			done(err)
			return
		}
		mb.waits[idx] = done
		n.touch(mb)
	}
	select {
	case <-n.done:
		return ErrClosed
	default:
	}
	select {
	case n.inbox <- f:
		return nil
	default:
		return ErrBusy
	}
}

// Propose is ProposeAsync that waits for the outcome, or for ctx (then
// the outcome is unknown).
func (n *Node) Propose(ctx context.Context, g uint32, data []byte) error {
	ch := make(chan error, 1)
	if err := n.ProposeAsync(g, data, func(err error) { ch <- err }); err != nil {
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

// ready carries out what a member asks for.
func (n *Node) ready(mb *member) {
	rd := mb.m.Ready()
	g := mb.id
	if e := mb.m.Epoch(); e > mb.epoch {
		mb.epoch = e
		rec := binary.BigEndian.AppendUint32([]byte{recEpoch}, g)
		n.j.Append(binary.BigEndian.AppendUint32(rec, e), noCompletion)
	}
	if rd.Truncate {
		mb.gen++
		gen, after := mb.gen, rd.TruncateAfter
		rec := binary.BigEndian.AppendUint32([]byte{recTruncate}, g)
		rec = binary.BigEndian.AppendUint64(rec, after)
		n.j.Append(rec, n.persisted(mb, gen, after))
	}
	for i, e := range rd.Persist {
		rec := make([]byte, 0, 17+len(e.Data))
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
		n.j.Append(rec, done)
	}
	for i := range rd.Messages {
		n.cfg.Transport.Send(&rd.Messages[i])
	}
	for _, e := range rd.Apply {
		n.cfg.Apply(g, e)
	}
	for _, c := range rd.Completed {
		if done, ok := mb.waits[c.Index]; ok {
			delete(mb.waits, c.Index)
			done(c.Err)
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
	if rd.AlterSet != nil {
		n.cfg.OnAlter(g, *rd.AlterSet)
	}
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
	mb.dur.set = false
	mb.dur.Unlock()
	if err != nil && mb.broken == nil {
		mb.broken = fmt.Errorf("groups: journal write failed: %w", err)
		n.log.Error("groups: group stopped on a journal failure", "group", mb.id, "err", err)
		for idx, done := range mb.waits {
			delete(mb.waits, idx)
			done(mb.broken)
		}
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
