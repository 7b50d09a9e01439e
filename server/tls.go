package server

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/panjf2000/gnet/v2"
)

// TLS on the client port. gnet has no TLS, so a TLS listener runs beside
// the gnet one: crypto/tls serves each connection with a reader goroutine,
// which hands whole frames to the same handler code as the loops
// (handler.traffic), and a writer goroutine, which takes frames from
// every other goroutine (shards, management, heartbeats) in order. The
// measurements that chose this design are in docs/BENCHMARKS.md.

const (
	// tlsHandshakeTimeout bounds the TLS handshake of a new connection.
	tlsHandshakeTimeout = 10 * time.Second
	// tlsReadBufferMin is the reader's starting buffer; it grows to hold
	// the largest frame the session allows.
	tlsReadBufferMin = 64 << 10
	// tlsStallWaitMax bounds how long a reader whose frames could not all
	// be taken waits before it tries them again (waitStalled): it parks
	// on the full shard ring, or until it is woken (its outbound buffer
	// drained), and a shard over its memory share, which wakes nobody,
	// is tried again after this.
	tlsStallWaitMax = 5 * time.Millisecond
	// tlsWriteBufferKeepMax: a writer's coalescing buffer above this is
	// dropped after use rather than kept for the connection's life.
	tlsWriteBufferKeepMax = 1 << 20
	// tlsWriteTimeout bounds one write to a client that reads nothing:
	// past it the connection is closed (and its session ends).
	tlsWriteTimeout = 30 * time.Second
)

var errConnClosed = errors.New("server: connection closed")

// tlsMaterial is the certificate, key and client CA, loaded from files at
// start and again on each ReloadTLS. Connections already open keep the
// material of their handshake.
type tlsMaterial struct {
	certFile, keyFile, clientCAFile string
	current                         atomic.Pointer[tls.Config]
}

// load reads the files and builds the configuration for new handshakes.
func (m *tlsMaterial) load() error {
	pair, err := tls.LoadX509KeyPair(m.certFile, m.keyFile)
	if err != nil {
		return fmt.Errorf("server: TLS certificate %s / key %s: %w", m.certFile, m.keyFile, err)
	}
	cfg := &tls.Config{MinVersion: tls.VersionTLS12, Certificates: []tls.Certificate{pair}}
	if m.clientCAFile != "" {
		pem, err := os.ReadFile(m.clientCAFile)
		if err != nil {
			return fmt.Errorf("server: TLS client CA: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return fmt.Errorf("server: TLS client CA %s: no PEM certificate in it", m.clientCAFile)
		}
		cfg.ClientCAs = pool
		cfg.ClientAuth = tls.RequireAndVerifyClientCert
	}
	m.current.Store(cfg)
	return nil
}

// listenerConfig hands every new handshake the material loaded last.
func (m *tlsMaterial) listenerConfig() *tls.Config {
	return &tls.Config{
		MinVersion: tls.VersionTLS12,
		GetConfigForClient: func(*tls.ClientHelloInfo) (*tls.Config, error) {
			return m.current.Load(), nil
		},
	}
}

// ReloadTLS rereads the TLS certificate, key and client CA. New
// connections use them; open ones are not touched. On an error the
// material in use stays.
func (s *Server) ReloadTLS() error {
	if s.tlsMat == nil {
		return errors.New("server: no TLS listener")
	}
	if err := s.tlsMat.load(); err != nil {
		return err
	}
	s.log.Info("server: TLS certificates reloaded", "cert", s.tlsMat.certFile)
	return nil
}

// TLSAddr is the bound TLS client address, or "".
func (s *Server) TLSAddr() string {
	if s.tlsLn == nil {
		return ""
	}
	return s.tlsLn.Addr().String()
}

// startTLS loads the material and listens; serving starts with serveTLS.
func (s *Server) startTLS() error {
	c := &s.cfg
	m := &tlsMaterial{certFile: c.TLSCert, keyFile: c.TLSKey, clientCAFile: c.TLSClientCA}
	if err := m.load(); err != nil {
		return err
	}
	ln, err := net.Listen("tcp4", c.TLSAddr)
	if err != nil {
		return fmt.Errorf("server: listen TLS on %s: %w", c.TLSAddr, err)
	}
	s.tlsMat, s.tlsLn = m, ln
	s.tlsConns.set = map[net.Conn]struct{}{}
	return nil
}

func (s *Server) serveTLS(h *handler) {
	defer s.tlsWG.Done()
	cfg := s.tlsMat.listenerConfig()
	for {
		nc, err := s.tlsLn.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			s.log.Warn("server: TLS accept", "err", err)
			time.Sleep(10 * time.Millisecond) // out of descriptors: do not spin
			continue
		}
		if !s.trackTLS(nc, true) {
			_ = nc.Close()
			continue
		}
		s.tlsWG.Add(1)
		go s.serveTLSConn(h, tls.Server(nc, cfg), nc)
	}
}

