package session

import (
	"math"
	"time"

	"github.com/berthmq/berth/shards"
	"github.com/berthmq/berth/wire"
)

// Message is one published message.
type Message struct {
	ID         uint64 // its command id
	Exchange   []byte
	RoutingKey []byte
	Props      []byte // opaque to the broker; handed to consumers unchanged
	Payload    []byte
	Persistent bool
	Priority   uint8
	TTLMs      uint64 // 0: none
	// DeliverAtMs is the unix time in milliseconds before which the
	// message is not delivered; 0 for none.
	DeliverAtMs uint64
	Producer    uint64 // the producer id (dedup), 0 for none
}

// Status is how far a publish got.
type Status uint8

const (
	// Done: the message went to its queues or was answered.
	Done Status = iota
	// Full: a shard's ring was full; call again with the same message.
	Full
	// Throttled: a target shard is over its memory share (Throttled
	// says which); call again with the same message once it lets
	// publishers in.
	Throttled
)

// publishState is a session's publishing between two Flushes.
type publishState struct {
	// The window left at the first publish since the last Flush, and
	// what was pushed since: Inflight is added to once per Flush.
	window, pushed int64
	windowed       bool
	now            int64 // the broker's clock, read once per Flush
	// A fan-out publish that reached some of its targets when a ring was
	// full: fanCmd goes to fanRest[fanNext:] before anything after it, so
	// per-queue order holds.
	fanPending bool
	fanCmd     shards.Publish
	fanRest    []*shards.Queue
	fanNext    int
	targets    []*shards.Queue
	throttled  *shards.Shard
}

// deliverAtMsMax is the latest deliver-at time that unix nanoseconds in
// an int64 hold.
const deliverAtMsMax = math.MaxInt64 / uint64(time.Millisecond)

// Publish routes m and hands it to its queues' shards. A message that
// cannot go (no permission, no exchange, the window full …) is failed
// through Replies and reported Done. After Full or Throttled the codec
// calls again with the same message; call Flush at the end of each batch
// of publishes the codec takes at once.
func (s *Session) Publish(m *Message) Status {
	p := &s.pub
	if p.fanPending {
		// The rest of a fan-out, before anything else.
		if !s.pushFanRest() {
			return Full
		}
		return Done
	}
	if !p.windowed {
		p.window = s.cfg.WindowMax - s.Sess.Inflight.Load()
		p.now = time.Now().UnixNano()
		p.windowed = true
	}
	rep := s.cfg.Replies
	id := m.ID
	if g := s.cfg.Guard; g != nil && !g.CanPublish(m.Exchange, m.RoutingKey, id) {
		return Done
	}
	if p.pushed >= p.window {
		rep.Fail(id, wire.CodeResourceLimit, "more uncompleted commands than the negotiated window")
		return Done
	}
	targets, err := s.cfg.Routing().Route(m.Exchange, m.RoutingKey, p.targets[:0])
	p.targets = targets[:0]
	if err != nil {
		rep.Fail(id, wire.CodeNotFound, "no exchange "+string(m.Exchange))
		return Done
	}
	if len(targets) == 0 {
		if len(m.Exchange) == 0 {
			rep.Fail(id, wire.CodeNotFound, "no queue "+string(m.RoutingKey))
		} else {
			if f := s.cfg.Unroutable; f != nil {
				f()
			}
			rep.Complete(id)
		}
		return Done
	}
	shardList := s.cfg.Broker.Shards()
	for _, q := range targets {
		if sh := shardList[q.Shard()]; sh.Throttled() {
			// Over its memory share: stop before this message, as on a
			// full ring, until the shard lets publishers in.
			p.throttled = sh
			return Throttled
		}
	}
	if m.DeliverAtMs > deliverAtMsMax {
		rep.Fail(id, wire.CodeInvalid, "deliver_at_ms beyond the year 2262")
		return Done
	}
	b := shards.NewBody(m.Exchange, m.RoutingKey, m.Props, m.Payload, m.Persistent)
	b.Priority, b.DeliverAt = m.Priority, int64(m.DeliverAtMs)*int64(time.Millisecond)
	cmd := shards.Publish{Sess: s.Sess, CmdID: id, Body: b, Now: p.now, TTLNanos: int64(m.TTLMs) * int64(time.Millisecond), Producer: m.Producer}
	if len(targets) > 1 {
		cmd.Fanout = shards.NewFanout(len(targets))
		for range targets[1:] {
			b.Ref()
		}
	}
	p.pushed++
	for j, q := range targets {
		cmd.Queue = q
		if s.cfg.Push.Push(q.Shard(), cmd.Command()) {
			continue
		}
		if j == 0 {
			// Nothing went out: retry this message later (its fan-out,
			// if any, is dropped unused).
			p.pushed--
			for range targets {
				b.Unref()
			}
			return Full
		}
		// Part of a fan-out went out: push the rest first when the
		// codec comes back (pushFanRest), so that no later message of
		// this session overtakes it on any queue.
		p.fanPending, p.fanCmd, p.fanNext = true, cmd, 0
		p.fanRest = append(p.fanRest[:0], targets[j:]...)
		return Full
	}
	return Done
}

// ThrottledShard is the shard whose memory share stopped the last
// publish (Throttled).
func (s *Session) ThrottledShard() *shards.Shard { return s.pub.throttled }

// Flush ends a batch of publishes: what they pushed counts against the
// session's window from now on.
func (s *Session) Flush() {
	p := &s.pub
	if p.pushed != 0 {
		s.Sess.Inflight.Add(p.pushed)
	}
	p.pushed, p.windowed, p.throttled = 0, false, nil
}

// pushFanRest pushes the pending rest of a fan-out publish. It reports
// whether all of it went out.
func (s *Session) pushFanRest() bool {
	p := &s.pub
	for ; p.fanNext < len(p.fanRest); p.fanNext++ {
		c := p.fanCmd
		c.Queue = p.fanRest[p.fanNext]
		if !s.cfg.Push.Push(c.Queue.Shard(), c.Command()) {
			return false
		}
	}
	s.DropFanRest()
	return true
}

// DropFanRest forgets a pending fan-out (the session ends).
func (s *Session) DropFanRest() {
	p := &s.pub
	clear(p.fanRest)
	p.fanPending, p.fanCmd, p.fanRest, p.fanNext = false, shards.Publish{}, p.fanRest[:0], 0
}

// PushFanRest pushes the rest of a fan-out cut short by a full ring, if
// any, and reports whether none is left.
func (s *Session) PushFanRest() bool {
	if !s.pub.fanPending {
		return true
	}
	return s.pushFanRest()
}

// TakeFanRest takes the rest of a fan-out cut short by a full ring, for
// the caller to push (the session ends): the command and the queues it
// did not reach yet. rest is nil when there is none.
func (s *Session) TakeFanRest() (cmd shards.Publish, rest []*shards.Queue) {
	p := &s.pub
	if !p.fanPending {
		return shards.Publish{}, nil
	}
	cmd, rest = p.fanCmd, append([]*shards.Queue(nil), p.fanRest[p.fanNext:]...)
	s.DropFanRest()
	return cmd, rest
}
