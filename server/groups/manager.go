package groups

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
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
	"github.com/berthmq/berth/shards/group"
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
	Ctl       *ctlclient.Client
	// Replicas is how many brokers hold every group. The manager waits
	// until that many brokers have registered and takes the lowest ids.
	Replicas int
	Apply    func(group uint32, e wire.GroupEntry)
	// OnMaster is told, on the node's goroutine, that this broker became
	// master of a group.
	OnMaster func(group uint32)
	// OnStepDown: see NodeConfig.OnStepDown.
	OnStepDown func(group uint32)
	// OnGroupCount is told the cluster's group count once it is known,
	// before the node opens.
	OnGroupCount func(groups uint32)
	// Auth proves cluster membership on every peer connection (nil: none).
	Auth   *peerauth.Auth
	Logger *slog.Logger
}

// Manager runs a broker's replication groups as the controller assigns
// them: it publishes its peer address, waits for the cluster's group count
// and the replica brokers, opens a Node for the groups, and from then on
// passes every controller decision (master, epoch, SyncStateSet) to it,
// asks for the first elections, and sends its SyncStateSet requests to the
// controller.
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

	mu sync.Mutex
	// node is read on every replicated publish: no lock.
	node atomic.Pointer[Node]
	seen map[uint32]ctlapi.Group // the group records last passed on

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
	if cfg.Replicas <= 0 {
		cfg.Replicas = 3
	}
	m := &Manager{cfg: cfg, log: cfg.Logger, seen: map[uint32]ctlapi.Group{}, alive: make(chan struct{})}
	tr, err := ListenAuth(cfg.PeerAddr, cfg.Self, cfg.Auth, func(msg *wire.GroupMessage) {
		if n := m.currentNode(); n != nil {
			n.Deliver(msg)
		}
	}, cfg.Logger)
	if err != nil {
		return nil, err
	}
	m.tr = tr
	if m.cfg.Advertise == "" {
		m.cfg.Advertise = tr.Addr()
	}
	m.ctx, m.cancel = context.WithCancel(context.Background())
	m.wg.Add(1)
	go m.run()
	return m, nil
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

// Close stops following the controller, the node and the transport.
func (m *Manager) Close() {
	m.cancel()
	m.wg.Wait()
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

func (m *Manager) call(f func(ctx context.Context) error) error {
	ctx, cancel := context.WithTimeout(m.ctx, 5*time.Second)
	defer cancel()
	return f(ctx)
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
	// Wait for the group count and the replica brokers' peer addresses.
	var groups uint32
	var replicas []uint32
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
			bs, err := cl.GetBrokers(ctx, ctlapi.ReadConsistent)
			if err != nil {
				return err
			}
			if len(bs) < m.cfg.Replicas {
				return fmt.Errorf("%d of %d brokers registered", len(bs), m.cfg.Replicas)
			}
			ids := make([]uint32, 0, len(bs))
			for _, b := range bs {
				ids = append(ids, b.ID)
			}
			slices.Sort(ids)
			replicas = ids[:m.cfg.Replicas]
			for _, id := range replicas {
				if id == m.cfg.Self {
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
	if !slices.Contains(replicas, m.cfg.Self) {
		m.log.Warn("groups: this broker is not among the group replicas", "broker_id", m.cfg.Self, "replicas", replicas)
		return
	}
	if m.cfg.OnGroupCount != nil {
		m.cfg.OnGroupCount(groups)
	}
	ids := make([]uint32, groups)
	for i := range ids {
		ids[i] = uint32(i)
	}
	n, err := OpenNode(NodeConfig{ID: m.cfg.Self, Dir: m.cfg.Dir, Fsync: m.cfg.Fsync, Transport: m.tr, Groups: ids,
		Replicas: replicas, Apply: m.cfg.Apply, OnAlter: m.alter, OnMaster: m.cfg.OnMaster, OnStepDown: m.cfg.OnStepDown, Logger: m.log})
	if err != nil {
		m.log.Error("groups: open the group journal; the broker serves no group", "err", err)
		return
	}
	m.node.Store(n)
	m.log.Info("groups: replicating", "groups", groups, "replicas", replicas, "peer", m.cfg.Advertise)
	m.follow(groups)
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
			gs = gs[:0]
			for start := uint32(0); start < groups; {
				page, _, err := cl.GetGroups(ctx, ctlapi.ReadConsistent, start, 1024)
				if err != nil {
					return err
				}
				if len(page) == 0 {
					break
				}
				gs = append(gs, page...)
				start += uint32(len(page))
			}
			return nil
		})
		if err == nil {
			m.update(gs)
		} else if !m.retry() {
			return
		}
		ctx, cancel := context.WithTimeout(m.ctx, 5*time.Second)
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
			unelected = append(unelected, g.ID)
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
		m.log.Info("groups: asking for a new epoch of a group this broker mastered before it restarted", "group", g)
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
		// Every broker may ask; an election of a group already elected
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

// alter sends a master's SyncStateSet request to the controller, off the
// node's goroutine, and passes the answer back.
func (m *Manager) alter(g uint32, a group.AlterSet) {
	m.wg.Add(1)
	go func() {
		defer m.wg.Done()
		n := m.currentNode()
		err := m.call(func(ctx context.Context) error {
			return m.cfg.Ctl.AlterSyncStateSet(ctx, g, m.cfg.Self, a.Epoch, a.Set)
		})
		if err == nil {
			_ = n.SetSyncStateSet(g, a.Epoch, a.Set)
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
