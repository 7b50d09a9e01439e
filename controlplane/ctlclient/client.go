// Package ctlclient is the client of Berth's controller. A Client finds
// the leader of a controller group, follows redirects and retries what is
// safe to retry; brokers, berthctl and the benchmarks use it. A broker that
// embeds its controller gets one from controlplane.Node.LocalClient, which
// calls the node in-process.
//
// The package needs only ctlapi and wire, so a program that talks to
// controllers links neither raft nor pebble; TestDependencies keeps it so.
package ctlclient

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/berthmq/berth/controlplane/ctlapi"
	"github.com/berthmq/berth/controlplane/internal/coalesce"
	"github.com/berthmq/berth/internal/peerauth"
	"github.com/berthmq/berth/wire"
)

const (
	// clientInflightMax bounds requests waiting on one connection.
	clientInflightMax = 4096
	// callAttemptsMax bounds the retries and redirects of one call.
	callAttemptsMax = 32
	// retryDelay is the first pause between attempts; it doubles up to
	// retryDelayMax, so the attempts (about 3 s in all) outlast an
	// election (a leader's death is noticed after an election timeout,
	// then a pre-vote and a vote round) instead of spending themselves in
	// 0.8 s, while a heartbeat still reaches the new leader within 100 ms
	// of its election.
	retryDelay    = 25 * time.Millisecond
	retryDelayMax = 100 * time.Millisecond
	// redirectsFree redirects per call are followed without counting as a
	// failed attempt or waiting; more mean the controllers disagree.
	redirectsFree = 4
	// callTimeoutDefault applies when the caller's context has no deadline.
	callTimeoutDefault = 10 * time.Second
	// dialTimeout bounds connecting to one controller.
	dialTimeout = time.Second
)

// Client talks to a controller group. It finds the leader, follows
// redirects and retries what is safe to retry. Safe for concurrent use.
type Client struct {
	addrs  []string
	auth   *peerauth.Auth // proof of cluster membership on each connection, or nil
	local  Handler        // in-process; no TCP
	rr     atomic.Uint32
	mu     sync.Mutex
	leader string
	conns  map[string]*clientConn
	closed bool
}

// NewClient returns a client for the controllers at addrs.
func NewClient(addrs []string) *Client {
	return &Client{addrs: append([]string(nil), addrs...), conns: map[string]*clientConn{}}
}

// NewClientAuth is NewClient for controllers that require proof of
// cluster membership (mutual TLS with the cluster CA, or the cluster
// secret): each connection gives it through auth before its first
// request.
func NewClientAuth(addrs []string, auth *peerauth.Auth) *Client {
	c := NewClient(addrs)
	c.auth = auth
	return c
}

// Handler serves one request in-process, as a controller's service serves
// one that arrived over TCP: op and body are the request's, and it returns
// the reply's status, leader address and body.
type Handler func(ctx context.Context, op uint8, body []byte) (status uint8, leader string, out []byte)

// NewLocal returns a client that calls h instead of dialing, for a broker
// that embeds its controller: the controller's Node.LocalClient.
func NewLocal(h Handler) *Client {
	return &Client{local: h, addrs: []string{"local"}, conns: map[string]*clientConn{}}
}

// Close closes the client's connections.
func (c *Client) Close() {
	c.mu.Lock()
	c.closed = true
	conns := c.conns
	c.conns = map[string]*clientConn{}
	c.mu.Unlock()
	for _, cc := range conns {
		cc.close(errors.New("controlplane: client closed"))
	}
}

// Leader returns the leader address the client last learned, if any.
func (c *Client) Leader() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.leader
}

// SetLeader tells the client where the leader is, as learned elsewhere
// (a broker's embedded controller member sees a new leader as soon as it
// is elected): the next call goes there first instead of to the leader
// last known, which may be dead or frozen. addr must be one of the
// controllers' addresses as the client was given them; "" forgets.
func (c *Client) SetLeader(addr string) {
	if c.local == nil {
		c.setLeader(addr)
	}
}

type clientConn struct {
	c       net.Conn
	w       *coalesce.Writer
	sem     chan struct{}
	mu      sync.Mutex
	nextID  uint64
	waiters map[uint64]chan wire.CtlResponse
	err     error
	done    chan struct{}
}

