package controlplane

import (
	"bufio"
	"context"
	"errors"
	"io"
	"net"
	"slices"
	"sync"
	"time"

	"github.com/berthmq/berth/controlplane/ctlapi"
	"github.com/berthmq/berth/controlplane/ctlclient"
	"github.com/berthmq/berth/controlplane/internal/coalesce"
	"github.com/berthmq/berth/wire"
	pb "go.etcd.io/raft/v3/raftpb"
	"google.golang.org/protobuf/proto"
)

const (
	// connInflightMax bounds requests served at once per connection.
	connInflightMax = 1024
	// requestTimeout bounds the time the server spends on one request.
	requestTimeout = 5 * time.Second
	// waitPollMax bounds one WaitChange long poll on the server.
	waitPollMax = 2 * time.Second
)

func (n *Node) serve() {
	defer n.wg.Done()
	for {
		c, err := n.listener.Accept()
		if err != nil {
			select {
			case <-n.stop:
				return
			default:
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				continue
			}
			return
		}
		n.connsMu.Lock()
		select {
		case <-n.stop:
			n.connsMu.Unlock()
			c.Close()
			return
		default:
		}
		n.conns[c] = struct{}{}
		n.connsMu.Unlock()
		n.wg.Add(1)
		go n.serveConn(c)
	}
}

type serverConn struct {
	c  net.Conn
	w  *coalesce.Writer
	id uint64 // nonzero, unique per node

	mu      sync.Mutex
	brokers []uint32 // guarded by mu: brokers that heartbeated here, at most connBrokersMax
}

// connBrokersMax bounds the brokers one connection is watched for.
const connBrokersMax = 64

func (sc *serverConn) sawBroker(id uint32) {
	sc.mu.Lock()
	if len(sc.brokers) < connBrokersMax && !slices.Contains(sc.brokers, id) {
		sc.brokers = append(sc.brokers, id)
	}
	sc.mu.Unlock()
}

func (sc *serverConn) reply(r wire.CtlResponse) {
	// A failed write closes the connection (onFailed); the reader then
	// stops and the client retries elsewhere.
	sc.w.Send(func(b []byte) []byte { return wire.AppendCtlResponse(b, r) })
}

func (n *Node) serveConn(raw net.Conn) {
	defer n.wg.Done()
	defer func() {
		raw.Close()
		n.connsMu.Lock()
		delete(n.conns, raw)
		n.connsMu.Unlock()
	}()
	// No frame is read before the peer proved it belongs to the cluster.
	c, err := n.cfg.Auth.Server(raw)
	if err != nil {
		if n.cfg.Auth.AllowLog(false) {
			n.cfg.Logger.Warn("controlplane: refused a connection before any frame (logged at most once a second)", "remote", raw.RemoteAddr().String(), "err", err)
		}
		return
	}
	sc := &serverConn{c: c, w: coalesce.New(c, func(error) { c.Close() }), id: n.connSeq.Add(1)}
	defer func() {
		if !n.cfg.KeepBrokersOnDisconnect {
			sc.mu.Lock()
			ids := slices.Clone(sc.brokers)
			sc.mu.Unlock()
			n.hb.disconnected(sc.id, ids, time.Now())
		}
	}()
	r := bufio.NewReaderSize(c, 64<<10)
	sem := make(chan struct{}, connInflightMax)
	var reqs sync.WaitGroup
	defer reqs.Wait()
	rb := &readBatcher{n: n, sc: sc, sem: sem, wg: &reqs}
	wb := &writeBatcher{n: n, sc: sc, sem: sem, wg: &reqs}
	defer rb.flush() // runs before reqs.Wait
	defer wb.flush()
	var chunks chunkAssembler
	var hdr [wire.HeaderSize]byte
	// scratch holds request bodies; what outlives the frame is copied.
	var scratch []byte
	for {
		if !frameBuffered(r) {
			// The next read may block: serve the requests collected so far.
			rb.flush()
			wb.flush()
		}
		if _, err := io.ReadFull(r, hdr[:]); err != nil {
			return
		}
		h, err := wire.ReadHeader(hdr[:], peerFrameMax)
		if err != nil || h.Version.Major() != wire.VersionMajor {
			return
		}
		if h.Type != wire.TypeRaftMessage && h.Type != wire.TypeRaftChunk && h.Length > ctlapi.RequestFrameMax {
			return
		}
		var body []byte
		if h.Type == wire.TypeCtlRequest {
			if int(h.Length) > cap(scratch) {
				scratch = make([]byte, h.Length)
			}
			body = scratch[:h.Length]
		} else {
			body = make([]byte, h.Length)
		}
		if _, err := io.ReadFull(r, body); err != nil {
			return
		}
		switch h.Type {
		case wire.TypeRaftMessage:
			if !n.receive(body) {
				return
			}
		case wire.TypeRaftHello:
			id, addr, err := wire.DecodeRaftHello(body)
			if err != nil {
				return
			}
			n.learnPeer(id, addr)
		case wire.TypeRaftChunk:
			raw, err := chunks.add(body)
			if err != nil {
				n.cfg.Logger.Warn("controlplane: bad raft chunk", "err", err)
				return
			}
			if raw != nil && !n.receive(raw) {
				return
			}
		case wire.TypeCtlRequest:
			req, err := wire.DecodeCtlRequest(body)
			if err != nil {
				return
			}
			select {
			case sem <- struct{}{}:
			default:
				// Requests held in the batches hold slots: start them
				// before waiting for one to come free.
				rb.flush()
				wb.flush()
				select {
				case sem <- struct{}{}:
				case <-n.stop:
					return
				}
			}
			if req.Op == ctlapi.OpRead && len(req.Body) > 0 &&
				(ctlapi.ReadMode(req.Body[0]) == ctlapi.ReadConsistent || ctlapi.ReadMode(req.Body[0]) == ctlapi.ReadFollower) {
				q, err := parseRead(req.Body)
				rb.add(batchedRead{id: req.ID, q: q, err: err})
				continue
			}
			if req.Op == ctlapi.OpPropose {
				wb.add(req.ID, req.Body)
				continue
			}
			req.Body = slices.Clone(req.Body)
			reqs.Add(1)
			go func() {
				defer func() { <-sem; reqs.Done() }()
				ctx, cancel := context.WithTimeout(context.Background(), requestTimeout)
				defer cancel()
				status, leader, out := n.handleOn(ctx, sc, req.Op, req.Body)
				sc.reply(wire.CtlResponse{ID: req.ID, Status: status, Leader: leader, Body: out})
			}()
		default:
			// A frame of a type this build does not know is skipped by size.
		}
	}
}

