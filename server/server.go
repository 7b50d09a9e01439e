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
	"github.com/berthmq/berth/server/groups"
	"github.com/berthmq/berth/server/wiring"
	"github.com/berthmq/berth/shards"
	"github.com/berthmq/berth/wire"
)

// Config configures a Server.
type Config struct {
	ClientAddr   string // host:port; port 0 picks a free one
	AdminAddr    string // "" = no admin HTTP
	DataDir      string
	Shards       int
	Loops        int
	HeartbeatMs  uint32 // default heartbeat interval offered to clients
	FrameSizeMax uint32 // largest frame the server accepts
	WindowMax    uint32 // most uncompleted commands per session
	CreditMax    uint32 // most credit per consumer
	// InboundMax bounds the bytes buffered from one connection that the
	// server has not yet taken; past it the connection is closed.
	InboundMax int
	// OutboundMax caps the bytes written to one connection that its
	// client has not read yet; past it the connection gets no deliveries
	// and takes no frames until it drains to half (outbound.go). 0 means
	// OutboundMaxDefault, negative no cap.
	OutboundMax int64
	// OutboundTimeout closes a connection that stays over OutboundMax this
	// long (0: OutboundTimeoutDefault).
	OutboundTimeout time.Duration
	// HandshakeTimeout closes a connection that has not logged in this
	// long after it was accepted (0: HandshakeTimeoutDefault).
	HandshakeTimeout time.Duration
	Logger           *slog.Logger
	ServerName       string
	// Fsync is the journal's policy: "always" (default; a completion
	// follows the fsync that covers its record) or "never" (a completion
	// follows the write; unsafe: a machine crash loses completed work).
	Fsync string
	// JournalFS, if set, replaces the real file system under the journal
	// (tests inject faults with it).
	JournalFS journal.FS
	// GroupJournalFS, if set, replaces the real file system under the
	// group journal (tests inject faults with journal.FaultFS).
	GroupJournalFS journal.FS
	// JournalSegmentBytes overrides the journal segment size.
	JournalSegmentBytes int64
	// JournalCheckpointRecords overrides the journal records per shard
	// between checkpoints (shards.JournalConfig.CheckpointRecords).
	JournalCheckpointRecords int
	// MetricsQueueLimit is the most queues /metrics exports series of
	// one by one; past it only their sums are (berth_queue_metrics_omitted
	// says so) and /metrics/queues has them. 0: MetricsQueueLimitDefault;
	// negative: no limit.
	MetricsQueueLimit int
	// RingSize is the capacity of each shard's command ring (0: the
	// shards' default). Tests make it tiny to exercise full rings.
	RingSize int
	// ControllerAddr is where the in-process one-member controller
	// listens (single-node mode; berthd's default is 127.0.0.1:7402).
	// Durable wiring goes through it. "" runs without a controller, with
	// the durable wiring in a local file. It needs DataDir.
	ControllerAddr string
	// ControllerPeers maps every member of the controller group, this
	// node included, from raft id to address (raft traffic and the
	// controller service share it). With 3 or 5 members this node runs
	// member ControllerID and ControllerAddr is ignored; with one member
	// it acts as ControllerAddr = ControllerPeers[ControllerID]. It needs
	// DataDir (the log lives in DataDir/controller). See CheckController.
	ControllerPeers map[uint64]string
	ControllerID    uint64
	// ControllerJoin starts this node's member as one being added to a
	// running group: it has no configuration until the leader, once an
	// operator ran "berthctl members add ID=ADDR", sends it a snapshot.
	// ControllerPeers then holds this node and the members it knows (2 to
	// 6 entries, not necessarily 1, 3 or 5), and Start does not wait for a
	// leader: the new member knows none until it is added. Keeping it set
	// on later restarts is harmless: a member with a configuration ignores
	// it.
	ControllerJoin bool
	// ControllerLeaseRead has a 3- or 5-member controller serve consistent
	// reads from the leader's lease instead of a heartbeat round each
	// (controlplane.Config.LeaseRead); it relies on bounded clock drift.
	ControllerLeaseRead bool
	// ControllerWait bounds how long Start waits for a 3- or 5-member
	// group to elect a leader before restoring the wiring (default
	// ControllerWaitDefault).
	ControllerWait time.Duration
	// Role is RoleBroker (default, "" too) or RoleController: a
	// controller-only node runs its controller member and the admin HTTP
	// (/healthz, /readyz, /metrics, /v1/status), no client listener and
	// no shards.
	Role string
	// ControllerHeartbeat is the interval of a broker's heartbeats to the
	// controller (default ControllerHeartbeatDefault); keep it well under
	// the controller's broker timeout (0.8 s by default). See
	// registration.go.
	ControllerHeartbeat time.Duration
	// ControllerBrokerTimeout and ControllerLeaderGrace are the embedded
	// controller member's controlplane.Config.BrokerTimeout and
	// LeaderGrace (0: their defaults, 3 s and a third of the timeout).
	ControllerBrokerTimeout time.Duration
	ControllerLeaderGrace   time.Duration
	// GroupRebalance is how often a group's master looks for a
	// preferred master back in sync to hand the group over to
	// (server/groups/rebalance.go): 0 means groups.RebalanceDefault, a
	// negative value turns it off.
	GroupRebalance time.Duration
	// GroupLag is how long a group's follower may go without
	// acknowledging before its master takes it out of the SyncStateSet;
	// 0 means groups.LagDefault (500 ms).
	GroupLag time.Duration
	// GroupLease is how long the controller's answer to a heartbeat lets
	// a group's master deliver, and how long a new master waits after its
	// election before it delivers (group.Config.Lease); 0 means twice
	// ControllerHeartbeat.
	GroupLease time.Duration
	// MemoryLimit is the memory budget for messages in bytes, split
	// evenly across the shards; 0 means none. Above half of a shard's
	// share its new message bodies are paged out to disk, above the share
	// its publishers are throttled (shards/memory.go). berthd's default is
	// a share of the machine's RAM.
	MemoryLimit int64
	// AdvertiseAddr is the client address the broker registers with the
	// controller, for other nodes and clients to dial; empty means the
	// address the client listener is bound to (which must then not be a
	// wildcard such as 0.0.0.0).
	AdvertiseAddr string

	// TLSAddr is the TLS client address (host:port; port 0 picks a free
	// one); "" runs no TLS listener. It needs TLSCert and TLSKey, PEM
	// files; TLSClientCA, if set, is a PEM file of the CAs whose client
	// certificates are required (mutual TLS). Server.ReloadTLS rereads
	// all three.
	TLSAddr, TLSCert, TLSKey, TLSClientCA string

	// PeerAddr is where this broker's replication-group transport listens
	// (host:port); "" runs no groups. It needs a controller. The broker
	// publishes PeerAdvertise (default: the bound address) in the
	// controller, and replicates the groups whose replica set the
	// controller placed it in ("berthctl cluster init --groups G
	// --replicas R"); it forwards publishes for the others to their
	// masters.
	PeerAddr, PeerAdvertise string

	// ClusterCA, ClusterCert and ClusterKey (PEM files) make every
	// connection on the peer and controller ports, both ways, mutual TLS
	// with certificates the cluster CA signed; ClusterSecretFile holds a
	// shared secret every such connection proves (clusterauth.go). With
	// none, those ports must listen on loopback.
	ClusterCA, ClusterCert, ClusterKey, ClusterSecretFile string

	// AdminToken, if set, opens the admin HTTP's guarded paths to
	// "Authorization: Bearer AdminToken" and makes them need credentials
	// even on loopback (adminauth.go). AdminTLSCert and AdminTLSKey make
	// the admin port serve HTTPS.
	AdminToken, AdminTLSCert, AdminTLSKey string

	// AllowPlainWithoutTLS lets clients log in with PLAIN on the
	// plaintext listener, where their password crosses the network in
	// the clear.
	AllowPlainWithoutTLS bool
}

