// Package server runs Berth's client listener on gnet event loops, turns
// frames into shard commands, and serves the admin HTTP endpoints.
//
// Security (docs/SECURITY.md): tls.go serves the client TLS listener,
// auth.go, login.go and authz.go log clients in and check their
// permissions, clusterauth.go guards the peer and controller ports, and
// adminauth.go the admin HTTP.
package server

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/panjf2000/gnet/v2"
	"golang.org/x/sys/unix"

	"github.com/berthmq/berth/controlplane"
	"github.com/berthmq/berth/controlplane/ctlclient"
	"github.com/berthmq/berth/internal/peerauth"
	"github.com/berthmq/berth/journal"
	"github.com/berthmq/berth/replication"
	"github.com/berthmq/berth/replication/groups"
	"github.com/berthmq/berth/server/wiring"
	"github.com/berthmq/berth/shards"
	"github.com/berthmq/berth/wire"
)

// Server is a running broker.
type Server struct {
	cfg    Config
	log    *slog.Logger
	broker *shards.Broker
	wiring *wiring.Wiring
	eng    gnet.Engine
	addr   string

	booted  chan struct{}
	runErr  chan error
	admin   *http.Server
	adminLn net.Listener
	// adminLimiter delays failed admin logins per source (adminauth.go);
	// adminTLSMat is the HTTPS material, or nil.
	adminLimiter authLimiter
	adminTLSMat  *tlsMaterial
	// mgmtWG counts the connections' management goroutines (mgmt.go);
	// mgmtPending the commands they hold.
	mgmtWG      sync.WaitGroup
	mgmtPending atomic.Int64
	// stopOnce runs the stop path once, for Close or a failed Start;
	// stopArmed is what Start brought up (see stopStep).
	stopOnce  sync.Once
	stopArmed [stopSteps]bool
	draining  atomic.Bool // Close began: no new work is taken (drain.go)
	stopHB    chan struct{}
	hbWG      sync.WaitGroup

	// The TLS listener (tls.go), or nil.
	tlsMat   *tlsMaterial
	tlsLn    net.Listener
	tlsWG    sync.WaitGroup // accept loop and connection goroutines
	tlsConns struct {
		sync.Mutex
		set    map[net.Conn]struct{} // raw connections, closed by Close
		closed bool
	}
	sec  *securityMetrics
	auth *authState // users and logins (auth.go)
	// peerAuth proves cluster membership on the peer and controller
	// ports (clusterauth.go), or nil.
	peerAuth *peerauth.Auth

	conns struct {
		sync.Mutex // guards set; taken on open, close and heartbeat scans
		set        map[*connState]struct{}
		// opened wakes the heartbeat scan, which sleeps while there
		// is no connection; capacity 1.
		opened chan struct{}
	}
	nextSession atomic.Uint64
	stalls      stallWatch // connections over their outbound cap (outbound.go)
	metrics     *metrics
	boot        boot               // what Start brought up, for the admin HTTP (ready.go)
	ctl         *controlplane.Node // in-process controller, or nil
	wiringLog   wiring.Log         // the controller's wiring, or nil (wiringsync.go)
	// ctlClient reaches the controller group's leader from this member
	// (3 or 5 members only), or nil.
	ctlClient *ctlclient.Client
	// ctlLocal is the in-process client of a one-member controller, for
	// registration and heartbeats, or nil.
	ctlLocal *ctlclient.Client
	// brokerID is this broker's id in the controller (0: no controller);
	// set in Start before anything reads it.
	brokerID   uint32
	registered atomic.Bool
	// welcomeAddrs is what WELCOME lists for plaintext clients to fail
	// over to: this broker's address, then every other registered
	// broker's client address (registration.go refreshes it), or nil for
	// this broker's alone.
	welcomeAddrs atomic.Pointer[[][]byte]
	// groups runs the replication groups (PeerAddr set), or nil;
	// replicator connects the shards to them (package replication).
	groups atomic.Pointer[groups.Manager]
	// proxies and proxiedSessions are the consumers proxied to other
	// brokers and, as a master, for other brokers (proxy.go).
	proxies         proxyTable
	proxiedSessions proxiedTable
	// lanes carry the peer connections' forwards and proxied commands to
	// the shards (replication/lanes.go); set once the shards run.
	lanes *replication.Lanes
	// queueConsumers indexes the consumers by queue, to tell them of
	// their queue's deletion (consumerend.go).
	queueConsumers queueConsumers
	replicator     *replication.Replicator
	// regCtx ends at Close; it stops the registration and heartbeat loop
	// (regWG) and cancels its calls.
	regCtx    context.Context
	regCancel context.CancelFunc
	regWG     sync.WaitGroup
}