func dialClientConn(ctx context.Context, addr string, auth *peerauth.Auth) (*clientConn, error) {
	d := net.Dialer{Timeout: dialTimeout}
	raw, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, err
	}
	nc, err := auth.Client(raw, addr)
	if err != nil {
		raw.Close()
		return nil, err
	}
	cc := &clientConn{c: nc, sem: make(chan struct{}, clientInflightMax),
		waiters: map[uint64]chan wire.CtlResponse{}, done: make(chan struct{})}
	cc.w = coalesce.New(nc, cc.close)
	go cc.readLoop()
	return cc, nil
}

func (cc *clientConn) close(err error) {
	cc.mu.Lock()
	if cc.err == nil {
		cc.err = err
		close(cc.done)
	}
	cc.mu.Unlock()
	cc.c.Close()
}

func (cc *clientConn) readLoop() {
	r := bufio.NewReaderSize(cc.c, 64<<10)
	var hdr [wire.HeaderSize]byte
	for {
		if _, err := io.ReadFull(r, hdr[:]); err != nil {
			cc.close(err)
			return
		}
		h, err := wire.ReadHeader(hdr[:], wire.FrameSizeMax)
		if err != nil {
			cc.close(err)
			return
		}
		body := make([]byte, h.Length)
		if _, err := io.ReadFull(r, body); err != nil {
			cc.close(err)
			return
		}
		if h.Type != wire.TypeCtlResponse {
			continue
		}
		resp, err := wire.DecodeCtlResponse(body)
		if err != nil {
			cc.close(err)
			return
		}
		cc.mu.Lock()
		ch := cc.waiters[resp.ID]
		delete(cc.waiters, resp.ID)
		cc.mu.Unlock()
		if ch != nil {
			ch <- resp
		}
	}
}

func (cc *clientConn) do(ctx context.Context, op uint8, body []byte) (wire.CtlResponse, error) {
	select {
	case cc.sem <- struct{}{}:
	case <-ctx.Done():
		return wire.CtlResponse{}, fmt.Errorf("%w: %v", coalesce.ErrNotSent, ctx.Err())
	}
	defer func() { <-cc.sem }()
	ch := make(chan wire.CtlResponse, 1)
	cc.mu.Lock()
	if cc.err != nil {
		cc.mu.Unlock()
		return wire.CtlResponse{}, fmt.Errorf("%w: %v", coalesce.ErrNotSent, cc.err)
	}
	cc.nextID++
	id := cc.nextID
	cc.waiters[id] = ch
	cc.mu.Unlock()
	err := cc.w.Send(func(b []byte) []byte {
		return wire.AppendCtlRequest(b, wire.CtlRequest{ID: id, Op: op, Body: body})
	})
	if err != nil {
		// Frames queued behind a failed write may have partly left; only
		// this caller's own failed write proves nothing was delivered, and
		// the writer does not say whose it was. Err on ambiguity.
		cc.close(err)
		return wire.CtlResponse{}, err
	}
	select {
	case r := <-ch:
		return r, nil
	case <-cc.done:
		return wire.CtlResponse{}, cc.err
	case <-ctx.Done():
		cc.mu.Lock()
		delete(cc.waiters, id)
		cc.mu.Unlock()
		return wire.CtlResponse{}, ctx.Err()
	}
}

func (c *Client) conn(ctx context.Context, addr string) (*clientConn, error) {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil, errors.New("controlplane: client closed")
	}
	cc := c.conns[addr]
	c.mu.Unlock()
	if cc != nil {
		select {
		case <-cc.done:
		default:
			return cc, nil
		}
	}
	cc, err := dialClientConn(ctx, addr, c.auth)
	if err != nil {
		return nil, err
	}
	c.mu.Lock()
	if old := c.conns[addr]; old != nil && old != cc {
		select {
		case <-old.done:
		default:
			c.mu.Unlock()
			cc.close(errors.New("controlplane: duplicate connection"))
			return old, nil
		}
	}
	c.conns[addr] = cc
	c.mu.Unlock()
	return cc, nil
}

func (c *Client) pick(anyNode bool) string {
	if !anyNode {
		c.mu.Lock()
		l := c.leader
		c.mu.Unlock()
		if l != "" {
			return l
		}
	}
	return c.addrs[int(c.rr.Add(1))%len(c.addrs)]
}

func (c *Client) setLeader(addr string) {
	c.mu.Lock()
	c.leader = addr
	c.mu.Unlock()
}

