package controlplane

import (
	"context"
	"fmt"
	"log/slog"
	"maps"
	"net"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/berthmq/berth/internal/peerauth"
	"go.etcd.io/raft/v3"
	pb "go.etcd.io/raft/v3/raftpb"
)

// BrokerTimeoutDefault is how long a broker may stay silent before the
// controller leader counts it dead and elects new masters for its groups:
// what a frozen (SIGSTOP) or cut-off master costs before its groups fail
// over. Brokers heartbeat every 200 ms by default (a quarter of it), so
// one late heartbeat is not a death. A broker whose heartbeat connection
// closes (a crash, kill -9) is counted dead at once, whatever this is.
// Before 0.8 s this was 3 s; a frozen master that led the controller
// cost 5 s more through a client that forgot the new leader (see
// ctlclient). docs/BENCHMARKS.md "Frozen masters" has the measurements,
// and that saturating load on the 2-core test machine caused no
// spurious election at 0.8 s.
const BrokerTimeoutDefault = 800 * time.Millisecond

// Config configures a controller node.
type Config struct {
	// ID is this controller's raft id, 1-based.
	ID uint64
	// Peers maps every controller's id, this one included, to its address.
	// The same address serves raft traffic and the controller service.
	Peers map[uint64]string
	// Dir holds the pebble log.
	Dir string
	// Listener, if set, is used instead of listening on Peers[ID]; tests
	// pass one bound to port 0.
	Listener net.Listener

	TickInterval   time.Duration // default 20ms
	ElectionTicks  int           // default 10
	HeartbeatTicks int           // default 2
	// LeaseRead lets the leader serve consistent reads from a lease
	// instead of a heartbeat round per ReadIndex. The lease is this
	// package's, not raft's ReadOnlyLeaseBased: raft's lets a partitioned
	// leader, which steps down only at its second quorum check, answer
	// reads after a new leader was elected (the linearizability test
	// caught it). Ours starts when a ReadIndex heartbeat round is sent
	// and lasts 3/4 of the minimum election timeout: every follower that
	// acked that round refuses votes for a full election timeout after it.
	LeaseRead bool
	// DisableBatching puts each proposal in its own entry and its own
	// Ready. It exists to measure what batching buys.
	DisableBatching bool
	// SnapshotEntries: snapshot after this many applied entries (default
	// 10000; 0 takes the default, negative disables).
	SnapshotEntries int
	// SnapshotBytes: snapshot also after this many bytes of applied
	// entries (default 64 MiB).
	SnapshotBytes int
	// SnapshotTrailing entries stay in the log after a snapshot so that a
	// slightly slow follower catches up from the log (default 1000).
	SnapshotTrailing int
	// FollowerLagMax: a follower further behind the leader's commit than
	// this redirects a follower read to the leader (default 1000).
	FollowerLagMax uint64
	// BrokerTimeout: a broker silent this long is dead (default
	// BrokerTimeoutDefault).
	BrokerTimeout time.Duration
	// LeaderGrace: a new leader counts a registered broker dead if the
	// broker has not heartbeated to it within this long of taking office
	// (default BrokerTimeout/2, which with the brokers' default heartbeat
	// interval of a quarter of BrokerTimeoutDefault lets a live broker's
	// next ordinary heartbeat arrive, and one retry, even if it never
	// learns of the new leader; brokers that embed a controller member
	// heartbeat at once when they see the leader change). Waiting out the whole BrokerTimeout instead cost a
	// failover of a broker that died together with the controller leader
	// seconds: the closed connection that would have told was on the dead
	// leader. At most BrokerTimeout.
	LeaderGrace time.Duration
	// KeepBrokersOnDisconnect: by default a broker whose heartbeat
	// connection drops is treated as dead at the next scan, without
	// waiting out BrokerTimeout. Set this to wait for the timeout only.
	KeepBrokersOnDisconnect bool
	// UncleanElection lets the failure detector elect masters from outside
	// the SyncStateSet when none inside is alive. Off by default.
	UncleanElection bool
	// Join starts a member being added to an existing group: it starts
	// with no configuration and waits for the leader's snapshot. Peers
	// must still hold this node's own address.
	Join bool
	// Auth, if set, is the proof of cluster membership every connection
	// to this node must give before its first frame is read (raft peers,
	// brokers and berthctl alike), and that this node gives when it dials
	// its peers.
	Auth *peerauth.Auth
	// Faults, if set, cuts raft links (tests only).
	Faults *Faults
	Logger *slog.Logger
}

