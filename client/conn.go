package client

import (
	"context"
	"crypto/tls"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"reflect"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/berthmq/berth/wire"
)

// Config tunes a connection. The zero value is usable.
type Config struct {
	// Name is the client name sent in HELLO; the server shows it in its
	// status pages. At most wire.NameLenMax bytes.
	Name string
	// Heartbeat is the interval asked of the server; 0 takes the server's
	// default, or ReconnectHeartbeatDefault for a Conn with Reconnect set.
	// The server's answer is what both sides use.
	Heartbeat time.Duration
	// MaxVersion, when set, is the newest protocol version HELLO offers:
	// to check how a broker treats older clients. Zero offers every
	// version this client speaks.
	MaxVersion wire.Version
	// MaxFrameSize is the largest frame (header plus body) asked for; 0 asks
	// for wire.FrameSizeDefault. It must lie within wire.FrameSizeMin and
	// wire.FrameSizeMax. The server may lower it.
	MaxFrameSize uint32
	// DialTimeout bounds the TCP connect to each address; default 5 s.
	DialTimeout time.Duration
	// HandshakeTimeout bounds HELLO/WELCOME; default 5 s.
	HandshakeTimeout time.Duration
	// CloseTimeout bounds how long Close waits for in-flight completions
	// and the server's CLOSE; default 5 s.
	CloseTimeout time.Duration
	// Window is the most uncompleted commands this connection keeps
	// (publishes count one per message). 0 means WindowDefault. It is
	// lowered to the server's WindowMax and capped at 65536. Publishes
	// take at most all but an eighth of it (at most 64 short), so that
	// settles and other commands still go out while a broker holds the
	// publishes back (a shard over its memory budget).
	Window int
	// WriteBufferSize is how many encoded bytes may wait for the writer
	// goroutine before callers block; default 1 MiB.
	WriteBufferSize int
	// ErrorHandler, if set, receives server errors that concern the
	// connection rather than a command (ERROR with command id 0) and
	// deliveries for consumers this side no longer knows. It runs on the
	// reader goroutine and must not block; a call from it that would wait
	// returns ErrCalledFromCallback.
	ErrorHandler func(error)
	// TLS, if set, makes the connection speak TLS (to the server's
	// -listen-tls address). Without a ServerName the host part of each
	// address dialled is used. Give Certificates for mutual TLS.
	TLS *tls.Config
	// User and Password log in as a user of the server. Without a User
	// the client logs in as the server's default user, which exists only
	// while the server has no users and only for clients on loopback.
	User, Password string
	// Mechanism is the SASL mechanism (wire.Mech*): "" picks
	// SCRAM-SHA-256 when User is set, else none. PLAIN sends the password
	// itself: servers take it over TLS only, unless told otherwise.
	// EXTERNAL logs in as the user named by the subject CN of the TLS
	// client certificate (User, if set, must be that name).
	Mechanism string
	// Reconnect, if set, makes the Conn outlive its connection: when the
	// connection breaks it dials again on its own, resends what had no
	// answer and resubscribes its consumers (see "Reconnecting" in the
	// package documentation). Nil (the default): a broken connection ends
	// the Conn.
	Reconnect *ReconnectPolicy
}

func (cfg *Config) withDefaults() (Config, error) {
	c := *cfg
	if len(c.Name) > wire.NameLenMax {
		return c, fmt.Errorf("%w: client name longer than %d bytes", ErrInvalid, wire.NameLenMax)
	}
	if c.MaxFrameSize == 0 {
		c.MaxFrameSize = wire.FrameSizeDefault
	}
	if c.MaxFrameSize < wire.FrameSizeMin || c.MaxFrameSize > wire.FrameSizeMax {
		return c, fmt.Errorf("%w: MaxFrameSize %d outside [%d, %d]", ErrInvalid, c.MaxFrameSize, wire.FrameSizeMin, wire.FrameSizeMax)
	}
	if c.Heartbeat < 0 || c.Heartbeat/time.Millisecond > 1<<31 {
		return c, fmt.Errorf("%w: heartbeat %v", ErrInvalid, c.Heartbeat)
	}
	if c.DialTimeout <= 0 {
		c.DialTimeout = 5 * time.Second
	}
	if c.HandshakeTimeout <= 0 {
		c.HandshakeTimeout = 5 * time.Second
	}
	if c.CloseTimeout <= 0 {
		c.CloseTimeout = 5 * time.Second
	}
	if c.Mechanism == "" {
		c.Mechanism = wire.MechNone
		if c.User != "" {
			c.Mechanism = wire.MechScramSHA256
		}
	}
	switch c.Mechanism {
	case wire.MechNone:
		if c.User != "" || c.Password != "" {
			return c, fmt.Errorf("%w: mechanism none takes no user or password", ErrInvalid)
		}
	case wire.MechPlain, wire.MechScramSHA256:
		if c.User == "" {
			return c, fmt.Errorf("%w: mechanism %s needs a User", ErrInvalid, c.Mechanism)
		}
	case wire.MechExternal:
		if c.TLS == nil || (len(c.TLS.Certificates) == 0 && c.TLS.GetClientCertificate == nil) {
			return c, fmt.Errorf("%w: mechanism EXTERNAL needs a TLS client certificate", ErrInvalid)
		}
	default:
		return c, fmt.Errorf("%w: unknown mechanism %q", ErrInvalid, c.Mechanism)
	}
	if c.Window <= 0 {
		c.Window = WindowDefault
	}
	c.Window = min(c.Window, windowLimitMax)
	if c.WriteBufferSize <= 0 {
		c.WriteBufferSize = writeBufferDefault
	}
	if c.Reconnect != nil {
		p, err := c.Reconnect.withDefaults()
		if err != nil {
			return c, err
		}
		c.Reconnect = &p
		if c.Heartbeat == 0 {
			c.Heartbeat = ReconnectHeartbeatDefault
		}
	}
	return c, nil
}