// trackTLS adds or removes a raw connection from the set that Close
// closes; adding fails once Close has begun.
func (s *Server) trackTLS(nc net.Conn, add bool) bool {
	s.tlsConns.Lock()
	defer s.tlsConns.Unlock()
	if !add {
		delete(s.tlsConns.set, nc)
		return true
	}
	if s.tlsConns.closed {
		return false
	}
	s.tlsConns.set[nc] = struct{}{}
	return true
}

// closeTLS stops accepting and, once the grace period is over, closes
// every TLS connection still open, then waits for their goroutines.
func (s *Server) stopTLSAccept() {
	if s.tlsLn != nil {
		_ = s.tlsLn.Close()
	}
}

func (s *Server) closeTLSConns() {
	if s.tlsLn == nil {
		return
	}
	s.tlsConns.Lock()
	s.tlsConns.closed = true
	for nc := range s.tlsConns.set {
		_ = nc.Close()
	}
	s.tlsConns.Unlock()
	s.tlsWG.Wait()
}

// serveTLSConn is the reader goroutine of one TLS connection.
func (s *Server) serveTLSConn(h *handler, tc *tls.Conn, raw net.Conn) {
	defer s.tlsWG.Done()
	defer s.trackTLS(raw, false)
	defer tc.Close()
	_ = tc.SetDeadline(time.Now().Add(tlsHandshakeTimeout))
	if err := tc.Handshake(); err != nil {
		s.sec.tlsHandshakeFailures.Inc()
		s.log.Debug("server: TLS handshake failed", "remote", raw.RemoteAddr().String(), "err", err)
		return
	}
	_ = tc.SetDeadline(time.Time{})
	t := &tlsConn{nc: tc, kick: make(chan struct{}, 1), woken: make(chan struct{}, 1), done: make(chan struct{})}
	go t.writeLoop()
	defer func() { <-t.done }()
	defer t.shutdown()
	cs := h.opened(t, true)
	cs.peerCerts = tc.ConnectionState().PeerCertificates
	defer h.closed(cs)
	buf := make([]byte, 0, tlsReadBufferMin)
	for {
		if len(buf) > 0 {
			cs.stalledOn.Store(0)
			t.own.Lock()
			consumed, action, stalled := h.traffic(cs, buf)
			t.own.Unlock()
			buf = buf[:copy(buf, buf[consumed:])]
			if action != gnet.None {
				t.closeAfterFlush()
				// Wait until the last frames went out: closing at once could
				// reset the connection before the client read them.
				<-t.done
				return
			}
			if stalled {
				s.waitStalled(t, cs)
				continue
			}
		}
		if len(buf) == cap(buf) {
			// A frame larger than the buffer: wire.Next refused any frame
			// above the session's maximum, so the buffer stays under
			// twice that.
			buf = append(buf, 0)[:len(buf)]
		}
		n, err := tc.Read(buf[len(buf):cap(buf)])
		buf = buf[:len(buf)+n]
		if err != nil && n == 0 {
			return
		}
	}
}

// tlsConn is the transport of a TLS connection. The reader goroutine
// (serveTLSConn) owns the connState and holds own while it handles
// frames; every write goes through the writer goroutine, in the order it
// was queued.
type tlsConn struct {
	nc  *tls.Conn
	own sync.Mutex

	// gauge is the session's OutBuffered once logged in: every change
	// of mu.pending is stored there, for the shards' cap.
	gauge atomic.Pointer[atomic.Int64]

	mu struct {
		sync.Mutex
		pending    int64    // bytes queued or being written
		bufs       [][]byte // queued frames, whole batches in order
		dones      []func() // run once their bufs are copied out
		closeAfter bool     // close once what is queued is written
		closed     bool     // no more writes are taken
	}
	kick chan struct{} // cap 1: the writer has work
	// woken (cap 1) wakes the reader from waitStalled (wake).
	woken chan struct{}
	done  chan struct{} // closed when the writer has exited
}

func (t *tlsConn) RemoteAddr() net.Addr { return t.nc.RemoteAddr() }

func (t *tlsConn) enqueue(bufs [][]byte, done func(), closeAfter bool) error {
	t.mu.Lock()
	if t.mu.closed || t.mu.closeAfter {
		t.mu.Unlock()
		return errConnClosed
	}
	t.mu.bufs = append(t.mu.bufs, bufs...)
	if done != nil {
		t.mu.dones = append(t.mu.dones, done)
	}
	for _, b := range bufs {
		t.mu.pending += int64(len(b))
	}
	if g := t.gauge.Load(); g != nil {
		g.Store(t.mu.pending)
	}
	t.mu.closeAfter = closeAfter
	t.mu.Unlock()
	select {
	case t.kick <- struct{}{}:
	default:
	}
	return nil
}

