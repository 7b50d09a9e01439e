package server

// Consumer proxying. A client that subscribes, on a broker that does not
// master the group of a replicated queue, to that queue gets its
// deliveries through this broker: the broker opens a proxy session on the
// master, over its forwarding connection to it (wire TypeProxy*), and
// passes the client's consumer commands (SUBSCRIBE, CREDIT, ACCEPT,
// RELEASE, REJECT, CANCEL) to it as they are. The master runs them on a
// session of its own whose output, the client frames its shards write
// (DELIVER, COMPLETE, ERROR), comes back as it is and goes to the client.
// Consumer ids, delivery tags and command ids are the client's own, so
// nothing is translated.
//
// When the connection to the master ends (the master died), or the
// controller gives the group another master (the old one, frozen or
// alive, delivers no more), the proxied consumers end (what they held is
// released, and the new master delivers it again). A client of protocol
// 1.3 or later keeps its session: the commands it sent for them and the
// master did not answer fail with outcome-unknown (unavailable before
// 1.4; a SUBSCRIBE with unavailable, its consumer undone at the master),
// then a CANCELLED for each consumer says it ended, and the
// client subscribes again if it wants to. An older client's connection is
// closed with a CLOSE saying so, as its only way to learn of it.
//
// A proxied command takes a mutex of this broker's proxy table and one of
// its session, and allocates its frame; deliveries are copied once on
// their way. The proxy session remembers the ids of its commands in
// flight (at most the server's window of them) so that it can answer them
// itself when the master cannot: retiring them costs a look at the header
// of each frame the master sends back.

import (
	"errors"
	"fmt"
	"slices"
	"sync"

	"github.com/berthmq/berth/replication/groups"
	"github.com/berthmq/berth/server/session"
	"github.com/berthmq/berth/shards"
	"github.com/berthmq/berth/wire"
)

// proxySession is one client connection's proxy session on one master.
type proxySession struct {
	id     uint64
	master uint32
	addr   string // the master's peer address
	cs     *connState

	// mu orders the session's output to its client against its end: no
	// frame of the master goes out after the CANCELLEDs.
	mu struct {
		sync.Mutex
		ended bool
		// pending holds the command ids sent to the master and not yet
		// answered by it; subscribes those of SUBSCRIBEs among them, by
		// consumer id.
		pending    map[uint64]struct{}
		subscribes map[uint32]uint64
	}
}

type proxyConsumer struct {
	cs *connState
	id uint32
}

// proxyTable is the proxying side's sessions.
type proxyTable struct {
	mu        sync.Mutex
	next      uint64
	byID      map[uint64]*proxySession
	byConn    map[*connState]map[uint32]*proxySession // by master
	consumers map[proxyConsumer]*proxySession
	groupOf   map[proxyConsumer]uint32 // the group of the consumer's queue
}

// proxyTarget says whether a subscribe to q on this broker is proxied:
// the master and its peer address, or why it cannot be now (where).
func (s *Server) proxyTarget(q *shards.Queue) (g, master uint32, addr, where string) {
	g, ok := q.Replicated()
	if !ok || s.replicator == nil || s.replicator.IsMaster(g) || s.cfg.ConsumeAtReplicas && s.replicator.HoldsReplica(g) {
		// A replica serves its consumers itself, as the queue's owner
		// when it gets the queue (shards/own.go).
		return 0, 0, "", ""
	}
	m := s.groups.Load()
	var v *groups.View
	if m != nil {
		v = m.View()
	}
	if v == nil || int(g) >= len(v.Groups) {
		// The broker has not read the groups from the controller yet: it
		// cannot tell where the queue is served, so the client retries.
		return g, 0, "", fmt.Sprintf("queue %q is replicated in group %d, which this broker does not know yet (the replication groups are starting); retry", q.Name, g)
	}
	master = v.Groups[g].Master
	addr = v.Peer[master]
	if master == 0 || master == s.brokerID || addr == "" {
		return g, 0, "", fmt.Sprintf("queue %q is replicated in group %d, which has no serving master now; retry", q.Name, g)
	}
	return g, master, addr, ""
}