// Start starts a broker and returns once it accepts clients.
func Start(cfg Config) (*Server, error) {
	cfg.EnsureDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if cfg.Role == RoleController {
		raiseGOMAXPROCS(0, true)
	} else {
		raiseGOMAXPROCS(cfg.Loops, cfg.controllerEmbedded())
	}
	s := &Server{
		cfg:    cfg,
		log:    cfg.Logger,
		booted: make(chan struct{}),
		runErr: make(chan error, 1),
		stopHB: make(chan struct{}),
	}
	s.regCtx, s.regCancel = context.WithCancel(context.Background())
	s.arm(stopLoops)
	s.conns.set = map[*connState]struct{}{}
	s.conns.opened = make(chan struct{}, 1)
	s.stalls.kick = make(chan struct{}, 1)
	s.metrics = newMetrics(s)
	s.sec = newSecurityMetrics(s.metrics.reg, cfg.Role != RoleController)
	if err := s.startClusterAuth(); err != nil {
		return nil, s.abort(err)
	}
	// Before the admin HTTP, whose basic auth reads the users: startAuth
	// (a broker) or startControllerOnly fills them in.
	s.auth = newAuthState(cfg.AllowPlainWithoutTLS)
	// The admin HTTP comes first: /readyz answers 503 while the rest
	// comes up.
	if cfg.AdminAddr != "" {
		if err := s.startAdmin(); err != nil {
			return nil, s.abort(err)
		}
		s.arm(stopAdmin)
	}
	if cfg.Role == RoleController {
		if err := startControllerOnly(s); err != nil {
			return nil, s.abort(err)
		}
		s.boot.started.Store(true)
		return s, nil
	}
	if cfg.DataDir != "" {
		// Queues hash onto shards and each shard has its journal, so the
		// count is fixed when the data directory is created.
		n, err := wiring.ShardCount(cfg.DataDir)
		if err != nil {
			return nil, s.abort(fmt.Errorf("server: %w", err))
		}
		if n > 0 && n != cfg.Shards {
			cfg.Logger.Warn("server: keeping the shard count of the data directory", "configured", cfg.Shards, "data_dir", n)
			cfg.Shards, s.cfg.Shards = n, n
		}
	}
	bcfg := shards.Config{Shards: cfg.Shards, OwnSlice: cfg.OwnSlice, ConsumeAtReplicas: cfg.ConsumeAtReplicas, CreditMax: cfg.CreditMax, Logger: cfg.Logger, RingSize: cfg.RingSize,
		MemoryLimit: cfg.MemoryLimit}
	if cfg.DataDir != "" {
		bcfg.PagingDir = filepath.Join(cfg.DataDir, "paging") // emptied at every start
	}
	wcfg := wiring.Config{Logger: cfg.Logger, Dropped: s.queueDropped}
	if cfg.DataDir != "" {
		if cfg.Fsync == journal.FsyncNever {
			cfg.Logger.Warn("server: fsync never: completions do not wait for the disk; a machine crash loses completed work")
		}
		bcfg.Journal = &shards.JournalConfig{Dir: cfg.DataDir, Fsync: cfg.Fsync, FS: cfg.JournalFS, SegmentBytes: cfg.JournalSegmentBytes,
			CheckpointRecords: cfg.JournalCheckpointRecords}
		if cfg.controllerEmbedded() || cfg.controllerRemote() {
			var wl *controllerWiring
			var err error
			if cfg.controllerRemote() {
				wl, err = s.connectController()
			} else {
				wl, err = s.startController(true)
			}
			if err != nil {
				return nil, s.abort(err)
			}
			wcfg.Log = wl
			s.wiringLog = wl
			if cfg.registersWithController() {
				err := s.loadBrokerID()
				if err == nil && cfg.PeerAddr == "" {
					err = s.checkPeerNotNeeded()
				}
				if err != nil {
					return nil, s.abort(err)
				}
			}
		}
	}
	s.broker = shards.New(bcfg)
	s.arm(stopShards)
	wcfg.Broker = s.broker
	if bcfg.Journal != nil {
		wcfg.Dir = cfg.DataDir
	}
	wcfg.Syncable = s.syncable
	wcfg.Foreign = s.foreignQueue
	wcfg.Droppable = s.syncDroppable
	wcfg.Place = s.placeQueue
	s.wiring = wiring.New(wcfg)
	s.boot.wiring.Store(s.wiring)
	s.boot.broker.Store(s.broker)
	// The shards run first; the wiring adds the durable queues to them;
	// then the journals replay into those queues.
	err := s.broker.Start()
	if err == nil {
		s.lanes = replication.NewLanes(s.regCtx, s.broker.Shards())
	}
	if err == nil && cfg.PeerAddr != "" && s.brokerID != 0 {
		s.arm(stopReplicator)
		err = s.initReplication()
	}
	if err == nil {
		err = s.wiring.Restore()
	}
	if err == nil && s.replicator != nil {
		err = s.replicator.RestoreDone()
	}
	if err == nil {
		err = s.broker.Recover()
	}
	if err != nil {
		return nil, s.abort(fmt.Errorf("server: %w", err))
	}

	usersApplied, err := s.startAuth()
	if err != nil {
		return nil, s.abort(err)
	}
	h := &handler{s: s}
	go func() {
		err := gnet.Run(h, "tcp4://"+cfg.ClientAddr,
			gnet.WithNumEventLoop(cfg.Loops),
			gnet.WithReusePort(false),
			gnet.WithReuseAddr(true), // restart at once after a crash, past TIME_WAIT
			gnet.WithTCPNoDelay(gnet.TCPNoDelay),
			gnet.WithReadBufferCap(256<<10),
			gnet.WithWriteBufferCap(256<<10),
			gnet.WithLogger(gnetLogger{s.log}),
		)
		s.runErr <- err
	}()
	select {
	case <-s.booted:
		s.arm(stopListener)
	case err := <-s.runErr:
		return nil, s.abort(fmt.Errorf("server: listen on %s: %w", cfg.ClientAddr, err))
	}
	if cfg.TLSAddr != "" {
		if err := s.startTLS(); err != nil {
			return nil, s.abort(err)
		}
		m := s.tlsMat
		s.registerCertExpiry("client", func() time.Time { return leafNotAfter(m.current.Load()) })
		s.tlsWG.Add(1)
		go s.serveTLS(h)
	}
	s.boot.serving.Store(true)
	s.arm(stopIntake)
	s.arm(stopClients)
	s.hbWG.Add(2)
	go s.heartbeats()
	go func() { defer s.hbWG.Done(); s.stalls.run(s.stopHB) }()
	s.arm(stopHeartbeats)
	if s.ctl != nil || s.ctlClient != nil {
		s.regWG.Add(1)
		go s.watchUsers(usersApplied)
	}
	if s.wiringLog != nil && s.ctlClient != nil {
		// A controller of 3 or 5 members, which other brokers share.
		s.regWG.Add(1)
		go s.watchWiring()
	}
	if s.brokerID != 0 {
		s.registerAtStart()
		if cfg.PeerAddr != "" {
			s.arm(stopGroups)
			if err := s.startGroups(); err != nil {
				return nil, s.abort(err)
			}
		}
		s.regWG.Add(1)
		go s.controllerLoop()
	}
	s.log.Info("berth: broker started", "clients", s.addr, "tls", s.TLSAddr(), "admin", s.AdminAddr(), "shards", cfg.Shards, "loops", cfg.Loops, "memory_limit_bytes", cfg.MemoryLimit, "broker_id", s.brokerID)
	s.boot.started.Store(true)
	return s, nil
}

