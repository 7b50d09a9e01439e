package groups

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"math"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/berthmq/berth/controlplane/ctlapi"
	"github.com/berthmq/berth/controlplane/ctlclient"
	"github.com/berthmq/berth/internal/peerauth"
	"github.com/berthmq/berth/journal"
	"github.com/berthmq/berth/replication/group"
	"github.com/berthmq/berth/wire"
)

// PeerAttribute is the controller attribute under which a broker publishes
// its peer address: "peer/" and its broker id.
func PeerAttribute(id uint32) string { return "peer/" + strconv.FormatUint(uint64(id), 10) }

// ManagerConfig configures a broker's group manager.
type ManagerConfig struct {
	Self     uint32
	PeerAddr string // where this broker's transport listens
	// Advertise is the peer address published for the others; default the
	// bound address.
	Advertise string
	Dir       string // the group journal's directory
	Fsync     journal.FsyncPolicy
	FS        journal.FS // the group journal's file system; nil: the OS's
	Ctl       *ctlclient.Client
	Apply     func(group uint32, e wire.GroupEntry) error
	// OnMaster is told, on the node's goroutine, that this broker became
	// master of a group.
	OnMaster func(group uint32)
	// PagedReplay: see NodeConfig.PagedReplay.
	PagedReplay bool
	// OnStepDown: see NodeConfig.OnStepDown.
	OnStepDown func(group uint32)
	// Lease and OnDeliver: see NodeConfig.Lease and NodeConfig.OnDeliver.
	// The broker's heartbeats renew the lease (Granted).
	Lease     time.Duration
	OnDeliver func(group uint32)
	// OnGroupCount is told the cluster's group count once it is known,
	// before the node opens.
	OnGroupCount func(groups uint32)
	// Auth proves cluster membership on every peer connection (nil: none).
	Auth   *peerauth.Auth
	Logger *slog.Logger
	// OnForward takes the events other brokers forward to this one as a
	// group's master (forward.go); nil refuses forwarding connections.
	OnForward ForwardHandler
	// OnView is told, on the manager's goroutine, each new View after the
	// one before (nil at first).
	OnView func(old, cur *View)
	// OnProxy runs the sessions other brokers proxy to this one as a
	// group's master (forward.go); zero refuses them.
	OnProxy ProxyHandler
	// HandoverHolds: see group.Config.HandoverHolds.
	HandoverHolds func(data []byte) bool
	// Rebalance is how often the manager looks for groups it masters
	// whose preferred master (the placement's first replica) is back in
	// their SyncStateSet, and hands them over to it (rebalance.go); 0
	// turns rebalancing off.
	Rebalance time.Duration
	// Lag is how long a follower may go without acknowledging before its
	// master takes it out of the group's SyncStateSet; 0 means LagDefault.
	Lag time.Duration
	// ForwardError builds the error of a forward the master refused;
	// default a plain error with the master's text.
	ForwardError func(code wire.ErrorCode, text string) error
}

// Manager runs a broker's replication groups as the controller placed
// them: it publishes its peer address, waits for the cluster's group count
// and placement, opens a Node for the groups whose replica set holds this
// broker (none: the broker only forwards), and from then on passes every
// controller decision (master, epoch, SyncStateSet) to it, asks for the
// first elections, and sends its SyncStateSet requests to the controller.
// It keeps the controller's view of every group's master and of the
// brokers' addresses (View) for forwarding to masters.
type Manager struct {
	cfg ManagerConfig
	log *slog.Logger
	tr  *Transport

	// alive is closed once the controller has taken a heartbeat of this
	// broker (Heartbeated): only then does the broker publish its peer
	// address, so a broker that sees every replica's address knows the
	// controller counts them all alive, and the first elections spread
	// the masters over all of them.
	alive     chan struct{}
	aliveOnce sync.Once

	fwd *Forwarder

	mu sync.Mutex
	// asking holds the brokers whose lost connection has an election
	// request going (masterLost); guarded by mu, like closing.
	asking  map[uint32]bool
	closing bool
	// moved is closed (and replaced) when the controller leader moves;
	// guarded by mu.
	moved chan struct{}
	// node is read on every replicated publish: no lock.
	node atomic.Pointer[Node]
	// openErr is why the group journal could not be opened, if it
	// could not (Failed).
	openErr atomic.Pointer[error]
	seen    map[uint32]ctlapi.Group // the group records last passed on

	view atomic.Pointer[View]

	handovers atomic.Uint64 // groups this broker handed to their preferred master

	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup
}

