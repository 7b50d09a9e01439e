package server

// Broker registration with the controller.
//
// A broker that has a controller (ControllerAddr or ControllerPeers, with a
// data directory) has a broker id, kept in DataDir/broker.id. On its first
// start it applies for the next free id (ApplyBrokerID 0) and persists it
// before it serves clients; later starts reuse the file. Start fails if the
// file is corrupt, or if on a first start the controller grants no id within
// wiringTimeout: the wiring load needs the controller at that point anyway.
//
// Once the client listener is bound the broker registers its client address
// and protocol version (RegisterBroker). Start makes one attempt bounded by
// wiringTimeout; if it fails the broker starts anyway, logs it, and the
// background loop retries at every heartbeat interval. Registered, that loop
// heartbeats every ControllerHeartbeat (default 200 ms, a quarter of the
// controller's default broker timeout), each call bounded by one interval,
// and at once when the broker's embedded controller member sees a new
// leader: a new leader gives the brokers only a short grace
// (controlplane.Config.LeaderGrace) before it counts them dead.
// A broker heartbeats only once registered, so the controller never elects
// as primary a broker whose address it does not know. The heartbeats carry
// no group log ends yet: a broker has no replication groups until the
// replicated data plane exists. Close stops the loop first, before the
// controller member stops.

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/berthmq/berth/controlplane"
	"github.com/berthmq/berth/controlplane/ctlapi"
	"github.com/berthmq/berth/controlplane/ctlclient"
	"github.com/berthmq/berth/journal"
	"github.com/berthmq/berth/replication/groups"
	"github.com/berthmq/berth/wire"
)

// brokerIDFile holds this broker's id in DataDir, in decimal.
const brokerIDFile = "broker.id"

// brokerIDFileMax bounds what is read of the id file; a valid one is at
// most 11 bytes.
const brokerIDFileMax = 64

// ControllerHeartbeatDefault is the default interval of a broker's
// heartbeats to the controller: a quarter of its default broker timeout
// (controlplane.BrokerTimeoutDefault).
const ControllerHeartbeatDefault = 200 * time.Millisecond

// ControllerBrokerTimeoutDefault is the embedded controller member's
// default broker timeout (controlplane.BrokerTimeoutDefault).
const ControllerBrokerTimeoutDefault = controlplane.BrokerTimeoutDefault

// registersWithController reports whether this node is a broker that gets
// an id from the controller, registers and heartbeats.
func (c *Config) registersWithController() bool {
	return c.Role == RoleBroker && (c.controllerEmbedded() || c.controllerRemote())
}

// BrokerID is this broker's id in the controller, or 0 when it runs
// without a controller.
func (s *Server) BrokerID() uint32 { return s.brokerID }

// BrokerRegistered reports whether the broker's registration with the
// controller succeeded since this start.
func (s *Server) BrokerRegistered() bool { return s.registered.Load() }

// brokerClient is the controller client registration and heartbeats use:
// in-process with a one-member controller, else the group client.
func (s *Server) brokerClient() *ctlclient.Client {
	if s.ctlClient != nil {
		return s.ctlClient
	}
	if s.ctlLocal == nil {
		s.ctlLocal = s.ctl.LocalClient()
	}
	return s.ctlLocal
}

// readBrokerID reads the id file; found is false when there is none.
func readBrokerID(dir string) (id uint32, found bool, err error) {
	path := filepath.Join(dir, brokerIDFile)
	f, err := os.Open(path)
	if errors.Is(err, os.ErrNotExist) {
		return 0, false, nil
	}
	if err != nil {
		return 0, false, fmt.Errorf("server: broker id: %w", err)
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, brokerIDFileMax+1))
	if err != nil {
		return 0, false, fmt.Errorf("server: broker id: read %s: %w", path, err)
	}
	text := strings.TrimSpace(string(b))
	v, perr := strconv.ParseUint(text, 10, 32)
	if len(b) > brokerIDFileMax || perr != nil || v == 0 || v == math.MaxUint32 {
		shown := text
		if len(shown) > 20 {
			shown = shown[:20] + "..."
		}
		return 0, false, fmt.Errorf("server: broker id file %s is corrupt (%q): it must hold one id from 1 to %d; restore it, or remove it to apply for a new id (the old one stays registered in the controller)",
			path, shown, uint32(math.MaxUint32-1))
	}
	return uint32(v), true, nil
}

