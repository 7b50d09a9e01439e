package server

import (
	"crypto/x509"
	"sync/atomic"

	"github.com/panjf2000/gnet/v2"

	"github.com/berthmq/berth/server/session"
	"github.com/berthmq/berth/shards"
	"github.com/berthmq/berth/wire"
)

// connState is one client connection. Everything but the atomics belongs
// to the connection's owner: its event loop, or for TLS its reader
// goroutine.
type connState struct {
	s   *Server
	t   transport
	tls bool // served by the TLS listener
	// ahead holds the offsets, from the head of the inbound bytes (a
	// parked publish frame), of the frames behind it already handled
	// (handler.aheadOfParked), in increasing order; the main loop skips
	// them. aheadEnd is where the scan for them stopped (0: nothing
	// scanned yet).
	ahead    []int
	aheadEnd int
	// peerCerts are the verified client certificates of a TLS connection
	// (mutual TLS), for EXTERNAL; set before the first frame.
	peerCerts []*x509.Certificate
	sess      *shards.Session // nil until HELLO
	// sessAt is sess for the heartbeat goroutine, set with it.
	sessAt atomic.Pointer[shards.Session]
	// openedAt is when the connection was accepted (unix nanoseconds),
	// for the handshake timeout.
	openedAt int64
	// readStalled is when the owner stopped taking frames because the
	// connection was over its cap of pending bytes, or 0 (outbound.go).
	readStalled atomic.Int64
	// stalledOn is 1 + the shard whose full ring stopped the owner's last
	// frame, 0 for none: a TLS reader parks on that ring (tls.go).
	stalledOn atomic.Int32
	checking  atomic.Bool // a checkOutbound is queued on the owner

	version     wire.Version
	frameMax    uint32
	heartbeatNs int64
	lastRecv    atomic.Int64
	closing     atomic.Bool
	busy        atomic.Bool // inside OnTraffic (see Server.quiesce)
	// Copies for the heartbeat goroutine, set once at HELLO.
	hbNs     atomic.Int64
	helloVer atomic.Uint32
	lastBeat int64 // heartbeat goroutine only

	// ss is the session (publishes, consumers, settles) once logged in,
	// nil before; the connection's owner runs it (session package).
	ss *session.Session
	// proxyTo is where the session's last SUBSCRIBE resolved to another
	// broker (SubscribeQueue), for the proxy's Subscribe just after.
	proxyTo struct {
		g, master uint32
		addr      string
	}

	mgmt mgmtQueue // management commands, run in order off the loop (mgmt.go)

	login loginState   // the handshake until WELCOME (login.go)
	authz sessionAuthz // the session's user and permission cache (authz.go)

	out    []byte       // frames written at the end of OnTraffic
	ranges []wire.Range // completions the loop itself makes
}

func (cs *connState) heartbeat(now int64) {
	if cs.closing.Load() {
		return
	}
	hb := cs.hbNs.Load()
	if hb == 0 {
		hb = int64(cs.s.cfg.Heartbeat)
	}
	if now-cs.lastRecv.Load() > 3*hb {
		cs.closing.Store(true)
		cs.s.metrics.heartbeatTimeouts.Inc()
		v := wire.Version(cs.helloVer.Load())
		if v == 0 {
			v = wire.Current
		}
		frame := wire.AppendClose(nil, v, wire.CodeHeartbeatTimeout, "no traffic for 3 heartbeat intervals")
		_ = cs.t.send(frame, true)
		return
	}
	if v := cs.helloVer.Load(); v != 0 && now-cs.lastBeat >= hb/2 {
		cs.lastBeat = now
		_ = cs.t.send(wire.AppendHeartbeat(nil, wire.Version(v)), false)
	}
}

func (cs *connState) versionOr() wire.Version {
	if cs.version != 0 {
		return cs.version
	}
	return wire.Current
}

func (cs *connState) complete(id uint64) { cs.ranges = wire.AddID(cs.ranges, id) }

func (cs *connState) fail(id uint64, code wire.ErrorCode, text string) {
	cs.flushRanges()
	cs.out = wire.AppendError(cs.out, cs.versionOr(), id, code, text)
}

func (cs *connState) flushRanges() {
	cs.out = wire.AppendCompletes(cs.out, cs.version, cs.ranges)
	cs.ranges = cs.ranges[:0]
}

// protocolError sends ERROR then CLOSE, and tells the loop to close.
func (cs *connState) protocolError(code wire.ErrorCode, text string) gnet.Action {
	cs.s.log.Debug("server: protocol error", "code", code.String(), "text", text)
	cs.s.metrics.protocolErrors.Inc()
	cs.flushRanges()
	cs.out = wire.AppendError(cs.out, cs.versionOr(), 0, code, text)
	cs.out = wire.AppendClose(cs.out, cs.versionOr(), code, text)
	cs.closing.Store(true)
	return gnet.Close
}
