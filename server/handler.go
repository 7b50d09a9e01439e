package server

import (
	"context"
	"sync"
	"time"

	"github.com/panjf2000/gnet/v2"

	"github.com/berthmq/berth/server/session"
	"github.com/berthmq/berth/shards"
	"github.com/berthmq/berth/wire"
)

type handler struct {
	gnet.BuiltinEventEngine
	s *Server
	// throttled holds the plaintext connections that stopped reading
	// publishes because a target shard is over its memory share
	// (shards/memory.go), each with that shard. Unlike a full ring, which
	// empties in microseconds, a throttle lasts until consumers bring the
	// shard's memory down, so these are not woken at once: wakeThrottled
	// wakes each when its shard lets publishers in again. Meanwhile the
	// connection's publishes do not complete, so the producer's window
	// fills and it stops sending (TLS readers retry on their own).
	throttled struct {
		sync.Mutex
		conns map[*connState]*shards.Shard
		kick  chan struct{} // one slot: a connection was added
	}
	throttleStop chan struct{} // closed when the engine stops
}

// throttleWakeInterval is how often parked publishers are checked.
const throttleWakeInterval = 5 * time.Millisecond

// park notes that cs stopped at a publish to the throttled shard sh.
func (h *handler) park(cs *connState, sh *shards.Shard) {
	if _, ok := cs.t.(gnetConn); !ok {
		return // a TLS reader waits on its own (tls.go)
	}
	h.throttled.Lock()
	h.throttled.conns[cs] = sh
	h.throttled.Unlock()
	select {
	case h.throttled.kick <- struct{}{}:
	default:
	}
}

func (h *handler) parked(cs *connState) bool {
	h.throttled.Lock()
	defer h.throttled.Unlock()
	_, ok := h.throttled.conns[cs]
	return ok
}

// wakeThrottled wakes parked connections whose shard is no longer
// throttled; it sleeps while none are parked.
func (h *handler) wakeThrottled(stop <-chan struct{}) {
	for {
		select {
		case <-stop:
			return
		case <-h.throttled.kick:
		}
		for {
			select {
			case <-stop:
				return
			case <-time.After(throttleWakeInterval):
			}
			h.throttled.Lock()
			for cs, sh := range h.throttled.conns {
				// A shutdown wakes everyone: refuse answers what they hold.
				if cs.closing.Load() || !sh.Throttled() || h.s.draining.Load() {
					delete(h.throttled.conns, cs)
					cs.t.wake()
				}
			}
			left := len(h.throttled.conns)
			h.throttled.Unlock()
			if left == 0 {
				break
			}
		}
	}
}

func (h *handler) OnBoot(eng gnet.Engine) gnet.Action {
	h.s.eng = eng
	addr, err := boundAddr(eng)
	if err != nil {
		h.s.log.Error("server: cannot read bound address", "err", err)
		return gnet.Shutdown
	}
	h.s.addr = addr
	h.throttled.conns = map[*connState]*shards.Shard{}
	h.throttled.kick = make(chan struct{}, 1)
	h.throttleStop = make(chan struct{})
	go h.wakeThrottled(h.throttleStop)
	close(h.s.booted)
	return gnet.None
}

func (h *handler) OnShutdown(gnet.Engine) { close(h.throttleStop) }

func (h *handler) OnOpen(c gnet.Conn) ([]byte, gnet.Action) {
	c.SetContext(h.opened(gnetConn{c}, false))
	return nil, gnet.None
}

// opened registers a new connection, whichever listener took it.
func (h *handler) opened(t transport, tls bool) *connState {
	cs := &connState{s: h.s, t: t, tls: tls}
	cs.openedAt = time.Now().UnixNano()
	cs.lastRecv.Store(cs.openedAt)
	cs.lastBeat = cs.lastRecv.Load()
	h.s.conns.Lock()
	h.s.conns.set[cs] = struct{}{}
	h.s.conns.Unlock()
	select {
	case h.s.conns.opened <- struct{}{}:
	default:
	}
	h.s.metrics.connections.Inc()
	return cs
}

func (h *handler) OnClose(c gnet.Conn, closeErr error) gnet.Action {
	h.s.log.Debug("server: connection closed", "err", closeErr)
	cs, _ := c.Context().(*connState)
	if cs == nil {
		return gnet.None
	}
	h.closed(cs)
	return gnet.None
}

