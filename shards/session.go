package shards

import (
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/berthmq/berth/wire"
)

// Writer sends bytes on a session's connection. WriteAsync queues bufs to
// be written in order and calls done once they are written or dropped; it is
// safe from any goroutine and never blocks. The bufs stay untouched by the
// caller until done runs. It either returns nil and calls done exactly
// once, or returns an error and never calls done: the caller then takes
// the bufs back at once (a batch released twice would be handed to two
// writes at once, each sending the other's frames).
type Writer interface {
	WriteAsync(bufs [][]byte, done func()) error
}

// Session is a client session as the shards see it. The server creates it
// at HELLO and tells every shard when it closes.
type Session struct {
	ID       uint64
	Version  wire.Version
	FrameMax uint32
	Out      Writer
	// Encoder writes what the shards send the session in its client
	// protocol; nil is the native wire format in Version (NativeEncoder).
	// Set it before the session is handed to the shards; it never changes
	// after.
	Encoder Encoder
	closed  atomic.Bool

	// Inflight counts commands sent to shards and not yet completed; the
	// server bounds it by the negotiated window. The loop adds once per
	// frame and each shard subtracts once per flush, so the shared counter
	// costs two atomics per batch, not per message.
	Inflight atomic.Int64

	// OutMax caps the bytes waiting to be written to the session's
	// connection (0: no cap). Past it the shards stop handing messages
	// to the session's consumers: a queue gives them to its other
	// consumers, and keeps them for these until the server resumes the
	// session (Resume, once the connection drained).
	OutMax int64
	// OutBuffered is what the connection holds that the kernel has not
	// taken: the server stores it from the connection's owner each time
	// a batch is written (gnet's outbound buffer) or queued (the TLS
	// writer's queue). The shards read it once per delivery: a plain load,
	// and no shared counter written per message or batch.
	OutBuffered atomic.Int64
	// stalledSince is when a shard first held a delivery back because the
	// session was over OutMax (unix nanoseconds, the shard's clock), or 0.
	stalledSince atomic.Int64
	// OnStall, if set, runs on the shard goroutine when a shard holds a
	// delivery back and the session was not stalled yet: once per stall,
	// not per message. It must not block (the server notes the session
	// for a quick check of its connection).
	OnStall func()
	// OnConsumerGone, if set, runs on a shard goroutine when the shard
	// forgets one of the session's consumers for good: its SUBSCRIBE
	// failed, or it was cancelled and has nothing left to settle.
	// Settles of it then fail not-found. It must not block (the server
	// drops its own record of the consumer). The consumers of a deleted
	// queue go without it: the server learns of them from the deletion.
	OnConsumerGone func(id uint32)
}

// consumerGone tells the session's owner that the shard forgot consumer
// id (Session.OnConsumerGone).
func (s *Session) consumerGone(id uint32) {
	if f := s.OnConsumerGone; f != nil {
		f(id)
	}
}

// OutPending is the bytes waiting to be written to the session's
// connection, as the server last saw them.
func (s *Session) OutPending() int64 { return s.OutBuffered.Load() }

// overOut reports whether the session is over its cap of pending bytes,
// counting extra bytes the shard gathered for it this cycle, and notes
// since when a delivery was held back for it.
func (s *Session) overOut(now, extra int64) bool {
	if s == nil || s.OutMax == 0 || extra+s.OutPending() <= s.OutMax {
		return false
	}
	if s.stalledSince.Load() == 0 {
		s.stalledSince.Store(now)
		if s.OnStall != nil {
			s.OnStall()
		}
	}
	return true
}

// StalledSince is when a shard first held back a delivery to the session
// because it was over OutMax (unix nanoseconds), or 0.
func (s *Session) StalledSince() int64 { return s.stalledSince.Load() }

// ClearStalled forgets that deliveries were held back; the server calls
// it, once the connection is back under its cap, before it pushes
// a Resume to the shards of the session's consumers.
func (s *Session) ClearStalled() { s.stalledSince.Store(0) }

// Closed reports whether the session has ended.
func (s *Session) Closed() bool { return s.closed.Load() }

// MarkClosed records that the session ended.
func (s *Session) MarkClosed() { s.closed.Store(true) }

// Error is a failure reported to a client with a wire error code.
type Error struct {
	Code wire.ErrorCode
	Text string
}

func (e *Error) Error() string { return "shards: " + e.Text }

// Errorf builds an *Error.
func Errorf(code wire.ErrorCode, format string, args ...any) *Error {
	return &Error{Code: code, Text: fmt.Sprintf(format, args...)}
}

// CodeOf maps an error to the wire code a client gets for it.
func CodeOf(err error) wire.ErrorCode {
	switch e := err.(type) {
	case *Error:
		return e.Code
	}
	switch err {
	case ErrQueueFull:
		return wire.CodeResourceLimit
	case ErrNoExchange, ErrNoSuchMessage:
		return wire.CodeNotFound
	}
	return wire.CodeInternal
}

// sessOut gathers what one shard sends one session during one cycle, so it
// goes out as the completions, any errors and the deliveries of each
// consumer, in the session's protocol (Encoder), in a single writev.
type sessOut struct {
	sess      *Session
	ranges    []wire.Range
	errs      []byte // encoded by the session's Encoder as the commands failed
	consumers []*Consumer
	queued    bool
	done      int64 // commands completed or failed this cycle
}

func (o *sessOut) complete(id uint64) { o.ranges = wire.AddID(o.ranges, id) }

func (o *sessOut) fail(id uint64, code wire.ErrorCode, text string) {
	o.errs = o.sess.appendError(o.errs, id, code, text)
}

// outBatch is one writev in flight: its buffer and payloads (Frames, which
// the session's Encoder fills), the vector that points into the buffer and
// at the payloads, and the bodies to release when the write is done.
// Batches are pooled.
type outBatch struct {
	Frames
	vec    [][]byte
	bodies []*Body
	done   func()
	// pooled: in the pool, not in use. A second release of a batch
	// (a Writer that broke its contract) is then ignored rather than
	// handing the batch to two writes at once.
	pooled bool
}

var outBatchPool sync.Pool

func getOutBatch() *outBatch {
	if v := outBatchPool.Get(); v != nil {
		ob := v.(*outBatch)
		ob.pooled = false
		return ob
	}
	ob := &outBatch{}
	ob.done = ob.release
	return ob
}

func (ob *outBatch) release() {
	if ob.pooled {
		return
	}
	ob.pooled = true
	for i, b := range ob.bodies {
		b.Unref()
		ob.bodies[i] = nil
	}
	for i := range ob.vec {
		ob.vec[i] = nil
	}
	for i := range ob.pays {
		ob.pays[i] = nil
	}
	ob.Buf, ob.vec, ob.cuts, ob.pays, ob.bodies = ob.Buf[:0], ob.vec[:0], ob.cuts[:0], ob.pays[:0], ob.bodies[:0]
	if cap(ob.Buf) > 4<<20 {
		ob.Buf = nil
	}
	outBatchPool.Put(ob)
}

// build turns the buffer and the payload cuts into the write vector.
func (ob *outBatch) build() {
	prev := 0
	for i, cut := range ob.cuts {
		if cut > prev {
			ob.vec = append(ob.vec, ob.Buf[prev:cut])
		}
		if len(ob.pays[i]) > 0 {
			ob.vec = append(ob.vec, ob.pays[i])
		}
		prev = cut
	}
	if len(ob.Buf) > prev {
		ob.vec = append(ob.vec, ob.Buf[prev:])
	}
}
