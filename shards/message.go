package shards

import (
	"sync"
	"sync/atomic"
)

// Body is a message's immutable content, shared by every queue the message
// was routed to. It is copied once from the connection's read buffer into a
// pooled buffer, and goes back to the pool when its last reference is
// dropped. References are held by queue entries and by writes in flight.
type Body struct {
	refs       atomic.Int32
	buf        []byte
	Exchange   []byte // aliases buf
	RoutingKey []byte // aliases buf
	Props      []byte // aliases buf
	Payload    []byte // aliases buf
	Persistent bool
	// Priority is the message's priority (wire.MsgPriority); a queue
	// caps it at its MaxPriority. Set it before the body is shared.
	Priority uint8
	// DeliverAt is the unix time in nanoseconds before which the message
	// is not delivered; 0 delivers at once. Set it before the body is
	// shared.
	DeliverAt int64
}

// bodyBufMax is the largest buffer the pool keeps; bigger ones are left to
// the garbage collector so that one huge message does not pin memory.
const bodyBufMax = 256 << 10

var bodyPool = sync.Pool{New: func() any { return new(Body) }}

// NewBody copies the parts into a pooled Body with one reference.
func NewBody(exchange, key, props, payload []byte, persistent bool) *Body {
	b := bodyPool.Get().(*Body)
	b.fill(exchange, key, props, payload, persistent)
	return b
}

// NewBodyView is NewBody without the copy: the Body's parts alias the
// arguments, which must not change while it lives (a replicated queue's
// message aliases its event in the group log, so a member holds its bytes
// once). The Body has no buffer of its own; it goes back to the pool like
// any other.
func NewBodyView(exchange, key, props, payload []byte, persistent bool) *Body {
	b := bodyPool.Get().(*Body)
	b.buf = nil // what the pool kept is not needed, and would be held twice
	b.Exchange = exchange[:len(exchange):len(exchange)]
	b.RoutingKey = key[:len(key):len(key)]
	b.Props = props[:len(props):len(props)]
	b.Payload = payload[:len(payload):len(payload)]
	b.Persistent = persistent
	b.Priority, b.DeliverAt = 0, 0
	b.refs.Store(1)
	return b
}

// fill copies the parts into b's buffer (growing it if too small) and gives
// b one reference.
func (b *Body) fill(exchange, key, props, payload []byte, persistent bool) {
	n := len(exchange) + len(key) + len(props) + len(payload)
	if cap(b.buf) < n {
		b.buf = make([]byte, 0, n)
	}
	buf := b.buf[:0]
	buf = append(buf, exchange...)
	buf = append(buf, key...)
	buf = append(buf, props...)
	buf = append(buf, payload...)
	b.buf = buf
	o := 0
	b.Exchange = buf[o : o+len(exchange) : o+len(exchange)]
	o += len(exchange)
	b.RoutingKey = buf[o : o+len(key) : o+len(key)]
	o += len(key)
	b.Props = buf[o : o+len(props) : o+len(props)]
	o += len(props)
	b.Payload = buf[o : o+len(payload) : o+len(payload)]
	b.Persistent = persistent
	b.Priority, b.DeliverAt = 0, 0
	b.refs.Store(1)
}

// bodySlab hands out Bodies and their buffers carved from large blocks, for
// recovery, which creates a million bodies at once and would otherwise
// allocate two objects for each. A carved buffer's capacity is exactly its
// region, so a Body reused from the pool for a bigger message allocates its
// own instead of growing into a neighbour's.
type bodySlab struct {
	bodies []Body
	bytes  []byte
}

const (
	slabBodies = 1024
	slabBytes  = 1 << 20
	// slabPartMax: bigger messages get a buffer of their own.
	slabPartMax = 16 << 10
)

// newBody is NewBody from the slab.
func (s *bodySlab) newBody(exchange, key, props, payload []byte, persistent bool) *Body {
	if len(s.bodies) == 0 {
		s.bodies = make([]Body, slabBodies)
	}
	b := &s.bodies[0]
	s.bodies = s.bodies[1:]
	if n := len(exchange) + len(key) + len(props) + len(payload); n <= slabPartMax {
		if len(s.bytes) < n {
			s.bytes = make([]byte, slabBytes)
		}
		b.buf = s.bytes[:0:n]
		s.bytes = s.bytes[n:]
	}
	b.fill(exchange, key, props, payload, persistent)
	return b
}

// Ref adds a reference.
func (b *Body) Ref() { b.refs.Add(1) }

// Unref drops a reference, and returns the body to the pool with the last.
func (b *Body) Unref() {
	n := b.refs.Add(-1)
	if n > 0 {
		return
	}
	if n < 0 {
		panic("shards: body reference count below zero")
	}
	if cap(b.buf) > bodyBufMax {
		b.buf = nil
	}
	b.Exchange, b.RoutingKey, b.Props, b.Payload = nil, nil, nil, nil
	bodyPool.Put(b)
}

// Size is the number of content bytes, used for max-length-bytes.
func (b *Body) Size() int { return len(b.Payload) + len(b.Props) }