// forgetLeader forgets addr as the leader, if it still is the one known.
func (c *Client) forgetLeader(addr string) {
	c.mu.Lock()
	if c.leader == addr {
		c.leader = ""
	}
	c.mu.Unlock()
}

// call sends one request, following redirects until it succeeds, fails for
// good, or runs out of attempts or time. anyNode spreads follower reads.
func (c *Client) call(ctx context.Context, op uint8, body []byte, anyNode bool) ([]byte, error) {
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, callTimeoutDefault)
		defer cancel()
	}
	addr := c.pick(anyNode)
	var lastErr error
	redirects := 0
	delay := retryDelay
	for attempt := 0; attempt < callAttemptsMax; attempt++ {
		if attempt > 0 {
			t := time.NewTimer(delay)
			select {
			case <-ctx.Done():
				t.Stop()
				return nil, fmt.Errorf("%w: %v (last error: %v)", ctlapi.ErrTimeout, ctx.Err(), lastErr)
			case <-t.C:
			}
			delay = min(2*delay, retryDelayMax)
		}
		var resp wire.CtlResponse
		if c.local != nil {
			resp.Status, resp.Leader, resp.Body = c.local(ctx, op, body)
		} else {
			cc, err := c.conn(ctx, addr)
			if err == nil {
				resp, err = cc.do(ctx, op, body)
			}
			if err != nil {
				lastErr = err
				if isWrite(op) && cc != nil && !errors.Is(err, coalesce.ErrNotSent) {
					// The request may have reached the leader.
					return nil, fmt.Errorf("%w: %w", ctlapi.ErrLeaderChanged, err)
				}
				// Forget addr as the leader, but not a leader learned
				// meanwhile (SetLeader from a broker's embedded member,
				// a redirect another call followed): a call to a frozen
				// old leader that its caller cancelled would otherwise
				// wipe the new leader's address, and the next call
				// would try members at random, the frozen one included.
				c.forgetLeader(addr)
				addr = c.pick(anyNode)
				continue
			}
		}
		switch resp.Status {
		case ctlapi.StatusOK:
			if !anyNode && c.local == nil {
				c.setLeader(addr)
			}
			return resp.Body, nil
		case ctlapi.StatusNotLeader:
			lastErr = &ctlapi.NotLeaderError{Leader: resp.Leader}
			if resp.Leader != "" && c.local == nil {
				c.setLeader(resp.Leader)
				addr = resp.Leader
				if redirects < redirectsFree {
					redirects++
					attempt-- // a fresh redirect is progress, not a failure
				}
			} else {
				c.forgetLeader(addr)
				addr = c.pick(true)
			}
		case ctlapi.StatusLagging:
			lastErr = &ctlapi.LaggingError{Leader: resp.Leader, Behind: wire.NewReader(resp.Body).U64()}
			if resp.Leader != "" {
				addr = resp.Leader
			} else {
				addr = c.pick(true)
			}
		case ctlapi.StatusBusy:
			lastErr = ctlapi.ErrBusy
		case ctlapi.StatusUnavailable, ctlapi.StatusStopped:
			lastErr = fmt.Errorf("controlplane: %s unavailable: %s", addr, resp.Body)
			addr = c.pick(anyNode)
		case ctlapi.StatusAmbiguous:
			return nil, fmt.Errorf("%w: %s", ctlapi.ErrLeaderChanged, resp.Body)
		default:
			return nil, fmt.Errorf("%w: %s", ctlapi.ErrBadRequest, resp.Body)
		}
	}
	return nil, fmt.Errorf("controlplane: gave up after %d attempts: %w", callAttemptsMax, lastErr)
}

// Propose sends a write event and returns its result. A refusal by the
// state machine is returned as a *ResultError. An ErrLeaderChanged error
// means the event may or may not have been applied.
func (c *Client) Propose(ctx context.Context, ev ctlapi.Event) (ctlapi.Result, error) {
	if err := ctlapi.ValidateEvent(ev); err != nil {
		return ctlapi.Result{}, err
	}
	out, err := c.call(ctx, ctlapi.OpPropose, ctlapi.EncodeEvent(nil, ev), false)
	if err != nil {
		return ctlapi.Result{}, err
	}
	res, err := ctlapi.DecodeResult(out)
	if err != nil {
		return ctlapi.Result{}, err
	}
	return res, res.Err()
}

// ApplyBrokerID asks for a broker id; 0 takes the next free one.
func (c *Client) ApplyBrokerID(ctx context.Context, requested uint32) (uint32, error) {
	r, err := c.Propose(ctx, &ctlapi.ApplyBrokerID{Requested: requested})
	return uint32(r.Value), err
}

