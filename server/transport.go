package server

import (
	"net"

	"github.com/panjf2000/gnet/v2"
)

// transport is what the frame handling needs of a client connection,
// whichever listener serves it: a gnet event loop (plaintext, gnetConn) or
// a reader goroutine per connection (TLS, tlsConn). The connection's
// state (connState) belongs to its owner: the loop, or the reader.
type transport interface {
	// WriteAsync queues a batch of whole frames from any goroutine; the
	// batch goes out in one piece, so frames of concurrent writers never
	// interleave. done runs once bufs are no longer needed. It is
	// shards.Writer.
	WriteAsync(bufs [][]byte, done func()) error
	// send queues one whole frame from any goroutine; with closeAfter the
	// connection closes once the frame is written.
	send(frame []byte, closeAfter bool) error
	// writeOwned writes frames from the connection's owner; b may be
	// reused once it returns.
	writeOwned(b []byte)
	// runOwned runs f where it may read the owner's state (the loop; for
	// TLS, between two rounds of frame handling), from any goroutine.
	runOwned(f func()) error
	// outBuffered is the bytes the transport holds that the kernel has
	// not taken; on the owner.
	outBuffered() int64
	// wake has the owner handle the frames it holds again.
	wake()
	// abort closes the connection at once, dropping what is unwritten.
	abort()
	RemoteAddr() net.Addr
}

// gnetConn serves a plaintext connection on a gnet loop.
type gnetConn struct{ c gnet.Conn }

// WriteAsync hands the batch to the connection's loop, which writes it in
// one writev; shards keep a batch under the kernel's IOV_MAX
// (shards.IovecsMax).
// Once the batch is written (or buffered), the session's OutBuffered
// takes the connection's outbound buffer, for the shards' cap.
//
// It never fails: gnet queues the write before it wakes the loop, and an
// error waking it comes back after the write was queued, whose callback
// (and so done) runs all the same; failing would have the caller release
// the bufs while the loop still writes them (shards.Writer).
func (g gnetConn) WriteAsync(bufs [][]byte, done func()) error {
	_ = g.c.AsyncWritev(bufs, func(c gnet.Conn, _ error) error {
		done()
		if cs, ok := c.Context().(*connState); ok && cs.sess != nil {
			cs.sess.OutBuffered.Store(int64(c.OutboundBuffered()))
		}
		return nil
	})
	return nil
}

func (g gnetConn) send(frame []byte, closeAfter bool) error {
	if !closeAfter {
		return g.c.AsyncWrite(frame, nil)
	}
	return g.c.AsyncWrite(frame, func(c gnet.Conn, _ error) error { return c.Close() })
}

func (g gnetConn) writeOwned(b []byte) { _, _ = g.c.Write(b) }

func (g gnetConn) runOwned(f func()) error {
	return g.c.AsyncWrite(nil, func(gnet.Conn, error) error { f(); return nil })
}

func (g gnetConn) outBuffered() int64 { return int64(g.c.OutboundBuffered()) }

func (g gnetConn) wake() { _ = g.c.Wake(nil) }

func (g gnetConn) abort() { _ = g.c.Close() }

func (g gnetConn) RemoteAddr() net.Addr { return g.c.RemoteAddr() }