// StartManager binds the peer transport and starts following the
// controller in the background.
func StartManager(cfg ManagerConfig) (*Manager, error) {
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	m := &Manager{cfg: cfg, log: cfg.Logger, seen: map[uint32]ctlapi.Group{}, alive: make(chan struct{}), asking: map[uint32]bool{},
		moved: make(chan struct{})}
	tr, err := ListenAuth(cfg.PeerAddr, cfg.Self, cfg.Auth, func(msg *wire.GroupMessage) {
		if n := m.currentNode(); n != nil {
			n.Deliver(msg)
		}
	}, cfg.Logger)
	if err != nil {
		return nil, err
	}
	m.tr = tr
	if cfg.OnForward != nil {
		tr.SetForwardHandler(cfg.OnForward)
	}
	if cfg.OnProxy.Command != nil {
		tr.SetProxyHandler(cfg.OnProxy)
	}
	if cfg.ForwardError == nil {
		cfg.ForwardError = func(code wire.ErrorCode, text string) error {
			return fmt.Errorf("groups: the master refused (%v): %s", code, text)
		}
	}
	m.fwd = NewForwarder(cfg.Self, cfg.Auth, cfg.ForwardError, cfg.Logger)
	if m.cfg.Advertise == "" {
		m.cfg.Advertise = tr.Addr()
	}
	m.ctx, m.cancel = context.WithCancel(context.Background())
	tr.SetPeerLost(m.masterLost)
	m.wg.Add(1)
	go m.run()
	return m, nil
}

// ControllerLeaderMoved tells the manager that the controller has a new
// leader: the wait for the next change, which may hang on a frozen old
// leader until it times out, ends, and the groups are read again from the
// new one at once.
func (m *Manager) ControllerLeaderMoved() {
	m.mu.Lock()
	defer m.mu.Unlock()
	close(m.moved)
	m.moved = make(chan struct{})
}

// leaderMoved is closed when the controller leader next moves.
func (m *Manager) leaderMoved() <-chan struct{} {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.moved
}

// Granted passes the controller's answer to a heartbeat sent at sent to
// the node (Node.Granted): it renews the leases of the groups this broker
// masters.
func (m *Manager) Granted(sent time.Time, r ctlapi.HeartbeatReply) {
	if n := m.node.Load(); n != nil {
		n.Granted(sent, r)
	}
}

// Heartbeated tells the manager that the controller took a heartbeat of
// this broker.
func (m *Manager) Heartbeated() { m.aliveOnce.Do(func() { close(m.alive) }) }

// PeerAddr is the transport's bound address.
func (m *Manager) PeerAddr() string { return m.tr.Addr() }

func (m *Manager) currentNode() *Node { return m.node.Load() }

// Node is the running node, or nil before the groups are known.
func (m *Manager) Node() *Node { return m.currentNode() }

// LogEnds are the groups' durable log ends, for heartbeats.
func (m *Manager) LogEnds() []ctlapi.GroupLogEnd {
	n := m.currentNode()
	if n == nil {
		return nil
	}
	return n.LogEnds()
}

// Forwarder sends events to the groups' masters.
func (m *Manager) Forwarder() *Forwarder { return m.fwd }

// Close stops following the controller, the forwards, the node and the
// transport.
func (m *Manager) Close() {
	m.mu.Lock()
	m.closing = true
	m.mu.Unlock()
	m.cancel()
	m.wg.Wait()
	m.fwd.Close()
	if n := m.currentNode(); n != nil {
		if err := n.Close(); err != nil {
			m.log.Error("groups: close the group journal", "err", err)
		}
	}
	m.tr.Close()
}

// retry waits a little, unless the manager is closing.
func (m *Manager) retry() bool {
	select {
	case <-m.ctx.Done():
		return false
	case <-time.After(200 * time.Millisecond):
		return true
	}
}

// callTimeout bounds one attempt of a call to the controller;
// callMovedTries bounds the attempts a call makes when the controller
// leader keeps moving under it.
const (
	callTimeout    = 5 * time.Second
	callMovedTries = 4
)