// proxySubscribe passes a SUBSCRIBE to the master, opening the client's
// proxy session there if needed. It runs on the connection's owner.
func (s *Server) proxySubscribe(cs *connState, g, master uint32, addr string, cmdID uint64, consumer uint32, body []byte) {
	t := &s.proxies
	t.mu.Lock()
	if t.byID == nil {
		t.byID, t.byConn, t.consumers = map[uint64]*proxySession{}, map[*connState]map[uint32]*proxySession{}, map[proxyConsumer]*proxySession{}
		t.groupOf = map[proxyConsumer]uint32{}
	}
	sessions := t.byConn[cs]
	if sessions == nil {
		sessions = map[uint32]*proxySession{}
		t.byConn[cs] = sessions
	}
	ps := sessions[master]
	if ps == nil {
		t.next++
		ps = &proxySession{id: t.next, master: master, addr: addr, cs: cs}
		sessions[master] = ps
		t.byID[ps.id] = ps
	}
	t.consumers[proxyConsumer{cs, consumer}] = ps
	t.groupOf[proxyConsumer{cs, consumer}] = g
	t.mu.Unlock()
	s.proxySend(cs, ps, cmdID, wire.TypeSubscribe, body, consumer)
}

// proxyConsumerCommand passes a consumer command of a proxied consumer to
// its master. It runs on the connection's owner.
func (s *Server) proxyConsumerCommand(cs *connState, consumer uint32, cmdID uint64, typ wire.Type, body []byte) {
	s.proxies.mu.Lock()
	ps := s.proxies.consumers[proxyConsumer{cs, consumer}]
	s.proxies.mu.Unlock()
	if ps == nil {
		if cmdID != 0 {
			cs.fail(cmdID, wire.CodeNotFound, "the proxied consumer ended with its master's connection")
		}
		return
	}
	s.proxySend(cs, ps, cmdID, typ, body, consumer)
}

// proxySend passes one client frame, of consumer, to the master and
// reports whether it went; a command that did not is answered here. It
// runs on the connection's owner.
func (s *Server) proxySend(cs *connState, ps *proxySession, cmdID uint64, typ wire.Type, body []byte, consumer uint32) bool {
	if cmdID != 0 {
		ps.mu.Lock()
		switch {
		case ps.mu.ended:
			// The session ended between the proxy table's lookup and
			// here: a SUBSCRIBE may go again (to the new master), any
			// other command's consumer is gone.
			ps.mu.Unlock()
			if typ == wire.TypeSubscribe {
				cs.fail(cmdID, wire.CodeUnavailable, "the master of the queue's group was lost; retry")
			} else {
				cs.fail(cmdID, wire.CodeNotFound, "the proxied consumer ended with its master's connection")
			}
			return false
		case len(ps.mu.pending) >= int(s.cfg.WindowMax):
			ps.mu.Unlock()
			cs.fail(cmdID, wire.CodeResourceLimit, "more uncompleted commands than the negotiated window")
			return false
		}
		if ps.mu.pending == nil {
			ps.mu.pending = map[uint64]struct{}{}
		}
		ps.mu.pending[cmdID] = struct{}{}
		if typ == wire.TypeSubscribe {
			// Noted with its id, so that the session's end, even one
			// that comes before the frame goes, knows it for a SUBSCRIBE.
			if ps.mu.subscribes == nil {
				ps.mu.subscribes = map[uint32]uint64{}
			}
			ps.mu.subscribes[consumer] = cmdID
			if len(ps.mu.subscribes) > 2*len(ps.mu.pending)+16 {
				// Answered SUBSCRIBEs need no entry: drop them, so the map
				// stays within twice the commands in flight.
				for id, cmd := range ps.mu.subscribes {
					if _, out := ps.mu.pending[cmd]; !out {
						delete(ps.mu.subscribes, id)
					}
				}
			}
		}
		ps.mu.Unlock()
	}
	frame := wire.AppendHeader(make([]byte, 0, wire.HeaderSize+len(body)), wire.Header{Version: cs.version, Type: typ, Length: uint32(len(body))})
	frame = append(frame, body...)
	pf := wire.AppendProxyCommand(make([]byte, 0, len(frame)+32), ps.id, cs.version, cs.frameMax, frame)
	err := s.groups.Load().Forwarder().SendProxy(ps.master, ps.addr, pf)
	if err == nil || cmdID == 0 {
		return err == nil
	}
	ps.mu.Lock()
	_, mine := ps.mu.pending[cmdID] // else the session's end answered it
	delete(ps.mu.pending, cmdID)
	ps.mu.Unlock()
	if mine {
		cs.fail(cmdID, wire.CodeUnavailable, fmt.Sprintf("the master of the queue's group, broker %d, cannot be reached now (%v); retry", ps.master, err))
	}
	return false
}