// writeBrokerID persists id.
func writeBrokerID(dir string, id uint32) error {
	return journal.WriteFileDurable(dir, brokerIDFile, []byte(strconv.FormatUint(uint64(id), 10)+"\n"))
}

// loadBrokerID reads this broker's id, or on a first start applies for one
// and persists it. It runs in Start once the controller is up.
func (s *Server) loadBrokerID() error {
	id, found, err := readBrokerID(s.cfg.DataDir)
	if err != nil {
		return err
	}
	if found {
		s.brokerID = id
		return nil
	}
	ctx, cancel := context.WithTimeout(s.regCtx, wiringTimeout)
	defer cancel()
	cl := s.brokerClient()
	for {
		id, err = cl.ApplyBrokerID(ctx, 0)
		if err == nil {
			break
		}
		var re *ctlapi.ResultError
		if errors.As(err, &re) || errors.Is(err, ctlapi.ErrBadRequest) {
			return fmt.Errorf("server: broker id: the controller refused: %w", err)
		}
		if errors.Is(err, ctlapi.ErrLeaderChanged) {
			// The id may have been granted; a retry takes another and
			// that one stays unused in the controller's broker list.
			s.log.Warn("server: broker id application was ambiguous; applying again", "err", err)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("server: broker id: the controller granted none within %v: %v", wiringTimeout, err)
		case <-time.After(wiringRetryDelay):
		}
	}
	if err := writeBrokerID(s.cfg.DataDir, id); err != nil {
		return fmt.Errorf("server: broker id %d granted but not saved: %w", id, err)
	}
	s.brokerID = id
	s.log.Info("server: broker id granted by the controller", "broker_id", id)
	return nil
}

// register records the broker's client address and protocol version in
// the controller. A controller that lost the id (its data was reset) gets
// it applied for again under the same number.
func (s *Server) register(ctx context.Context) error {
	cl := s.brokerClient()
	addrs := []string{cmp.Or(s.cfg.AdvertiseAddr, s.addr)}
	err := cl.RegisterBroker(ctx, s.brokerID, addrs, uint16(wire.Current))
	var re *ctlapi.ResultError
	if errors.As(err, &re) && re.Code == ctlapi.CodeNotFound {
		if _, aerr := cl.ApplyBrokerID(ctx, s.brokerID); aerr != nil && !errors.As(aerr, &re) {
			return aerr
		}
		err = cl.RegisterBroker(ctx, s.brokerID, addrs, uint16(wire.Current))
	}
	if err != nil {
		return err
	}
	s.registered.Store(true)
	s.log.Info("server: broker registered with the controller", "broker_id", s.brokerID, "addrs", addrs)
	return nil
}

// registerAtStart makes Start's one registration attempt; on failure the
// background loop retries.
func (s *Server) registerAtStart() {
	if host, _, err := net.SplitHostPort(s.addr); err == nil && s.cfg.AdvertiseAddr == "" {
		if ip := net.ParseIP(host); ip != nil && ip.IsUnspecified() {
			s.log.Warn("server: the client listener is bound to a wildcard address and no advertise address is set; the controller records it as is and other nodes cannot dial it", "addr", s.addr)
		}
	}
	ctx, cancel := context.WithTimeout(s.regCtx, wiringTimeout)
	defer cancel()
	if err := s.register(ctx); err != nil {
		s.log.Warn("server: broker registration failed; retrying in the background", "broker_id", s.brokerID, "err", err)
	}
}

// refreshWelcomeAddrs reads the registered brokers from the controller
// and makes WELCOME list their client addresses after this broker's, so a
// client that loses this broker can dial another (client.ServerAddrs).
// A failed read keeps the last list.
func (s *Server) refreshWelcomeAddrs(ctx context.Context) {
	bs, err := s.brokerClient().GetBrokers(ctx, ctlapi.ReadConsistent)
	if err != nil {
		return
	}
	slices.SortFunc(bs, func(a, b ctlapi.Broker) int { return cmp.Compare(a.ID, b.ID) })
	addrs := [][]byte{[]byte(s.addr)}
	for _, b := range bs {
		if b.ID == s.brokerID || len(b.Addrs) == 0 || len(addrs) == wire.AddrsMax {
			continue
		}
		addrs = append(addrs, []byte(b.Addrs[0]))
	}
	s.welcomeAddrs.Store(&addrs)
}