// ReconnectHeartbeatDefault is the heartbeat interval a Conn with
// Reconnect set asks for when Config.Heartbeat is 0. A broker that froze
// without closing the connection is noticed after three intervals, so a
// Conn meant to follow a failover notices it in 3 s rather than the 15 s
// of a server's default interval (5 s); the cost is an 8-byte frame each
// way every half second.
const ReconnectHeartbeatDefault = time.Second

// Conn is one session with a Berth server. All methods are safe for
// concurrent use. Without Config.Reconnect a Conn does not reconnect: once
// it fails, every call returns an error wrapping ErrClosed; dial again
// (ServerAddrs lists the cluster's addresses). With it, see
// "Reconnecting" in the package documentation.
//
// Each connection runs three goroutines: a writer that coalesces every
// queued command into as few writes as it can, a reader that decodes
// completions and deliveries, and a heartbeat timer. A reconnecting Conn
// runs one more while it dials again.
type Conn struct {
	nc   net.Conn // the handshake's connection; the goroutines use their link's
	cfg  Config
	addr string // the handshake's address; Addr reads c.mu.addr
	// seeds are the addresses given to Dial; a reconnecting Conn dials
	// them and the ones the last WELCOME listed.
	seeds []string
	// offer is the versions HELLO offers: offeredVersions, then only the
	// negotiated one when reconnecting.
	offer []wire.Version
	// producer is the producer id of this Conn's publishes (protocol 1.2,
	// Config.Reconnect), or 0. Sequence numbers are command ids.
	producer  uint64
	stop      chan struct{} // closed by Close: stop reconnecting
	stopOnce  sync.Once
	version   wire.Version
	frameMax  uint32
	heartbeat time.Duration
	creditMax uint32
	// windowMaxFromServer is the server's WindowMax, kept apart from
	// cfg.Window so the client's own wish stays visible.
	windowMaxFromServer uint32
	serverName          string
	addrs               []string
	start               time.Time

	kick chan struct{} // cap 1: there is something for the writer
	dead chan struct{} // closed as soon as the connection failed or closed
	done chan struct{} // closed once dead and no callback can run any more

	lastRead  atomic.Int64 // nanoseconds since start
	lastWrite atomic.Int64

	wg sync.WaitGroup // every goroutine of the Conn

	// rl is the link the reader goroutine reads; the reader's alone (set
	// before it starts).
	rl *link

	mu struct {
		sync.Mutex
		win         window
		out         []byte // frames waiting for the writer
		spare       []byte // the writer's other buffer, when not in use
		pubStart    int    // offset of the open PUBLISH frame in out, or -1
		pubCountOff int
		pubCount    int
		pubExchange string
		kicked      bool
		closing     bool  // Close was called: no new commands
		sentClose   bool  // our CLOSE is queued: the server's CLOSE is its answer
		err         error // why the connection ended; nil while it is up
		// callErr is what calls get once the connection ended: err without
		// any *Error in its chain (a command's *Error means "refused").
		callErr error
		// sentBelow: every command id below it was handed to the writer;
		// the others are still in out and were never sent.
		sentBelow uint64
		waitCh    chan struct{}
		// firing counts completion callbacks taken from the window but not
		// yet run (they run outside the lock): Flush waits for them too.
		firing int
		// submitting counts settles split over several frames whose frames
		// are still being queued: their done may still fire.
		submitting   int
		readerExited bool
		doneClosed   bool
		consumers    map[uint32]*Consumer
		nextCons     uint32
		// link is the live connection, nil while a reconnecting Conn
		// dials again.
		link *link
		// gen counts broken connections: a settle built for deliveries of
		// one generation is refused in another (ErrStaleDelivery).
		gen uint64
		// pubNext is the id the open PUBLISH frame's next message must
		// have (a resend after a reconnect leaves gaps).
		pubNext uint64
		// addr, serverName, heartbeat, addrs: of the live connection.
		addr       string
		serverName string
		heartbeat  time.Duration
		addrs      []string
	}

	// Reader goroutine only.
	scratch []completion
	dec     wire.Deliver
	msgs    []wire.DeliverMessage
	pos     []deliverScratch
	strs    []byte
}

// Dial connects to the first address that accepts a session, trying them
// in order, with a default Config. It blocks until a session is up, every
// address failed, or ctx ends.
func Dial(ctx context.Context, addrs ...string) (*Conn, error) {
	return DialConfig(ctx, Config{}, addrs...)
}