// receive hands a marshalled raft message to the raft goroutine. It
// reports false if the message is malformed or the node stops: the
// connection then closes. A message dropped because the queue is full is
// retransmitted by raft (a snapshot is sent again).
func (n *Node) receive(raw []byte) bool {
	m := &pb.Message{}
	if err := proto.Unmarshal(raw, m); err != nil {
		n.cfg.Logger.Warn("controlplane: bad raft message", "err", err)
		return false
	}
	select {
	case n.msgIn <- m:
	case <-n.stop:
		return false
	default:
	}
	return true
}

// frameBuffered reports whether r holds a whole frame, so reading it
// cannot block.
func frameBuffered(r *bufio.Reader) bool {
	if r.Buffered() < wire.HeaderSize {
		return false
	}
	b, err := r.Peek(wire.HeaderSize)
	if err != nil {
		return false
	}
	h, err := wire.ReadHeader(b, peerFrameMax)
	if err != nil {
		return true // the reader fails on it without blocking
	}
	return r.Buffered()-wire.HeaderSize >= int(h.Length)
}

// handle serves one request. It is what both the TCP service and the
// in-process client call.
func (n *Node) handle(ctx context.Context, op uint8, body []byte) (status uint8, leader string, out []byte) {
	return n.handleOn(ctx, nil, op, body)
}

// LocalClient returns a client that calls this node in-process, for a
// broker that embeds its controller (single-node mode).
func (n *Node) LocalClient() *ctlclient.Client {
	return ctlclient.NewLocal(n.handle)
}

