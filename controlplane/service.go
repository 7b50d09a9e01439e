package controlplane

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"slices"
	"sync"
	"time"

	"github.com/berthmq/berth/wire"
	pb "go.etcd.io/raft/v3/raftpb"
	"google.golang.org/protobuf/proto"
)

// Service operations (wire.CtlRequest.Op). Persisted nowhere, but brokers
// of other versions send them: never renumber.
const (
	opPropose   uint8 = 1 // body: an event; reply: a Result
	opRead      uint8 = 2 // body: mode, query, args; reply: per query
	opHeartbeat uint8 = 3 // body: broker, log ends
	opElect     uint8 = 4 // body: preferred broker, group ids; reply: a Result
	opStatus    uint8 = 5 // reply: a Status
	opWait      uint8 = 6 // body: an applied index; reply: the applied index once past it
	opPrimary   uint8 = 7 // body: preferred broker; reply: a Result (elected on the leader from its heartbeats)
	// opMembers: no body; reply: the leader's id, then the voters as
	// count + (id u64, address str)*. Served on the leader only, after a
	// ReadIndex round (a consistent read): the configuration it reports
	// holds every membership change committed before the request.
	opMembers uint8 = 8
	// opChangeMembers: body: adds as count + (id u64, address str)*,
	// removes as count + id*; each count at most membersChangeMax. Runs
	// ChangeMembership on the leader; an empty reply once the joint
	// configuration is left. A write: a stopping leader's answer is
	// ambiguous. Repeating a change that took effect succeeds.
	opChangeMembers uint8 = 9
)

// membersChangeMax bounds the adds and the removes in one opChangeMembers
// request: no change leaves more than VotersMax voters, and replacing a
// whole 5-member group takes 5 of each.
const membersChangeMax = VotersMax

// Read queries.
const (
	queryWiring uint8 = iota + 1
	queryGroups
	queryBrokers
	queryNextBrokerID
	queryAttribute
	queryClusterInfo
	querySyncStateSet
	queryPrimary
)

// Response statuses (wire.CtlResponse.Status).
const (
	statusOK uint8 = iota
	statusNotLeader
	statusLagging
	statusBusy
	statusBadRequest
	statusUnavailable // not served; safe to retry
	statusAmbiguous   // a write whose outcome is unknown
	statusStopped
)