// proxyClosed ends the proxy sessions of a client connection that closed.
func (s *Server) proxyClosed(cs *connState) {
	t := &s.proxies
	t.mu.Lock()
	sessions := t.byConn[cs]
	delete(t.byConn, cs)
	for _, ps := range sessions {
		delete(t.byID, ps.id)
	}
	for k := range t.consumers {
		if k.cs == cs {
			delete(t.consumers, k)
			delete(t.groupOf, k)
		}
	}
	t.mu.Unlock()
	m := s.groups.Load()
	for _, ps := range sessions {
		_ = m.Forwarder().SendProxy(ps.master, ps.addr, wire.AppendProxyClose(nil, ps.id))
	}
}

// proxyOutput writes what a master sent for a proxied session to its
// client. It runs on the forwarding connection's reader; frames aliases
// its buffer.
func (s *Server) proxyOutput(master uint32, session uint64, frames []byte) {
	s.proxies.mu.Lock()
	ps := s.proxies.byID[session]
	s.proxies.mu.Unlock()
	if ps == nil || ps.master != master {
		return // its client went away
	}
	out := append([]byte(nil), frames...)
	ps.mu.Lock()
	if ps.mu.ended {
		ps.mu.Unlock()
		return // its consumers were cancelled: nothing of theirs follows
	}
	cancelled := retireAnswered(ps.mu.pending, frames)
	_ = ps.cs.t.WriteAsync([][]byte{out}, func() {})
	ps.mu.Unlock()
	if cancelled {
		s.proxyForgetCancelled(ps, frames)
	}
}

// proxyForgetCancelled forgets the consumers that the CANCELLEDs among a
// master's frames ended (their queue was deleted there): later commands
// for them fail here.
func (s *Server) proxyForgetCancelled(ps *proxySession, frames []byte) {
	t := &s.proxies
	for len(frames) > 0 {
		h, body, n, err := wire.Next(frames, wire.FrameSizeMax)
		if err != nil || n == 0 {
			return
		}
		frames = frames[n:]
		var c wire.Cancelled
		if h.Type != wire.TypeCancelled || wire.DecodeCancelled(body, &c) != nil {
			continue
		}
		k := proxyConsumer{ps.cs, c.ConsumerID}
		t.mu.Lock()
		if t.consumers[k] == ps {
			delete(t.consumers, k)
			delete(t.groupOf, k)
		}
		t.mu.Unlock()
	}
}