// call runs f, a request to the controller leader, bounded by
// callTimeout. An attempt ends early when this broker's controller
// member sees a new leader (ControllerLeaderMoved), and f runs again at
// once against it: a request sent to a leader that froze (SIGSTOP, a
// hung machine) would otherwise wait out the whole timeout, and a group
// update it was reading would reach this broker that much later (5 s
// after a frozen master that led the controller, against about half a
// second with this). Callers' requests are idempotent or fenced (an
// election of a group already elected changes nothing; an
// AlterSyncStateSet carries the set it was made from).
func (m *Manager) call(f func(ctx context.Context) error) error {
	for try := 1; ; try++ {
		moved := m.leaderMoved()
		ctx, cancel := context.WithTimeout(m.ctx, callTimeout)
		cancelOnMove(ctx, cancel, moved)
		err := f(ctx)
		cancel()
		if err == nil || !isClosed(moved) || m.ctx.Err() != nil || try == callMovedTries {
			return err
		}
	}
}

func (m *Manager) run() {
	defer m.wg.Done()
	cl := m.cfg.Ctl
	select {
	case <-m.alive:
	case <-m.ctx.Done():
		return
	}
	// Publish where the others reach this broker's transport.
	for m.call(func(ctx context.Context) error {
		return cl.SetAttribute(ctx, PeerAttribute(m.cfg.Self), m.cfg.Advertise)
	}) != nil {
		if !m.retry() {
			return
		}
	}
	// Wait for the group count, the placement and the peer addresses of
	// the brokers sharing a group with this one.
	var groups uint32
	sets := map[uint32][]uint32{} // this broker's groups' replica sets
	for {
		err := m.call(func(ctx context.Context) error {
			info, err := cl.GetClusterInfo(ctx, ctlapi.ReadConsistent)
			if err != nil {
				return err
			}
			groups = info.Config.Groups
			if groups == 0 {
				return errors.New("the cluster has no groups yet")
			}
			gs, err := m.readGroups(ctx, groups)
			if err != nil {
				return err
			}
			clear(sets)
			peers := map[uint32]bool{}
			for _, g := range gs {
				if len(g.Replicas) == 0 {
					return fmt.Errorf("group %d is not placed yet (no broker was registered at cluster init; run it again)", g.ID)
				}
				if slices.Contains(g.Replicas, m.cfg.Self) {
					sets[g.ID] = g.Replicas
					for _, id := range g.Replicas {
						peers[id] = id != m.cfg.Self
					}
				}
			}
			for id, need := range peers {
				if !need {
					continue
				}
				addr, ok, err := cl.GetAttribute(ctx, ctlapi.ReadConsistent, PeerAttribute(id))
				if err != nil {
					return err
				}
				if !ok {
					return fmt.Errorf("broker %d has no peer address yet", id)
				}
				m.tr.SetPeer(id, addr)
			}
			return nil
		})
		if err == nil {
			break
		}
		m.log.Debug("groups: waiting for the cluster", "err", err)
		if !m.retry() {
			return
		}
	}
	if m.cfg.OnGroupCount != nil {
		m.cfg.OnGroupCount(groups)
	}
	ids := slices.Sorted(maps.Keys(sets))
	if len(ids) == 0 {
		m.log.Info("groups: this broker holds no group; it forwards to the groups' masters", "broker_id", m.cfg.Self, "groups", groups)
	} else {
		n, err := OpenNode(NodeConfig{ID: m.cfg.Self, Dir: m.cfg.Dir, Fsync: m.cfg.Fsync, FS: m.cfg.FS, Transport: m.tr, Groups: ids, LagTicks: lagTicks(m.cfg.Lag),
			ReplicaSets: sets, PagedReplay: m.cfg.PagedReplay, HandoverHolds: m.cfg.HandoverHolds, Apply: m.cfg.Apply, OnAlter: m.alter, OnMaster: m.cfg.OnMaster, OnStepDown: m.cfg.OnStepDown,
			Lease: m.cfg.Lease, OnDeliver: m.cfg.OnDeliver, Logger: m.log})
		if err != nil {
			// Failed says so from now on: /readyz, and no heartbeats,
			// so that the controller elects other masters. The broker
			// still follows the groups' masters, to forward to them.
			m.log.Error("groups: open the group journal; the broker serves no group", "err", err)
			m.openErr.Store(&err)
		} else {
			m.node.Store(n)
			m.log.Info("groups: replicating", "groups", groups, "held", len(ids), "peer", m.cfg.Advertise)
			if m.cfg.Rebalance > 0 {
				m.wg.Add(1)
				go m.rebalance(n, m.cfg.Rebalance)
			}
		}
	}
	m.follow(groups)
}