// closed unregisters a connection and ends its session, on its owner.
func (h *handler) closed(cs *connState) {
	cs.closing.Store(true)
	h.s.conns.Lock()
	delete(h.s.conns.set, cs)
	h.s.conns.Unlock()
	h.s.metrics.connections.Dec()
	if cs.sess != nil {
		h.s.proxyClosed(cs)
		cs.ss.Served(func(id uint32, q *shards.Queue) { h.s.forgetConsumer(q, consumerRef{cs: cs, id: id}) })
		sess := cs.sess
		// A fan-out cut short by a full ring still reaches every target
		// (its other parts are in queues already), ahead of the close.
		fan, rest := cs.ss.TakeFanRest()
		// Requeueing may wait on shard rings: never on the loop.
		go func() {
			shardList := h.s.broker.Shards()
			for _, q := range rest {
				fan.Queue = q
				_ = shardList[q.Shard()].Push(context.Background(), fan.Command())
			}
			h.s.wiring.SessionClosed(sess)
		}()
	}
}

func (h *handler) OnTraffic(c gnet.Conn) gnet.Action {
	cs := c.Context().(*connState)
	buf, _ := c.Peek(-1)
	consumed, action, stalled := h.traffic(cs, buf)
	if consumed > 0 {
		_, _ = c.Discard(consumed)
	}
	if stalled && action == gnet.None && cs.readStalled.Load() == 0 && !h.parked(cs) {
		// A shard ring is full: come back once the loop has run its other
		// work, and carry on where we stopped. (A connection over its
		// outbound cap is woken once it drains, by the stall watcher or
		// the heartbeat scan: outbound.go.)
		_ = c.Wake(nil)
	}
	return action
}

// traffic handles the whole frames at the head of buf, on the
// connection's owner, and writes what they produced. It returns how many
// bytes it took, what the owner should do, and whether a full shard ring
// stopped it (then the owner calls again later with the same bytes,
// after discarding consumed).
func (h *handler) traffic(cs *connState, buf []byte) (consumed int, action gnet.Action, stalled bool) {
	cs.lastRecv.Store(time.Now().UnixNano())
	cs.busy.Store(true)
	defer cs.busy.Store(false)
	if h.s.draining.Load() {
		consumed, action = h.refuse(cs, buf)
		return consumed, action, false
	}
	if len(buf) > h.s.cfg.InboundMax {
		act := cs.protocolError(wire.CodeResourceLimit, "inbound buffer limit exceeded")
		h.writeOut(cs)
		return 0, act, false
	}
	if cs.overOutbound() {
		// The client does not read what we write: take none of its frames,
		// whose answers would pile up too, until it drains (outbound.go).
		return 0, gnet.None, true
	}
	action = gnet.None
	maxFrame := h.s.cfg.FrameSizeMax
	if cs.frameMax != 0 {
		maxFrame = cs.frameMax
	}
	for !cs.closing.Load() {
		hd, body, n, err := wire.Next(buf[consumed:], maxFrame)
		if err == nil && n > 0 && cs.skipAhead(consumed) {
			consumed += n // handled while the publish before it was parked
			continue
		}
		if err != nil {
			code := wire.CodeMalformed
			switch err {
			case wire.ErrFrameTooBig:
				code = wire.CodeFrameTooLarge
			case wire.ErrMajorVersion:
				code = wire.CodeVersion
			}
			action = cs.protocolError(code, err.Error())
			break
		}
		if n == 0 {
			break
		}
		done, act := h.frame(cs, hd, body)
		if act != gnet.None {
			action = act
			break
		}
		if !done {
			stalled = true
			break
		}
		consumed += n
		if cs.ss != nil {
			cs.ss.Resume = 0
		}
	}
	cs.rebaseAhead(consumed)
	if stalled && action == gnet.None && h.parked(cs) {
		action = h.aheadOfParked(cs, buf[consumed:], maxFrame)
	}
	h.writeOut(cs)
	if stalled && action == gnet.None && !h.parked(cs) {
		h.s.metrics.ringFull.Inc()
	}
	return consumed, action, stalled
}

// aheadMax bounds the frames handled behind a parked publish (and the
// offsets kept of them: 8 bytes each).
const aheadMax = 1 << 14

