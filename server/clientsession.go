package server

// A client connection's session (server/session) is served through the
// methods below: connState answers in the native codec, pushes to shard
// rings without waiting (a full ring stops the connection's owner, which
// tries again when there is room), checks the user's permissions, and
// proxies a consumer of a queue another broker masters (proxy.go).

import (
	"github.com/berthmq/berth/server/session"
	"github.com/berthmq/berth/shards"
	"github.com/berthmq/berth/wire"
)

// newSession makes the session of cs, just logged in with sess.
func (s *Server) newSession(cs *connState, sess *shards.Session) *session.Session {
	return session.New(sess, session.Config{
		Broker:     s.broker,
		Routing:    s.wiring.Routing,
		Push:       cs,
		Replies:    cs,
		Guard:      cs,
		Resolve:    cs,
		Remote:     cs,
		Reg:        cs,
		WindowMax:  int64(s.cfg.WindowMax),
		Unroutable: func() { s.metrics.unroutable.Inc() },
	})
}

// Push is session.Pusher: a full ring stops the owner, and notes the
// shard, on whose ring a TLS reader waits for room (tls.go).
func (cs *connState) Push(shard int, cmd shards.Command) bool {
	if !cs.s.broker.Shards()[shard].TryPush(cmd) {
		cs.stalledOn.Store(int32(shard) + 1)
		return false
	}
	return true
}

// Complete and Fail are session.Replies.
func (cs *connState) Complete(id uint64) { cs.complete(id) }

func (cs *connState) Fail(id uint64, code wire.ErrorCode, text string) { cs.fail(id, code, text) }

// CanPublish and CanConsume are session.Guard (authz.go).
func (cs *connState) CanPublish(exchange, routingKey []byte, id uint64) bool {
	return cs.canPublish(exchange, routingKey, id)
}

func (cs *connState) CanConsume(queue []byte, id uint64) bool {
	return cs.allowed(permRead, "queue", queue, id)
}

// SubscribeQueue is session.Resolver: the queue if this broker serves
// its consumers, remote if its group's master is another broker (noted
// in cs.proxyTo for Subscribe).
func (cs *connState) SubscribeQueue(name []byte, cmdID uint64) (*shards.Queue, bool) {
	q := cs.s.wiring.Routing().Queue(name)
	if q == nil {
		cs.fail(cmdID, wire.CodeNotFound, "no queue "+string(name))
		return nil, false
	}
	g, master, addr, where := cs.s.proxyTarget(q)
	if where != "" {
		cs.fail(cmdID, wire.CodeUnavailable, where)
		return nil, false
	}
	if master != 0 {
		cs.proxyTo.g, cs.proxyTo.master, cs.proxyTo.addr = g, master, addr
		return nil, true
	}
	return q, false
}

// Subscribe, Credit, Cancel and Settle are session.Remote: the proxy to
// the queue's master (proxy.go), which takes the native frames' bodies;
// a command from another codec is encoded here.
func (cs *connState) Subscribe(m *session.Subscribe, raw []byte) {
	if raw == nil {
		var flags uint8
		if m.Exclusive {
			flags = wire.SubscribeExclusive
		}
		raw = nativeBody(wire.AppendSubscribe(nil, cs.version, &wire.Subscribe{CommandID: m.CommandID, ConsumerID: m.ConsumerID,
			Queue: m.Queue, Credit: m.Credit, AckMode: m.AckMode, Flags: flags}))
	}
	p := cs.proxyTo
	cs.s.proxySubscribe(cs, p.g, p.master, p.addr, m.CommandID, m.ConsumerID, raw)
}

func (cs *connState) Credit(consumer, credit uint32, raw []byte) {
	if raw == nil {
		raw = nativeBody(wire.AppendCredit(nil, cs.version, consumer, credit))
	}
	cs.s.proxyConsumerCommand(cs, consumer, 0, wire.TypeCredit, raw)
}

func (cs *connState) Cancel(cmdID uint64, consumer uint32, raw []byte) {
	if raw == nil {
		raw = nativeBody(wire.AppendCancel(nil, cs.version, cmdID, consumer))
	}
	cs.s.proxyConsumerCommand(cs, consumer, cmdID, wire.TypeCancel, raw)
}

func (cs *connState) Settle(cmdID uint64, consumer uint32, op session.Op, tags session.Tags, raw []byte) {
	t := settleType(op)
	if raw == nil {
		ranges := make([]wire.Range, tags.Len())
		for i := range ranges {
			ranges[i] = tags.At(i)
		}
		raw = nativeBody(wire.AppendSettle(nil, cs.version, t, cmdID, consumer, ranges))
	}
	cs.s.proxyConsumerCommand(cs, consumer, cmdID, t, raw)
}

// nativeBody is the body of the native frame f.
func nativeBody(f []byte) []byte { return f[wire.HeaderSize:] }

// NoteConsumer and ForgetConsumer are session.Registry
// (consumerend.go).
func (cs *connState) NoteConsumer(q *shards.Queue, id uint32) {
	cs.s.noteConsumer(q, consumerRef{cs: cs, id: id})
}

func (cs *connState) ForgetConsumer(q *shards.Queue, id uint32) {
	cs.s.forgetConsumer(q, consumerRef{cs: cs, id: id})
}

// settleOp is the session's op of a native settle frame (ACCEPT, RELEASE
// or REJECT), and settleType the frame of a settle op.
func settleOp(t wire.Type) session.Op {
	switch t {
	case wire.TypeRelease:
		return session.OpRelease
	case wire.TypeReject:
		return session.OpReject
	}
	return session.OpAccept
}

func settleType(op session.Op) wire.Type {
	switch op {
	case session.OpRelease:
		return wire.TypeRelease
	case session.OpReject:
		return wire.TypeReject
	}
	return wire.TypeAccept
}