// RegisterBroker records a broker's addresses and protocol version.
func (c *Client) RegisterBroker(ctx context.Context, id uint32, addrs []string, version uint16) error {
	_, err := c.Propose(ctx, &ctlapi.RegisterBroker{ID: id, Addrs: addrs, Version: version})
	return err
}

// Heartbeat reports a broker alive with each group's log end.
func (c *Client) Heartbeat(ctx context.Context, broker uint32, logEnds []ctlapi.GroupLogEnd) error {
	_, err := c.HeartbeatGrants(ctx, broker, logEnds)
	return err
}

// HeartbeatGrants is Heartbeat that returns the leader's answer: the
// groups it confirms broker as the master of.
func (c *Client) HeartbeatGrants(ctx context.Context, broker uint32, logEnds []ctlapi.GroupLogEnd) (ctlapi.HeartbeatReply, error) {
	body := ctlapi.AppendHeartbeat(nil, broker, logEnds)
	if len(body) > ctlapi.RequestFrameMax-64 {
		return ctlapi.HeartbeatReply{}, fmt.Errorf("controlplane: heartbeat with %d groups is too large", len(logEnds))
	}
	out, err := c.call(ctx, ctlapi.OpHeartbeat, body, false)
	if err != nil {
		return ctlapi.HeartbeatReply{}, err
	}
	return ctlapi.DecodeHeartbeatReply(out)
}

// ElectMaster asks the leader to elect masters for groups from its heartbeat
// data; preferred, if not 0, wins ties. It returns how many groups were
// elected under a new epoch (a live master may win again). The leader
// refuses, electing nothing, a group that does not exist and a preferred
// broker that is not registered or not in a group's replica set: a
// *ctlapi.ResultError.
func (c *Client) ElectMaster(ctx context.Context, groups []uint32, preferred uint32) (uint64, error) {
	if len(groups) > ctlapi.GroupsPerReplyMax {
		return 0, fmt.Errorf("controlplane: at most %d groups per election call", ctlapi.GroupsPerReplyMax)
	}
	out, err := c.call(ctx, ctlapi.OpElect, ctlapi.AppendElect(nil, preferred, groups), false)
	if err != nil {
		return 0, err
	}
	r, err := ctlapi.DecodeResult(out)
	if err != nil {
		return 0, err
	}
	return r.Value, r.Err()
}

// Handover asks the leader to make h.To master of h.Group in place of
// h.From, which must master it in h.Epoch (Node.Handover states the
// rule). It reports whether the master moved; a refusal is a
// *ctlapi.ResultError.
func (c *Client) Handover(ctx context.Context, h ctlapi.Handover) (bool, error) {
	out, err := c.call(ctx, ctlapi.OpHandover, ctlapi.AppendHandover(nil, &h), false)
	if err != nil {
		return false, err
	}
	r, err := ctlapi.DecodeResult(out)
	if err != nil {
		return false, err
	}
	return r.Value > 0, r.Err()
}

// LogEnds reads, from the leader's heartbeats, each group's replicas
// alive or not and their log ends (Node.LogEnds), in the order of groups.
func (c *Client) LogEnds(ctx context.Context, groups []uint32) ([][]ctlapi.Candidate, error) {
	out := make([][]ctlapi.Candidate, 0, len(groups))
	for len(groups) > 0 {
		chunk := groups[:min(len(groups), ctlapi.LogEndsGroupsMax)]
		groups = groups[len(chunk):]
		body, err := c.call(ctx, ctlapi.OpLogEnds, ctlapi.AppendIDs(nil, chunk), false)
		if err != nil {
			return nil, err
		}
		ends, err := ctlapi.DecodeLogEnds(body, len(chunk))
		if err != nil {
			return nil, err
		}
		out = append(out, ends...)
	}
	return out, nil
}

// AlterSyncStateSet replaces a group's SyncStateSet; master and epoch must
// be current.
func (c *Client) AlterSyncStateSet(ctx context.Context, group, master, epoch uint32, set []uint32) error {
	_, err := c.Propose(ctx, &ctlapi.AlterSyncStateSet{Group: group, Master: master, Epoch: epoch, Set: set})
	return err
}