// retireAnswered deletes from pending the command ids that the COMPLETE
// and ERROR frames among frames answer, and reports whether a CANCELLED
// is among them. A DELIVER is stepped over by its length.
func retireAnswered(pending map[uint64]struct{}, frames []byte) (cancelled bool) {
	for len(frames) > 0 {
		h, body, n, err := wire.Next(frames, wire.FrameSizeMax)
		if err != nil || n == 0 {
			return cancelled // the master writes whole frames; nothing to retire in the rest
		}
		frames = frames[n:]
		if len(pending) == 0 && h.Type != wire.TypeCancelled {
			continue
		}
		switch h.Type {
		case wire.TypeCancelled:
			cancelled = true
		case wire.TypeComplete:
			rl, err := wire.DecodeComplete(body)
			if err != nil {
				continue
			}
			for i := range rl.Len() {
				r := rl.At(i)
				if r.Last-r.First >= uint64(len(pending)) {
					for id := range pending {
						if id >= r.First && id <= r.Last {
							delete(pending, id)
						}
					}
					continue
				}
				for id := r.First; ; id++ {
					delete(pending, id)
					if id == r.Last {
						break
					}
				}
			}
		case wire.TypeError:
			var e wire.Error
			if wire.DecodeError(body, &e) == nil {
				delete(pending, e.CommandID)
			}
		}
	}
	return cancelled
}

// proxyLost ends the proxied consumers of every session on master, whose
// connection ended.
func (s *Server) proxyLost(master uint32) {
	s.proxyEnd(func(ps *proxySession, _ uint32) bool { return ps.master == master }, false,
		fmt.Sprintf("the connection to broker %d, master of the consumer's queue, ended; subscribe again", master))
}

// proxyViewChanged ends the proxy sessions holding a consumer of a group
// whose master changed: the old master, alive or not, delivers no more.
// The old master is told to close them, which releases what they held.
func (s *Server) proxyViewChanged(old, cur *groups.View) {
	if old == nil {
		return
	}
	moved := map[uint32]uint32{} // group -> its old master
	for g := range min(len(old.Groups), len(cur.Groups)) {
		if o := old.Groups[g].Master; o != 0 && o != cur.Groups[g].Master {
			moved[uint32(g)] = o
		}
	}
	if len(moved) == 0 {
		return
	}
	s.proxyEnd(func(ps *proxySession, g uint32) bool {
		o, ok := moved[g]
		return ok && ps.master == o
	}, true, "the master of the consumer's queue changed; subscribe again")
}

// proxyEnd ends the sessions with a consumer that match, and tells their
// masters if tell. A client of protocol 1.3 or later keeps its session:
// its commands the master did not answer fail with outcome-unknown
// (unavailable for a SUBSCRIBE, and before 1.4), and each
// consumer of the session gets a CANCELLED with reason. An older client's
// connection is closed with reason.
func (s *Server) proxyEnd(match func(ps *proxySession, g uint32) bool, tell bool, reason string) {
	t := &s.proxies
	ended := map[*proxySession][]uint32{} // its consumers
	t.mu.Lock()
	for k, ps := range t.consumers {
		if match(ps, t.groupOf[k]) {
			ended[ps] = nil
		}
	}
	for k, ps := range t.consumers {
		if cons, ok := ended[ps]; ok {
			ended[ps] = append(cons, k.id)
			delete(t.consumers, k)
			delete(t.groupOf, k)
		}
	}
	for ps := range ended {
		delete(t.byID, ps.id)
		delete(t.byConn[ps.cs], ps.master)
	}
	t.mu.Unlock()
	m := s.groups.Load()
	for ps, cons := range ended {
		if tell && m != nil {
			_ = m.Forwarder().SendProxy(ps.master, ps.addr, wire.AppendProxyClose(nil, ps.id))
		}
		cs := ps.cs
		ps.mu.Lock()
		ps.mu.ended = true
		if cs.version < wire.VersionCancelled {
			ps.mu.Unlock()
			_ = cs.t.send(wire.AppendClose(nil, cs.version, wire.CodeShutdown, reason), true)
			continue
		}
		var out []byte
		subscribing := map[uint64]bool{} // the pending SUBSCRIBEs' ids
		for _, sub := range ps.mu.subscribes {
			if _, out := ps.mu.pending[sub]; out {
				subscribing[sub] = true
			}
		}
		for id := range ps.mu.pending {
			if subscribing[id] {
				// Undone if the master made it: its session there ends.
				out = wire.AppendError(out, cs.version, id, wire.CodeUnavailable,
					"the consumer's master was lost before it answered; no consumer is left (its session at the master ends); subscribe again")
				continue
			}
			// An older session gets unavailable, with this text.
			out = wire.AppendError(out, cs.version, id, wire.CodeOutcomeUnknown,
				"the consumer's master was lost before it answered; the outcome is unknown")
		}
		slices.Sort(cons)
		for _, id := range cons {
			if sub, ok := ps.mu.subscribes[id]; ok && subscribing[sub] {
				continue // its SUBSCRIBE failed just above
			}
			out = wire.AppendCancelled(out, cs.version, id, wire.CodeUnavailable, reason)
		}
		ps.mu.pending, ps.mu.subscribes = nil, nil
		if len(out) > 0 {
			_ = cs.t.WriteAsync([][]byte{out}, func() {})
		}
		ps.mu.Unlock()
	}
}