// handleOn serves one request arriving on sc (nil in-process).
func (n *Node) handleOn(ctx context.Context, sc *serverConn, op uint8, body []byte) (status uint8, leader string, out []byte) {
	var err error
	switch op {
	case ctlapi.OpPropose:
		var ev ctlapi.Event
		ev, err = ctlapi.DecodeEvent(body)
		if err != nil {
			return ctlapi.StatusBadRequest, "", []byte(err.Error())
		}
		var res ctlapi.Result
		res, err = n.Propose(ctx, ev)
		if err == nil {
			out = ctlapi.AppendResult(out, res)
		}
	case ctlapi.OpRead:
		out, err = n.handleRead(ctx, body)
	case ctlapi.OpHeartbeat:
		var broker uint32
		var logEnds []ctlapi.GroupLogEnd
		if broker, logEnds, err = ctlapi.DecodeHeartbeat(body); err == nil {
			var conn uint64
			if sc != nil {
				conn = sc.id
			}
			var grants []ctlapi.MasterGrant
			if grants, err = n.heartbeatOn(ctx, broker, logEnds, conn); err == nil {
				out = ctlapi.AppendHeartbeatReply(out, grants)
				if sc != nil {
					sc.sawBroker(broker)
				}
			}
		} else {
			err = ctlapi.ErrBadRequest
		}
	case ctlapi.OpElect:
		preferred, groups, derr := ctlapi.DecodeElect(body)
		if derr != nil {
			err = ctlapi.ErrBadRequest
			break
		}
		var res ctlapi.Result
		res, err = n.ElectNow(ctx, groups, preferred)
		if err == nil {
			out = ctlapi.AppendResult(out, res)
		}
	case ctlapi.OpHandover:
		h, derr := ctlapi.DecodeHandover(body)
		if derr != nil {
			err = ctlapi.ErrBadRequest
			break
		}
		var res ctlapi.Result
		if res, err = n.Handover(ctx, h); err == nil {
			out = ctlapi.AppendResult(out, res)
		}
	case ctlapi.OpLogEnds:
		r := wire.NewReader(body)
		groups := ctlapi.ReadIDs(r)
		if err = r.Done(); err != nil || len(groups) > ctlapi.LogEndsGroupsMax {
			err = ctlapi.ErrBadRequest
			break
		}
		var ends [][]ctlapi.Candidate
		if ends, err = n.LogEnds(groups); err == nil {
			out = ctlapi.AppendLogEnds(out, ends)
		}
	case ctlapi.OpPrimary:
		r := wire.NewReader(body)
		preferred := r.U32()
		if err = r.Done(); err != nil || preferred == 0 {
			err = ctlapi.ErrBadRequest
			break
		}
		var res ctlapi.Result
		res, err = n.ElectPrimaryNow(ctx, preferred)
		var re *ctlapi.ResultError
		if errors.As(err, &re) {
			// A refusal by the state machine is an answer, not a failure.
			res, err = ctlapi.Result{Code: re.Code, Msg: re.Msg}, nil
		}
		if err == nil {
			out = ctlapi.AppendResult(out, res)
		}
	case ctlapi.OpWait:
		r := wire.NewReader(body)
		after := r.U64()
		if err = r.Done(); err != nil {
			err = ctlapi.ErrBadRequest
			break
		}
		// Waiting until the request deadline is the normal outcome of a
		// long poll, not an error: the caller polls again.
		wctx, cancel := context.WithTimeout(ctx, waitPollMax)
		n.waitApplied(wctx, after+1)
		cancel()
		out = wire.AppendU64(out, n.Applied())
	case ctlapi.OpMembers:
		if len(body) != 0 {
			return ctlapi.StatusBadRequest, "", []byte("controlplane: members takes no arguments")
		}
		// The ReadIndex round proves this node still leads and waits until
		// it applied every entry committed before the request, membership
		// changes included.
		if _, err = n.ReadIndex(ctx, false); err != nil {
			break
		}
		out = wire.AppendU64(out, n.self)
		out = ctlapi.AppendMembers(out, n.memberAddrs())
	case ctlapi.OpChangeMembers:
		var add map[uint64]string
		var remove []uint64
		add, remove, err = ctlapi.DecodeMembersChange(body)
		if err != nil {
			return ctlapi.StatusBadRequest, "", []byte(err.Error())
		}
		err = n.ChangeMembership(ctx, add, remove)
	case ctlapi.OpStatus:
		s := n.Status()
		for _, v := range []uint64{s.ID, s.Leader, s.Term, s.Applied, s.SnapshotIndex, s.FirstIndex, s.LastIndex} {
			out = wire.AppendU64(out, v)
		}
	default:
		return ctlapi.StatusBadRequest, "", []byte("controlplane: unknown operation")
	}
	if err != nil {
		if op == ctlapi.OpPropose || op == ctlapi.OpElect || op == ctlapi.OpPrimary || op == ctlapi.OpChangeMembers || op == ctlapi.OpHandover {
			return proposeErrorStatus(err)
		}
		return errorStatus(err)
	}
	return ctlapi.StatusOK, "", out
}