// DialConfig is Dial with a Config. The returned error joins the failure of
// every address tried; a refusal by a server is an *Error inside it.
func DialConfig(ctx context.Context, cfg Config, addrs ...string) (*Conn, error) {
	if len(addrs) == 0 {
		return nil, ErrNoAddress
	}
	full, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	var errs []error
	for _, a := range addrs {
		c, err := dialOne(ctx, full, a, addrs)
		if err == nil {
			return c, nil
		}
		errs = append(errs, fmt.Errorf("%s: %w", a, err))
		if ctx.Err() != nil {
			break
		}
	}
	return nil, fmt.Errorf("client: dial failed: %w", errors.Join(errs...))
}

func dialOne(ctx context.Context, cfg Config, addr string, seeds []string) (*Conn, error) {
	d := net.Dialer{Timeout: cfg.DialTimeout}
	nc, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, err
	}
	if cfg.TLS != nil {
		if nc, err = clientTLS(ctx, cfg, nc, addr); err != nil {
			return nil, err
		}
	}
	c := &Conn{nc: nc, cfg: cfg, addr: addr, seeds: slices.Clone(seeds), start: time.Now(), offer: offerUpTo(cfg.MaxVersion)}
	leftover, err := c.handshake(ctx)
	if err != nil {
		nc.Close()
		return nil, err
	}
	c.kick = make(chan struct{}, 1)
	c.dead = make(chan struct{})
	c.done = make(chan struct{})
	c.stop = make(chan struct{})
	c.mu.win = newWindow(min(cfg.Window, int(min(uint32(windowLimitMax), c.windowMaxFromServer))))
	c.mu.pubStart = -1
	c.mu.consumers = make(map[uint32]*Consumer)
	c.mu.addr, c.mu.serverName, c.mu.heartbeat, c.mu.addrs = addr, c.serverName, c.heartbeat, c.addrs
	c.msgs = make([]wire.DeliverMessage, 0, 64)
	if cfg.Reconnect != nil && !cfg.Reconnect.NoProducerID && c.version >= wire.VersionProducer {
		c.producer = newProducerID()
	}
	l := &link{nc: nc, addr: addr, broken: make(chan struct{}), heartbeat: c.heartbeat}
	c.mu.link = l
	c.startLink(l, leftover)
	return c, nil
}

// link is one connection of a Conn and the state its goroutines share.
type link struct {
	nc        net.Conn
	addr      string
	broken    chan struct{} // closed once this connection failed
	heartbeat time.Duration
	wg        linkWG // its three goroutines
}

// startLink starts l's goroutines. The previous link's have exited.
func (c *Conn) startLink(l *link, leftover []byte) {
	c.rl = l
	c.lastRead.Store(c.now())
	c.lastWrite.Store(c.now())
	c.wg.Add(3)
	l.wg.Add(3)
	go c.writeLoop(l)
	go c.readLoop(l, leftover)
	go c.heartbeatLoop(l)
}

// clientTLS runs the TLS handshake on nc, within HandshakeTimeout; it
// closes nc on failure.
func clientTLS(ctx context.Context, cfg Config, nc net.Conn, addr string) (net.Conn, error) {
	tc := cfg.TLS.Clone()
	if tc.ServerName == "" {
		host, _, err := net.SplitHostPort(addr)
		if err != nil {
			host = addr
		}
		tc.ServerName = host
	}
	conn := tls.Client(nc, tc)
	hctx, cancel := context.WithTimeout(ctx, cfg.HandshakeTimeout)
	defer cancel()
	if err := conn.HandshakeContext(hctx); err != nil {
		nc.Close()
		return nil, fmt.Errorf("client: TLS handshake: %w", err)
	}
	return conn, nil
}

// handshake sends HELLO and reads the answer. It returns bytes read past
// the WELCOME, which belong to the reader.
func (c *Conn) handshake(ctx context.Context) ([]byte, error) {
	deadline := time.Now().Add(c.cfg.HandshakeTimeout)
	if d, ok := ctx.Deadline(); ok && d.Before(deadline) {
		deadline = d
	}
	c.nc.SetDeadline(deadline)
	defer c.nc.SetDeadline(time.Time{})
	stop := context.AfterFunc(ctx, func() { c.nc.SetDeadline(time.Unix(1, 0)) })
	defer stop()

	hb := uint32(c.cfg.Heartbeat / time.Millisecond)
	if c.cfg.Heartbeat > 0 && hb == 0 {
		hb = 1
	}
	lg, err := newLogin(&c.cfg)
	if err != nil {
		return nil, err
	}
	hello := wire.AppendHello(nil, c.offer, c.cfg.Name, c.cfg.Mechanism, lg.first, c.cfg.MaxFrameSize, hb)
	if _, err := c.nc.Write(hello); err != nil {
		return nil, c.ctxOr(ctx, err)
	}
	buf := make([]byte, 0, 4096)
	for {
		h, body, n, err := wire.Next(buf, wire.FrameSizeMax)
		if err != nil {
			return nil, fmt.Errorf("%w: handshake: %v", ErrProtocol, err)
		}
		if n == 0 {
			if len(buf) == cap(buf) {
				buf = append(buf, 0)[:len(buf)]
			}
			m, err := c.nc.Read(buf[len(buf):cap(buf)])
			buf = buf[:len(buf)+m]
			if err != nil {
				return nil, c.ctxOr(ctx, fmt.Errorf("handshake: %w", err))
			}
			continue
		}
		switch h.Type {
		case wire.TypeAuth:
			var a wire.Auth
			if err := wire.DecodeAuth(body, &a); err != nil {
				return nil, fmt.Errorf("%w: AUTH: %v", ErrProtocol, err)
			}
			reply, err := lg.step(a.Data)
			if err != nil {
				return nil, err
			}
			if reply != nil {
				if _, err := c.nc.Write(wire.AppendAuth(nil, h.Version, reply)); err != nil {
					return nil, c.ctxOr(ctx, err)
				}
			}
			buf = buf[:copy(buf, buf[n:])]
			continue
		case wire.TypeWelcome:
			var w wire.Welcome
			if err := wire.DecodeWelcome(body, &w); err != nil {
				return nil, fmt.Errorf("%w: WELCOME: %v", ErrProtocol, err)
			}
			if err := lg.done(); err != nil {
				return nil, err
			}
			if err := c.accept(&w); err != nil {
				return nil, err
			}
			return buf[n:], nil
		case wire.TypeError:
			var e wire.Error
			if err := wire.DecodeError(body, &e); err != nil {
				return nil, fmt.Errorf("%w: ERROR: %v", ErrProtocol, err)
			}
			return nil, &Error{Code: e.Code, Text: string(e.Text)}
		case wire.TypeClose:
			var cl wire.Close
			if err := wire.DecodeClose(body, &cl); err != nil {
				return nil, fmt.Errorf("%w: CLOSE: %v", ErrProtocol, err)
			}
			return nil, &Error{Code: cl.Code, Text: string(cl.Reason)}
		default:
			return nil, fmt.Errorf("%w: %v before WELCOME", ErrProtocol, h.Type)
		}
	}
}