// ClientAddr is the bound client address.
func (s *Server) ClientAddr() string { return s.addr }

// AdminAddr is the bound admin HTTP address, or "".
func (s *Server) AdminAddr() string {
	if s.adminLn == nil {
		return ""
	}
	return s.adminLn.Addr().String()
}

// Broker exposes the core, for tests and tools.
func (s *Server) Broker() *shards.Broker { return s.broker }

// Close shuts down gracefully: it stops accepting, lets the shards finish
// what they hold (their completions go out), then closes the connections.
// It runs the stop path (stopStep); a second Close does nothing.
func (s *Server) Close() error {
	var err error
	s.stopOnce.Do(func() { err = s.stop() })
	return err
}

// abort stops what a failed Start brought up, by the path Close takes, and
// returns Start's error.
func (s *Server) abort(err error) error {
	s.stopOnce.Do(func() { _ = s.stop() })
	return err
}

// stopStep is one step of the stop path. Close and a failed Start stop
// the server the same way: stop runs, in the order of the steps below,
// each step Start armed. Start arms a step when its component comes up
// (or, when the step copes with a component not there, just before it
// starts), so that a start that fails halfway stops what it started.
//
// The order is not the reverse of the start order:
//   - The registration loops stop first, so that the controller learns of
//     this broker's departure before its member stops, and before the
//     groups, which the heartbeats report on.
//   - The admin HTTP starts first, so that /readyz answers while the rest
//     comes up, but stops early, before the drain, as Close always had it.
//   - The shards start before the client listener but stop before it:
//     what they finish completes to clients still connected, and only
//     then are the clients told and the event loops stopped.
//   - The controller member stops last: the management commands that
//     finish in the drain may need it.
type stopStep uint8

