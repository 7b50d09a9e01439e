package groups

// Forwarding: a broker that takes a publish for a replicated queue whose
// group another broker masters sends the group event to that master over
// a forwarding connection on the master's peer port (wire TypeForward*),
// and completes the client's command with the master's answer. The
// master proposes the event as if its own client had published it, and
// answers once the event committed and applied, or with why not.
//
// One connection per master, dialled by the forwarding broker, carries
// forwards one way and results the other. Forwards are pipelined: at most
// forwardWindowMax wait for their result on a connection, and at most
// forwardBufMax bytes wait to be written. A forward that was written and
// whose connection then broke (the master died, or stopped answering for
// forwardStallMax) fails with a retryable error: its outcome is unknown,
// the event may have committed.
//
// The same connection carries proxied consumer sessions (wire
// TypeProxy*): the forwarding side passes client consumer commands on
// (SendProxy) and hands what comes back to SetProxy's output function;
// the master's side runs them through its ProxyHandler.

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/berthmq/berth/internal/peerauth"
	"github.com/berthmq/berth/wire"
)

const (
	// forwardWindowMax bounds the forwards waiting for their result on
	// one connection.
	forwardWindowMax = 1 << 14
	// forwardBufMax bounds the bytes of forwards not written yet to one
	// master.
	forwardBufMax = 32 << 20
	// forwardStallMax is how long forwards may wait with no result at all
	// before the connection is dropped and they fail.
	forwardStallMax = 5 * time.Second
	// forwardRedialMin is how long forwards to a master whose dial failed
	// are refused before the next dial.
	forwardRedialMin = 100 * time.Millisecond
	// proxySessionsMax bounds the proxied sessions open on one forwarding
	// connection.
	proxySessionsMax = 1 << 14
)

// ErrForwardBusy is returned when a master's forwarding window or buffer
// is full.
var ErrForwardBusy = errors.New("groups: too many forwards waiting for the group's master; retry")

// ForwardLostError is the outcome of a forward whose connection to the
// master broke, or that the master could not be reached for: the event may
// or may not have committed.
type ForwardLostError struct {
	Master uint32
	Err    error
	// NotSent: the forward was never written to a connection (the dial
	// failed), so the master never saw it.
	NotSent bool
}

func (e *ForwardLostError) Error() string {
	return fmt.Sprintf("groups: forward to master %d lost, outcome unknown: %v", e.Master, e.Err)
}
func (e *ForwardLostError) Unwrap() error { return e.Err }

// Forwarder sends group events to their masters (the forwarding side).
// Forward is safe from any goroutine and never blocks.
type Forwarder struct {
	self uint32
	auth *peerauth.Auth // proves cluster membership on each connection (nil: none)
	log  *slog.Logger
	// mapError turns a master's answer into the error done receives.
	mapError func(code wire.ErrorCode, text string) error

	// proxyOutput takes the client frames a master sent for a proxied
	// session (frames aliases the read buffer); linkLost is told that
	// the connection to a master ended, so every session proxied there
	// ended too. Set by SetProxy before the first SendProxy.
	proxyOutput func(master uint32, session uint64, frames []byte)
	linkLost    func(master uint32)

	links atomic.Pointer[map[uint32]*forwardLink] // copy on write, under mu
	mu    sync.Mutex
	done  chan struct{}
	wg    sync.WaitGroup
}

// NewForwarder returns a forwarder for broker self, which proves its
// cluster membership with auth on each connection (nil: none). mapError
// builds the error a forward's done receives from the master's refusal.
func NewForwarder(self uint32, auth *peerauth.Auth, mapError func(code wire.ErrorCode, text string) error, log *slog.Logger) *Forwarder {
	if log == nil {
		log = slog.Default()
	}
	f := &Forwarder{self: self, auth: auth, log: log, mapError: mapError, done: make(chan struct{})}
	f.links.Store(&map[uint32]*forwardLink{})
	return f
}

type forwardSlot struct {
	id   uint64
	done func(error)
}

// forwardLink is the forwards to one master.
type forwardLink struct {
	f    *Forwarder
	to   uint32
	wake chan struct{} // capacity 1: frames to write, or a new address

	mu struct {
		sync.Mutex
		addr     string
		out      []byte        // whole TypeForward frames not written yet
		slots    []forwardSlot // by id % forwardWindowMax
		next     uint64        // the next forward's id
		inflight int
		// refuseUntil: the last dial failed; forwards are refused with
		// refuseErr until then.
		refuseUntil time.Time
		refuseErr   error
		progress    time.Time // the last result, or when the window was last empty
	}
}