// aheadOfParked handles, while cs is parked at the publish frame at the
// head of buf (its shard is over the memory budget), the frames behind it
// that do not depend on the publishes: credit, small settles and
// heartbeats. A connection that also consumes from that shard can then
// drain it; without this it waited for itself until it closed. It passes
// over publishes, which wait their turn, and stops at any other frame (a
// subscribe, a cancel, a declare: later frames may depend on it); the
// main loop skips what it handled once the publishes go through. Each
// call scans on from where the last one stopped.
func (h *handler) aheadOfParked(cs *connState, buf []byte, maxFrame uint32) gnet.Action {
	_, _, off, err := wire.Next(buf, maxFrame)
	if err != nil || off == 0 {
		return gnet.None
	}
	off = max(off, cs.aheadEnd)
	for len(cs.ahead) < aheadMax && !cs.closing.Load() {
		hd, body, n, err := wire.Next(buf[off:], maxFrame)
		if err != nil || n == 0 {
			return gnet.None // the main loop reports a bad frame in turn
		}
		if hd.Type != wire.TypePublish {
			if !aheadSafe(hd, body) {
				return gnet.None
			}
			saved := cs.ss.Resume
			cs.ss.Resume = 0
			done, act := h.frame(cs, hd, body)
			cs.ss.Resume = saved
			if act != gnet.None {
				return act
			}
			if !done {
				return gnet.None // a full ring: nothing of it was taken
			}
			cs.ahead = append(cs.ahead, off)
		}
		off += n
		cs.aheadEnd = off
	}
	return gnet.None
}

// aheadSafe reports whether a frame may be handled before the publish in
// front of it: it must not depend on it, and must be taken whole or not
// at all (a settle of one part).
func aheadSafe(hd wire.Header, body []byte) bool {
	switch hd.Type {
	case wire.TypeCredit, wire.TypeHeartbeat:
		return true
	case wire.TypeAccept, wire.TypeRelease, wire.TypeReject:
		var m wire.Settle
		return wire.DecodeSettle(body, &m) == nil && m.Tags.Len() <= shards.RangesInline
	}
	return false
}

// skipAhead reports whether the frame at off was handled ahead of a
// parked publish, and forgets it. The main loop asks in increasing
// order of off.
func (cs *connState) skipAhead(off int) bool {
	for len(cs.ahead) > 0 && cs.ahead[0] < off {
		cs.ahead = cs.ahead[1:] // not at a frame boundary of these bytes: cannot be
	}
	if len(cs.ahead) == 0 || cs.ahead[0] != off {
		return false
	}
	cs.ahead = cs.ahead[1:]
	if len(cs.ahead) == 0 {
		cs.ahead = nil
	}
	return true
}

// rebaseAhead makes the offsets of frames handled ahead relative to the
// inbound bytes left once the first consumed are discarded.
func (cs *connState) rebaseAhead(consumed int) {
	if consumed == 0 || (len(cs.ahead) == 0 && cs.aheadEnd == 0) {
		return
	}
	keep := cs.ahead[:0]
	for _, off := range cs.ahead {
		if off >= consumed {
			keep = append(keep, off-consumed)
		}
	}
	cs.ahead = keep
	cs.aheadEnd = max(cs.aheadEnd-consumed, 0)
}

func (h *handler) writeOut(cs *connState) {
	cs.flushRanges()
	if len(cs.out) > 0 {
		cs.t.writeOwned(cs.out)
		cs.out = cs.out[:0]
	}
}