const (
	stopLoops      stopStep = iota // registration, controller heartbeats, user and wiring watches (regWG)
	stopGroups                     // the replication groups
	stopHeartbeats                 // the client heartbeat scan and the stall watch (hbWG)
	stopAdmin                      // the admin HTTP
	stopIntake                     // take no new work; what is in flight finishes
	stopShards                     // the shards finish what they hold; journals close
	stopReplicator                 // the replicated data plane's queue lists
	stopClients                    // CLOSE to every client; TLS connections closed
	stopListener                   // the client event loops
	stopController                 // the controller clients and member
	stopSteps
)

// arm adds step to the stop path. Only Start calls it, before it returns.
func (s *Server) arm(step stopStep) { s.stopArmed[step] = true }

// stop runs the armed steps in order and returns the event loops' error
// from stopping, if any. stopOnce guards it.
func (s *Server) stop() error {
	var err error
	for step := range stopSteps {
		if s.stopArmed[step] {
			if e := s.stopOne(step); e != nil && err == nil {
				err = e
			}
		}
	}
	return err
}

func (s *Server) stopOne(step stopStep) error {
	switch step {
	case stopLoops:
		s.regCancel()
		s.regWG.Wait()
		if s.lanes != nil {
			s.lanes.Wait()
		}
	case stopGroups:
		if g := s.groups.Load(); g != nil {
			g.Close()
		}
	case stopHeartbeats:
		close(s.stopHB)
		s.hbWG.Wait()
	case stopAdmin:
		_ = s.admin.Close()
	case stopIntake:
		s.stopTLSAccept()
		s.draining.Store(true)
		s.quiesce()
		// Management commands taken before finish first: they may need
		// the shards and the controller.
		s.mgmtWG.Wait()
	case stopShards:
		s.broker.Stop()
	case stopReplicator:
		if s.replicator != nil { // initReplication may fail before it sets one
			s.replicator.Close()
		}
	case stopClients:
		s.conns.Lock()
		for cs := range s.conns.set {
			v := wire.Version(cs.helloVer.Load())
			if v == 0 {
				v = wire.Current
			}
			_ = cs.t.send(wire.AppendClose(nil, v, wire.CodeShutdown, "server shutting down"), true)
		}
		s.conns.Unlock()
		for deadline := time.Now().Add(2 * time.Second); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
			s.conns.Lock()
			n := len(s.conns.set)
			s.conns.Unlock()
			if n == 0 {
				break
			}
		}
		s.closeTLSConns()
	case stopListener:
		// gnet's Engine.Stop starts the shutdown and then looks every
		// 500 ms whether it finished, which made every stop take half a
		// second: the end of gnet.Run (runErr) says it sooner.
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		stopped := make(chan error, 1)
		go func() { stopped <- s.eng.Stop(ctx) }()
		select {
		case <-s.runErr:
			return nil
		case err := <-stopped:
			<-s.runErr
			return err
		}
	case stopController:
		s.stopController()
	}
	return nil
}

func (s *Server) stopController() {
	if s.ctlLocal != nil {
		s.ctlLocal.Close()
	}
	if s.ctlClient != nil {
		s.ctlClient.Close()
	}
	if s.ctl != nil {
		s.ctl.Stop()
	}
}