func (c *Config) defaults() error {
	if c.ID == 0 || c.Peers[c.ID] == "" {
		return fmt.Errorf("controlplane: node id %d has no address in peers", c.ID)
	}
	switch len(c.Peers) {
	case 1, 3, 5:
	default:
		if !c.Join {
			return fmt.Errorf("controlplane: a controller group has 1, 3 or 5 members, not %d", len(c.Peers))
		}
	}
	if c.Dir == "" {
		return fmt.Errorf("controlplane: no data directory")
	}
	if c.TickInterval <= 0 {
		c.TickInterval = 20 * time.Millisecond
	}
	if c.ElectionTicks <= 0 {
		c.ElectionTicks = 10
	}
	if c.HeartbeatTicks <= 0 {
		c.HeartbeatTicks = 2
	}
	if c.SnapshotEntries == 0 {
		c.SnapshotEntries = 10000
	}
	if c.SnapshotBytes <= 0 {
		c.SnapshotBytes = 64 << 20
	}
	if c.SnapshotTrailing <= 0 {
		c.SnapshotTrailing = 1000
	}
	if c.FollowerLagMax == 0 {
		c.FollowerLagMax = 1000
	}
	if c.BrokerTimeout <= 0 {
		c.BrokerTimeout = BrokerTimeoutDefault
	}
	if c.LeaderGrace <= 0 {
		c.LeaderGrace = c.BrokerTimeout / 2
	}
	c.LeaderGrace = min(c.LeaderGrace, c.BrokerTimeout)
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return nil
}

// Node is one controller: a raft member, its state machine, its service
// endpoint and, while leader, the broker failure detector.
//
// Goroutines: the raft goroutine owns rn, pending and readBatches; the
// listener and one goroutine per connection serve requests; the scanner
// watches broker heartbeats. Requests from any goroutine meet the raft
// goroutine only through the proposal and read queues.
type Node struct {
	cfg       Config
	self      uint64
	rn        *raft.RawNode
	storage   *diskStorage
	transport *transport
	listener  net.Listener

	confMu    sync.Mutex
	confState *pb.ConfState // guarded by confMu
	// confIndex is the log index confState is current at: the last
	// membership change raft applied, or the snapshot restored.
	confIndex uint64      // guarded by confMu
	forceSnap atomic.Bool // snapshot after a membership change
	confQ     chan confRequest

	peersMu sync.RWMutex
	peers   map[uint64]string // guarded by peersMu: id to address

	// mu guards state and applied; appliedCh is closed and replaced each
	// time applied moves, waking readers waiting for an index.
	mu        sync.RWMutex
	state     *State
	applied   uint64
	appliedCh chan struct{}

	snapIndex      uint64 // raft goroutine only
	bytesSinceSnap int    // raft goroutine only
	// compactPast, if nonzero, asks the next snapshot to compact the log
	// past this index: a follower lost entries it had acknowledged, and
	// raft, which never lowers a follower's match, reaches it only with a
	// snapshot.
	compactPast atomic.Uint64
	lostLogSeen map[uint64]time.Time // raft goroutine only: last detection per follower

	lead atomic.Uint64
	// leadMoved is closed, and replaced, when lead changes
	// (LeaderChanged).
	leadMoved atomic.Pointer[chan struct{}]
	term      atomic.Uint64
	isLdr     atomic.Bool

	propMu     sync.Mutex
	propQ      []*proposal
	propSignal chan struct{}
	nextSeq    uint64               // guarded by propMu
	pending    map[uint64]*proposal // raft goroutine only
	batches    entryBatches         // proposals per entry (metrics.go)

	readMu      sync.Mutex
	readQ       []*readRequest
	readSignal  chan struct{}
	nextReadID  uint64
	readBatches map[uint64]*readBatch

	// The read lease; raft goroutine only.
	leaseUntil    time.Time
	leaseTerm     uint64
	leaseRenewing bool
	leaseUsed     time.Time

	msgIn chan *pb.Message

	hb *heartbeats

	stop     chan struct{}
	stopOnce sync.Once
	wg       sync.WaitGroup
	fatalErr atomic.Pointer[error]

	connsMu sync.Mutex
	conns   map[net.Conn]struct{}
	connSeq atomic.Uint64
}