// groupRebalance is the groups' rebalance interval, 0 for none.
func (s *Server) groupRebalance() time.Duration {
	switch r := s.cfg.GroupRebalance; {
	case r < 0:
		return 0
	case r == 0:
		return groups.RebalanceDefault
	default:
		return r
	}
}

// GroupJournalFaultEnv names, for process tests, a file under the data
// directory whose presence makes every write and fsync of the group
// journal fail with ENOSPC, as a full disk does: a fault-injecting layer
// over the real file system (journal.FaultFS), since a test cannot make
// a real disk full. Unset, the journal writes to the OS directly.
const GroupJournalFaultEnv = "BERTH_TEST_GROUP_JOURNAL_FAULT"

// groupJournalFS is the group journal's file system: Config.GroupJournalFS,
// or the fault layer GroupJournalFaultEnv asks for, or nil (the OS's).
func (s *Server) groupJournalFS() journal.FS {
	if s.cfg.GroupJournalFS != nil {
		return s.cfg.GroupJournalFS
	}
	name := os.Getenv(GroupJournalFaultEnv)
	if name == "" {
		return nil
	}
	flag := filepath.Join(s.cfg.DataDir, filepath.Base(name))
	s.log.Warn("server: the group journal fails while a test's fault file exists", "file", flag)
	ffs := journal.NewFaultFS(nil)
	ffs.SetRule(func(op journal.Op, _ string, _ int) error {
		if op != journal.OpWrite && op != journal.OpSync {
			return nil
		}
		if _, err := os.Stat(flag); err == nil {
			return syscall.ENOSPC
		}
		return nil
	})
	return ffs
}

// groupLease is the masters' lease (Config.GroupLease).
func (s *Server) groupLease() time.Duration {
	if s.cfg.GroupLease > 0 {
		return s.cfg.GroupLease
	}
	return 2 * s.cfg.ControllerHeartbeat
}

// startGroups starts the replication groups' manager: the peer
// transport, and the goroutine that follows the controller's group
// decisions. Entries are not applied to queues yet: the replicated data
// plane's queue events come next.
func (s *Server) startGroups() error {
	mcfg := groups.ManagerConfig{
		Self: s.brokerID, PeerAddr: s.cfg.PeerAddr, Advertise: s.cfg.PeerAdvertise,
		Dir: filepath.Join(s.cfg.DataDir, "groups"), Fsync: s.cfg.Fsync, FS: s.groupJournalFS(), Ctl: s.brokerClient(),
		Auth: s.peerAuth, Logger: s.log, Rebalance: s.groupRebalance(), Lag: s.cfg.GroupLag,
		// Under a memory budget a restart does not load the group log's
		// data: it is read back as it is applied (and paged again).
		PagedReplay: s.cfg.MemoryLimit > 0,
		OnMaster:    func(g uint32) { s.broker.GroupMastered(g) },
		Lease:       s.groupLease(),
		OnDeliver:   func(g uint32) { s.broker.GroupDelivering(g) },
		OnStepDown: func(g uint32) {
			if s.replicator != nil {
				s.replicator.ResetOwnership(g)
			}
			s.broker.ResetGroup(g)
			go s.groupSteppedDown(g)
		},
		OnView: s.proxyViewChanged,
		OnProxy: groups.ProxyHandler{
			Command: func(from uint32, out groups.ProxyOut, version wire.Version, frameMax uint32, frame []byte) {
				if s.replicator == nil {
					out.Write([][]byte{wire.AppendError(nil, version, 0, wire.CodeResourceLimit, "the broker is starting; retry")})
					return
				}
				s.proxyCommand(from, out, version, frameMax, frame)
			},
			Close: s.proxyClose,
		},
	}
	// The apply of committed entries, the group count and the forwards
	// are the replicator's: s.replicator is set by now (initReplication
	// runs earlier in Start), and SetCallbacks takes a nil one too.
	s.replicator.SetCallbacks(&mcfg)
	m, err := groups.StartManager(mcfg)
	if err != nil {
		return fmt.Errorf("server: %w", err)
	}
	m.Forwarder().SetProxy(s.proxyOutput, s.proxyLost)
	s.groups.Store(m)
	s.log.Info("server: replication groups' peer transport listening", "peer", m.PeerAddr())
	return nil
}

