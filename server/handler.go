package server

import (
	"context"
	"fmt"
	"math"
	"sync"
	"time"

	"github.com/panjf2000/gnet/v2"

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
	cs := &connState{s: h.s, t: t, tls: tls, consumers: map[uint32]int{}}
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
		for id, q := range cs.queueOf {
			h.s.forgetConsumer(q, consumerRef{cs: cs, id: id})
		}
		sess := cs.sess
		// A fan-out cut short by a full ring still reaches every target
		// (its other parts are in queues already), ahead of the close.
		var fan shards.Publish
		var rest []*shards.Queue
		if cs.fanPending {
			fan, rest = cs.fanCmd, append([]*shards.Queue(nil), cs.fanRest[cs.fanNext:]...)
			dropFanRest(cs)
		}
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
		cs.resume = 0
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
			saved := cs.resume
			cs.resume = 0
			done, act := h.frame(cs, hd, body)
			cs.resume = saved
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
	switch hd.Type {
	case wire.TypePublish:
		return h.publish(cs, hd.Flags, body)
	case wire.TypeAccept, wire.TypeRelease, wire.TypeReject:
		return h.settle(cs, hd.Type, body)
	case wire.TypeCredit:
		var m wire.Credit
		if err := wire.DecodeCredit(body, &m); err != nil {
			return true, cs.protocolError(wire.CodeMalformed, "CREDIT: "+err.Error())
		}
		shard, ok := cs.consumers[m.ConsumerID]
		if !ok {
			return true, gnet.None // credit for a cancelled consumer: harmless
		}
		if shard == proxyShard {
			h.s.proxyConsumerCommand(cs, m.ConsumerID, 0, hd.Type, body)
			return true, gnet.None
		}
		return h.push(cs, shard, shards.Credit{Sess: cs.sess, ConsumerID: m.ConsumerID, Credit: m.Credit}.Command()), gnet.None
	case wire.TypeSubscribe:
		return h.subscribe(cs, body)
	case wire.TypeCancel:
		var m wire.Cancel
		if err := wire.DecodeCancel(body, &m); err != nil {
			return true, cs.protocolError(wire.CodeMalformed, "CANCEL: "+err.Error())
		}
		shard, ok := cs.consumers[m.ConsumerID]
		if !ok {
			cs.fail(m.CommandID, wire.CodeNotFound, "no such consumer")
			return true, gnet.None
		}
		if shard == proxyShard {
			h.s.proxyConsumerCommand(cs, m.ConsumerID, m.CommandID, hd.Type, body)
			return true, gnet.None
		}
		// The id keeps its shard: deliveries made before the cancel can
		// still be settled.
		if !h.push(cs, shard, shards.Cancel{Sess: cs.sess, CmdID: m.CommandID, ConsumerID: m.ConsumerID}.Command()) {
			return false, gnet.None
		}
		if q := cs.queueOf[m.ConsumerID]; q != nil {
			delete(cs.queueOf, m.ConsumerID)
			h.s.forgetConsumer(q, consumerRef{cs: cs, id: m.ConsumerID})
		}
		return true, gnet.None
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

// push hands a command to a shard. A command the shard will complete
// counts against the session's window.
func (h *handler) push(cs *connState, shard int, cmd shards.Command) bool {
	if !h.s.broker.Shards()[shard].TryPush(cmd) {
		cs.stalledOn.Store(int32(shard) + 1)
		return false
	}
	if cmd.Completes() {
		cs.sess.Inflight.Add(1)
	}
	return true
}

// deliverAtMsMax is the latest deliver-at time that unix nanoseconds in
// an int64 hold.
const deliverAtMsMax = math.MaxInt64 / uint64(time.Millisecond)

func (h *handler) publish(cs *connState, flags uint8, body []byte) (bool, gnet.Action) {
	var p wire.Publish
	if flags != 0 && cs.version < wire.VersionProducer {
		return true, cs.protocolError(wire.CodeMalformed, "PUBLISH: flags need protocol "+wire.VersionProducer.String())
	}
	if err := wire.DecodePublishSession(body, flags, cs.version, &p); err != nil {
		return true, cs.protocolError(wire.CodeMalformed, "PUBLISH: "+err.Error())
	}
	routing := h.s.wiring.Routing()
	shardList := h.s.broker.Shards()
	now := time.Now().UnixNano()
	window := int64(h.s.cfg.WindowMax) - cs.sess.Inflight.Load()
	pushed := int64(0)
	defer func() { cs.sess.Inflight.Add(pushed) }()
	var m wire.PublishMessage
	for i := 0; p.Next(&m); i++ {
		if i < cs.resume {
			continue
		}
		if cs.fanPending {
			// i == cs.resume: the rest of a fan-out, before anything else.
			if !pushFanRest(cs, shardList) {
				return false, gnet.None
			}
			continue
		}
		id := p.FirstID + uint64(i)
		if !cs.canPublish(p.Exchange, m.RoutingKey, id) {
			continue
		}
		if pushed >= window {
			cs.fail(id, wire.CodeResourceLimit, "more uncompleted commands than the negotiated window")
			continue
		}
		targets, err := routing.Route(p.Exchange, m.RoutingKey, cs.targets[:0])
		cs.targets = targets[:0]
		if err != nil {
			cs.fail(id, wire.CodeNotFound, "no exchange "+string(p.Exchange))
			continue
		}
		if len(targets) == 0 {
			if len(p.Exchange) == 0 {
				cs.fail(id, wire.CodeNotFound, "no queue "+string(m.RoutingKey))
			} else {
				h.s.metrics.unroutable.Inc()
				cs.complete(id)
			}
			continue
		}
		if sh := throttledTarget(shardList, targets); sh != nil {
			// Over its memory share: stop before this message, as on a
			// full ring, until the shard lets publishers in (park).
			cs.resume = i
			h.park(cs, sh)
			return false, gnet.None
		}
		if m.DeliverAtMs > deliverAtMsMax {
			cs.fail(id, wire.CodeInvalid, "deliver_at_ms beyond the year 2262")
			continue
		}
		persistent := m.Flags&wire.MsgPersistent != 0
		b := shards.NewBody(p.Exchange, m.RoutingKey, m.Props, m.Payload, persistent)
		b.Priority, b.DeliverAt = m.Priority, int64(m.DeliverAtMs)*int64(time.Millisecond)
		cmd := shards.Publish{Sess: cs.sess, CmdID: id, Body: b, Now: now, TTLNanos: int64(m.TTLMs) * int64(time.Millisecond), Producer: p.Producer}
		if len(targets) > 1 {
			cmd.Fanout = shards.NewFanout(len(targets))
			for range targets[1:] {
				b.Ref()
			}
		}
		pushed++
		for j, q := range targets {
			cmd.Queue = q
			if shardList[q.Shard()].TryPush(cmd.Command()) {
				continue
			}
			cs.stalledOn.Store(int32(q.Shard()) + 1)
			cs.resume = i
			if j == 0 {
				// Nothing went out: stop here and retry this message
				// later (its fan-out, if any, is dropped unused).
				pushed--
				for range targets {
					b.Unref()
				}
				return false, gnet.None
			}
			// Part of a fan-out went out: stop reading, and push the rest
			// first when the loop comes back (pushFanRest), so that no
			// later message of this session overtakes it on any queue.
			cs.fanPending, cs.fanCmd, cs.fanNext = true, cmd, 0
			cs.fanRest = append(cs.fanRest[:0], targets[j:]...)
			return false, gnet.None
		}
	}
	return true, gnet.None
}

// throttledTarget returns the first shard of targets over its memory
// share, or nil.
func throttledTarget(shardList []*shards.Shard, targets []*shards.Queue) *shards.Shard {
	for _, q := range targets {
		if sh := shardList[q.Shard()]; sh.Throttled() {
			return sh
		}
	}
	return nil
}

// pushFanRest pushes the pending rest of a fan-out publish. It reports
// whether all of it went out.
func pushFanRest(cs *connState, shardList []*shards.Shard) bool {
	for ; cs.fanNext < len(cs.fanRest); cs.fanNext++ {
		p := cs.fanCmd
		p.Queue = cs.fanRest[cs.fanNext]
		if !shardList[p.Queue.Shard()].TryPush(p.Command()) {
			cs.stalledOn.Store(int32(p.Queue.Shard()) + 1)
			return false
		}
	}
	dropFanRest(cs)
	return true
}

func dropFanRest(cs *connState) {
	clear(cs.fanRest)
	cs.fanPending, cs.fanCmd, cs.fanRest, cs.fanNext = false, shards.Publish{}, cs.fanRest[:0], 0
}

func (h *handler) subscribe(cs *connState, body []byte) (bool, gnet.Action) {
	var m wire.Subscribe
	if err := wire.DecodeSubscribe(body, &m); err != nil {
		return true, cs.protocolError(wire.CodeMalformed, "SUBSCRIBE: "+err.Error())
	}
	if cs.usedIDs.has(m.ConsumerID) {
		cs.fail(m.CommandID, wire.CodeInvalid, "consumer id already used in this session")
		return true, gnet.None
	}
	if !cs.usedIDs.canAdd(m.ConsumerID) {
		cs.fail(m.CommandID, wire.CodeResourceLimit, fmt.Sprintf("this session used consumer ids in %d separate runs; number them upwards", idRangesMax))
		return true, gnet.None
	}
	if m.AckMode > wire.AckNone {
		cs.fail(m.CommandID, wire.CodeInvalid, "unknown ack mode")
		return true, gnet.None
	}
	if !cs.allowed(permRead, "queue", m.Queue, m.CommandID) {
		return true, gnet.None
	}
	q := h.s.wiring.Routing().Queue(m.Queue)
	if q == nil {
		cs.fail(m.CommandID, wire.CodeNotFound, "no queue "+string(m.Queue))
		return true, gnet.None
	}
	if g, master, addr, where := h.s.proxyTarget(q); where != "" {
		cs.fail(m.CommandID, wire.CodeUnavailable, where)
		return true, gnet.None
	} else if master != 0 {
		// Another broker masters the queue's group: consume there
		// through this one (proxy.go).
		h.s.proxySubscribe(cs, g, master, addr, &m, body)
		cs.usedIDs.add(m.ConsumerID)
		cs.consumers[m.ConsumerID] = proxyShard
		return true, gnet.None
	}
	cmd := shards.Subscribe{Sess: cs.sess, CmdID: m.CommandID, Queue: q, ConsumerID: m.ConsumerID,
		Credit: m.Credit, AckMode: m.AckMode, Exclusive: m.Flags&wire.SubscribeExclusive != 0}
	if !h.push(cs, q.Shard(), cmd.Command()) {
		return false, gnet.None
	}
	cs.usedIDs.add(m.ConsumerID)
	cs.consumers[m.ConsumerID] = q.Shard()
	if cs.queueOf == nil {
		cs.queueOf = map[uint32]*shards.Queue{}
	}
	cs.queueOf[m.ConsumerID] = q
	h.s.noteConsumer(q, consumerRef{cs: cs, id: m.ConsumerID})
	return true, gnet.None
}

func (h *handler) settle(cs *connState, t wire.Type, body []byte) (bool, gnet.Action) {
	var m wire.Settle
	if err := wire.DecodeSettle(body, &m); err != nil {
		return true, cs.protocolError(wire.CodeMalformed, t.String()+": "+err.Error())
	}
	shard, ok := cs.consumers[m.ConsumerID]
	if !ok {
		cs.fail(m.CommandID, wire.CodeNotFound, "no such consumer")
		return true, gnet.None
	}
	if shard == proxyShard {
		h.s.proxyConsumerCommand(cs, m.ConsumerID, m.CommandID, t, body)
		return true, gnet.None
	}
	kind := shards.SettleAccept
	switch t {
	case wire.TypeRelease:
		kind = shards.SettleRelease
	case wire.TypeReject:
		kind = shards.SettleReject
	}
	n := m.Tags.Len()
	if n == 0 {
		cs.complete(m.CommandID)
		return true, gnet.None
	}
	// Each Settle carries a few ranges; the last part completes.
	parts := (n + shards.RangesInline - 1) / shards.RangesInline
	for part := cs.resume; part < parts; part++ {
		cmd := shards.Settle{Sess: cs.sess, CmdID: m.CommandID, ConsumerID: m.ConsumerID, Kind: kind}
		for k := 0; k < shards.RangesInline; k++ {
			r := part*shards.RangesInline + k
			if r >= n {
				break
			}
			cmd.Ranges[k] = m.Tags.At(r)
			cmd.NRanges++
		}
		cmd.Last = part == parts-1
		if !h.push(cs, shard, cmd.Command()) {
			cs.resume = part
			return false, gnet.None
		}
	}
	return true, gnet.None
}