func (t *tlsConn) WriteAsync(bufs [][]byte, done func()) error {
	return t.enqueue(bufs, done, false)
}

func (t *tlsConn) send(frame []byte, closeAfter bool) error {
	return t.enqueue([][]byte{frame}, nil, closeAfter)
}

// writeOwned copies b: the owner reuses it at once.
func (t *tlsConn) writeOwned(b []byte) {
	_ = t.enqueue([][]byte{append([]byte(nil), b...)}, nil, false)
}

// runOwned runs f between two rounds of the reader's frame handling.
func (t *tlsConn) runOwned(f func()) error {
	go func() {
		t.own.Lock()
		defer t.own.Unlock()
		f()
	}()
	return nil
}

func (t *tlsConn) outBuffered() int64 {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.mu.pending
}

// setGauge has every change of the pending bytes stored in g (the
// session's OutBuffered).
func (t *tlsConn) setGauge(g *atomic.Int64) {
	t.mu.Lock()
	t.gauge.Store(g)
	g.Store(t.mu.pending)
	t.mu.Unlock()
}

// wake does nothing: a reader that stopped taking frames tries again on
// its own.
// wake tells a reader waiting in waitStalled that what stopped it may
// have passed (the outbound buffer drained).
func (t *tlsConn) wake() {
	select {
	case t.woken <- struct{}{}:
	default:
	}
}

// waitStalled parks a TLS reader whose frames were not all taken until
// they may be: the shard ring it found full has room, or (over its
// outbound cap) it is woken, or tlsStallWaitMax passed (a shard over its
// memory share, which wakes no one). A gnet loop comes back with Wake
// instead; this goroutine may block.
func (s *Server) waitStalled(t *tlsConn, cs *connState) {
	ctx, cancel := context.WithTimeout(s.regCtx, tlsStallWaitMax)
	defer cancel()
	if sh := cs.stalledOn.Load(); sh > 0 {
		_ = s.broker.Shards()[sh-1].WaitRoom(ctx)
		return
	}
	select {
	case <-t.woken:
	case <-ctx.Done():
	}
}

// abort closes the socket under the writer and the reader: a write in
// progress fails, and the reader's next read ends the connection.
func (t *tlsConn) abort() { _ = t.nc.NetConn().Close() }

func (t *tlsConn) closeAfterFlush() {
	t.mu.Lock()
	t.mu.closeAfter = true
	t.mu.Unlock()
	select {
	case t.kick <- struct{}{}:
	default:
	}
}

// shutdown stops the writer once the reader is done: nothing more is
// written, and the queued batches' done callbacks still run.
func (t *tlsConn) shutdown() {
	t.mu.Lock()
	t.mu.closed = true
	t.mu.Unlock()
	_ = t.nc.Close()
	select {
	case t.kick <- struct{}{}:
	default:
	}
}

func (t *tlsConn) writeLoop() {
	defer close(t.done)
	var out []byte
	var bufs [][]byte
	var dones []func()
	failed := false
	for range t.kick {
		t.mu.Lock()
		bufs, t.mu.bufs = t.mu.bufs, bufs[:0]
		dones, t.mu.dones = t.mu.dones, dones[:0]
		closeAfter, closed := t.mu.closeAfter, t.mu.closed
		t.mu.Unlock()
		out = out[:0]
		for _, b := range bufs {
			out = append(out, b...)
		}
		clear(bufs)
		for _, d := range dones {
			d()
		}
		clear(dones)
		if len(out) > 0 && !failed {
			_ = t.nc.SetWriteDeadline(time.Now().Add(tlsWriteTimeout))
			if _, err := t.nc.Write(out); err != nil {
				failed = true // the reader sees the connection fail too
			}
		}
		t.mu.Lock()
		t.mu.pending -= int64(len(out))
		if g := t.gauge.Load(); g != nil {
			g.Store(t.mu.pending)
		}
		t.mu.Unlock()
		if cap(out) > tlsWriteBufferKeepMax {
			out = nil
		}
		if closeAfter {
			_ = t.nc.Close()
		}
		if closeAfter || closed {
			t.drainLocked()
			return
		}
	}
}

// drainLocked runs the done callbacks of batches queued after the writer
// stopped, and refuses further ones.
func (t *tlsConn) drainLocked() {
	t.mu.Lock()
	t.mu.closed = true
	dones := t.mu.dones
	t.mu.bufs, t.mu.dones = nil, nil
	t.mu.Unlock()
	for _, d := range dones {
		d()
	}
}