func (c *Conn) ctxOr(ctx context.Context, err error) error {
	if ctx.Err() != nil {
		return ctx.Err()
	}
	return err
}

// accept checks and adopts the server's WELCOME.
func (c *Conn) accept(w *wire.Welcome) error {
	if !slices.Contains(c.offer, w.Version) {
		return fmt.Errorf("%w: server chose version %v, offered %v", ErrProtocol, w.Version, c.offer)
	}
	if w.FrameSizeMax < wire.FrameSizeMin || w.FrameSizeMax > wire.FrameSizeMax {
		return fmt.Errorf("%w: WELCOME frame size %d", ErrProtocol, w.FrameSizeMax)
	}
	if w.WindowMax == 0 || w.CreditMax == 0 {
		return fmt.Errorf("%w: WELCOME window %d credit %d", ErrProtocol, w.WindowMax, w.CreditMax)
	}
	c.version = w.Version
	c.frameMax = w.FrameSizeMax
	c.heartbeat = time.Duration(w.HeartbeatMs) * time.Millisecond
	c.creditMax = w.CreditMax
	c.windowMaxFromServer = w.WindowMax
	c.serverName = string(w.ServerName)
	for _, a := range w.Addrs {
		c.addrs = append(c.addrs, string(a))
	}
	return nil
}

// Addr is the address of this Conn's connection (the latest one, for a
// reconnecting Conn).
func (c *Conn) Addr() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.mu.addr
}

// ServerName is the name the server gave in WELCOME (the latest one).
func (c *Conn) ServerName() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.mu.serverName
}

// ServerAddrs are the cluster addresses the server listed for failover
// (in the latest WELCOME). The slice is the caller's.
func (c *Conn) ServerAddrs() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.mu.addrs)
}

// MaxFrameSize is the negotiated maximum frame size.
func (c *Conn) MaxFrameSize() uint32 { return c.frameMax }

// Version is the protocol version the session negotiated (a reconnect
// keeps it). Below wire.VersionOutcome (1.4) the server answers
// unavailable also for a command whose outcome is unknown, which only
// the error's text tells apart.
func (c *Conn) Version() wire.Version { return c.version }

// Heartbeat is the negotiated heartbeat interval; 0 means none.
func (c *Conn) Heartbeat() time.Duration {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.mu.heartbeat
}

// CreditMax is the most credit the server lets one consumer hold.
func (c *Conn) CreditMax() uint32 { return c.creditMax }

// Window is the most uncompleted commands this Conn allows itself.
func (c *Conn) Window() int { return c.mu.win.max }

// Done is closed once the connection has ended and no callback of it can
// run any more: every done function of its commands has returned (those
// still in flight got their error), Config.ErrorHandler will not be called
// again, and its consumers have been told (see Consumer.Next). A callback
// that never returns keeps Done open.
func (c *Conn) Done() <-chan struct{} { return c.done }

// Err is why the connection ended, or nil while it is up. It wraps
// ErrClosed and the cause: ErrHeartbeatTimeout, ErrProtocol, a network
// error, or, when the server closed the connection with an error code
// (shutdown, for instance), an *Error with CommandID 0.
func (c *Conn) Err() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.mu.err
}

// Flush blocks until every command issued before the call has completed
// (or failed) and its done function has run, or ctx ends. It returns
// ctx.Err() in the latter case, or an error wrapping ErrClosed if the
// connection ended with commands still out. From a callback it returns
// ErrCalledFromCallback instead of waiting.
func (c *Conn) Flush(ctx context.Context) error {
	c.mu.Lock()
	target := c.mu.win.next
	for c.mu.win.oldest() < target || c.mu.firing > 0 {
		if c.mu.err != nil {
			err := c.mu.callErr
			c.mu.Unlock()
			return err
		}
		ch := c.waitChLocked()
		c.mu.Unlock()
		if calledFromCallback() {
			return ErrCalledFromCallback
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return ctx.Err()
		}
		c.mu.Lock()
	}
	c.mu.Unlock()
	return nil
}