func errorStatus(err error) (uint8, string, []byte) {
	var nl *ctlapi.NotLeaderError
	var lag *ctlapi.LaggingError
	switch {
	case errors.As(err, &nl):
		return ctlapi.StatusNotLeader, nl.Leader, nil
	case errors.As(err, &lag):
		return ctlapi.StatusLagging, lag.Leader, wire.AppendU64(nil, lag.Behind)
	case errors.Is(err, ctlapi.ErrBusy):
		return ctlapi.StatusBusy, "", nil
	case errors.Is(err, ctlapi.ErrLeaderChanged):
		return ctlapi.StatusAmbiguous, "", []byte(err.Error())
	case errors.Is(err, ctlapi.ErrTimeout):
		// A proposal that timed out may still apply.
		return ctlapi.StatusAmbiguous, "", []byte(err.Error())
	case errors.Is(err, ctlapi.ErrStopped):
		return ctlapi.StatusStopped, "", nil
	case errors.Is(err, ctlapi.ErrReadAborted):
		return ctlapi.StatusUnavailable, "", []byte(err.Error())
	}
	return ctlapi.StatusBadRequest, "", []byte(err.Error())
}

// readQuery is a parsed ctlapi.OpRead body.
type readQuery struct {
	mode                ctlapi.ReadMode
	query               uint8
	start, count, group uint32
	key                 string
}

func parseRead(body []byte) (readQuery, error) {
	r := wire.NewReader(body)
	q := readQuery{mode: ctlapi.ReadMode(r.U8()), query: r.U8()}
	switch q.query {
	case ctlapi.QueryGroups:
		q.start, q.count = r.U32(), r.U32()
		if q.count > ctlapi.GroupsPerReplyMax {
			q.count = ctlapi.GroupsPerReplyMax
		}
	case ctlapi.QueryAttribute:
		q.key = ctlapi.ReadString(r)
	case ctlapi.QuerySyncStateSet:
		q.group = r.U32()
	case ctlapi.QueryWiring, ctlapi.QueryBrokers, ctlapi.QueryNextBrokerID, ctlapi.QueryClusterInfo, ctlapi.QueryPrimary, ctlapi.QueryUsers:
	default:
		return q, ctlapi.ErrBadRequest
	}
	if err := r.Done(); err != nil {
		return q, ctlapi.ErrBadRequest
	}
	return q, nil
}

// appendAnswer appends the query's answer from s; the caller holds s's
// read lock.
func (q *readQuery) appendAnswer(b []byte, s *State) []byte {
	switch q.query {
	case ctlapi.QueryWiring:
		b = ctlapi.AppendWiring(b, s.Wiring())
	case ctlapi.QueryGroups:
		total := uint32(s.GroupCount())
		b = wire.AppendU32(b, total)
		start := q.start
		end := uint64(start) + uint64(q.count)
		if end > uint64(total) {
			end = uint64(total)
		}
		if uint64(start) > end {
			start = uint32(end)
		}
		b = wire.AppendU32(b, uint32(end)-start)
		for id := start; uint64(id) < end; id++ {
			g, _ := s.Group(id)
			b = ctlapi.AppendGroup(b, g)
		}
	case ctlapi.QueryBrokers:
		bs := s.Brokers()
		b = wire.AppendU32(b, uint32(len(bs)))
		for _, br := range bs {
			b = ctlapi.AppendBroker(b, br)
		}
	case ctlapi.QueryNextBrokerID:
		b = wire.AppendU32(b, s.NextBrokerID())
	case ctlapi.QueryAttribute:
		v, ok := s.Attribute(q.key)
		b = wire.AppendBool(b, ok)
		b = ctlapi.AppendString(b, v)
	case ctlapi.QueryClusterInfo:
		b = ctlapi.AppendClusterConfig(b, s.Config())
		b = wire.AppendU16(b, s.ClusterVersion())
	case ctlapi.QuerySyncStateSet:
		g, ok := s.Group(q.group)
		b = wire.AppendBool(b, ok)
		b = ctlapi.AppendGroup(b, g)
	case ctlapi.QueryPrimary:
		// mode, broker, epoch, then the broker's addresses.
		p, epoch := s.Primary()
		br, _ := s.Broker(p)
		b = wire.AppendU8(b, s.Config().Mode)
		b = ctlapi.AppendBroker(b, ctlapi.Broker{ID: p, Addrs: br.Addrs})
		b = wire.AppendU32(b, epoch)
	case ctlapi.QueryUsers:
		us := s.Users()
		b = wire.AppendU32(b, uint32(len(us)))
		for i := range us {
			b = ctlapi.AppendUser(b, &us[i])
		}
	}
	return b
}

func (n *Node) handleRead(ctx context.Context, body []byte) ([]byte, error) {
	q, err := parseRead(body)
	if err != nil {
		return nil, err
	}
	var out []byte
	err = n.Read(ctx, q.mode, func(s *State) { out = q.appendAnswer(out, s) })
	return out, err
}