// ControllerAddr is the in-process controller's address, or "".
func (s *Server) ControllerAddr() string {
	if s.ctl == nil {
		return ""
	}
	return s.ctl.Addr()
}

func (s *Server) heartbeats() {
	defer s.hbWG.Done()
	// Sessions negotiate their own intervals, so the scan runs often and
	// each connection decides whether it is due.
	interval := min(s.cfg.Heartbeat/2, heartbeatScanMax)
	interval = max(interval, 5*time.Millisecond)
	t := time.NewTicker(interval)
	defer t.Stop()
	var list []*connState
	for {
		select {
		case <-s.stopHB:
			return
		case <-t.C:
		}
		now := time.Now().UnixNano()
		list = list[:0]
		s.conns.Lock()
		for cs := range s.conns.set {
			list = append(list, cs)
		}
		s.conns.Unlock()
		if len(list) == 0 {
			// Nothing to scan until a client connects: an idle broker
			// is not woken 40 times a second for nothing.
			s.broker.SetOutbound(0)
			t.Stop()
			select {
			case <-s.stopHB:
				return
			case <-s.conns.opened:
			}
			t.Reset(interval)
			continue
		}
		var outbound int64
		for _, cs := range list {
			if cs.handshakeExpired(now) {
				continue
			}
			cs.heartbeat(now)
			if sess := cs.sessAt.Load(); sess != nil {
				outbound += sess.OutBuffered.Load()
			}
			if cs.outboundDue() && !cs.checking.Swap(true) {
				if cs.t.runOwned(func() { cs.checkOutbound(now) }) != nil {
					cs.checking.Store(false)
				}
			}
		}
		s.broker.SetOutbound(outbound)
	}
}

// raiseGOMAXPROCS gives the runtime one P per event loop on top of one per
// core, unless GOMAXPROCS was set by hand. gnet's loops wait in epoll_wait
// as raw syscalls that keep their P; with GOMAXPROCS equal to the cores,
// two idle loops held both Ps, and a shard or journal goroutine woken by
// a producer waited for the runtime's monitor to take a P back: up to
// 10 ms. Measured on 2 cores (GOMAXPROCS 2 -> 4): publish p99 at 500 msg/s
// 7.7 ms -> 2.0 ms, durable 1 KiB throughput 173k -> 270k msgs/s.
//
// An embedded controller (or a controller-only node, loops 0) adds one
// more: its pebble fsyncs block in syscalls holding a P. Measured in the
// controller benchmarks, GOMAXPROCS 2 -> 4 raised controller write
// throughput from about 60k to 100k events/s.
func raiseGOMAXPROCS(loops int, controller bool) {
	if os.Getenv("GOMAXPROCS") != "" {
		return
	}
	want := numCPU() + loops
	if controller {
		want++
	}
	if runtime.GOMAXPROCS(0) < want {
		runtime.GOMAXPROCS(want)
	}
}

// heartbeatScanMax is the longest gap between two heartbeat scans.
const heartbeatScanMax = 25 * time.Millisecond

func numCPU() int {
	var set unix.CPUSet
	if err := unix.SchedGetaffinity(0, &set); err == nil && set.Count() > 0 {
		return set.Count()
	}
	return 1
}

// boundAddr reads the listener's address from the engine.
func boundAddr(eng gnet.Engine) (string, error) {
	fd, err := eng.Dup()
	if err != nil {
		return "", err
	}
	defer unix.Close(fd)
	sa, err := unix.Getsockname(fd)
	if err != nil {
		return "", err
	}
	if a, ok := sa.(*unix.SockaddrInet4); ok {
		return net.JoinHostPort(net.IP(a.Addr[:]).String(), strconv.Itoa(a.Port)), nil
	}
	return "", errors.New("server: listener is not IPv4")
}

type gnetLogger struct{ l *slog.Logger }

func (g gnetLogger) Debugf(format string, args ...any) {}
func (g gnetLogger) Infof(format string, args ...any)  {}
func (g gnetLogger) Warnf(format string, args ...any) {
	g.l.Warn("gnet: " + fmt.Sprintf(format, args...))
}
func (g gnetLogger) Errorf(format string, args ...any) {
	g.l.Error("gnet: " + fmt.Sprintf(format, args...))
}
func (g gnetLogger) Fatalf(format string, args ...any) {
	g.l.Error("gnet: " + fmt.Sprintf(format, args...))
}