// AlterSyncStateSetFrom is AlterSyncStateSet that the controller refuses
// unless the group's set is still from, the set the request was made from.
func (c *Client) AlterSyncStateSetFrom(ctx context.Context, group, master, epoch uint32, from, set []uint32) error {
	_, err := c.Propose(ctx, &ctlapi.AlterSyncStateSet{Group: group, Master: master, Epoch: epoch, Set: set, From: from})
	return err
}

// CleanBrokerData removes a broker.
func (c *Client) CleanBrokerData(ctx context.Context, id uint32) error {
	_, err := c.Propose(ctx, &ctlapi.CleanBrokerData{ID: id})
	return err
}

// DeclareExchange declares an exchange.
func (c *Client) DeclareExchange(ctx context.Context, name, typ string, durable bool) error {
	_, err := c.Propose(ctx, &ctlapi.DeclareExchange{Name: name, Type: typ, Durable: durable})
	return err
}

// DeclareQueue declares a queue.
func (c *Client) DeclareQueue(ctx context.Context, name string, opts ctlapi.QueueOptions) error {
	_, err := c.Propose(ctx, &ctlapi.DeclareQueue{Name: name, Options: opts})
	return err
}

// Bind binds a queue to an exchange.
func (c *Client) Bind(ctx context.Context, exchange, queue, key string) error {
	_, err := c.Propose(ctx, &ctlapi.Bind{Exchange: exchange, Queue: queue, Key: key})
	return err
}

// Unbind removes a binding.
func (c *Client) Unbind(ctx context.Context, exchange, queue, key string) error {
	_, err := c.Propose(ctx, &ctlapi.Unbind{Exchange: exchange, Queue: queue, Key: key})
	return err
}

// DeleteQueue deletes a queue and its bindings.
func (c *Client) DeleteQueue(ctx context.Context, name string) error {
	_, err := c.Propose(ctx, &ctlapi.DeleteQueue{Name: name})
	return err
}

// DeleteExchange deletes an exchange and its bindings.
func (c *Client) DeleteExchange(ctx context.Context, name string) error {
	_, err := c.Propose(ctx, &ctlapi.DeleteExchange{Name: name})
	return err
}

// SetClusterConfig sets G (once), the mode and the unclean election default.
func (c *Client) SetClusterConfig(ctx context.Context, cfg ctlapi.ClusterConfig) error {
	_, err := c.Propose(ctx, &ctlapi.SetClusterConfig{Groups: cfg.Groups, Mode: cfg.Mode, UncleanElection: cfg.UncleanElection, Replicas: cfg.Replicas})
	return err
}

// SetAttribute sets a cluster attribute; an empty value deletes it.
func (c *Client) SetAttribute(ctx context.Context, key, value string) error {
	_, err := c.Propose(ctx, &ctlapi.SetAttribute{Key: key, Value: value})
	return err
}

// read sends a read of query in mode; args, if set, appends the query's
// arguments. It returns a reader over the answer.
func (c *Client) read(ctx context.Context, mode ctlapi.ReadMode, query uint8, args func(b []byte) []byte) (*wire.Reader, error) {
	b := []byte{uint8(mode), query}
	if args != nil {
		b = args(b)
	}
	out, err := c.call(ctx, ctlapi.OpRead, b, mode == ctlapi.ReadFollower)
	if err != nil {
		return nil, err
	}
	return wire.NewReader(out), nil
}

// GetAttribute reads a cluster attribute.
func (c *Client) GetAttribute(ctx context.Context, mode ctlapi.ReadMode, key string) (string, bool, error) {
	r, err := c.read(ctx, mode, ctlapi.QueryAttribute, func(b []byte) []byte { return ctlapi.AppendString(b, key) })
	if err != nil {
		return "", false, err
	}
	ok, v := r.Bool(), ctlapi.ReadString(r)
	return v, ok, r.Done()
}

// GetWiring reads all exchanges, queues and bindings.
func (c *Client) GetWiring(ctx context.Context, mode ctlapi.ReadMode) (ctlapi.Wiring, error) {
	r, err := c.read(ctx, mode, ctlapi.QueryWiring, nil)
	if err != nil {
		return ctlapi.Wiring{}, err
	}
	w := ctlapi.ReadWiring(r)
	return w, r.Done()
}