type raftLogger struct{ l *slog.Logger }

// raft's debug and info lines go out at debug level, formatted only when
// that level is on (raft logs on hot paths).
func (r raftLogger) verbose(f string, v ...any) {
	if r.l.Enabled(context.Background(), slog.LevelDebug) {
		r.l.Debug("controlplane: raft: " + fmt.Sprintf(f, v...))
	}
}
func (r raftLogger) Debug(v ...any)            { r.verbose("%s", fmt.Sprint(v...)) }
func (r raftLogger) Debugf(f string, v ...any) { r.verbose(f, v...) }
func (r raftLogger) Info(v ...any)             { r.verbose("%s", fmt.Sprint(v...)) }
func (r raftLogger) Infof(f string, v ...any)  { r.verbose(f, v...) }
func (r raftLogger) Warning(v ...any)          { r.l.Debug("controlplane: raft: " + fmt.Sprint(v...)) }
func (r raftLogger) Warningf(f string, v ...any) {
	r.l.Debug("controlplane: raft: " + fmt.Sprintf(f, v...))
}
func (r raftLogger) Error(v ...any) { r.l.Error("controlplane: raft: " + fmt.Sprint(v...)) }
func (r raftLogger) Errorf(f string, v ...any) {
	r.l.Error("controlplane: raft: " + fmt.Sprintf(f, v...))
}
func (r raftLogger) Fatal(v ...any)            { panic("controlplane: raft: " + fmt.Sprint(v...)) }
func (r raftLogger) Fatalf(f string, v ...any) { panic("controlplane: raft: " + fmt.Sprintf(f, v...)) }
func (r raftLogger) Panic(v ...any)            { panic("controlplane: raft: " + fmt.Sprint(v...)) }
func (r raftLogger) Panicf(f string, v ...any) { panic("controlplane: raft: " + fmt.Sprintf(f, v...)) }

// Start opens the log in cfg.Dir, restores the state from the latest
// snapshot and the log tail, and starts serving on Peers[ID].
func Start(cfg Config) (*Node, error) {
	if err := cfg.defaults(); err != nil {
		return nil, err
	}
	voters := make([]uint64, 0, len(cfg.Peers))
	for id := range cfg.Peers {
		voters = append(voters, id)
	}
	slices.Sort(voters)
	if cfg.Join {
		voters = nil
	}
	st, err := openStorage(cfg.Dir, voters, cfg.Logger)
	if err != nil {
		return nil, err
	}
	snap, _ := st.Snapshot()
	raw, err := decompressSnapshot(snap.GetData())
	if err != nil {
		st.close()
		return nil, err
	}
	state, err := DecodeState(raw)
	if err != nil {
		st.close()
		return nil, err
	}
	n := &Node{
		cfg: cfg, self: cfg.ID, storage: st, state: state,
		confState:   snap.GetMetadata().GetConfState(),
		confIndex:   snap.GetMetadata().GetIndex(),
		applied:     snap.GetMetadata().GetIndex(),
		snapIndex:   snap.GetMetadata().GetIndex(),
		appliedCh:   make(chan struct{}),
		propSignal:  make(chan struct{}, 1),
		readSignal:  make(chan struct{}, 1),
		pending:     map[uint64]*proposal{},
		readBatches: map[uint64]*readBatch{},
		msgIn:       make(chan *pb.Message, recvQueueMax),
		confQ:       make(chan confRequest, confQueueMax),
		peers:       maps.Clone(cfg.Peers),
		stop:        make(chan struct{}),
		conns:       map[net.Conn]struct{}{},
		// Sequence numbers start from the clock so that entries proposed by
		// an earlier incarnation of this node never match a new waiter.
		nextSeq: uint64(time.Now().UnixNano()),
	}
	n.hb = newHeartbeats(cfg.BrokerTimeout, cfg.LeaderGrace)
	moved := make(chan struct{})
	n.leadMoved.Store(&moved)
	ro := raft.ReadOnlySafe
	rn, err := raft.NewRawNode(&raft.Config{
		ID:              cfg.ID,
		ElectionTick:    cfg.ElectionTicks,
		HeartbeatTick:   cfg.HeartbeatTicks,
		Storage:         st,
		Applied:         n.applied,
		MaxSizePerMsg:   1 << 20,
		MaxInflightMsgs: 256,
		CheckQuorum:     true,
		PreVote:         true,
		ReadOnlyOption:  ro,
		Logger:          raftLogger{cfg.Logger},
	})
	if err != nil {
		st.close()
		return nil, fmt.Errorf("controlplane: start raft: %w", err)
	}
	n.rn = rn
	if len(voters) == 1 {
		// Alone, there is nobody to wait for.
		rn.Campaign()
	}
	ln := cfg.Listener
	if ln == nil {
		ln, err = net.Listen("tcp", cfg.Peers[cfg.ID])
		if err != nil {
			st.close()
			return nil, fmt.Errorf("controlplane: listen: %w", err)
		}
	}
	n.listener = ln
	n.transport = newTransport(cfg.ID, cfg.Peers, cfg.Auth, cfg.Faults, cfg.Logger)
	n.adoptAddressBook(state.Controllers())
	n.wg.Add(3)
	go n.run()
	go n.serve()
	go n.scanLoop()
	return n, nil
}