// readGroups reads all groups' records, a page at a time.
func (m *Manager) readGroups(ctx context.Context, groups uint32) ([]ctlapi.Group, error) {
	var gs []ctlapi.Group
	for start := uint32(0); start < groups; {
		page, _, err := m.cfg.Ctl.GetGroups(ctx, ctlapi.ReadConsistent, start, 1024)
		if err != nil {
			return nil, err
		}
		if len(page) == 0 {
			break
		}
		gs = append(gs, page...)
		start += uint32(len(page))
	}
	return gs, nil
}

// follow passes the controller's group records to the node whenever the
// controller's state moves, and asks for the first election of groups
// never elected. It reads at the leader (consistent reads): a follower
// read may go to a member that is frozen or cut off, and a broker must not
// miss that it became master.
func (m *Manager) follow(groups uint32) {
	cl := m.cfg.Ctl
	var applied uint64
	for {
		var gs []ctlapi.Group
		err := m.call(func(ctx context.Context) error {
			var err error
			if gs, err = m.readGroups(ctx, groups); err != nil {
				return err
			}
			return m.refreshView(ctx, gs)
		})
		if err == nil {
			m.update(gs)
		} else if !m.retry() {
			return
		}
		ctx, cancel := context.WithTimeout(m.ctx, callTimeout)
		cancelOnMove(ctx, cancel, m.leaderMoved())
		idx, err := cl.WaitChange(ctx, applied)
		cancel()
		if m.ctx.Err() != nil {
			return
		}
		if err == nil {
			applied = idx
		}
	}
}

func (m *Manager) update(gs []ctlapi.Group) {
	n := m.currentNode()
	var unelected []uint32
	var stale []ctlapi.Group
	for _, g := range gs {
		if g.Epoch == 0 {
			// Only a replica asks: it opened its node once every replica
			// of its groups published its peer address, which each does
			// after the controller took its heartbeat, so all of them
			// are candidates alive and the placement's first master wins.
			if n != nil && slices.Contains(g.Replicas, m.cfg.Self) {
				unelected = append(unelected, g.ID)
			}
			continue
		}
		if n == nil || !slices.Contains(g.Replicas, m.cfg.Self) {
			continue // the View has it, for forwarding
		}
		if n.Stopped(g.ID) {
			// This broker's member stopped on an entry it could not
			// apply: it takes no decision any more, and a group it
			// masters needs another master.
			if g.Master == m.cfg.Self {
				stale = append(stale, g)
			}
			continue
		}
		old, seen := m.seen[g.ID]
		if seen && old.Epoch == g.Epoch && old.Master == g.Master && slices.Equal(old.SyncStateSet, g.SyncStateSet) {
			continue
		}
		var err error
		switch {
		case g.Master == m.cfg.Self:
			if !seen || old.Epoch != g.Epoch || old.Master != g.Master {
				err = n.BecomeMaster(g.ID, g.Epoch, g.SyncStateSet)
				if st, serr := n.Status(g.ID); err == nil && serr == nil && st.Role != group.RoleMaster && st.Epoch >= g.Epoch {
					// This broker restarted after the controller made it
					// master of the epoch, and the controller did not see
					// it die: a member never masters an epoch it knew
					// before a restart, so the group needs a new one.
					stale = append(stale, g)
					continue
				}
			}
			if err == nil {
				err = n.SetSyncStateSet(g.ID, g.Epoch, g.SyncStateSet)
			}
		case g.Master != 0:
			err = n.BecomeFollower(g.ID, g.Epoch, g.Master)
		default:
			// Fenced with no live member of its set: ask again, so a
			// member that came back is elected.
			unelected = append(unelected, g.ID)
		}
		if err != nil {
			m.log.Warn("groups: pass a controller decision on", "group", g.ID, "err", err)
			continue
		}
		m.seen[g.ID] = g
	}
	for _, sg := range stale {
		g := sg.ID
		// A live master keeps its group unless another broker is
		// preferred: name one, so the controller elects under a new
		// epoch (this broker may win it again).
		pref := uint32(math.MaxUint32) // no such broker
		for _, id := range sg.SyncStateSet {
			if id != m.cfg.Self {
				pref = id
				break
			}
		}
		m.log.Info("groups: asking for a new epoch of a group this broker mastered before it restarted, or whose member here stopped", "group", g)
		err := m.call(func(ctx context.Context) error {
			_, err := m.cfg.Ctl.ElectMaster(ctx, []uint32{g}, pref)
			return err
		})
		if err != nil {
			m.log.Debug("groups: new epoch", "group", g, "err", err)
		}
	}
	if len(unelected)+len(stale) > 0 {
		// The election is an event whatever it decides, which wakes this
		// loop again: ask at most ten times a second.
		defer func() {
			select {
			case <-m.ctx.Done():
			case <-time.After(100 * time.Millisecond):
			}
		}()
	}
	if len(unelected) > 0 {
		// Every replica may ask; an election of a group already elected
		// changes nothing (its epoch moved on).
		err := m.call(func(ctx context.Context) error {
			_, err := m.cfg.Ctl.ElectMaster(ctx, unelected, 0)
			return err
		})
		if err != nil {
			m.log.Debug("groups: first election", "groups", len(unelected), "err", err)
		}
	}
}