// Close ends the session gracefully: no new commands are taken, commands
// in flight get up to Config.CloseTimeout to complete, then CLOSE is sent
// and the server's CLOSE awaited (within the same timeout). Commands still
// out after that fail with ErrOutcomeUnknown. It blocks until the
// connection's goroutines have exited and Done is closed, so no callback
// runs after it returns. Calling it again is a no-op returning nil. Called
// from a callback it would wait for itself: it returns
// ErrCalledFromCallback and does nothing (start it on a goroutine of its
// own instead).
func (c *Conn) Close() error {
	if calledFromCallback() {
		return ErrCalledFromCallback
	}
	c.mu.Lock()
	if c.mu.closing || c.mu.err != nil {
		c.mu.Unlock()
		c.wg.Wait()
		<-c.done
		return nil
	}
	c.mu.closing = true
	c.mu.Unlock()
	c.stopOnce.Do(func() { close(c.stop) })

	timer := time.NewTimer(c.cfg.CloseTimeout)
	defer timer.Stop()
	ctx, cancel := context.WithTimeout(context.Background(), c.cfg.CloseTimeout)
	_ = c.Flush(ctx)
	cancel()

	c.mu.Lock()
	if c.mu.err == nil && c.mu.link != nil {
		c.sealPublishLocked()
		c.mu.out = wire.AppendClose(c.mu.out, c.version, wire.CodeOK, "client closing")
		c.mu.sentClose = true
		c.kickLocked()
	}
	c.mu.Unlock()
	select {
	case <-c.dead:
	case <-timer.C:
		c.fail(fmt.Errorf("%w: no CLOSE from server within %v", ErrClosed, c.cfg.CloseTimeout))
	}
	c.wg.Wait()
	<-c.done
	return nil
}

// fail ends the connection once, with err as its reason (Err). Commands
// that were sent and not answered get an error wrapping ErrOutcomeUnknown,
// those still waiting for the writer and later calls one wrapping only
// ErrClosed; neither holds an *Error, which would say "refused".
//
// A reconnecting Conn (Config.Reconnect) that is not closing only loses
// its connection: its commands stay out, and a goroutine dials again
// (reconnect.go). fail is then a no-op until a new connection is up.
func (c *Conn) fail(err error) {
	c.mu.Lock()
	if c.mu.err != nil {
		c.mu.Unlock()
		return
	}
	l := c.mu.link
	if c.cfg.Reconnect != nil && !c.mu.closing {
		if l == nil {
			c.mu.Unlock()
			return // dialling again already
		}
		c.breakLinkLocked(l, err)
		c.mu.Unlock()
		return
	}
	c.failForGood(l, err)
}

// failForGood ends the Conn. c.mu is held, and released on return. l is
// the live link, or nil between connections.
func (c *Conn) failForGood(l *link, err error) {
	if !errors.Is(err, ErrClosed) {
		err = fmt.Errorf("%w: %w", ErrClosed, err)
	}
	c.mu.link = nil
	c.mu.err = err
	callErr := err
	if se := (*Error)(nil); errors.As(err, &se) {
		callErr = fmt.Errorf("%w: server closed the connection: %s", ErrClosed, se.Error())
	}
	c.mu.callErr = callErr
	unknown := fmt.Errorf("%w: %w", ErrOutcomeUnknown, callErr)
	var fired []completion
	w := &c.mu.win
	for _, id := range w.outIDs(nil) {
		if s, ok := w.take(id); ok {
			e := callErr
			if id < c.mu.sentBelow {
				e = unknown
			}
			if cp, ok := resolve(s, e); ok {
				fired = append(fired, cp)
			}
		}
	}
	c.mu.firing += len(fired)
	c.wakeLocked()
	cons := make([]*Consumer, 0, len(c.mu.consumers))
	for _, s := range c.mu.consumers {
		cons = append(cons, s)
	}
	c.mu.Unlock()
	close(c.dead)
	if l != nil {
		close(l.broken)
		l.nc.Close()
	}
	for _, s := range cons {
		s.fail(callErr)
	}
	// Counted like the reader's callbacks: when fail runs on the reader,
	// a callback that waits for this or another Conn must be told.
	readersInCallbacks.Add(1)
	for _, cp := range fired {
		cp.fire()
	}
	readersInCallbacks.Add(-1)
	c.mu.Lock()
	c.mu.firing -= len(fired)
	c.wakeLocked()
	c.closeDoneLocked()
	c.mu.Unlock()
}

// closeDoneLocked closes done once the connection has ended and nothing
// can run a callback any more: the reader has exited, no completion is
// being fired, no split settle is still being queued. c.mu must be held.
func (c *Conn) closeDoneLocked() {
	if c.mu.err == nil || !c.mu.readerExited || c.mu.firing > 0 || c.mu.submitting > 0 || c.mu.doneClosed {
		return
	}
	c.mu.doneClosed = true
	close(c.done)
}

// waitChLocked returns a channel closed at the next state change that may
// free window or buffer space or complete commands. c.mu must be held.
func (c *Conn) waitChLocked() chan struct{} {
	if c.mu.waitCh == nil {
		c.mu.waitCh = make(chan struct{})
	}
	return c.mu.waitCh
}