// GroupsManager is the replication groups' manager, or nil.
func (s *Server) GroupsManager() *groups.Manager { return s.groups.Load() }

// leaderWatch follows the embedded controller member's view of the
// leader, woken by the member when it changes (a 10 ms poll did this
// before: 100 wake-ups a second of an idle broker). A new leader is
// heartbeated at once, not at the next interval, since it counts a
// broker that stays silent dead after a short grace
// (controlplane.Config.LeaderGrace).
// On a change it points the controller client at the new leader, ends the
// heartbeat in flight (it may hang on a frozen old leader until its
// interval runs out) and asks the loop for a heartbeat now, and has the
// group manager read the groups again from the new leader.
type leaderWatch struct {
	moved chan struct{} // capacity 1
	mu    sync.Mutex
	term  context.Context // ended when the leader moves; guarded by mu
	end   context.CancelFunc
}

func (s *Server) watchLeader(w *leaderWatch) {
	defer s.regWG.Done()
	lead := s.ctl.Leader()
	for {
		moved := s.ctl.LeaderChanged()
		l := s.ctl.Leader()
		if l == lead || l == 0 {
			select {
			case <-s.regCtx.Done():
				return
			case <-moved:
			}
			continue
		}
		lead = l
		if addr := s.ctl.LeaderAddr(); addr != "" {
			s.ctlClient.SetLeader(addr)
		}
		w.mu.Lock()
		w.end()
		w.term, w.end = context.WithCancel(s.regCtx)
		w.mu.Unlock()
		if g := s.groups.Load(); g != nil {
			g.ControllerLeaderMoved()
		}
		select {
		case w.moved <- struct{}{}:
		default:
		}
	}
}

// heartbeatContext is the context of one heartbeat: ended by the
// interval, by Close, or by the leader moving.
func (w *leaderWatch) heartbeatContext(parent context.Context, interval time.Duration) (context.Context, context.CancelFunc) {
	if w == nil {
		return context.WithTimeout(parent, interval)
	}
	w.mu.Lock()
	term := w.term
	w.mu.Unlock()
	return context.WithTimeout(term, interval)
}

// controllerLoop registers the broker if Start could not, then heartbeats
// until Close: every interval, and at once when the embedded controller
// member sees a new leader.
func (s *Server) controllerLoop() {
	defer s.regWG.Done()
	interval := s.cfg.ControllerHeartbeat
	t := time.NewTicker(interval)
	defer t.Stop()
	var watch *leaderWatch
	var moved chan struct{}
	if s.ctl != nil && s.ctlClient != nil {
		// A group of 3 or 5 members, one of them in this process.
		watch = &leaderWatch{moved: make(chan struct{}, 1)}
		watch.term, watch.end = context.WithCancel(s.regCtx)
		defer func() { watch.mu.Lock(); watch.end(); watch.mu.Unlock() }()
		moved = watch.moved
		s.regWG.Add(1)
		go s.watchLeader(watch)
	}
	failing := false
	beats := 0
	for {
		select {
		case <-s.regCtx.Done():
			return
		case <-t.C:
		case <-moved:
			t.Reset(interval)
		}
		var err error
		what := "heartbeat"
		var ctx context.Context
		var cancel context.CancelFunc
		if !s.registered.Load() {
			what = "registration"
			ctx, cancel = context.WithTimeout(s.regCtx, interval)
			err = s.register(ctx)
		} else {
			ctx, cancel = watch.heartbeatContext(s.regCtx, interval)
			var ends []ctlapi.GroupLogEnd
			if g := s.groups.Load(); g != nil {
				if err := g.Failed(); err != nil {
					// The group journal failed: this broker left its
					// groups (Node.fail). Silent, it is counted dead
					// by the controller, which elects other masters
					// for its groups and none here.
					cancel()
					if !failing {
						failing = true
						s.log.Error("server: no heartbeats to the controller: the group journal failed and this broker left its replication groups; restart it once the journal's directory is writable", "err", err)
					}
					continue
				}
				ends = g.LogEnds()
			}
			// The answer renews the leases of the groups this broker
			// masters, from the time the heartbeat was sent.
			sent := time.Now()
			var reply ctlapi.HeartbeatReply
			reply, err = s.brokerClient().HeartbeatGrants(ctx, s.brokerID, ends)
			if g := s.groups.Load(); g != nil && err == nil {
				g.Granted(sent, reply)
				g.Heartbeated()
			}
			if err == nil && beats%10 == 0 {
				s.refreshWelcomeAddrs(ctx)
			}
			beats++
		}
		moving := ctx.Err() == context.Canceled
		cancel()
		if s.regCtx.Err() != nil {
			return
		}
		if err != nil && moving {
			continue // the leader moved: the next beat goes to the new one at once
		}
		switch {
		case err != nil && !failing:
			failing = true
			s.log.Warn("server: broker "+what+" to the controller failing", "broker_id", s.brokerID, "err", err)
		case err == nil && failing:
			failing = false
			s.log.Info("server: broker "+what+" to the controller succeeds again", "broker_id", s.brokerID)
		}
	}
}