// DefaultConfig returns the embedded defaults: clients on 127.0.0.1:7400,
// admin HTTP on 127.0.0.1:7480, one shard and one loop per core.
func DefaultConfig() Config {
	return Config{
		ClientAddr:       "127.0.0.1:7400",
		AdminAddr:        "127.0.0.1:7480",
		DataDir:          "data",
		HeartbeatMs:      5000,
		FrameSizeMax:     wire.FrameSizeDefault,
		WindowMax:        1 << 16,
		CreditMax:        1 << 16,
		InboundMax:       64 << 20,
		OutboundMax:      OutboundMaxDefault,
		OutboundTimeout:  OutboundTimeoutDefault,
		HandshakeTimeout: HandshakeTimeoutDefault,
		ServerName:       "berthd",
		Fsync:            "always",
	}
}

// MetricsQueueLimitDefault is Config.MetricsQueueLimit's default: about
// 110,000 series, a few megabytes per scrape.
const MetricsQueueLimitDefault = 10000

func (c *Config) fill() {
	d := DefaultConfig()
	if c.MetricsQueueLimit == 0 {
		c.MetricsQueueLimit = MetricsQueueLimitDefault
	}
	if c.ClientAddr == "" {
		c.ClientAddr = "127.0.0.1:0"
	}
	if c.HeartbeatMs == 0 {
		c.HeartbeatMs = d.HeartbeatMs
	}
	if c.FrameSizeMax == 0 {
		c.FrameSizeMax = d.FrameSizeMax
	}
	if c.FrameSizeMax < wire.FrameSizeMin {
		c.FrameSizeMax = wire.FrameSizeMin
	}
	if c.FrameSizeMax > wire.FrameSizeMax {
		c.FrameSizeMax = wire.FrameSizeMax
	}
	if c.WindowMax == 0 {
		c.WindowMax = d.WindowMax
	}
	if c.CreditMax == 0 {
		c.CreditMax = d.CreditMax
	}
	if c.InboundMax == 0 {
		c.InboundMax = d.InboundMax
	}
	if c.OutboundMax == 0 {
		c.OutboundMax = d.OutboundMax
	}
	if c.OutboundMax < 0 {
		c.OutboundMax = 0 // no cap
	}
	if c.OutboundTimeout <= 0 {
		c.OutboundTimeout = d.OutboundTimeout
	}
	if c.HandshakeTimeout <= 0 {
		c.HandshakeTimeout = d.HandshakeTimeout
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	if c.ServerName == "" {
		c.ServerName = d.ServerName
	}
	if len(c.ServerName) > wire.NameLenMax {
		c.ServerName = c.ServerName[:wire.NameLenMax] // WELCOME carries at most this much
	}
	if c.Shards <= 0 {
		c.Shards = numCPU()
	}
	if c.Loops <= 0 {
		c.Loops = numCPU()
	}
	if c.Role == "" {
		c.Role = RoleBroker
	}
	if c.ControllerWait <= 0 {
		c.ControllerWait = ControllerWaitDefault
	}
	if c.ControllerHeartbeat <= 0 {
		c.ControllerHeartbeat = ControllerHeartbeatDefault
	}
}

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
	stopOnce    sync.Once
	draining    atomic.Bool // Close began: no new work is taken (drain.go)
	stopHB      chan struct{}
	hbWG        sync.WaitGroup

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
	// replicator connects the shards to them (replicate.go).
	groups atomic.Pointer[groups.Manager]
	// proxies and proxiedSessions are the consumers proxied to other
	// brokers and, as a master, for other brokers (proxy.go).
	proxies         proxyTable
	proxiedSessions proxiedTable
	// lanes carry the peer connections' forwards and proxied commands to
	// the shards (lanes.go); set once the shards run.
	lanes *lanes
	// queueConsumers indexes the consumers by queue, to tell them of
	// their queue's deletion (consumerend.go).
	queueConsumers queueConsumers
	replicator     *replicator
	// regCtx ends at Close; it stops the registration and heartbeat loop
	// (regWG) and cancels its calls.
	regCtx    context.Context
	regCancel context.CancelFunc
	regWG     sync.WaitGroup
}

