package controlplane

import (
	"context"
	"encoding/binary"
	"fmt"
	"log/slog"
	"maps"
	"net"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"go.etcd.io/raft/v3"
	pb "go.etcd.io/raft/v3/raftpb"
	"go.etcd.io/raft/v3/tracker"
)

// Bounds on the node's queues.
const (
	// proposalQueueMax bounds proposals waiting for the raft goroutine.
	proposalQueueMax = 1 << 16
	// readQueueMax bounds reads waiting for a ReadIndex.
	readQueueMax = 1 << 16
	// readBatchesMax bounds ReadIndex requests in flight.
	readBatchesMax = 1024
	// readRoundsMax bounds the ReadIndex rounds a node keeps in flight;
	// readers arriving meanwhile join the next round, so under load each
	// heartbeat round answers many readers.
	readRoundsMax = 2
	// readBatchTimeout drops a ReadIndex request whose answer was lost
	// (raft drops them silently, for example without a leader).
	readBatchTimeout = 3 * time.Second
	// entryBytesMax bounds one log entry; a batch of proposals is split
	// into entries of at most this size.
	entryBytesMax = 256 << 10
	// recvQueueMax bounds raft messages received and not yet stepped.
	recvQueueMax = 4096
	// readyProposalsMax bounds the proposals packed into one Ready, so a
	// burst does not make one giant fsync.
	readyProposalsMax = 8192
)

// ReadMode picks how a read is served.
type ReadMode uint8

const (
	// ReadConsistent is linearizable: the leader confirms it is still
	// leader by ReadIndex (a heartbeat round) or, when the node runs with
	// LeaseRead, by its lease.
	ReadConsistent ReadMode = iota
	// ReadFollower is linearizable and served by any controller: it asks
	// the leader for a ReadIndex and waits to apply up to it, or redirects
	// when too far behind.
	ReadFollower
	// ReadUnsafe is served from the leader's state with no check.
	ReadUnsafe
)

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
	// BrokerTimeout: a broker silent this long is dead (default 3s).
	BrokerTimeout time.Duration
	// KeepBrokersOnDisconnect: by default a broker whose heartbeat
	// connection drops is treated as dead at the next scan, without
	// waiting out BrokerTimeout. Set this to wait for the timeout only.
	KeepBrokersOnDisconnect bool
	// UncleanElection lets the failure detector elect masters from outside
	// the SyncStateSet when none inside is alive. Off by default.
	UncleanElection bool
	// AsyncStorageWrites takes the fsync off the raft goroutine (raft's
	// AsyncStorageWrites): an append goroutine group-commits log writes and
	// an apply goroutine applies, so the raft goroutine keeps stepping
	// messages and packing proposals while the disk works.
	AsyncStorageWrites bool
	// Join starts a member being added to an existing group: it starts
	// with no configuration and waits for the leader's snapshot. Peers
	// must still hold this node's own address.
	Join bool
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
		c.BrokerTimeout = 3 * time.Second
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return nil
}

// proposal is one event waiting for the log. Proposals are queued in
// groups (one for Propose, a connection's burst of writes for the service)
// and answered as a group.
type proposal struct {
	data []byte
	seq  uint64
	grp  *proposalGroup
	idx  int // the proposal's slot in grp.res
}

// proposalGroup collects the results of proposals queued together.
type proposalGroup struct {
	res  []proposeResult // one per proposal, each written once by its finisher
	left atomic.Int32
	done chan struct{} // closed when every result is in
}

// finish delivers p's result. Every proposal is finished exactly once.
func (p *proposal) finish(r proposeResult) {
	p.grp.res[p.idx] = r
	if p.grp.left.Add(-1) == 0 {
		close(p.grp.done)
	}
}

type proposeResult struct {
	res Result
	err error
}

type readRequest struct {
	follower bool
	done     chan readIndexResult // cap 1
	// seal, if set, is closed to newcomers by the raft goroutine before
	// the request's index is taken: readers that joined before it are
	// covered by the index, later ones must not join.
	seal *readSeal
}