// GetGroups reads up to count groups from start, and the group count G.
func (c *Client) GetGroups(ctx context.Context, mode ctlapi.ReadMode, start, count uint32) ([]ctlapi.Group, uint32, error) {
	r, err := c.read(ctx, mode, ctlapi.QueryGroups, func(b []byte) []byte { return wire.AppendU32(wire.AppendU32(b, start), count) })
	if err != nil {
		return nil, 0, err
	}
	total := r.U32()
	gs := make([]ctlapi.Group, r.Count(24))
	for i := range gs {
		gs[i] = ctlapi.ReadGroup(r)
	}
	return gs, total, r.Done()
}

// GetReplicaInfo reads one group consistently.
func (c *Client) GetReplicaInfo(ctx context.Context, mode ctlapi.ReadMode, group uint32) (ctlapi.Group, error) {
	r, err := c.read(ctx, mode, ctlapi.QuerySyncStateSet, func(b []byte) []byte { return wire.AppendU32(b, group) })
	if err != nil {
		return ctlapi.Group{}, err
	}
	ok := r.Bool()
	g := ctlapi.ReadGroup(r)
	if err := r.Done(); err != nil {
		return ctlapi.Group{}, err
	}
	if !ok {
		return ctlapi.Group{}, &ctlapi.ResultError{Code: ctlapi.CodeNotFound, Msg: fmt.Sprintf("group %d does not exist", group)}
	}
	return g, nil
}

// GetSyncStateSet reads one group from the leader without a consistency
// check (an unsafe read, for admin tools).
func (c *Client) GetSyncStateSet(ctx context.Context, group uint32) (ctlapi.Group, error) {
	return c.GetReplicaInfo(ctx, ctlapi.ReadUnsafe, group)
}

// GetBrokers reads the registered brokers.
func (c *Client) GetBrokers(ctx context.Context, mode ctlapi.ReadMode) ([]ctlapi.Broker, error) {
	r, err := c.read(ctx, mode, ctlapi.QueryBrokers, nil)
	if err != nil {
		return nil, err
	}
	out := make([]ctlapi.Broker, r.Count(10))
	for i := range out {
		out[i] = ctlapi.ReadBroker(r)
	}
	return out, r.Done()
}

// GetUsers reads every user: credentials (salted keys) and permissions.
func (c *Client) GetUsers(ctx context.Context, mode ctlapi.ReadMode) ([]ctlapi.User, error) {
	r, err := c.read(ctx, mode, ctlapi.QueryUsers, nil)
	if err != nil {
		return nil, err
	}
	out := make([]ctlapi.User, r.Count(2+4+4+4+4+6))
	for i := range out {
		out[i] = ctlapi.ReadUser(r)
	}
	return out, r.Done()
}

// GetNextBrokerID reads the id the next ApplyBrokerID{0} would get.
func (c *Client) GetNextBrokerID(ctx context.Context, mode ctlapi.ReadMode) (uint32, error) {
	r, err := c.read(ctx, mode, ctlapi.QueryNextBrokerID, nil)
	if err != nil {
		return 0, err
	}
	v := r.U32()
	return v, r.Done()
}

// ClusterInfo is the cluster configuration and version.
type ClusterInfo struct {
	Config  ctlapi.ClusterConfig
	Version uint16
}

// GetClusterInfo reads the cluster configuration and version.
func (c *Client) GetClusterInfo(ctx context.Context, mode ctlapi.ReadMode) (ClusterInfo, error) {
	r, err := c.read(ctx, mode, ctlapi.QueryClusterInfo, nil)
	if err != nil {
		return ClusterInfo{}, err
	}
	info := ClusterInfo{Config: ctlapi.ReadClusterConfig(r), Version: r.U16()}
	return info, r.Done()
}

// WaitChange long-polls the leader until its applied index passes after,
// or about two seconds pass, and returns the applied index. A broker calls
// it in a loop and re-reads wiring and groups when the index moves, so
// changes made through any controller reach it without a fixed poll rate.
func (c *Client) WaitChange(ctx context.Context, after uint64) (uint64, error) {
	out, err := c.call(ctx, ctlapi.OpWait, wire.AppendU64(nil, after), false)
	if err != nil {
		return 0, err
	}
	r := wire.NewReader(out)
	v := r.U64()
	return v, r.Done()
}

// GetPrimary reads the primary broker of an active-passive cluster (0 when
// there is none, or the cluster is active-active), the primary epoch and
// the primary's addresses.
func (c *Client) GetPrimary(ctx context.Context, mode ctlapi.ReadMode) (broker, epoch uint32, addrs []string, err error) {
	info, err := c.GetPrimaryInfo(ctx, mode)
	return info.Broker, info.Epoch, info.Addrs, err
}