// masterLostAskFor bounds how long a follower asks for elections after its
// master's connection dropped; masterLostRetry spaces its attempts while
// the controller has no leader to answer (it may have died with the
// master).
const (
	masterLostAskFor = 5 * time.Second
	masterLostRetry  = 50 * time.Millisecond
)

// masterLost is told that broker id's group connection to this broker
// ended. If id masters groups this broker follows, this broker asks the
// controller for their election at once, after a heartbeat that makes it
// a candidate there with its log ends. The controller may not know yet that
// id died: when it died together with the controller leader, the new
// leader never saw its connection close and would wait out its grace. The
// election is the controller's as always: it keeps a master that
// heartbeats to it (the connection may have dropped for another reason),
// and elects from the SyncStateSet under a new epoch otherwise, which
// fences the old master. A master slow to reach a new leader loses its
// groups (as it would after the grace), nothing worse.
func (m *Manager) masterLost(id uint32) {
	v, n := m.view.Load(), m.currentNode()
	if v == nil || n == nil || id == m.cfg.Self {
		return
	}
	var gs []uint32
	for _, g := range v.Groups {
		// Only a member of the SyncStateSet can win; another's request,
		// reaching a new controller leader before any member of the set
		// heartbeated to it, would leave the group fenced without a
		// master until one does.
		if g.Master == id && slices.Contains(g.SyncStateSet, m.cfg.Self) {
			gs = append(gs, g.ID)
		}
	}
	if len(gs) == 0 {
		return
	}
	m.mu.Lock()
	if m.closing || m.asking[id] {
		m.mu.Unlock()
		return
	}
	m.asking[id] = true
	m.wg.Add(1)
	m.mu.Unlock()
	go func() {
		defer m.wg.Done()
		defer func() {
			m.mu.Lock()
			delete(m.asking, id)
			m.mu.Unlock()
		}()
		m.askElection(n, id, gs)
	}()
}

// askElection heartbeats and asks for the election of gs, mastered by the
// broker lost, until a controller leader answers or masterLostAskFor
// passes.
func (m *Manager) askElection(n *Node, lost uint32, gs []uint32) {
	deadline := time.Now().Add(masterLostAskFor)
	for {
		var elected uint64
		// The controller leader may have died with the master: a try
		// waiting between its attempts for a leader ends as soon as this
		// broker's controller member sees one elected, and the next goes
		// to it at once.
		moved := m.leaderMoved()
		err := m.call(func(ctx context.Context) error {
			ctx, cancel := context.WithCancel(ctx)
			defer cancel()
			cancelOnMove(ctx, cancel, moved)
			if err := n.Failed(); err != nil {
				return err // this broker left its groups: it does not heartbeat them
			}
			if err := m.cfg.Ctl.Heartbeat(ctx, m.cfg.Self, n.LogEnds()); err != nil {
				return err
			}
			var err error
			elected, err = m.cfg.Ctl.ElectMaster(ctx, gs, 0)
			return err
		})
		if err != nil && isClosed(moved) && time.Now().Before(deadline) {
			continue // (an election asked twice changes nothing more)
		}
		if err == nil {
			m.log.Info("groups: asked for elections after the master's connection dropped", "master", lost, "groups", gs, "elected", elected)
			return
		}
		if time.Now().After(deadline) {
			m.log.Debug("groups: elections after the master's connection dropped", "master", lost, "err", err)
			return
		}
		select {
		case <-m.ctx.Done():
			return
		case <-time.After(masterLostRetry):
		}
	}
}