// Forward sends event (a group event for group g) to broker master, which
// listens on addr, and calls done with nil once the master reports it
// committed, or with why not. event is copied; done runs on another
// goroutine. An error means nothing was sent and done will not be called.
func (f *Forwarder) Forward(master uint32, addr string, g uint32, event []byte, done func(error)) error {
	return f.ForwardEncoded(master, addr, g, len(event), func(dst []byte) []byte { return append(dst, event...) }, done)
}

// ForwardEncoded is Forward with the event, of n bytes, written by enc
// straight into the connection's buffer, so that it is not encoded into
// a buffer of its own first and copied (a publish forwarded from a
// follower). enc runs at once, under the link's lock: it must append
// exactly n bytes and do nothing else.
func (f *Forwarder) ForwardEncoded(master uint32, addr string, g uint32, n int, enc func(dst []byte) []byte, done func(error)) error {
	l := f.link(master)
	if l == nil {
		return &ForwardLostError{Master: master, Err: ErrClosed, NotSent: true}
	}
	size := wire.ForwardSize(n)
	if err := l.lockFor(master, addr); err != nil {
		return err
	}
	if l.mu.inflight == forwardWindowMax || len(l.mu.out)+size > forwardBufMax {
		l.mu.Unlock()
		return ErrForwardBusy
	}
	id := l.mu.next
	at := len(l.mu.out)
	l.mu.out = enc(wire.AppendForwardHead(l.mu.out, id, g, n))
	if got := len(l.mu.out) - at - (size - n); got != n {
		l.mu.out = l.mu.out[:at]
		l.mu.Unlock()
		return fmt.Errorf("groups: a forwarded event encoded to %d bytes, not the %d it said", got, n)
	}
	l.mu.next++
	if l.mu.inflight == 0 {
		l.mu.progress = time.Now()
	}
	l.mu.inflight++
	l.mu.slots[id%forwardWindowMax] = forwardSlot{id: id, done: done}
	l.mu.Unlock()
	select {
	case l.wake <- struct{}{}:
	default:
	}
	return nil
}

// lockFor takes l's lock for a frame to master at addr, unless the last
// dial there failed a moment ago: then it returns that failure, the lock
// not held.
func (l *forwardLink) lockFor(master uint32, addr string) error {
	l.mu.Lock()
	if l.mu.addr != addr {
		l.mu.addr = addr
		l.mu.refuseUntil = time.Time{}
	}
	if time.Now().Before(l.mu.refuseUntil) {
		err := l.mu.refuseErr
		l.mu.Unlock()
		return &ForwardLostError{Master: master, Err: err, NotSent: true}
	}
	return nil
}

// SetProxy sets what the forwarder does with proxied sessions' output
// and with the end of a master's connection. Call it before any
// SendProxy.
func (f *Forwarder) SetProxy(output func(master uint32, session uint64, frames []byte), lost func(master uint32)) {
	f.proxyOutput, f.linkLost = output, lost
}

// SendProxy queues a whole frame (a TypeProxyCommand or TypeProxyClose)
// for broker master, which listens on addr. It never blocks; an error
// means it was not queued.
func (f *Forwarder) SendProxy(master uint32, addr string, frame []byte) error {
	l := f.link(master)
	if l == nil {
		return &ForwardLostError{Master: master, Err: ErrClosed, NotSent: true}
	}
	if err := l.lockFor(master, addr); err != nil {
		return err
	}
	if len(l.mu.out)+len(frame) > forwardBufMax {
		l.mu.Unlock()
		return ErrForwardBusy
	}
	l.mu.out = append(l.mu.out, frame...)
	l.mu.Unlock()
	select {
	case l.wake <- struct{}{}:
	default:
	}
	return nil
}