// frame handles one frame. done is false when a full ring stopped it
// part-way; cs.resume then says how far it got.
func (h *handler) frame(cs *connState, hd wire.Header, body []byte) (done bool, act gnet.Action) {
	if cs.sess == nil {
		return true, h.preSession(cs, hd, body) // HELLO and the login (login.go)
	}
	if hd.Version.Minor() > cs.version.Minor() {
		return true, gnet.None // a newer minor version: skip it by its size
	}
	ss := cs.ss
	switch hd.Type {
	case wire.TypePublish:
		return h.publish(cs, hd.Flags, body)
	case wire.TypeAccept, wire.TypeRelease, wire.TypeReject:
		var m wire.Settle
		if err := wire.DecodeSettle(body, &m); err != nil {
			return true, cs.protocolError(wire.CodeMalformed, hd.Type.String()+": "+err.Error())
		}
		return ss.Settle(m.CommandID, m.ConsumerID, settleOp(hd.Type), m.Tags, body), gnet.None
	case wire.TypeCredit:
		var m wire.Credit
		if err := wire.DecodeCredit(body, &m); err != nil {
			return true, cs.protocolError(wire.CodeMalformed, "CREDIT: "+err.Error())
		}
		return ss.Credit(m.ConsumerID, m.Credit, body), gnet.None
	case wire.TypeSubscribe:
		var m wire.Subscribe
		if err := wire.DecodeSubscribe(body, &m); err != nil {
			return true, cs.protocolError(wire.CodeMalformed, "SUBSCRIBE: "+err.Error())
		}
		return ss.Subscribe(subscribeOf(&m), body), gnet.None
	case wire.TypeCancel:
		var m wire.Cancel
		if err := wire.DecodeCancel(body, &m); err != nil {
			return true, cs.protocolError(wire.CodeMalformed, "CANCEL: "+err.Error())
		}
		return ss.Cancel(m.CommandID, m.ConsumerID, body), gnet.None
	case wire.TypeHeartbeat:
		return true, gnet.None
	case wire.TypeClose:
		var m wire.Close
		_ = wire.DecodeClose(body, &m)
		cs.flushRanges()
		cs.out = wire.AppendClose(cs.out, cs.version, wire.CodeOK, "bye")
		cs.closing.Store(true)
		return true, gnet.Close
	case wire.TypeDeclareQueue, wire.TypeDeclareExchange, wire.TypeBind, wire.TypeUnbind, wire.TypeDelete, wire.TypePurge:
		return true, h.management(cs, hd.Type, body)
	case wire.TypeHello:
		return true, cs.protocolError(wire.CodeUnexpected, "HELLO twice")
	}
	return true, cs.protocolError(wire.CodeMalformed, "unknown frame type "+hd.Type.String())
}

func (h *handler) hello(cs *connState, body []byte) gnet.Action {
	var m wire.Hello
	if err := wire.DecodeHello(body, &m); err != nil {
		return cs.protocolError(wire.CodeMalformed, "HELLO: "+err.Error())
	}
	v, ok := wire.Negotiate(m.Versions)
	if !ok {
		return cs.protocolError(wire.CodeVersion, "no common protocol version; this server speaks "+wire.Current.String())
	}
	cfg := &h.s.cfg
	frameMax := cfg.FrameSizeMax
	if m.FrameSizeMax != 0 && m.FrameSizeMax < frameMax {
		frameMax = max(m.FrameSizeMax, wire.FrameSizeMin)
	}
	hb := cfg.heartbeatMs()
	if m.HeartbeatMs != 0 {
		hb = max(m.HeartbeatMs, 10)
	}
	cs.login.version, cs.login.frameMax, cs.login.heartbeatMs = v, frameMax, hb
	return h.authenticate(cs, m.Mechanism, m.Auth)
}

// subscribeOf is m as the session takes it.
func subscribeOf(m *wire.Subscribe) *session.Subscribe {
	return &session.Subscribe{CommandID: m.CommandID, ConsumerID: m.ConsumerID, Queue: m.Queue,
		Credit: m.Credit, AckMode: m.AckMode, Exclusive: m.Flags&wire.SubscribeExclusive != 0}
}

func (h *handler) publish(cs *connState, flags uint8, body []byte) (bool, gnet.Action) {
	var p wire.Publish
	if flags != 0 && cs.version < wire.VersionProducer {
		return true, cs.protocolError(wire.CodeMalformed, "PUBLISH: flags need protocol "+wire.VersionProducer.String())
	}
	if err := wire.DecodePublishSession(body, flags, cs.version, &p); err != nil {
		return true, cs.protocolError(wire.CodeMalformed, "PUBLISH: "+err.Error())
	}
	ss := cs.ss
	defer ss.Flush()
	var m wire.PublishMessage
	msg := session.Message{Exchange: p.Exchange, Producer: p.Producer}
	for i := 0; p.Next(&m); i++ {
		if i < ss.Resume {
			continue
		}
		msg.ID = p.FirstID + uint64(i)
		msg.RoutingKey, msg.Props, msg.Payload = m.RoutingKey, m.Props, m.Payload
		msg.Persistent, msg.Priority = m.Flags&wire.MsgPersistent != 0, m.Priority
		msg.TTLMs, msg.DeliverAtMs = m.TTLMs, m.DeliverAtMs
		switch ss.Publish(&msg) {
		case session.Full:
			ss.Resume = i
			return false, gnet.None
		case session.Throttled:
			// Over its memory share: stop before this message, as on a
			// full ring, until the shard lets publishers in (park).
			ss.Resume = i
			h.park(cs, ss.ThrottledShard())
			return false, gnet.None
		}
	}
	return true, gnet.None
}