// cancelOnMove cancels ctx when moved closes (the controller leader
// moved) before ctx ends.
func cancelOnMove(ctx context.Context, cancel context.CancelFunc, moved <-chan struct{}) {
	go func() {
		select {
		case <-moved:
			cancel()
		case <-ctx.Done():
		}
	}()
}

func isClosed(c <-chan struct{}) bool {
	select {
	case <-c:
		return true
	default:
		return false
	}
}

// alter sends a master's SyncStateSet request to the controller, off the
// node's goroutine, and passes the answer back.
func (m *Manager) alter(g uint32, a group.AlterSet) {
	m.wg.Add(1)
	go func() {
		defer m.wg.Done()
		n := m.currentNode()
		err := m.call(func(ctx context.Context) error {
			return m.cfg.Ctl.AlterSyncStateSetFrom(ctx, g, m.cfg.Self, a.Epoch, a.From, a.Set)
		})
		if err == nil {
			_ = n.AlterGranted(g, a.Epoch, a.Set)
			return
		}
		var re *ctlapi.ResultError
		if errors.As(err, &re) {
			_ = n.AlterRefused(g, a.Epoch)
			return
		}
		// Unknown outcome (no leader, timeout): the next controller
		// update tells; let the master ask again.
		_ = n.AlterRefused(g, a.Epoch)
	}()
}

// Failed is why this broker serves none of the groups it holds, or nil:
// its group journal failed (Node.Failed), or could not be opened at all.
// Either way the broker must say so and stop heartbeating, so that the
// controller elects other masters and none here.
func (m *Manager) Failed() error {
	if n := m.node.Load(); n != nil {
		return n.Failed()
	}
	if e := m.openErr.Load(); e != nil {
		return fmt.Errorf("%w: %w", ErrJournalFailed, *e)
	}
	return nil
}

// View is the controller's record of every group and of the brokers'
// addresses, as this broker last read it. It is replaced whole, never
// changed: readers may keep it.
type View struct {
	Groups []ctlapi.Group    // by id
	Client map[uint32]string // each broker's first client address
	Peer   map[uint32]string // each group master's peer address, when published
}

// View is the controller's view last read, or nil before the first read.
// It is safe from any goroutine.
func (m *Manager) View() *View { return m.view.Load() }

// refreshView reads the brokers' addresses and the masters' peer
// addresses (a restarted broker may publish a new one), and publishes a
// new View.
func (m *Manager) refreshView(ctx context.Context, gs []ctlapi.Group) error {
	bs, err := m.cfg.Ctl.GetBrokers(ctx, ctlapi.ReadConsistent)
	if err != nil {
		return err
	}
	v := &View{Groups: gs, Client: map[uint32]string{}, Peer: map[uint32]string{}}
	for _, b := range bs {
		if len(b.Addrs) > 0 {
			v.Client[b.ID] = b.Addrs[0]
		}
	}
	asked := map[uint32]bool{}
	for _, g := range gs {
		if g.Master == 0 || g.Master == m.cfg.Self || asked[g.Master] {
			continue
		}
		asked[g.Master] = true
		addr, ok, err := m.cfg.Ctl.GetAttribute(ctx, ctlapi.ReadConsistent, PeerAttribute(g.Master))
		if err != nil {
			return err
		}
		if ok {
			v.Peer[g.Master] = addr
		}
	}
	old := m.view.Swap(v)
	if m.cfg.OnView != nil {
		m.cfg.OnView(old, v)
	}
	return nil
}

// LagDefault is ManagerConfig.Lag's default: a follower that has not
// acknowledged for 500 ms leaves its group's SyncStateSet, so that a
// follower frozen or cut off without its connection closing stalls
// commits for about that long.
const LagDefault = 500 * time.Millisecond

// lagTicks is lag in node ticks (20 ms), at least one.
func lagTicks(lag time.Duration) int {
	if lag <= 0 {
		lag = LagDefault
	}
	return max(1, int(lag/nodeTick))
}