// followApplied long-polls the controller's applied index (WaitChange)
// from applied on, and calls pass each time the index has moved past the
// one the last successful pass saw, no sooner than gap() after the last
// call of pass ended. pass reports whether it succeeded; a failed one is
// called again for the same change. It returns when the broker closes
// (regCtx). The users' and the wiring's watches run on it.
func (s *Server) followApplied(applied uint64, retry time.Duration, gap func() time.Duration, pass func() bool) {
	cl := s.brokerClient()
	var last time.Time
	for {
		idx, err := cl.WaitChange(s.regCtx, applied)
		if s.regCtx.Err() != nil {
			return
		}
		if err != nil {
			if !s.pauseReg(retry) {
				return
			}
			continue
		}
		if idx == applied {
			continue
		}
		if wait := gap() - time.Since(last); wait > 0 && !s.pauseReg(wait) {
			return
		}
		ok := pass()
		last = time.Now()
		if s.regCtx.Err() != nil {
			return
		}
		if ok {
			applied = idx
		}
	}
}

// pauseReg waits d, or less if the broker closes; false then.
func (s *Server) pauseReg(d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-s.regCtx.Done():
		return false
	case <-t.C:
		return true
	}
}

// ErrPeerRequired is wrapped by Start's error when the cluster has
// replication groups and this broker runs no peer transport (PeerAddr);
// berthd exits with status 2 on it, a configuration error.
var ErrPeerRequired = errors.New("server: this broker runs no peer transport (-peer), which a cluster with replication groups needs")

// checkPeerNotNeeded refuses the start of a broker without a peer
// transport in a cluster that has replication groups. Such a broker
// would run no group: its durable queues would stay its own (a queue of
// the same name at the other brokers being a replicated one), it would
// never learn the replicated queues declared through the others (its
// clients would get not-found for them), and the groups placed on it
// would stay a replica short. "berthctl cluster init" refuses to create
// the groups while a registered broker has no peer address; this covers
// a broker started without -peer after that. A controller that cannot be
// read here is not a refusal: the restore of the wiring that follows
// needs it and reports it.
func (s *Server) checkPeerNotNeeded() error {
	ctx, cancel := context.WithTimeout(s.regCtx, wiringTimeout)
	defer cancel()
	cl := s.brokerClient()
	for {
		info, err := cl.GetClusterInfo(ctx, ctlapi.ReadFollower)
		if err == nil {
			if n := info.Config.Groups; n > 0 {
				return fmt.Errorf("%w: the cluster has %d groups, and a broker without one would hold none of them, keep its "+
					"durable queues to itself and answer not-found for the replicated ones; start broker %d with -peer HOST:PORT (BERTH_PEER)",
					ErrPeerRequired, n, s.brokerID)
			}
			return nil
		}
		if ctx.Err() != nil {
			s.log.Warn("server: could not read the cluster's group count to check that this broker needs no -peer", "err", err)
			return nil
		}
		time.Sleep(50 * time.Millisecond)
	}
}