func (c *Conn) wakeLocked() {
	if c.mu.waitCh != nil {
		close(c.mu.waitCh)
		c.mu.waitCh = nil
	}
}

func (c *Conn) kickLocked() {
	if !c.mu.kicked {
		c.mu.kicked = true
		select {
		case c.kick <- struct{}{}:
		default:
		}
	}
}

// reserveLocked blocks (releasing c.mu while it waits) until one more
// command (a publish: within the publishes' share) fits in the window and
// the write buffer has room. c.mu must be
// held; it is held again on return. From a callback, where waiting would
// deadlock, it returns ErrCalledFromCallback instead.
func (c *Conn) reserveLocked(ctx context.Context, publish bool) error {
	for {
		if c.mu.err != nil {
			return c.mu.callErr
		}
		if c.mu.closing {
			return ErrClosed
		}
		fits := c.mu.win.canAdd()
		if publish {
			fits = c.mu.win.canAddPublish()
		}
		if fits && len(c.mu.out) < c.cfg.WriteBufferSize {
			return nil
		}
		ch := c.waitChLocked()
		c.mu.Unlock()
		// Checked without the lock: the stack walk must not hold up the
		// reader, which needs c.mu to free the window.
		if calledFromCallback() {
			c.mu.Lock()
			return ErrCalledFromCallback
		}
		select {
		case <-ch:
		case <-ctx.Done():
			c.mu.Lock()
			return ctx.Err()
		}
		c.mu.Lock()
	}
}

// sealPublishLocked finishes the open PUBLISH frame, if any.
func (c *Conn) sealPublishLocked() {
	if c.mu.pubStart < 0 {
		return
	}
	binary.BigEndian.PutUint16(c.mu.out[c.mu.pubCountOff:], uint16(c.mu.pubCount))
	wire.EndFrame(c.mu.out, c.mu.pubStart, 0)
	c.mu.pubStart = -1
	c.mu.pubCount = 0
}

// command queues one command that carries a command id and reports its
// result to fn or cl. build appends the frame for the given id. It blocks
// only while the window or write buffer is full. A caller that will wait
// for cl is refused up front when it runs in a callback.
func (c *Conn) command(ctx context.Context, build func(b []byte, id uint64) []byte, fn func(error), cl *call, grp *group) error {
	return c.commandAs(ctx, cmdSpec{}, build, fn, cl, grp)
}

// cmdSpec says what a reconnecting Conn does with a command when its
// connection breaks.
type cmdSpec struct {
	kind slotKind
	cons *Consumer // kindSubscribe
	// gen, for kindSettle, is the connection generation whose deliveries
	// it settles; in another it is refused with ErrStaleDelivery.
	gen uint64
}

func (c *Conn) commandAs(ctx context.Context, spec cmdSpec, build func(b []byte, id uint64) []byte, fn func(error), cl *call, grp *group) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if cl != nil && calledFromCallback() {
		return ErrCalledFromCallback
	}
	c.mu.Lock()
	if err := c.reserveLocked(ctx, false); err != nil {
		c.mu.Unlock()
		return err
	}
	if spec.kind == kindSettle && spec.gen != c.mu.gen {
		c.mu.Unlock()
		return ErrStaleDelivery
	}
	c.sealPublishLocked()
	id := c.mu.win.add(fn, cl, grp)
	if c.cfg.Reconnect != nil {
		sl := c.mu.win.at(id)
		sl.kind, sl.cons = spec.kind, spec.cons
		if spec.kind == kindResend {
			sl.build = build
		}
	}
	c.mu.out = build(c.mu.out, id)
	c.kickLocked()
	c.mu.Unlock()
	return nil
}

// roundTrip issues one command and waits for its completion. A
// reconnecting Conn does what spec says with it when its connection
// breaks.
func (c *Conn) roundTrip(ctx context.Context, spec cmdSpec, build func(b []byte, id uint64) []byte) error {
	cl := getCall()
	if err := c.commandAs(ctx, spec, build, nil, cl, nil); err != nil {
		putCall(cl)
		return err
	}
	return c.wait(ctx, cl)
}

// wait receives the result of cl. If ctx ends first the command stays out
// (the server will still answer it) and cl is abandoned to the collector;
// the caller gets ctx's error wrapped with ErrOutcomeUnknown, since the
// command is sent (or will be) and its answer goes unheard.
func (c *Conn) wait(ctx context.Context, cl *call) error {
	select {
	case err := <-cl.ch:
		putCall(cl)
		return err
	case <-ctx.Done():
		return fmt.Errorf("%w: %w", ErrOutcomeUnknown, ctx.Err())
	}
}

// control queues a frame without a command id (CREDIT, HEARTBEAT). It does
// not wait for buffer space: such frames are small and bounded by the
// commands that cause them.
func (c *Conn) control(build func(b []byte) []byte) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.mu.err != nil {
		return c.mu.callErr
	}
	c.sealPublishLocked()
	c.mu.out = build(c.mu.out)
	c.kickLocked()
	return nil
}

func (c *Conn) now() int64 { return int64(time.Since(c.start)) }