// proxied is a proxy session on the master's side.
type proxied struct {
	s    *Server
	sess *shards.Session
	out  groups.ProxyOut
	// ss is the session's dispatcher, as a client connection's (the
	// forwarding connection's reader owns it).
	ss *session.Session
}

// A proxied session is served through the methods below: it answers at
// once on the forwarding connection, pushes to the shards' lanes
// (replication.Lanes: a busy shard holds up only the commands for it,
// and the forwarding connection's reader waits only when a lane itself
// is full, a shard that took nothing for LaneMax commands), has nothing to check
// (the proxying broker checked the client's permissions), adopts a queue
// its wiring has not shown here yet, and serves only as the master.

// Push is session.Pusher.
func (p *proxied) Push(shard int, cmd shards.Command) bool {
	p.s.lanes.Push(shard, cmd)
	return true
}

// Complete and Fail are session.Replies.
func (p *proxied) Complete(id uint64) {
	p.out.Write([][]byte{wire.AppendCompletes(nil, p.sess.Version, []wire.Range{{First: id, Last: id}})})
}

func (p *proxied) Fail(id uint64, code wire.ErrorCode, text string) {
	p.out.Write([][]byte{wire.AppendError(nil, p.sess.Version, id, code, text)})
}

// SubscribeQueue is session.Resolver.
func (p *proxied) SubscribeQueue(name []byte, cmdID uint64) (*shards.Queue, bool) {
	s := p.s
	q := s.wiring.Routing().Queue(name)
	if q == nil {
		var err error
		if q, err = s.wiring.Adopt(string(name)); err != nil {
			p.Fail(cmdID, wire.CodeNotFound, "no queue "+string(name))
			return nil, false
		}
	}
	if g, ok := q.Replicated(); !ok || !s.replicator.IsMaster(g) {
		p.Fail(cmdID, wire.CodeUnavailable, fmt.Sprintf("broker %d is not the master of queue %q's group (any more); retry", s.brokerID, q.Name))
		return nil, false
	}
	return q, false
}

// NoteConsumer and ForgetConsumer are session.Registry.
func (p *proxied) NoteConsumer(q *shards.Queue, id uint32) {
	p.s.noteConsumer(q, consumerRef{p: p, id: id})
}

func (p *proxied) ForgetConsumer(q *shards.Queue, id uint32) {
	p.s.forgetConsumer(q, consumerRef{p: p, id: id})
}

// proxiedTable is the master's side's sessions, by their connection and
// id (groups.ProxyOut).
type proxiedTable struct {
	mu   sync.Mutex
	byID map[groups.ProxyOut]*proxied
}

// proxyWriter is a proxied session's shards.Writer: it copies the frames
// into the forwarding connection's buffer at once.
type proxyWriter struct{ out frameSink }

// frameSink is where a proxyWriter copies frames (groups.ProxyOut): false
// once the connection to the proxying broker has closed.
type frameSink interface{ Write(bufs [][]byte) bool }

