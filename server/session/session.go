// Package session is the client-protocol session, apart from any frame
// codec and transport: the command ids a session completes or fails, its
// publishes and their routing, its consumers (which shard or which other
// broker serves each), their credit and settles. A codec (the native one
// in server/handler.go; a second protocol later) decodes its frames into
// the calls below and encodes the session's answers (Replies); shards
// write what they send the session through its shards.Session, in the
// codec's frames (shards.Session.Encoder; nil for the native one). A
// consumer proxied from a peer broker is served on the master by a
// Session of the same kind (server/proxy.go), so that both go through one
// dispatcher.
//
// A Session belongs to one goroutine at a time (a connection's owner, or
// the reader of a peer connection): nothing in it is locked.
package session

import (
	"github.com/berthmq/berth/server/wiring"
	"github.com/berthmq/berth/shards"
	"github.com/berthmq/berth/wire"
)

// Replies is how a session answers a command itself, rather than
// through a shard: in the session's codec.
type Replies interface {
	// Complete tells the client that command id succeeded.
	Complete(id uint64)
	// Fail tells the client that command id failed.
	Fail(id uint64, code wire.ErrorCode, text string)
}

// Pusher hands a command to shard i. It reports false when the shard's
// ring is full and it did not wait: the session then stops where it is
// (see Session.Resume), and the codec calls again with the same command
// once there is room. A pusher that waits for room always reports true.
type Pusher interface {
	Push(shard int, cmd shards.Command) bool
}

// Guard checks a session's permissions; it answers a refused command
// itself (Replies.Fail) and reports false.
type Guard interface {
	CanPublish(exchange, routingKey []byte, id uint64) bool
	CanConsume(queue []byte, id uint64) bool
}

// Resolver finds the queue a SUBSCRIBE names. It returns the queue served
// here; or remote true when another broker serves it (the consumer is
// then proxied through Config.Remote); or neither, having answered the
// command (Replies.Fail) with why.
type Resolver interface {
	SubscribeQueue(name []byte, cmdID uint64) (q *shards.Queue, remote bool)
}

// Registry is told of the consumers served here, by queue, so that the
// broker can end them when their queue goes (server/consumerend.go).
type Registry interface {
	NoteConsumer(q *shards.Queue, id uint32)
	ForgetConsumer(q *shards.Queue, id uint32)
}

// Remote serves the consumers of this session that another broker
// serves (consumer proxying, server/proxy.go). raw is the command's frame
// body as the native codec received it, which the master takes unchanged;
// nil from another codec, and the Remote encodes the command itself.
type Remote interface {
	Subscribe(m *Subscribe, raw []byte)
	Credit(consumer, credit uint32, raw []byte)
	Cancel(cmdID uint64, consumer uint32, raw []byte)
	Settle(cmdID uint64, consumer uint32, op Op, tags Tags, raw []byte)
}

// Config is what a session is served with.
type Config struct {
	Broker  *shards.Broker
	Routing func() *wiring.Routing // the current routing snapshot
	Push    Pusher
	Replies Replies
	Guard   Guard    // nil: everything allowed
	Resolve Resolver // nil: the routing's queues
	Remote  Remote   // nil: no consumer is proxied
	Reg     Registry // nil: nobody is told
	// WindowMax bounds the session's commands in shards not yet
	// completed (the negotiated window).
	WindowMax int64
	// Unroutable, if set, counts a publish to an exchange that routed it
	// nowhere (completed, and dropped).
	Unroutable func()
}

// Session is one client-protocol session.
type Session struct {
	cfg  Config
	Sess *shards.Session // the shards' view: where they write to, and Inflight

	// Resume is how far the command at the head of the codec's input got
	// when a push stopped it (a message index of a batch, a part of a
	// settle): the codec calls again with the same command, and sets it
	// to 0 when it takes the next one.
	Resume int

	consumers map[uint32]int // consumer id -> shard, or remoteShard
	usedIDs   idSet          // consumer ids used in the session (never reused)
	// queueOf is the queue of each consumer served on this broker (not
	// proxied), as told to Registry.
	queueOf map[uint32]*shards.Queue

	pub publishState
}

// remoteShard marks, in Session.consumers, a consumer another broker
// serves (Config.Remote).
const remoteShard = -1

// New makes a session of sess with cfg.
func New(sess *shards.Session, cfg Config) *Session {
	return &Session{cfg: cfg, Sess: sess, consumers: map[uint32]int{}}
}

// push hands cmd to shard i through the session's Pusher; a command the
// shard will complete counts against the session's window.
func (s *Session) push(i int, cmd shards.Command) bool {
	if !s.cfg.Push.Push(i, cmd) {
		return false
	}
	if cmd.Completes() {
		s.Sess.Inflight.Add(1)
	}
	return true
}

// Op is a consumer command.
type Op uint8

const (
	OpCredit Op = iota
	OpCancel
	OpAccept
	OpRelease
	OpReject
)

func (o Op) settleKind() uint8 {
	switch o {
	case OpRelease:
		return shards.SettleRelease
	case OpReject:
		return shards.SettleReject
	}
	return shards.SettleAccept
}