// Start starts a broker and returns once it accepts clients.
func Start(cfg Config) (*Server, error) {
	cfg.fill()
	if err := cfg.CheckController(); err != nil {
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
	s.conns.set = map[*connState]struct{}{}
	s.conns.opened = make(chan struct{}, 1)
	s.stalls.kick = make(chan struct{}, 1)
	s.metrics = newMetrics(s)
	s.sec = newSecurityMetrics(s.metrics.reg, cfg.Role != RoleController)
	if err := s.startClusterAuth(); err != nil {
		return nil, err
	}
	// Before the admin HTTP, whose basic auth reads the users: startAuth
	// (a broker) or startControllerOnly fills them in.
	s.auth = newAuthState(cfg.AllowPlainWithoutTLS)
	// The admin HTTP comes first: /readyz answers 503 while the rest
	// comes up.
	if cfg.AdminAddr != "" {
		if err := s.startAdmin(); err != nil {
			return nil, err
		}
	}
	started := false
	defer func() {
		if !started && s.admin != nil {
			_ = s.admin.Close()
		}
	}()
	if cfg.Role == RoleController {
		if err := startControllerOnly(s); err != nil {
			return nil, err
		}
		started = true
		s.boot.started.Store(true)
		return s, nil
	}
	if cfg.DataDir != "" {
		// Queues hash onto shards and each shard has its journal, so the
		// count is fixed when the data directory is created.
		n, err := wiring.ShardCount(cfg.DataDir)
		if err != nil {
			return nil, fmt.Errorf("server: %w", err)
		}
		if n > 0 && n != cfg.Shards {
			cfg.Logger.Warn("server: keeping the shard count of the data directory", "configured", cfg.Shards, "data_dir", n)
			cfg.Shards, s.cfg.Shards = n, n
		}
	}
	bcfg := shards.Config{Shards: cfg.Shards, CreditMax: cfg.CreditMax, Logger: cfg.Logger, RingSize: cfg.RingSize,
		MemoryLimit: cfg.MemoryLimit}
	if cfg.DataDir != "" {
		bcfg.PagingDir = filepath.Join(cfg.DataDir, "paging") // emptied at every start
	}
	wcfg := wiring.Config{Logger: cfg.Logger, Dropped: s.queueDropped}
	if cfg.DataDir != "" {
		var policy journal.FsyncPolicy
		switch cfg.Fsync {
		case "", "always":
			policy = journal.FsyncAlways
		case "never":
			policy = journal.FsyncNever
			cfg.Logger.Warn("server: fsync never: completions do not wait for the disk; a machine crash loses completed work")
		default:
			return nil, fmt.Errorf("server: fsync policy %q: want always or never", cfg.Fsync)
		}
		bcfg.Journal = &shards.JournalConfig{Dir: cfg.DataDir, Fsync: policy, FS: cfg.JournalFS, SegmentBytes: cfg.JournalSegmentBytes,
			CheckpointRecords: cfg.JournalCheckpointRecords}
		if cfg.controllerEmbedded() {
			wl, err := s.startController(true)
			if err != nil {
				return nil, err
			}
			wcfg.Log = wl
			s.wiringLog = wl
			if cfg.registersWithController() {
				err := s.loadBrokerID()
				if err == nil && cfg.PeerAddr == "" {
					err = s.checkPeerNotNeeded()
				}
				if err != nil {
					s.stopController()
					return nil, err
				}
			}
		}
	}
	s.broker = shards.New(bcfg)
	wcfg.Broker = s.broker
	if bcfg.Journal != nil {
		wcfg.Dir = cfg.DataDir
	}
	wcfg.Syncable = s.syncable
	wcfg.Foreign = s.foreignQueue
	wcfg.Droppable = s.syncDroppable
	s.wiring = wiring.New(wcfg)
	s.boot.wiring.Store(s.wiring)
	s.boot.broker.Store(s.broker)
	// The shards run first; the wiring adds the durable queues to them;
	// then the journals replay into those queues.
	if err := s.broker.Start(); err == nil {
		s.lanes = newLanes(s.regCtx, s.broker.Shards())
		if cfg.PeerAddr != "" && s.brokerID != 0 {
			err = s.initReplication()
		}
		if err == nil {
			err = s.wiring.Restore()
		}
		if err == nil && s.replicator != nil {
			err = s.replicator.restoreDone()
		}
		if err == nil {
			err = s.broker.Recover()
		}
		if err != nil {
			s.broker.Stop()
			s.stopController()
			return nil, fmt.Errorf("server: %w", err)
		}
	}

	usersApplied, err := s.startAuth()
	if err != nil {
		s.broker.Stop()
		s.stopController()
		return nil, err
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
	case err := <-s.runErr:
		s.broker.Stop()
		s.stopController()
		return nil, fmt.Errorf("server: listen on %s: %w", cfg.ClientAddr, err)
	}
	if cfg.TLSAddr != "" {
		if err := s.startTLS(); err != nil {
			_ = s.eng.Stop(context.Background())
			<-s.runErr
			s.broker.Stop()
			s.stopController()
			return nil, err
		}
		m := s.tlsMat
		s.registerCertExpiry("client", func() time.Time { return leafNotAfter(m.current.Load()) })
		s.tlsWG.Add(1)
		go s.serveTLS(h)
	}
	s.boot.serving.Store(true)
	s.hbWG.Add(2)
	go s.heartbeats()
	go func() { defer s.hbWG.Done(); s.stalls.run(s.stopHB) }()
	if s.ctl != nil {
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
			if err := s.startGroups(); err != nil {
				started = true // Close cleans up from here
				_ = s.Close()
				return nil, err
			}
		}
		s.regWG.Add(1)
		go s.controllerLoop()
	}
	s.log.Info("berth: broker started", "clients", s.addr, "tls", s.TLSAddr(), "admin", s.AdminAddr(), "shards", cfg.Shards, "loops", cfg.Loops, "memory_limit_bytes", cfg.MemoryLimit, "broker_id", s.brokerID)
	started = true
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
func (s *Server) Close() error {
	var err error
	s.stopOnce.Do(func() {
		// Heartbeats stop first: the controller learns of this broker's
		// departure before its member stops.
		s.regCancel()
		s.regWG.Wait()
		if s.lanes != nil {
			s.lanes.wait()
		}
		if g := s.groups.Load(); g != nil {
			g.Close()
		}
		if s.broker == nil { // controller-only
			if s.admin != nil {
				_ = s.admin.Close()
			}
			s.stopController()
			return
		}
		close(s.stopHB)
		s.hbWG.Wait()
		if s.admin != nil {
			_ = s.admin.Close()
		}
		// Take no new work, finish what is in flight, then tell every
		// client and stop the loops.
		s.stopTLSAccept()
		s.draining.Store(true)
		s.quiesce()
		// Management commands taken before finish first: they may need
		// the shards and the controller.
		s.mgmtWG.Wait()
		s.broker.Stop()
		if s.replicator != nil {
			s.replicator.local.close()
			s.replicator.foreign.close()
		}
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
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		err = s.eng.Stop(ctx)
		<-s.runErr
		s.stopController()
	})
	return err
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
	interval := min(time.Duration(s.cfg.HeartbeatMs)*time.Millisecond/2, heartbeatScanMax)
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