// WriteAsync copies bufs at once; done runs before it returns, and not at
// all when it fails (shards.Writer: the caller then releases the bufs).
func (w proxyWriter) WriteAsync(bufs [][]byte, done func()) error {
	if !w.out.Write(bufs) {
		return errProxyGone
	}
	done()
	return nil
}

var errProxyGone = errors.New("server: the proxying broker's connection closed")

// proxyCommand runs one command of a proxied session, on this broker as
// the master, on the forwarding connection's reader goroutine, through
// the same session dispatcher as a client's.
func (s *Server) proxyCommand(from uint32, out groups.ProxyOut, version wire.Version, frameMax uint32, frame []byte) {
	t := &s.proxiedSessions
	t.mu.Lock()
	if t.byID == nil {
		t.byID = map[groups.ProxyOut]*proxied{}
	}
	p := t.byID[out]
	if p == nil {
		p = &proxied{s: s, out: out, sess: &shards.Session{ID: s.nextSession.Add(1), Version: version, FrameMax: frameMax, Out: proxyWriter{out}}}
		p.ss = session.New(p.sess, session.Config{
			Broker: s.broker, Routing: s.wiring.Routing, Push: p, Replies: p, Resolve: p, Reg: p,
			WindowMax: int64(s.cfg.WindowMax),
		})
		t.byID[out] = p
	}
	t.mu.Unlock()
	hd, err := wire.ReadHeader(frame, wire.FrameSizeMax)
	if err != nil || int(hd.Length) != len(frame)-wire.HeaderSize {
		p.Fail(0, wire.CodeMalformed, "malformed proxied frame")
		return
	}
	body := frame[wire.HeaderSize:]
	ss := p.ss
	switch hd.Type {
	case wire.TypeSubscribe:
		var m wire.Subscribe
		if err := wire.DecodeSubscribe(body, &m); err != nil {
			p.Fail(0, wire.CodeMalformed, "SUBSCRIBE: "+err.Error())
			return
		}
		ss.Subscribe(subscribeOf(&m), body)
	case wire.TypeCredit:
		var m wire.Credit
		if err := wire.DecodeCredit(body, &m); err != nil {
			p.Fail(0, wire.CodeMalformed, "CREDIT: "+err.Error())
			return
		}
		ss.Credit(m.ConsumerID, m.Credit, body)
	case wire.TypeCancel:
		var m wire.Cancel
		if err := wire.DecodeCancel(body, &m); err != nil {
			p.Fail(0, wire.CodeMalformed, "CANCEL: "+err.Error())
			return
		}
		ss.Cancel(m.CommandID, m.ConsumerID, body)
	case wire.TypeAccept, wire.TypeRelease, wire.TypeReject:
		var m wire.Settle
		if err := wire.DecodeSettle(body, &m); err != nil {
			p.Fail(0, wire.CodeMalformed, "settle: "+err.Error())
			return
		}
		ss.Resume = 0
		ss.Settle(m.CommandID, m.ConsumerID, settleOp(hd.Type), m.Tags, body)
	default:
		p.Fail(0, wire.CodeInvalid, "frame "+hd.Type.String()+" is not proxied")
	}
}

// proxyClose ends a proxied session on the master: what its consumers
// held goes back to their queues.
func (s *Server) proxyClose(out groups.ProxyOut) {
	t := &s.proxiedSessions
	t.mu.Lock()
	p := t.byID[out]
	delete(t.byID, out)
	t.mu.Unlock()
	if p != nil {
		p.ss.Served(func(id uint32, q *shards.Queue) { s.forgetConsumer(q, consumerRef{p: p, id: id}) })
		// After what the session's commands wait for in the lanes: a
		// SUBSCRIBE that reached its shard after the close would leave
		// a consumer of a closed session.
		s.lanes.AfterAll(func() { go s.wiring.SessionClosed(p.sess) })
	}
}