const (
	// ctlFrameMax bounds a service request frame.
	ctlFrameMax = 1 << 20
	// connInflightMax bounds requests served at once per connection.
	connInflightMax = 1024
	// requestTimeout bounds the time the server spends on one request.
	requestTimeout = 5 * time.Second
	// waitPollMax bounds one WaitChange long poll on the server.
	waitPollMax = 2 * time.Second
	// groupsPerReplyMax bounds the groups in one GetGroups reply.
	groupsPerReplyMax = 16384
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

// handleOn serves one request arriving on sc (nil in-process).
func (n *Node) handleOn(ctx context.Context, sc *serverConn, op uint8, body []byte) (status uint8, leader string, out []byte) {
	var e encoder
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
			encodeResult(&e, res)
		}
	case opRead:
		err = n.handleRead(ctx, body, &e)
	case opHeartbeat:
		d := decoder{b: body}
		broker := d.u32()
		cnt := d.count(16)
		logEnds := make([]GroupLogEnd, cnt)
		for i := range logEnds {
			logEnds[i] = GroupLogEnd{d.u32(), LogEnd{d.u32(), d.u64()}}
		}
		if err = d.finish(); err == nil {
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
		d := decoder{b: body}
		preferred := d.u32()
		groups := decodeIDs(&d)
		if err = d.finish(); err != nil {
			err = ErrBadRequest
			break
		}
		var res Result
		res, err = n.ElectNow(ctx, groups, preferred)
		if err == nil {
			encodeResult(&e, res)
		}
	case opPrimary:
		d := decoder{b: body}
		preferred := d.u32()
		if err = d.finish(); err != nil || preferred == 0 {
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
			encodeResult(&e, res)
		}
	case opWait:
		d := decoder{b: body}
		after := d.u64()
		if err = d.finish(); err != nil {
			err = ErrBadRequest
			break
		}
		// Waiting until the request deadline is the normal outcome of a
		// long poll, not an error: the caller polls again.
		wctx, cancel := context.WithTimeout(ctx, waitPollMax)
		n.waitApplied(wctx, after+1)
		cancel()
		e.u64(n.Applied())
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
		members := n.memberAddrs()
		e.u64(n.self)
		e.u32(uint32(len(members)))
		for _, id := range slices.Sorted(maps.Keys(members)) {
			e.u64(id)
			e.str(members[id])
		}
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
			e.u64(v)
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
	return statusOK, "", e.b
}

func encodeMembersChange(e *encoder, add map[uint64]string, remove []uint64) {
	e.u32(uint32(len(add)))
	for _, id := range slices.Sorted(maps.Keys(add)) {
		e.u64(id)
		e.str(add[id])
	}
	encodeMemberIDs(e, remove)
}

func encodeMemberIDs(e *encoder, ids []uint64) {
	e.u32(uint32(len(ids)))
	for _, id := range ids {
		e.u64(id)
	}
}

// decodeMembersChange reads an opChangeMembers body. ChangeMembership
// checks the ids and addresses against the membership; this checks only
// the shape and the bounds.
func decodeMembersChange(body []byte) (map[uint64]string, []uint64, error) {
	d := decoder{b: body}
	na := d.count(10) // id and string length
	if na > membersChangeMax {
		return nil, nil, fmt.Errorf("%w: %d controllers to add; at most %d per change", ErrBadRequest, na, membersChangeMax)
	}
	add := make(map[uint64]string, na)
	for i := 0; i < na && d.err == nil; i++ {
		id, addr := d.u64(), d.str()
		if _, dup := add[id]; dup && d.err == nil {
			return nil, nil, fmt.Errorf("%w: controller %d is listed twice to add", ErrBadRequest, id)
		}
		add[id] = addr
	}
	nr := d.count(8)
	if nr > membersChangeMax {
		return nil, nil, fmt.Errorf("%w: %d controllers to remove; at most %d per change", ErrBadRequest, nr, membersChangeMax)
	}
	remove := make([]uint64, 0, nr)
	for i := 0; i < nr && d.err == nil; i++ {
		remove = append(remove, d.u64())
	}
	if err := d.finish(); err != nil {
		return nil, nil, fmt.Errorf("%w: malformed membership change: %v", ErrBadRequest, err)
	}
	return add, remove, nil
}

func errorStatus(err error) (uint8, string, []byte) {
	var nl *NotLeaderError
	var lag *LaggingError
	switch {
	case errors.As(err, &nl):
		return statusNotLeader, nl.Leader, nil
	case errors.As(err, &lag):
		var e encoder
		e.u64(lag.Behind)
		return statusLagging, lag.Leader, e.b
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

func encodeResult(e *encoder, r Result) {
	e.u8(r.Code)
	e.u64(r.Value)
	e.str(r.Msg)
}

func decodeResult(b []byte) (Result, error) {
	d := decoder{b: b}
	r := Result{Code: d.u8(), Value: d.u64(), Msg: d.str()}
	return r, d.finish()
}

func encodeGroup(e *encoder, g Group) {
	e.u32(g.ID)
	e.u32(g.Master)
	e.u32(g.Epoch)
	e.u32(g.ElectedLogEnd.Epoch)
	e.u64(g.ElectedLogEnd.Index)
	encodeIDs(e, g.SyncStateSet)
}

func decodeGroup(d *decoder) Group {
	g := Group{ID: d.u32(), Master: d.u32(), Epoch: d.u32()}
	g.ElectedLogEnd = LogEnd{d.u32(), d.u64()}
	g.SyncStateSet = decodeIDs(d)
	return g
}

// readQuery is a parsed opRead body.
type readQuery struct {
	mode                ReadMode
	query               uint8
	start, count, group uint32
	key                 string
}

func parseRead(body []byte) (readQuery, error) {
	d := decoder{b: body}
	q := readQuery{mode: ReadMode(d.u8()), query: d.u8()}
	switch q.query {
	case queryGroups:
		q.start, q.count = d.u32(), d.u32()
		if q.count > groupsPerReplyMax {
			q.count = groupsPerReplyMax
		}
	case queryAttribute:
		q.key = d.str()
	case querySyncStateSet:
		q.group = d.u32()
	case queryWiring, queryBrokers, queryNextBrokerID, queryClusterInfo, queryPrimary:
	default:
		return q, ErrBadRequest
	}
	if err := d.finish(); err != nil {
		return q, ErrBadRequest
	}
	return q, nil
}

// encode appends the query's answer from s; the caller holds s's read lock.
func (q *readQuery) encode(s *State, e *encoder) {
	switch q.query {
	case queryWiring:
		encodeWiring(e, s.Wiring())
	case queryGroups:
		total := uint32(s.GroupCount())
		e.u32(total)
		start := q.start
		end := uint64(start) + uint64(q.count)
		if end > uint64(total) {
			end = uint64(total)
		}
		if uint64(start) > end {
			start = uint32(end)
		}
		e.u32(uint32(end) - start)
		for id := start; uint64(id) < end; id++ {
			g, _ := s.Group(id)
			encodeGroup(e, g)
		}
	case queryBrokers:
		bs := s.Brokers()
		e.u32(uint32(len(bs)))
		for _, b := range bs {
			(&RegisterBroker{ID: b.ID, Addrs: b.Addrs, Version: b.Version}).encode(e)
		}
	case queryNextBrokerID:
		e.u32(s.NextBrokerID())
	case queryAttribute:
		v, ok := s.Attribute(q.key)
		e.boolean(ok)
		e.str(v)
	case queryClusterInfo:
		c := s.Config()
		(&SetClusterConfig{Groups: c.Groups, Mode: c.Mode, UncleanElection: c.UncleanElection}).encode(e)
		e.u16(s.ClusterVersion())
	case querySyncStateSet:
		g, ok := s.Group(q.group)
		e.boolean(ok)
		encodeGroup(e, g)
	case queryPrimary:
		// mode, broker, epoch, then the broker's addresses.
		p, epoch := s.Primary()
		b, _ := s.Broker(p)
		e.u8(s.Config().Mode)
		(&RegisterBroker{ID: p, Addrs: b.Addrs}).encode(e)
		e.u32(epoch)
	}
}

func (n *Node) handleRead(ctx context.Context, body []byte, e *encoder) error {
	q, err := parseRead(body)
	if err != nil {
		return err
	}
	return n.Read(ctx, q.mode, func(s *State) { q.encode(s, e) })
}