// link is the link to master, started on first use; nil once closed.
func (f *Forwarder) link(master uint32) *forwardLink {
	if l := (*f.links.Load())[master]; l != nil {
		return l
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	select {
	case <-f.done:
		return nil
	default:
	}
	old := *f.links.Load()
	if l := old[master]; l != nil {
		return l
	}
	l := &forwardLink{f: f, to: master, wake: make(chan struct{}, 1)}
	l.mu.slots = make([]forwardSlot, forwardWindowMax)
	l.mu.next = 1
	links := make(map[uint32]*forwardLink, len(old)+1)
	for k, v := range old {
		links[k] = v
	}
	links[master] = l
	f.links.Store(&links)
	f.wg.Add(1)
	go l.run()
	return l
}

// Close fails every forward waiting and stops the links.
func (f *Forwarder) Close() {
	f.mu.Lock()
	select {
	case <-f.done:
		f.mu.Unlock()
		return
	default:
	}
	close(f.done)
	f.mu.Unlock()
	f.wg.Wait()
}

// failAll ends every forward waiting on l with err; notSent says none
// of them was written to a connection.
func (l *forwardLink) failAll(err error, notSent bool) {
	var dones []func(error)
	l.mu.Lock()
	for i := range l.mu.slots {
		if s := &l.mu.slots[i]; s.done != nil {
			dones = append(dones, s.done)
			*s = forwardSlot{}
		}
	}
	l.mu.inflight = 0
	l.mu.out = l.mu.out[:0]
	l.mu.Unlock()
	lost := &ForwardLostError{Master: l.to, Err: err, NotSent: notSent}
	for _, d := range dones {
		d(lost)
	}
}

// lost tells the proxying side that the sessions proxied to l's master
// ended with its connection.
func (l *forwardLink) lost() {
	if l.f.linkLost != nil {
		l.f.linkLost(l.to)
	}
}

// finish ends forward id with the master's answer.
func (l *forwardLink) finish(id uint64, code wire.ErrorCode, text []byte) {
	l.mu.Lock()
	s := &l.mu.slots[id%forwardWindowMax]
	if s.id != id || s.done == nil {
		l.mu.Unlock()
		return // failed already with its connection
	}
	done := s.done
	*s = forwardSlot{}
	l.mu.inflight--
	l.mu.progress = time.Now()
	l.mu.Unlock()
	if code == wire.CodeOK {
		done(nil)
		return
	}
	done(l.f.mapError(code, string(text)))
}

// run dials the master when there is something to send, and runs one
// connection at a time.
func (l *forwardLink) run() {
	defer l.f.wg.Done()
	for {
		select {
		case <-l.f.done:
			l.failAll(ErrClosed, false)
			return
		case <-l.wake:
		}
		l.mu.Lock()
		addr, waiting := l.mu.addr, l.mu.inflight > 0 || len(l.mu.out) > 0
		l.mu.Unlock()
		if !waiting {
			continue
		}
		conn, err := net.DialTimeout("tcp", addr, time.Second)
		if err == nil {
			raw := conn
			if conn, err = l.f.auth.Client(raw, addr); err != nil {
				raw.Close()
				err = fmt.Errorf("cluster handshake: %w", err)
			}
		}
		if err != nil {
			l.mu.Lock()
			l.mu.refuseUntil, l.mu.refuseErr = time.Now().Add(forwardRedialMin), fmt.Errorf("dial %s: %w", addr, err)
			l.mu.Unlock()
			// What waits now was queued after the last connection
			// failed its own forwards: none of it was written.
			l.failAll(err, true)
			l.lost()
			continue
		}
		err = l.serve(conn)
		l.f.log.Debug("groups: forwarding connection ended", "master", l.to, "err", err)
		l.failAll(err, false)
		l.lost()
	}
}

// serve writes forwards on conn and reads their results until conn
// breaks, stalls or the forwarder closes.
func (l *forwardLink) serve(conn net.Conn) error {
	defer conn.Close()
	readErr := make(chan error, 1)
	go func() { readErr <- l.read(conn) }()
	defer func() { conn.Close(); <-readErr }()
	if _, err := conn.Write(wire.AppendForwardHello(nil, l.f.self, wire.Current)); err != nil {
		return err
	}
	stall := time.NewTicker(forwardStallMax / 4)
	defer stall.Stop()
	var buf []byte // the frames being written; swapped with l.mu.out
	for {
		l.mu.Lock()
		buf, l.mu.out = l.mu.out, buf[:0]
		l.mu.Unlock()
		if len(buf) > 0 {
			// A master that stopped reading (frozen) must not hold the
			// forwards waiting past the stall bound.
			_ = conn.SetWriteDeadline(time.Now().Add(forwardStallMax))
			if _, err := conn.Write(buf); err != nil {
				return err
			}
			continue
		}
		select {
		case <-l.wake:
		case err := <-readErr:
			readErr <- err
			return err
		case <-stall.C:
			l.mu.Lock()
			stalled := l.mu.inflight > 0 && time.Since(l.mu.progress) > forwardStallMax
			l.mu.Unlock()
			if stalled {
				return fmt.Errorf("no result from master %d for %v", l.to, forwardStallMax)
			}
		case <-l.f.done:
			return ErrClosed
		}
	}
}

// read takes results off conn.
func (l *forwardLink) read(conn net.Conn) error {
	r := bufio.NewReaderSize(conn, 64<<10)
	var hdr [wire.HeaderSize]byte
	body := make([]byte, 0, 8+2+2+wire.ForwardTextMax)
	for {
		if _, err := io.ReadFull(r, hdr[:]); err != nil {
			return err
		}
		h, err := wire.ReadHeader(hdr[:], wire.FrameSizeMax)
		if err != nil {
			return err
		}
		switch {
		case h.Type == wire.TypeForwardResult && h.Length <= 8+2+2+wire.ForwardTextMax:
		case h.Type == wire.TypeProxyOutput && l.f.proxyOutput != nil:
		default:
			return fmt.Errorf("groups: unexpected frame %v of %d bytes from master %d", h.Type, h.Length, l.to)
		}
		if cap(body) < int(h.Length) {
			body = make([]byte, h.Length)
		}
		body = body[:h.Length]
		if _, err := io.ReadFull(r, body); err != nil {
			return err
		}
		if h.Type == wire.TypeProxyOutput {
			session, frames, err := wire.DecodeProxyOutput(body)
			if err != nil {
				return err
			}
			l.f.proxyOutput(l.to, session, frames)
			continue
		}
		id, code, text, err := wire.DecodeForwardResult(body)
		if err != nil {
			return err
		}
		l.finish(id, code, text)
	}
}

// ForwardReply answers one forward on the master's side. Send is safe
// from any goroutine; a reply whose connection closed is dropped (the
// forwarding broker failed the forward already).
type ForwardReply struct {
	c  *forwardConn
	id uint64
}

// Send answers the forward: code 0 when its event committed and applied.
func (r ForwardReply) Send(code wire.ErrorCode, text string) { r.c.send(r.id, code, text) }

// ForwardHandler takes one forwarded event of group g from broker from,
// on the connection's reader goroutine. event is the handler's to keep
// (the reader does not use its bytes again). It must answer through reply
// exactly once, now or later.
type ForwardHandler func(from, g uint32, event []byte, reply ForwardReply)

// forwardConn is the master's side of one forwarding connection: its
// results wait in out (bounded by the forwarding side's window) for the
// writer goroutine.
type forwardConn struct {
	conn net.Conn
	wake chan struct{}
	// version is the forwarding broker's highest version (its hello):
	// results carry codes it knows (wire.ErrorCode.For).
	version wire.Version
	mu      struct {
		sync.Mutex
		out    []byte
		closed bool
	}
}

func (c *forwardConn) send(id uint64, code wire.ErrorCode, text string) {
	c.mu.Lock()
	if c.mu.closed {
		c.mu.Unlock()
		return
	}
	c.mu.out = wire.AppendForwardResult(c.mu.out, id, code.For(c.version), text)
	c.mu.Unlock()
	select {
	case c.wake <- struct{}{}:
	default:
	}
}

func (c *forwardConn) write(stop <-chan struct{}) {
	var buf []byte
	for {
		select {
		case <-c.wake:
		case <-stop:
			return
		}
		c.mu.Lock()
		buf, c.mu.out = c.mu.out, buf[:0]
		c.mu.Unlock()
		if len(buf) > 0 {
			if _, err := c.conn.Write(buf); err != nil {
				c.conn.Close()
				return
			}
		}
	}
}

// ProxyOut writes client frames to one proxied session's broker; it is
// comparable, so it serves as the session's key. Write is safe from any
// goroutine; it copies bufs and reports false once the connection closed.
type ProxyOut struct {
	c       *forwardConn
	session uint64
}

// Write queues bufs, whole client frames, for the proxying broker.
func (p ProxyOut) Write(bufs [][]byte) bool {
	n := 0
	for _, b := range bufs {
		n += len(b)
	}
	p.c.mu.Lock()
	if p.c.mu.closed {
		p.c.mu.Unlock()
		return false
	}
	p.c.mu.out = wire.AppendProxyOutputHeader(p.c.mu.out, p.session, n)
	for _, b := range bufs {
		p.c.mu.out = append(p.c.mu.out, b...)
	}
	p.c.mu.Unlock()
	select {
	case p.c.wake <- struct{}{}:
	default:
	}
	return true
}

// ProxyHandler runs proxied sessions on the master's side, on the
// forwarding connection's reader goroutine. Command gets one client
// frame (header and body, aliasing the read buffer) of the session out
// stands for, the first of a session opening it; Close ends a session,
// when its broker says so or when the connection ends.
type ProxyHandler struct {
	Command func(from uint32, out ProxyOut, version wire.Version, frameMax uint32, frame []byte)
	Close   func(out ProxyOut)
}

// SetProxyHandler makes the transport run proxied sessions with h.
func (t *Transport) SetProxyHandler(h ProxyHandler) { t.proxy.Store(&h) }

// SetForwardHandler makes the transport accept forwarding connections
// and pass their forwards to h.
func (t *Transport) SetForwardHandler(h ForwardHandler) { t.forward.Store(&h) }

// serveForwards reads the forwards of one connection from broker from,
// which speaks version at most, until it ends. r holds what was read past
// the hello.
func (t *Transport) serveForwards(conn net.Conn, r *bufio.Reader, from uint32, version wire.Version) {
	hp := t.forward.Load()
	if hp == nil {
		t.log.Warn("groups: a forwarding connection, but this broker takes no forwards", "peer", from)
		return
	}
	h := *hp
	var ph ProxyHandler
	if p := t.proxy.Load(); p != nil {
		ph = *p
	}
	c := &forwardConn{conn: conn, wake: make(chan struct{}, 1), version: version}
	stop := make(chan struct{})
	wrote := make(chan struct{})
	go func() { c.write(stop); close(wrote) }()
	sessions := map[uint64]bool{} // proxied sessions open on this connection
	defer func() {
		c.mu.Lock()
		c.mu.closed = true
		c.mu.Unlock()
		close(stop)
		<-wrote
		for s := range sessions {
			ph.Close(ProxyOut{c: c, session: s})
		}
	}()
	var hdr [wire.HeaderSize]byte
	var scratch []byte
	for {
		if _, err := io.ReadFull(r, hdr[:]); err != nil {
			return
		}
		hd, err := wire.ReadHeader(hdr[:], wire.FrameSizeMax)
		proxied := ph.Command != nil && (hd.Type == wire.TypeProxyCommand || hd.Type == wire.TypeProxyClose)
		if err != nil || (hd.Type != wire.TypeForward && !proxied) {
			t.log.Warn("groups: bad frame on a forwarding connection", "peer", from, "type", hd.Type, "err", err)
			return
		}
		// A forward's body is its handler's to keep (the master's log
		// holds the event as it came, without copying it again); the
		// proxy frames, decoded at once, reuse one buffer.
		var body []byte
		if hd.Type == wire.TypeForward {
			body = make([]byte, hd.Length)
		} else {
			if cap(scratch) < int(hd.Length) {
				scratch = make([]byte, hd.Length)
			}
			body = scratch[:hd.Length]
		}
		if _, err := io.ReadFull(r, body); err != nil {
			return
		}
		switch hd.Type {
		case wire.TypeProxyCommand:
			session, version, frameMax, frame, err := wire.DecodeProxyCommand(body)
			if err != nil || len(sessions) >= proxySessionsMax && !sessions[session] {
				t.log.Warn("groups: malformed proxy command, or too many proxied sessions", "peer", from, "err", err)
				return
			}
			sessions[session] = true
			ph.Command(from, ProxyOut{c: c, session: session}, version, frameMax, frame)
			continue
		case wire.TypeProxyClose:
			session, err := wire.DecodeProxyClose(body)
			if err != nil {
				t.log.Warn("groups: malformed proxy close", "peer", from)
				return
			}
			if sessions[session] {
				delete(sessions, session)
				ph.Close(ProxyOut{c: c, session: session})
			}
			continue
		}
		id, g, event, err := wire.DecodeForward(body)
		if err != nil {
			t.log.Warn("groups: malformed forward", "peer", from)
			return
		}
		h(from, g, event, ForwardReply{c: c, id: id})
	}
}