// readSeal lets readers join a queued ReadIndex request until the raft
// goroutine takes its index.
type readSeal struct {
	mu     sync.Mutex
	sealed bool // guarded by mu
}

func sealReads(q []*readRequest) {
	for _, r := range q {
		if r.seal != nil {
			r.seal.mu.Lock()
			r.seal.sealed = true
			r.seal.mu.Unlock()
		}
	}
}

type readIndexResult struct {
	index uint64
	err   error
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
	confIndex uint64 // guarded by confMu
	// confSeen is the index of the last membership change entry the state
	// machine applied. With asynchronous storage writes raft applies the
	// change on its own goroutine a little later; until confIndex catches
	// up, confState is stale and no snapshot may be taken.
	confSeen  atomic.Uint64
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

	lead  atomic.Uint64
	term  atomic.Uint64
	isLdr atomic.Bool

	propMu     sync.Mutex
	propQ      []*proposal
	propSignal chan struct{}
	nextSeq    uint64     // guarded by propMu
	pendingMu  sync.Mutex // guards pending: the raft and apply goroutines share it
	pending    map[uint64]*proposal
	batches    entryBatches // proposals per entry (metrics.go)

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

	// Asynchronous storage writes only.
	appendQ     chan *pb.Message
	applyQ      chan applyItem
	localMu     sync.Mutex
	localQ      []localItem
	localSignal chan struct{}

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
		appendQ:     make(chan *pb.Message, storageQueueMax),
		applyQ:      make(chan applyItem, storageQueueMax),
		localSignal: make(chan struct{}, 1),
		stop:        make(chan struct{}),
		conns:       map[net.Conn]struct{}{},
		// Sequence numbers start from the clock so that entries proposed by
		// an earlier incarnation of this node never match a new waiter.
		nextSeq: uint64(time.Now().UnixNano()),
	}
	n.hb = newHeartbeats(cfg.BrokerTimeout)
	ro := raft.ReadOnlySafe
	rn, err := raft.NewRawNode(&raft.Config{
		ID:                 cfg.ID,
		ElectionTick:       cfg.ElectionTicks,
		HeartbeatTick:      cfg.HeartbeatTicks,
		Storage:            st,
		Applied:            n.applied,
		MaxSizePerMsg:      1 << 20,
		MaxInflightMsgs:    256,
		CheckQuorum:        true,
		PreVote:            true,
		ReadOnlyOption:     ro,
		AsyncStorageWrites: cfg.AsyncStorageWrites,
		Logger:             raftLogger{cfg.Logger},
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
	n.transport = newTransport(cfg.ID, cfg.Peers, cfg.Faults, cfg.Logger)
	n.adoptAddressBook(state.Controllers())
	if cfg.AsyncStorageWrites {
		n.wg.Add(2)
		go n.appendLoop()
		go n.applyLoop()
	}
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

// run is the raft goroutine.
func (n *Node) run() {
	defer n.wg.Done()
	defer n.abortAll(ErrStopped)
	ticker := time.NewTicker(n.cfg.TickInterval)
	defer ticker.Stop()
	for {
		select {
		case <-n.stop:
			return
		case <-ticker.C:
			n.rn.Tick()
			n.expireReads(time.Now())
		case m := <-n.msgIn:
			n.step(m)
			for i := 0; i < recvQueueMax; i++ {
				select {
				case m = <-n.msgIn:
					n.step(m)
					continue
				default:
				}
				break
			}
		case r := <-n.transport.reports:
			if r.unreachable {
				n.rn.ReportUnreachable(r.to)
			}
			if r.snapshot {
				status := raft.SnapshotFinish
				if r.snapFailed {
					status = raft.SnapshotFailure
				}
				n.rn.ReportSnapshot(r.to, status)
			}
		case <-n.propSignal:
		case <-n.readSignal:
		case <-n.localSignal:
			n.stepLocal()
		case r := <-n.confQ:
			r.done <- n.rn.ProposeConfChange(r.cc)
		}
		n.drainProposals()
		n.drainReads()
		for n.rn.HasReady() {
			if err := n.handleReady(); err != nil {
				n.fail(err)
				return
			}
		}
	}
}

func (n *Node) step(m *pb.Message) {
	if m.GetType() == pb.MsgHeartbeat {
		// A controller whose data was wiped has an empty log while the
		// leader still remembers its old match index. Raft would panic on
		// a commit index past the log end; drop the commit instead and let
		// the following append or snapshot bring the log up.
		if last, _ := n.storage.LastIndex(); m.GetCommit() > last {
			m.Commit = nil
		}
	}
	if m.GetType() == pb.MsgApp && n.cfg.Join && n.unconfigured() {
		// A joining member must start from a snapshot, which carries the
		// configuration: entries applied onto no configuration would make
		// raft apply a membership change to an empty one. The leader
		// compacts its log right after the change, so its next probe
		// after this drop sends the snapshot.
		return
	}
	if m.GetType() == pb.MsgAppResp && m.GetReject() && n.isLdr.Load() {
		n.checkLostLog(m)
	}
	if err := n.rn.Step(m); err != nil && err != raft.ErrStepPeerNotFound {
		n.cfg.Logger.Debug("controlplane: step", "err", err)
	}
}

// unconfigured reports whether the node has no configuration yet: a joining
// member before its first snapshot.
func (n *Node) unconfigured() bool {
	n.confMu.Lock()
	defer n.confMu.Unlock()
	return len(n.confState.GetVoters()) == 0 && len(n.confState.GetLearners()) == 0
}

// lostLogCheckInterval rate-limits the lost-log check per follower: a
// follower that lost its log rejects every append in flight at once.
const lostLogCheckInterval = 100 * time.Millisecond

// checkLostLog runs on the leader for each rejected append. Raft assumes a
// follower never loses what it acknowledged, so it never lowers a
// follower's match below the acknowledged index. A controller whose data
// was wiped (a replaced disk, an operator's rm) then rejects the probe at
// its old match forever while the leader still holds that entry, and never
// catches up. When the follower's hint says its log ends before the match
// it acknowledged, the leader compacts its log past that match, so that
// raft's next probe finds the entry gone and sends a snapshot instead.
func (n *Node) checkLostLog(m *pb.Message) {
	from := m.GetFrom()
	now := time.Now()
	if now.Sub(n.lostLogSeen[from]) < lostLogCheckInterval {
		return
	}
	var match uint64
	var probing bool
	n.rn.WithProgress(func(id uint64, _ raft.ProgressType, pr tracker.Progress) {
		if id == from {
			match, probing = pr.Match, pr.State == tracker.StateProbe
		}
	})
	// Only a probe at the acknowledged index itself proves the loss: a
	// stale rejection of an earlier probe carries a lower index.
	if !probing || m.GetIndex() != match || m.GetRejectHint() >= match {
		return
	}
	if n.lostLogSeen == nil {
		n.lostLogSeen = map[uint64]time.Time{}
	}
	n.lostLogSeen[from] = now
	if n.compactPast.Load() < match+1 {
		n.compactPast.Store(match + 1)
	}
	n.cfg.Logger.Warn("controlplane: a controller lost log entries it had acknowledged; compacting so that it receives a snapshot",
		"node", n.self, "controller", from, "acknowledged", match, "log_end", m.GetRejectHint())
	if last, _ := n.storage.LastIndex(); last <= match {
		// Nothing was written since: the log needs an entry past the
		// match to compact to. An empty entry applies as nothing.
		n.rn.Propose(nil)
	}
	if n.cfg.AsyncStorageWrites {
		// The apply goroutine takes snapshots in this mode; wake it.
		select {
		case n.applyQ <- applyItem{}:
		default:
		}
	}
}

// Propose puts ev through the log and returns its result once applied on
// this node. Only the leader accepts proposals.
func (n *Node) Propose(ctx context.Context, ev Event) (Result, error) {
	if err := ValidateEvent(ev); err != nil {
		return Result{}, err
	}
	res, err := n.proposeMany(ctx, [][]byte{EncodeEvent(nil, ev)})
	if err != nil {
		return Result{}, err
	}
	return res[0].res, res[0].err
}

// proposeMany puts a group of encoded events through the log at once (one
// queue lock, consecutive sequence numbers, so usually one entry) and
// returns their results in order. If ctx ends first it returns ErrTimeout
// and the group's outcome is unknown.
func (n *Node) proposeMany(ctx context.Context, datas [][]byte) ([]proposeResult, error) {
	if !n.isLdr.Load() {
		return nil, &NotLeaderError{Leader: n.leaderAddr()}
	}
	g := &proposalGroup{res: make([]proposeResult, len(datas)), done: make(chan struct{})}
	g.left.Store(int32(len(datas)))
	ps := make([]proposal, len(datas))
	n.propMu.Lock()
	if len(n.propQ)+len(datas) > proposalQueueMax {
		n.propMu.Unlock()
		return nil, ErrBusy
	}
	for i, d := range datas {
		n.nextSeq++
		ps[i] = proposal{data: d, seq: n.nextSeq, grp: g, idx: i}
		n.propQ = append(n.propQ, &ps[i])
	}
	n.propMu.Unlock()
	signal(n.propSignal)
	select {
	case <-g.done:
		return g.res, nil
	case <-ctx.Done():
		return nil, fmt.Errorf("%w: %v", ErrTimeout, ctx.Err())
	case <-n.stop:
		return nil, ErrStopped
	}
}

const entryFormat = 1

// An entry carries a batch of events: format, proposer id, first sequence
// number, count, then each event as a uint32 length and bytes. Events of one
// entry have consecutive sequence numbers.
func (n *Node) drainProposals() {
	n.propMu.Lock()
	q := n.propQ
	if n.cfg.DisableBatching && len(q) > 1 {
		n.propQ = q[1:]
		q = q[:1]
		signal(n.propSignal)
	} else if len(q) > readyProposalsMax {
		n.propQ = slices.Clone(q[readyProposalsMax:])
		q = q[:readyProposalsMax]
		signal(n.propSignal)
	} else {
		n.propQ = nil
	}
	n.propMu.Unlock()
	if len(q) == 0 {
		return
	}
	if !n.isLdr.Load() {
		for _, p := range q {
			p.finish(proposeResult{err: &NotLeaderError{Leader: n.leaderAddr()}})
		}
		return
	}
	for len(q) > 0 {
		// q's sequence numbers are consecutive: they were assigned in queue
		// order under propMu.
		size := 21
		k := 0
		for k < len(q) && (k == 0 || size+4+len(q[k].data) <= entryBytesMax) {
			size += 4 + len(q[k].data)
			k++
		}
		batch := q[:k]
		q = q[k:]
		buf := make([]byte, 0, size)
		buf = append(buf, entryFormat)
		buf = binary.BigEndian.AppendUint64(buf, n.self)
		buf = binary.BigEndian.AppendUint64(buf, batch[0].seq)
		buf = binary.BigEndian.AppendUint32(buf, uint32(len(batch)))
		for _, p := range batch {
			buf = binary.BigEndian.AppendUint32(buf, uint32(len(p.data)))
			buf = append(buf, p.data...)
		}
		if err := n.rn.Propose(buf); err != nil {
			for _, p := range batch {
				p.finish(proposeResult{err: &NotLeaderError{Leader: n.leaderAddr()}})
			}
			continue
		}
		n.batches.observe(len(batch))
		n.pendingMu.Lock()
		for _, p := range batch {
			n.pending[p.seq] = p
		}
		n.pendingMu.Unlock()
	}
}

// ReadIndex returns an index such that the state at or after it reflects
// every write completed before the call. With follower set it may run on a
// follower; it fails with *LaggingError if the follower is too far behind.
func (n *Node) ReadIndex(ctx context.Context, follower bool) (uint64, error) {
	return n.readIndex(ctx, follower, nil)
}

// readIndex is ReadIndex for readers that may join until seal is sealed.
func (n *Node) readIndex(ctx context.Context, follower bool, seal *readSeal) (uint64, error) {
	if !follower && !n.isLdr.Load() {
		return 0, &NotLeaderError{Leader: n.leaderAddr()}
	}
	if n.lead.Load() == 0 {
		return 0, &NotLeaderError{}
	}
	r := &readRequest{follower: follower, done: make(chan readIndexResult, 1), seal: seal}
	n.readMu.Lock()
	if len(n.readQ) >= readQueueMax {
		n.readMu.Unlock()
		return 0, ErrBusy
	}
	n.readQ = append(n.readQ, r)
	n.readMu.Unlock()
	signal(n.readSignal)
	var res readIndexResult
	select {
	case res = <-r.done:
	case <-ctx.Done():
		return 0, fmt.Errorf("%w: %v", ErrTimeout, ctx.Err())
	case <-n.stop:
		return 0, ErrStopped
	}
	if res.err != nil {
		return 0, res.err
	}
	if follower {
		if applied := n.Applied(); res.index > applied+n.cfg.FollowerLagMax {
			return 0, &LaggingError{Leader: n.leaderAddr(), Behind: res.index - applied}
		}
	}
	return res.index, n.waitApplied(ctx, res.index)
}

func (n *Node) waitApplied(ctx context.Context, index uint64) error {
	for {
		n.mu.RLock()
		applied, ch := n.applied, n.appliedCh
		n.mu.RUnlock()
		if applied >= index {
			return nil
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return fmt.Errorf("%w: %v", ErrTimeout, ctx.Err())
		case <-n.stop:
			return ErrStopped
		}
	}
}

// drainReads turns every waiting reader into one ReadIndex request.
// readBatch is the readers sharing one ReadIndex request.
type readBatch struct {
	reqs []*readRequest
	sent time.Time // before the heartbeat round: a lease may start here
	term uint64
}

func (n *Node) leaseDuration() time.Duration {
	return time.Duration(n.cfg.ElectionTicks) * n.cfg.TickInterval * 3 / 4
}

func (n *Node) drainReads() {
	n.readMu.Lock()
	q := n.readQ
	n.readQ = nil
	n.readMu.Unlock()
	renew := false
	var st raft.BasicStatus
	now := time.Now()
	if n.cfg.LeaseRead && n.isLdr.Load() {
		st = n.rn.BasicStatus()
		if st.RaftState == raft.StateLeader && st.HardState.GetTerm() == n.leaseTerm && now.Before(n.leaseUntil) {
			// While the lease holds no other leader can exist, so the
			// commit index covers every write completed before now. Only
			// this goroutine moves it, so it holds until the seal.
			idx := st.HardState.GetCommit()
			sealReads(q)
			for _, r := range q {
				r.done <- readIndexResult{index: idx}
			}
			if len(q) > 0 {
				n.leaseUsed = now
			}
			q = nil
			// Renew ahead of expiry only while the lease is in use, so an
			// idle leader sends no extra heartbeat rounds.
			renew = !n.leaseRenewing && n.leaseUntil.Sub(now) < n.leaseDuration()/2 &&
				now.Sub(n.leaseUsed) < n.leaseDuration()
		}
		// Otherwise the readers' own ReadIndex round, below, renews it.
	}
	if len(q) == 0 && !renew {
		return
	}
	if len(n.readBatches) >= readRoundsMax {
		// Put the readers back; the next round takes them when an answer
		// arrives (deliverReadStates signals).
		n.readMu.Lock()
		n.readQ = append(q, n.readQ...)
		n.readMu.Unlock()
		return
	}
	if len(n.readBatches) >= readBatchesMax {
		for _, r := range q {
			r.done <- readIndexResult{err: ErrBusy}
		}
		return
	}
	sealReads(q)
	if renew {
		n.leaseRenewing = true
	}
	n.nextReadID++
	id := n.nextReadID
	var ctx [16]byte
	binary.BigEndian.PutUint64(ctx[:], n.self)
	binary.BigEndian.PutUint64(ctx[8:], id)
	n.readBatches[id] = &readBatch{reqs: q, sent: now, term: st.HardState.GetTerm()}
	n.rn.ReadIndex(ctx[:])
}

// Read runs fn on the state once the read mode's consistency is met. fn runs
// under the state's read lock and must not keep references into it.
func (n *Node) Read(ctx context.Context, mode ReadMode, fn func(*State)) error {
	switch mode {
	case ReadUnsafe:
		if !n.isLdr.Load() {
			return &NotLeaderError{Leader: n.leaderAddr()}
		}
	case ReadConsistent, ReadFollower:
		if _, err := n.ReadIndex(ctx, mode == ReadFollower); err != nil {
			return err
		}
	default:
		return fmt.Errorf("%w: unknown read mode %d", ErrBadRequest, mode)
	}
	n.mu.RLock()
	defer n.mu.RUnlock()
	fn(n.state)
	return nil
}

func (n *Node) softState(rd raft.Ready) {
	if rd.SoftState != nil {
		wasLeader := n.isLdr.Load()
		n.lead.Store(rd.SoftState.Lead)
		isLeader := rd.SoftState.RaftState == raft.StateLeader
		n.isLdr.Store(isLeader)
		if wasLeader && !isLeader {
			n.abortPending(ErrLeaderChanged)
		}
		if !isLeader || rd.SoftState.Lead == raft.None {
			n.abortReads(ErrReadAborted)
		}
		if isLeader && !wasLeader {
			n.mu.RLock()
			brokers := n.state.Brokers()
			n.mu.RUnlock()
			n.hb.becomeLeader(brokers, time.Now())
		}
	}
	if rd.HardState != nil {
		n.term.Store(rd.HardState.GetTerm())
	}
}

func (n *Node) handleReady() error {
	if n.cfg.AsyncStorageWrites {
		return n.handleReadyAsync()
	}
	rd := n.rn.Ready()
	n.softState(rd)
	// A leader may send its appends before its own fsync (raft thesis
	// 10.2.1): it counts itself toward a quorum only for entries it has
	// persisted, so its disk write and its followers' overlap. For the same
	// reason every entry a leader sees committed was persisted by an
	// earlier Ready (acks are stepped only after that Ready's write), so it
	// applies, and answers its clients, before this Ready's fsync.
	// Everyone else persists first: their messages vouch for what is on
	// disk, and their committed entries may be in this Ready's Entries.
	if n.isLdr.Load() && raft.IsEmptySnap(rd.Snapshot) {
		for _, m := range rd.Messages {
			n.transport.send(m)
		}
		n.apply(rd.CommittedEntries)
		n.deliverReadStates(rd.ReadStates)
		if err := n.storage.save(rd.HardState, rd.Entries, rd.Snapshot, rd.MustSync); err != nil {
			return err
		}
	} else {
		if err := n.storage.save(rd.HardState, rd.Entries, rd.Snapshot, rd.MustSync); err != nil {
			return err
		}
		for _, m := range rd.Messages {
			n.transport.send(m)
		}
		if !raft.IsEmptySnap(rd.Snapshot) {
			if err := n.restoreSnapshot(rd.Snapshot); err != nil {
				return err
			}
		}
		n.apply(rd.CommittedEntries)
		n.deliverReadStates(rd.ReadStates)
	}
	n.rn.Advance(rd)
	return n.maybeSnapshot()
}

// expireReads fails ReadIndex requests that got no answer in time.
func (n *Node) expireReads(now time.Time) {
	for id, b := range n.readBatches {
		if now.Sub(b.sent) > readBatchTimeout {
			for _, r := range b.reqs {
				r.done <- readIndexResult{err: ErrReadAborted}
			}
			delete(n.readBatches, id)
			if b.term != 0 {
				n.leaseRenewing = false
			}
		}
	}
}

func (n *Node) deliverReadStates(states []raft.ReadState) {
	if len(states) > 0 {
		signal(n.readSignal) // readers held back by readRoundsMax may go now
	}
	for _, rs := range states {
		if len(rs.RequestCtx) != 16 || binary.BigEndian.Uint64(rs.RequestCtx) != n.self {
			continue
		}
		id := binary.BigEndian.Uint64(rs.RequestCtx[8:])
		b := n.readBatches[id]
		if b == nil {
			continue
		}
		delete(n.readBatches, id)
		for _, r := range b.reqs {
			r.done <- readIndexResult{index: rs.Index}
		}
		if n.cfg.LeaseRead && b.term != 0 && n.isLdr.Load() {
			if st := n.rn.BasicStatus(); st.HardState.GetTerm() == b.term && st.RaftState == raft.StateLeader {
				if until := b.sent.Add(n.leaseDuration()); until.After(n.leaseUntil) || n.leaseTerm != b.term {
					n.leaseUntil, n.leaseTerm = until, b.term
				}
				n.leaseRenewing = false
			}
		}
	}
}

func (n *Node) abortPending(err error) {
	n.pendingMu.Lock()
	defer n.pendingMu.Unlock()
	for seq, p := range n.pending {
		delete(n.pending, seq)
		p.finish(proposeResult{err: err})
	}
}

func (n *Node) abortReads(err error) {
	for id, b := range n.readBatches {
		for _, r := range b.reqs {
			r.done <- readIndexResult{err: err}
		}
		delete(n.readBatches, id)
	}
	n.leaseUntil, n.leaseTerm, n.leaseRenewing = time.Time{}, 0, false
}

func (n *Node) abortAll(err error) {
	n.abortPending(err)
	n.abortReads(err)
	n.propMu.Lock()
	for _, p := range n.propQ {
		p.finish(proposeResult{err: err})
	}
	n.propQ = nil
	n.propMu.Unlock()
	n.readMu.Lock()
	for _, r := range n.readQ {
		r.done <- readIndexResult{err: err}
	}
	n.readQ = nil
	n.readMu.Unlock()
}

func (n *Node) restoreSnapshot(snap *pb.Snapshot) error {
	raw, err := decompressSnapshot(snap.GetData())
	if err != nil {
		return err
	}
	state, err := DecodeState(raw)
	if err != nil {
		return err
	}
	n.mu.Lock()
	n.state = state
	n.applied = snap.GetMetadata().GetIndex()
	close(n.appliedCh)
	n.appliedCh = make(chan struct{})
	n.mu.Unlock()
	n.snapIndex = snap.GetMetadata().GetIndex()
	n.bytesSinceSnap = 0
	n.confMu.Lock()
	n.confState = snap.GetMetadata().GetConfState()
	n.confIndex = snap.GetMetadata().GetIndex()
	n.confMu.Unlock()
	n.adoptAddressBook(state.Controllers())
	return nil
}

type delivery struct {
	p   *proposal
	res Result
}

func (n *Node) apply(ents []*pb.Entry) {
	if len(ents) == 0 {
		return
	}
	var out []delivery
	var ccs []confItem
	n.mu.Lock()
	for _, e := range ents {
		if e.GetIndex() <= n.applied {
			continue
		}
		switch e.GetType() {
		case pb.EntryNormal:
			if len(e.GetData()) > 0 {
				out = n.applyBatchLocked(e.GetData(), out)
			}
		default:
			cc, err := decodeConfEntry(e)
			if err != nil {
				n.cfg.Logger.Error("controlplane: bad configuration change entry", "index", e.GetIndex(), "err", err)
				break
			}
			if len(cc.GetContext()) > 0 {
				if book, err := decodeAddressBook(cc.GetContext()); err == nil {
					n.state.applyMembership(book)
				}
			}
			ccs = append(ccs, confItem{cc, e.GetIndex()})
			n.confSeen.Store(e.GetIndex())
		}
		n.applied = e.GetIndex()
		n.bytesSinceSnap += len(e.GetData())
	}
	close(n.appliedCh)
	n.appliedCh = make(chan struct{})
	n.mu.Unlock()
	for _, d := range out {
		d.p.finish(proposeResult{res: d.res})
	}
	for _, c := range ccs {
		if n.cfg.AsyncStorageWrites {
			// Only the raft goroutine may touch raft. The change goes
			// ahead of this batch's MsgStorageApplyResp in the local
			// queue, so raft learns of it before it counts it applied.
			n.localConf(c)
		} else {
			n.applyConfChange(c)
		}
	}
}

// applyBatchLocked applies one entry's events. A malformed event is skipped
// with a logged error on every node alike, so state stays identical.
func (n *Node) applyBatchLocked(data []byte, out []delivery) []delivery {
	if len(data) < 21 || data[0] != entryFormat {
		n.cfg.Logger.Error("controlplane: malformed log entry")
		return out
	}
	proposer := binary.BigEndian.Uint64(data[1:])
	seq := binary.BigEndian.Uint64(data[9:])
	count := binary.BigEndian.Uint32(data[17:])
	rest := data[21:]
	for i := uint32(0); i < count; i++ {
		if len(rest) < 4 {
			n.cfg.Logger.Error("controlplane: truncated log entry")
			return out
		}
		ln := binary.BigEndian.Uint32(rest)
		if uint64(ln) > uint64(len(rest)-4) {
			n.cfg.Logger.Error("controlplane: truncated log entry")
			return out
		}
		raw := rest[4 : 4+ln]
		rest = rest[4+ln:]
		var res Result
		if ev, err := DecodeEvent(raw); err != nil {
			res = fail(CodeInvalid, "undecodable event: %v", err)
		} else {
			res = n.state.Apply(ev)
		}
		if proposer == n.self {
			n.pendingMu.Lock()
			if p := n.pending[seq+uint64(i)]; p != nil {
				delete(n.pending, p.seq)
				out = append(out, delivery{p, res})
			}
			n.pendingMu.Unlock()
		}
	}
	return out
}

func (n *Node) maybeSnapshot() error {
	if n.cfg.SnapshotEntries < 0 && n.compactPast.Load() == 0 {
		return nil
	}
	n.mu.RLock()
	applied := n.applied
	past := n.compactPast.Load()
	forcePast := past != 0 && applied >= past
	due := n.cfg.SnapshotEntries >= 0 &&
		(applied >= n.snapIndex+uint64(n.cfg.SnapshotEntries) || n.bytesSinceSnap >= n.cfg.SnapshotBytes)
	n.confMu.Lock()
	confStale := n.confSeen.Load() > n.confIndex
	n.confMu.Unlock()
	if confStale {
		// Raft has not applied a membership change the state holds: a
		// snapshot now would record the old configuration. The change's
		// own wake-up retries.
		n.mu.RUnlock()
		return nil
	}
	force := n.forceSnap.Load()
	if !force && !forcePast && !due {
		n.mu.RUnlock()
		return nil
	}
	raw := n.state.Encode()
	n.mu.RUnlock()
	data := compressSnapshot(raw)
	compactTo := n.snapIndex
	if applied > uint64(n.cfg.SnapshotTrailing) && applied-uint64(n.cfg.SnapshotTrailing) > compactTo {
		compactTo = applied - uint64(n.cfg.SnapshotTrailing)
	}
	if force {
		compactTo = applied
		n.forceSnap.Store(false)
	}
	if forcePast {
		compactTo = max(compactTo, past)
		n.compactPast.CompareAndSwap(past, 0)
	}
	n.confMu.Lock()
	cs := n.confState
	n.confMu.Unlock()
	if err := n.storage.compact(applied, compactTo, cs, data); err != nil {
		return err
	}
	n.snapIndex = applied
	n.bytesSinceSnap = 0
	return nil
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