func (c *Conn) writeLoop(l *link) {
	defer c.wg.Done()
	defer l.wg.Done()
	for {
		select {
		case <-c.kick:
		case <-l.broken:
			return
		}
		c.mu.Lock()
		c.mu.kicked = false
		c.sealPublishLocked()
		c.mu.sentBelow = c.mu.win.next
		buf := c.mu.out
		c.mu.out = c.mu.spare
		c.mu.spare = nil
		if c.mu.out == nil {
			c.mu.out = make([]byte, 0, min(c.cfg.WriteBufferSize+int(c.frameMax), 2*c.cfg.WriteBufferSize))
		}
		c.wakeLocked()
		c.mu.Unlock()
		if len(buf) > 0 {
			if _, err := l.nc.Write(buf); err != nil {
				c.fail(fmt.Errorf("write: %w", err))
				return
			}
			c.lastWrite.Store(c.now())
		}
		// A buffer that grew far past its bound for one huge frame is
		// dropped rather than kept for the life of the connection.
		if cap(buf) <= 4*c.cfg.WriteBufferSize+int(c.frameMax) {
			c.mu.Lock()
			c.mu.spare = buf[:0]
			c.mu.Unlock()
		}
	}
}

func (c *Conn) heartbeatLoop(l *link) {
	defer c.wg.Done()
	defer l.wg.Done()
	if l.heartbeat <= 0 {
		return
	}
	tick := time.NewTicker(max(l.heartbeat/3, time.Millisecond))
	defer tick.Stop()
	hb := int64(l.heartbeat)
	for {
		select {
		case <-l.broken:
			return
		case <-tick.C:
		}
		now := c.now()
		if now-c.lastRead.Load() > 3*hb {
			l.nc.SetWriteDeadline(time.Now().Add(l.heartbeat))
			l.nc.Write(wire.AppendClose(nil, c.version, wire.CodeHeartbeatTimeout, "no frame from server for 3 heartbeats"))
			c.fail(ErrHeartbeatTimeout)
			return
		}
		if now-c.lastWrite.Load() >= hb {
			if c.control(func(b []byte) []byte { return wire.AppendHeartbeat(b, c.version) }) != nil {
				return
			}
		}
	}
}

// readLoop is the reader goroutine, the one that runs callbacks; its name
// is what calledFromCallback looks for on the stack.
func (c *Conn) readLoop(l *link, leftover []byte) {
	defer c.wg.Done()
	defer l.wg.Done()
	defer func() {
		c.mu.Lock()
		c.mu.readerExited = true
		c.closeDoneLocked()
		c.mu.Unlock()
	}()
	buf := make([]byte, max(readBufferInitial, len(leftover)))
	w := copy(buf, leftover)
	r := 0
	for {
		for {
			h, body, n, err := wire.Next(buf[r:w], c.frameMax)
			if err != nil {
				code := wire.CodeMalformed
				switch {
				case errors.Is(err, wire.ErrFrameTooBig):
					code = wire.CodeFrameTooLarge
				case errors.Is(err, wire.ErrMajorVersion):
					code = wire.CodeVersion
				}
				c.protocolError(code, err.Error())
				return
			}
			if n == 0 {
				break
			}
			if err := c.handleFrame(h, body); err != nil {
				if errors.Is(err, ErrClosed) {
					c.fail(err)
				} else {
					c.protocolError(wire.CodeMalformed, err.Error())
				}
				return
			}
			r += n
		}
		if r > 0 {
			w = copy(buf, buf[r:w])
			r = 0
		}
		if w >= wire.HeaderSize {
			// The header was checked by wire.Next, so total is within
			// the negotiated maximum.
			total := wire.HeaderSize + int(binary.BigEndian.Uint32(buf[8:]))
			if total > len(buf) {
				nb := make([]byte, total)
				copy(nb, buf[:w])
				buf = nb
			}
		}
		n, err := l.nc.Read(buf[w:])
		if n > 0 {
			w += n
			c.lastRead.Store(c.now())
		}
		if err != nil {
			c.fail(fmt.Errorf("read: %w", err))
			return
		}
	}
}

// protocolError tells the server why we are leaving, then leaves.
func (c *Conn) protocolError(code wire.ErrorCode, text string) {
	c.rl.nc.SetWriteDeadline(time.Now().Add(time.Second))
	c.rl.nc.Write(wire.AppendClose(nil, c.version, code, text))
	c.fail(fmt.Errorf("%w: %s", ErrProtocol, text))
}