// PrimaryInfo is the cluster mode and its primary broker.
type PrimaryInfo struct {
	Mode   uint8
	Broker uint32 // 0: none
	Epoch  uint32
	Addrs  []string
}

// GetPrimaryInfo reads the cluster mode and the primary in one read.
func (c *Client) GetPrimaryInfo(ctx context.Context, mode ctlapi.ReadMode) (PrimaryInfo, error) {
	r, err := c.read(ctx, mode, ctlapi.QueryPrimary, nil)
	if err != nil {
		return PrimaryInfo{}, err
	}
	var info PrimaryInfo
	info.Mode = r.U8()
	br := ctlapi.ReadBroker(r)
	info.Broker, info.Addrs = br.ID, br.Addrs
	info.Epoch = r.U32()
	if err := r.Done(); err != nil {
		return PrimaryInfo{}, err
	}
	return info, nil
}

// ElectPrimary hands the primary role of an active-passive cluster to
// broker preferred, which must be registered and alive: the leader builds
// the election from its own heartbeat table, as its failure detector does.
// It reports whether the primary changed; a refusal comes back as a
// *ResultError.
func (c *Client) ElectPrimary(ctx context.Context, preferred uint32) (bool, error) {
	if preferred == 0 {
		return false, fmt.Errorf("controlplane: elect primary needs a broker id")
	}
	out, err := c.call(ctx, ctlapi.OpPrimary, wire.AppendU32(nil, preferred), false)
	if err != nil {
		return false, err
	}
	r, err := ctlapi.DecodeResult(out)
	if err != nil {
		return false, err
	}
	return r.Value == 1, r.Err()
}

// MemberList reads the controller group's voters with their addresses, and
// the leader's id, from the leader after a ReadIndex round: it reflects
// every membership change committed before the call.
func (c *Client) MemberList(ctx context.Context) (members map[uint64]string, leader uint64, err error) {
	out, err := c.call(ctx, ctlapi.OpMembers, nil, false)
	if err != nil {
		return nil, 0, err
	}
	r := wire.NewReader(out)
	leader = r.U64()
	members = ctlapi.ReadMembers(r)
	if err := r.Done(); err != nil {
		return nil, 0, err
	}
	return members, leader, nil
}

// Members reads the controller group's voters and their addresses (see
// MemberList).
func (c *Client) Members(ctx context.Context) (map[uint64]string, error) {
	m, _, err := c.MemberList(ctx)
	return m, err
}

// ChangeMembership adds the controllers in add (id to address) and removes
// those in remove in one joint-consensus change on the leader, and returns
// once the group has left the joint configuration. A new member must be
// running already, started to join (Config.Join), or the group runs with
// one member it cannot reach. Repeating a change that took effect
// succeeds; an ErrLeaderChanged error means it may or may not have.
func (c *Client) ChangeMembership(ctx context.Context, add map[uint64]string, remove []uint64) error {
	if len(add) == 0 && len(remove) == 0 {
		return errors.New("controlplane: a membership change must add or remove a controller")
	}
	if len(add) > ctlapi.MembersChangeMax || len(remove) > ctlapi.MembersChangeMax {
		return fmt.Errorf("controlplane: at most %d controllers added and %d removed per change", ctlapi.MembersChangeMax, ctlapi.MembersChangeMax)
	}
	for id, addr := range add {
		if id == 0 {
			return errors.New("controlplane: cannot add controller 0: ids start at 1")
		}
		if err := ctlapi.CheckControllerAddr(addr); err != nil {
			return fmt.Errorf("controlplane: cannot add controller %d: %v", id, err)
		}
	}
	for _, id := range remove {
		if id == 0 {
			return errors.New("controlplane: cannot remove controller 0: ids start at 1")
		}
	}
	_, err := c.call(ctx, ctlapi.OpChangeMembers, ctlapi.AppendMembersChange(nil, add, remove), false)
	return err
}

// isWrite reports whether op may change the state: after a connection
// failure such a request may have reached the leader, so it is not retried
// elsewhere but reported as ambiguous.
func isWrite(op uint8) bool {
	switch op {
	case ctlapi.OpPropose, ctlapi.OpElect, ctlapi.OpPrimary, ctlapi.OpChangeMembers, ctlapi.OpHandover:
		return true
	}
	return false
}