// Stop stops the node and closes its log. In-flight requests fail.
func (n *Node) Stop() {
	n.stopOnce.Do(func() {
		close(n.stop)
		n.listener.Close()
		n.connsMu.Lock()
		for c := range n.conns {
			c.Close()
		}
		n.connsMu.Unlock()
		n.wg.Wait()
		n.transport.close()
		n.storage.close()
	})
}

// Done is closed once the node stops, by Stop or on a fatal error (a log
// write that failed, say); Err then tells which.
func (n *Node) Done() <-chan struct{} { return n.stop }

// Err returns the fatal error that stopped the node, or nil.
func (n *Node) Err() error {
	if p := n.fatalErr.Load(); p != nil {
		return *p
	}
	return nil
}

// ID returns the node's raft id.
func (n *Node) ID() uint64 { return n.self }

// Addr returns the address the node serves on.
func (n *Node) Addr() string { return n.listener.Addr().String() }

// Leader returns the current leader's id, 0 if unknown.
func (n *Node) Leader() uint64 { return n.lead.Load() }

// LeaderChanged returns a channel that is closed once Leader's answer
// changes after this call. Take it before reading Leader, so no change
// falls between the two.
func (n *Node) LeaderChanged() <-chan struct{} { return *n.leadMoved.Load() }

// setLeader records the leader raft reports; raft goroutine only.
func (n *Node) setLeader(lead uint64) {
	if n.lead.Swap(lead) == lead {
		return
	}
	ch := make(chan struct{})
	close(*n.leadMoved.Swap(&ch))
}

// LeaderAddr returns the current leader's address, "" if unknown.
func (n *Node) LeaderAddr() string { return n.leaderAddr() }

// IsLeader reports whether this node is the leader.
func (n *Node) IsLeader() bool { return n.isLdr.Load() }

// Applied returns the applied index.
func (n *Node) Applied() uint64 {
	n.mu.RLock()
	defer n.mu.RUnlock()
	return n.applied
}

func (n *Node) leaderAddr() string {
	if l := n.lead.Load(); l != 0 {
		n.peersMu.RLock()
		defer n.peersMu.RUnlock()
		return n.peers[l]
	}
	return ""
}

func (n *Node) fail(err error) {
	n.cfg.Logger.Error("controlplane: node stopping on fatal error", "node", n.self, "err", err)
	n.fatalErr.Store(&err)
	go n.Stop()
}

func signal(c chan struct{}) {
	select {
	case c <- struct{}{}:
	default:
	}
}

// Status is a point-in-time view of a node, for tests and admin tools.
type Status struct {
	ID, Leader, Term, Applied, SnapshotIndex, FirstIndex, LastIndex uint64
}

// Status returns the node's status. Safe from any goroutine.
func (n *Node) Status() Status {
	first, _ := n.storage.FirstIndex()
	last, _ := n.storage.LastIndex()
	snap, _ := n.storage.Snapshot()
	return Status{ID: n.self, Leader: n.lead.Load(), Term: n.term.Load(), Applied: n.Applied(),
		SnapshotIndex: snap.GetMetadata().GetIndex(), FirstIndex: first, LastIndex: last}
}