func (c *Conn) handleFrame(h wire.Header, body []byte) error {
	if h.Version.Minor() > c.version.Minor() {
		return nil // a newer minor version's frame: skipped by its length
	}
	if h.Channel != 0 {
		return fmt.Errorf("frame on channel %d", h.Channel)
	}
	switch h.Type {
	case wire.TypeHeartbeat:
		return nil
	case wire.TypeComplete:
		rl, err := wire.DecodeComplete(body)
		if err != nil {
			return fmt.Errorf("COMPLETE: %w", err)
		}
		c.complete(rl)
		return nil
	case wire.TypeError:
		var e wire.Error
		if err := wire.DecodeError(body, &e); err != nil {
			return fmt.Errorf("ERROR: %w", err)
		}
		se := &Error{Code: e.Code, Text: string(e.Text), CommandID: e.CommandID}
		if e.CommandID == 0 {
			c.handleError(se)
			return nil
		}
		c.mu.Lock()
		if e.Code == wire.CodeShutdown && c.resendableLocked(e.CommandID) {
			// Not taken by a broker that is going away: a reconnecting
			// Conn sends it again on its next connection.
			c.mu.Unlock()
			return nil
		}
		s, ok := c.mu.win.take(e.CommandID)
		var cp completion
		if ok {
			var err error = se
			if s.resent {
				// The copy sent before the break may have been carried
				// out; this refusal speaks for the resend only.
				err = fmt.Errorf("%w: %w: resent after a reconnect and refused (%s)", ErrOutcomeUnknown, ErrConnectionLost, se.Error())
			}
			cp, ok = resolve(s, err)
			c.wakeLocked()
		}
		if ok {
			c.mu.firing++
		}
		c.mu.Unlock()
		if ok {
			readersInCallbacks.Add(1)
			cp.fire()
			readersInCallbacks.Add(-1)
			c.fired(1)
		}
		return nil
	case wire.TypeDeliver:
		return c.deliver(body)
	case wire.TypeCancelled:
		if c.version < wire.VersionCancelled {
			return fmt.Errorf("unexpected frame %v in a %v session", h.Type, c.version)
		}
		var m wire.Cancelled
		if err := wire.DecodeCancelled(body, &m); err != nil {
			return fmt.Errorf("CANCELLED: %w", err)
		}
		c.consumerEnded(m.ConsumerID, &Error{Code: m.Code, Text: string(m.Reason)})
		return nil
	case wire.TypeClose:
		var cl wire.Close
		if err := wire.DecodeClose(body, &cl); err != nil {
			return fmt.Errorf("CLOSE: %w", err)
		}
		c.mu.Lock()
		answer := !c.mu.sentClose
		c.mu.Unlock()
		if answer {
			c.rl.nc.SetWriteDeadline(time.Now().Add(time.Second))
			c.rl.nc.Write(wire.AppendClose(nil, c.version, wire.CodeOK, ""))
		}
		if cl.Code == wire.CodeOK {
			return ErrClosed
		}
		return fmt.Errorf("%w: %w", ErrClosed, &Error{Code: cl.Code, Text: string(cl.Reason)})
	default:
		return fmt.Errorf("unexpected frame %v (type 0x%02x)", h.Type, uint8(h.Type))
	}
}

// complete retires the command ids of a COMPLETE and fires their callbacks
// outside the lock.
func (c *Conn) complete(rl wire.RangeList) {
	fired := c.scratch[:0]
	c.mu.Lock()
	w := &c.mu.win
	for i := 0; i < rl.Len(); i++ {
		rg := rl.At(i)
		w.takeRange(rg.First, rg.Last, func(s slot) {
			if cp, ok := resolve(s, nil); ok {
				fired = append(fired, cp)
			}
		})
	}
	c.mu.firing += len(fired)
	c.wakeLocked()
	c.mu.Unlock()
	if len(fired) > 0 {
		readersInCallbacks.Add(1)
		for i := range fired {
			fired[i].fire()
			fired[i] = completion{}
		}
		readersInCallbacks.Add(-1)
	}
	c.fired(len(fired))
	c.scratch = fired[:0]
}

// fired records that n callbacks counted in firing have run, and wakes
// Flush.
func (c *Conn) fired(n int) {
	if n == 0 {
		return
	}
	c.mu.Lock()
	c.mu.firing -= n
	c.wakeLocked()
	c.closeDoneLocked()
	c.mu.Unlock()
}

// handleError hands a connection-level error to Config.ErrorHandler.
// Reader goroutine only.
func (c *Conn) handleError(err error) {
	if c.cfg.ErrorHandler == nil {
		return
	}
	readersInCallbacks.Add(1)
	defer readersInCallbacks.Add(-1)
	c.cfg.ErrorHandler(err)
}

// readersInCallbacks counts reader goroutines, of any Conn, running
// callbacks right now. While it is 0 no call can come from a callback, and
// calledFromCallback answers without looking at the stack.
var readersInCallbacks atomic.Int32

// readLoopEntry is the entry of the function every callback of a reader
// has below it on its stack. readLoop is never inlined (it is far too big,
// and a goroutine's start), so its frame is always there; functions
// inlined into it report its entry too.
// It is set in init, not by its declaration: readLoop's calls lead back
// to calledFromCallback, which reads it.
var readLoopEntry uintptr

func init() {
	readLoopEntry = runtime.FuncForPC(reflect.ValueOf((*Conn).readLoop).Pointer()).Entry()
}

// calledFromCallback reports whether the calling goroutine is a Conn's
// reader, which is only ever running user code inside a callback (a done
// function or Config.ErrorHandler). Go has no goroutine identity to ask;
// the reader's own function on the stack is the mark, and the stack is
// only walked while some reader is in a callback, on paths that are about
// to wait anyway.
func calledFromCallback() bool {
	if readersInCallbacks.Load() == 0 {
		return false
	}
	var buf [64]uintptr
	pcs := buf[:]
	for {
		n := runtime.Callers(2, pcs)
		if n < len(pcs) {
			pcs = pcs[:n]
			break
		}
		pcs = make([]uintptr, 2*len(pcs))
	}
	for _, pc := range pcs {
		// pc is a return address: pc-1 lies in the calling function.
		if f := runtime.FuncForPC(pc - 1); f != nil && f.Entry() == readLoopEntry {
			return true
		}
	}
	return false
}
