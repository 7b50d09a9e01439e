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
	w  coalescer
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
	sc.w.write(func(b []byte) []byte { return wire.AppendCtlResponse(b, r) })
}

func (n *Node) serveConn(c net.Conn) {
	defer n.wg.Done()
	defer func() {
		c.Close()
		n.connsMu.Lock()
		delete(n.conns, c)
		n.connsMu.Unlock()
	}()
	sc := &serverConn{c: c, w: coalescer{c: c, onFailed: func(error) { c.Close() }}, id: n.connSeq.Add(1)}
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
		if h.Type != wire.TypeRaftMessage && h.Type != wire.TypeRaftChunk && h.Length > ctlFrameMax {
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
			if req.Op == opRead && len(req.Body) > 0 &&
				(ReadMode(req.Body[0]) == ReadConsistent || ReadMode(req.Body[0]) == ReadFollower) {
				q, err := parseRead(req.Body)
				rb.add(batchedRead{id: req.ID, q: q, err: err})
				continue
			}
			if req.Op == opPropose {
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
func (n *Node) LocalClient() *Client {
	return NewLocal(n.handle)
}

// handleOn serves one request arriving on sc (nil in-process).
func (n *Node) handleOn(ctx context.Context, sc *serverConn, op uint8, body []byte) (status uint8, leader string, out []byte) {
	var err error
	switch op {
	case opPropose:
		var ev Event
		ev, err = DecodeEvent(body)
		if err != nil {
			return statusBadRequest, "", []byte(err.Error())
		}
		var res Result
		res, err = n.Propose(ctx, ev)
		if err == nil {
			out = appendResult(out, res)
		}
	case opRead:
		out, err = n.handleRead(ctx, body)
	case opHeartbeat:
		var broker uint32
		var logEnds []GroupLogEnd
		if broker, logEnds, err = decodeHeartbeat(body); err == nil {
			var conn uint64
			if sc != nil {
				conn = sc.id
			}
			if err = n.heartbeatOn(broker, logEnds, conn); err == nil && sc != nil {
				sc.sawBroker(broker)
			}
		} else {
			err = ErrBadRequest
		}
	case opElect:
		preferred, groups, derr := decodeElect(body)
		if derr != nil {
			err = ErrBadRequest
			break
		}
		var res Result
		res, err = n.ElectNow(ctx, groups, preferred)
		if err == nil {
			out = appendResult(out, res)
		}
	case opPrimary:
		r := wire.NewReader(body)
		preferred := r.U32()
		if err = r.Done(); err != nil || preferred == 0 {
			err = ErrBadRequest
			break
		}
		var res Result
		res, err = n.ElectPrimaryNow(ctx, preferred)
		var re *ResultError
		if errors.As(err, &re) {
			// A refusal by the state machine is an answer, not a failure.
			res, err = Result{Code: re.Code, Msg: re.Msg}, nil
		}
		if err == nil {
			out = appendResult(out, res)
		}
	case opWait:
		r := wire.NewReader(body)
		after := r.U64()
		if err = r.Done(); err != nil {
			err = ErrBadRequest
			break
		}
		// Waiting until the request deadline is the normal outcome of a
		// long poll, not an error: the caller polls again.
		wctx, cancel := context.WithTimeout(ctx, waitPollMax)
		n.waitApplied(wctx, after+1)
		cancel()
		out = wire.AppendU64(out, n.Applied())
	case opMembers:
		if len(body) != 0 {
			return statusBadRequest, "", []byte("controlplane: members takes no arguments")
		}
		// The ReadIndex round proves this node still leads and waits until
		// it applied every entry committed before the request, membership
		// changes included.
		if _, err = n.ReadIndex(ctx, false); err != nil {
			break
		}
		out = wire.AppendU64(out, n.self)
		out = appendMembers(out, n.memberAddrs())
	case opChangeMembers:
		var add map[uint64]string
		var remove []uint64
		add, remove, err = decodeMembersChange(body)
		if err != nil {
			return statusBadRequest, "", []byte(err.Error())
		}
		err = n.ChangeMembership(ctx, add, remove)
	case opStatus:
		s := n.Status()
		for _, v := range []uint64{s.ID, s.Leader, s.Term, s.Applied, s.SnapshotIndex, s.FirstIndex, s.LastIndex} {
			out = wire.AppendU64(out, v)
		}
	default:
		return statusBadRequest, "", []byte("controlplane: unknown operation")
	}
	if err != nil {
		if op == opPropose || op == opElect || op == opPrimary || op == opChangeMembers {
			return proposeErrorStatus(err)
		}
		return errorStatus(err)
	}
	return statusOK, "", out
}

func errorStatus(err error) (uint8, string, []byte) {
	var nl *NotLeaderError
	var lag *LaggingError
	switch {
	case errors.As(err, &nl):
		return statusNotLeader, nl.Leader, nil
	case errors.As(err, &lag):
		return statusLagging, lag.Leader, wire.AppendU64(nil, lag.Behind)
	case errors.Is(err, ErrBusy):
		return statusBusy, "", nil
	case errors.Is(err, ErrLeaderChanged):
		return statusAmbiguous, "", []byte(err.Error())
	case errors.Is(err, ErrTimeout):
		// A proposal that timed out may still apply.
		return statusAmbiguous, "", []byte(err.Error())
	case errors.Is(err, ErrStopped):
		return statusStopped, "", nil
	case errors.Is(err, ErrReadAborted):
		return statusUnavailable, "", []byte(err.Error())
	}
	return statusBadRequest, "", []byte(err.Error())
}

// readQuery is a parsed opRead body.
type readQuery struct {
	mode                ReadMode
	query               uint8
	start, count, group uint32
	key                 string
}

func parseRead(body []byte) (readQuery, error) {
	r := wire.NewReader(body)
	q := readQuery{mode: ReadMode(r.U8()), query: r.U8()}
	switch q.query {
	case queryGroups:
		q.start, q.count = r.U32(), r.U32()
		if q.count > groupsPerReplyMax {
			q.count = groupsPerReplyMax
		}
	case queryAttribute:
		q.key = readStr(r)
	case querySyncStateSet:
		q.group = r.U32()
	case queryWiring, queryBrokers, queryNextBrokerID, queryClusterInfo, queryPrimary:
	default:
		return q, ErrBadRequest
	}
	if err := r.Done(); err != nil {
		return q, ErrBadRequest
	}
	return q, nil
}

// appendAnswer appends the query's answer from s; the caller holds s's
// read lock.
func (q *readQuery) appendAnswer(b []byte, s *State) []byte {
	switch q.query {
	case queryWiring:
		b = appendWiring(b, s.Wiring())
	case queryGroups:
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
			b = appendGroup(b, g)
		}
	case queryBrokers:
		bs := s.Brokers()
		b = wire.AppendU32(b, uint32(len(bs)))
		for _, br := range bs {
			b = (&RegisterBroker{ID: br.ID, Addrs: br.Addrs, Version: br.Version}).appendBody(b)
		}
	case queryNextBrokerID:
		b = wire.AppendU32(b, s.NextBrokerID())
	case queryAttribute:
		v, ok := s.Attribute(q.key)
		b = wire.AppendBool(b, ok)
		b = appendStr(b, v)
	case queryClusterInfo:
		c := s.Config()
		b = (&SetClusterConfig{Groups: c.Groups, Mode: c.Mode, UncleanElection: c.UncleanElection}).appendBody(b)
		b = wire.AppendU16(b, s.ClusterVersion())
	case querySyncStateSet:
		g, ok := s.Group(q.group)
		b = wire.AppendBool(b, ok)
		b = appendGroup(b, g)
	case queryPrimary:
		// mode, broker, epoch, then the broker's addresses.
		p, epoch := s.Primary()
		br, _ := s.Broker(p)
		b = wire.AppendU8(b, s.Config().Mode)
		b = (&RegisterBroker{ID: p, Addrs: br.Addrs}).appendBody(b)
		b = wire.AppendU32(b, epoch)
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
