package server

import (
	"fmt"
	"time"

	"github.com/panjf2000/gnet/v2"

	"github.com/berthmq/berth/shards"
	"github.com/berthmq/berth/wire"
)

// The login part of the handshake: HELLO names a mechanism, and the
// session starts (WELCOME) only once it succeeded. Everything here runs
// on the connection's owner (its loop, or its TLS reader), except PLAIN's
// password check, which runs on a goroutine of its own and comes back
// through runOwned: a loop never derives a key. A failed login is
// answered with ERROR + CLOSE(auth-failed) after a delay that grows with
// the source's recent failures (authLimiter), from a timer, so nothing
// waits for it; the connection handles no frame meanwhile.

// loginState is what HELLO negotiated, kept until the login ends.
type loginState struct {
	version     wire.Version
	frameMax    uint32
	heartbeatMs uint32
	mechanism   string
	// scram is a SCRAM exchange waiting for the client's AUTH.
	scram *scramLogin
	// plainPending: a PLAIN check runs; any frame meanwhile is unexpected.
	plainPending bool
}

// authenticate starts the login HELLO asked for.
func (h *handler) authenticate(cs *connState, mechanism, data []byte) gnet.Action {
	a := h.s.auth
	set := a.users.Load()
	cs.login.mechanism = string(mechanism)
	switch cs.login.mechanism {
	case "", wire.MechNone:
		switch {
		case len(set.users) > 0:
			return h.loginFailed(cs, "", "the default user (mechanism none) is disabled once users exist: log in as a user with SCRAM-SHA-256, PLAIN or EXTERNAL")
		case !remoteIP(cs.t.RemoteAddr()).IsLoopback():
			return h.loginFailed(cs, "", "the default user (mechanism none) logs in from loopback only: define users (berthctl users add) and log in as one")
		}
		return h.loggedIn(cs, defaultUser, nil)
	case wire.MechExternal:
		if len(cs.peerCerts) == 0 {
			return h.loginFailed(cs, "", "EXTERNAL needs a TLS client certificate (the TLS listener with -tls-client-ca)")
		}
		cn := cs.peerCerts[0].Subject.CommonName
		if len(data) > 0 && string(data) != cn {
			return h.loginFailed(cs, cn, fmt.Sprintf("EXTERNAL: the authorization identity %q is not the certificate's subject CN %q", data, cn))
		}
		u := set.users[cn]
		if u == nil {
			return h.loginFailed(cs, cn, fmt.Sprintf("EXTERNAL: no user %q (the certificate's subject CN)", cn))
		}
		return h.loggedIn(cs, u, nil)
	case wire.MechPlain:
		if !cs.tls && !a.allowPlain {
			return h.loginFailed(cs, "", "PLAIN is refused on a plaintext listener: use the TLS listener or SCRAM-SHA-256 (or start berthd with -allow-plain-without-tls)")
		}
		authzid, name, password, ok := parsePlain(data)
		if !ok {
			return h.loginFailed(cs, "", "PLAIN: the auth field is not authzid NUL user NUL password")
		}
		if authzid != "" && authzid != name {
			return h.loginFailed(cs, name, "PLAIN: an authorization identity other than the user is not supported")
		}
		cs.login.plainPending = true
		go func() {
			u := a.checkPlain(set, name, password)
			_ = cs.t.runOwned(func() {
				cs.login.plainPending = false
				if cs.closing.Load() {
					return
				}
				if u == nil {
					h.loginFailed(cs, name, "authentication failed: "+errBadCredentials.Error())
				} else {
					h.loggedIn(cs, u, nil)
				}
				h.writeOut(cs)
			})
		}()
		return gnet.None
	case wire.MechScramSHA256:
		if cs.login.version < wire.VersionAuth {
			return h.loginFailed(cs, "", "SCRAM-SHA-256 needs protocol "+wire.VersionAuth.String()+" (AUTH frames); this session negotiated "+cs.login.version.String())
		}
		l := a.startScram(set)
		serverFirst, err := l.conv.Step(string(data))
		if err != nil {
			return h.loginFailed(cs, "", "SCRAM-SHA-256: "+err.Error())
		}
		cs.login.scram = l
		cs.out = wire.AppendAuth(cs.out, cs.login.version, []byte(serverFirst))
		return gnet.None
	}
	return h.loginFailed(cs, "", fmt.Sprintf("unknown mechanism %q: this server offers SCRAM-SHA-256, PLAIN, EXTERNAL and none", mechanism))
}

// preSession handles a frame that arrives before WELCOME.
func (h *handler) preSession(cs *connState, hd wire.Header, body []byte) gnet.Action {
	switch {
	case hd.Type == wire.TypeHello && cs.login.version == 0:
		return h.hello(cs, body)
	case hd.Type == wire.TypeAuth && cs.login.scram != nil:
		var m wire.Auth
		if err := wire.DecodeAuth(body, &m); err != nil {
			return cs.protocolError(wire.CodeMalformed, "AUTH: "+err.Error())
		}
		l := cs.login.scram
		cs.login.scram = nil
		serverFinal, u, err := l.finish(string(m.Data))
		if err != nil {
			name := ""
			if l.user != nil {
				name = l.user.name
			}
			return h.loginFailed(cs, name, "authentication failed: "+err.Error())
		}
		return h.loggedIn(cs, u, []byte(serverFinal))
	case cs.login.version == 0:
		return cs.protocolError(wire.CodeUnexpected, "the first frame must be HELLO, not "+hd.Type.String())
	}
	return cs.protocolError(wire.CodeUnexpected, hd.Type.String()+" before WELCOME: wait for the login to end")
}

// loggedIn starts the session: the server's last AUTH (if any), then
// WELCOME.
func (h *handler) loggedIn(cs *connState, u *authUser, final []byte) gnet.Action {
	h.s.auth.limiter.succeeded(remoteIP(cs.t.RemoteAddr()))
	l := cs.login
	cs.login = loginState{}
	cs.authz.name, cs.authz.builtin = u.name, u.builtin
	cs.authz.user, cs.authz.gen = u, h.s.auth.users.Load().gen
	if final != nil {
		cs.out = wire.AppendAuth(cs.out, l.version, final)
	}
	cfg := &h.s.cfg
	cs.version = l.version
	cs.frameMax = l.frameMax
	cs.heartbeatNs = int64(l.heartbeatMs) * int64(time.Millisecond)
	cs.hbNs.Store(cs.heartbeatNs)
	cs.helloVer.Store(uint32(l.version))
	cs.sess = &shards.Session{ID: h.s.nextSession.Add(1), Version: l.version, FrameMax: l.frameMax, Out: cs.t,
		OutMax: max(cfg.OutboundMax, 0)} // a negative OutboundMax is no cap, the shards' 0
	cs.sessAt.Store(cs.sess)
	cs.ss = h.s.newSession(cs, cs.sess)
	cs.sess.OnStall = func() { h.s.stalls.add(cs) }
	cs.sess.OnConsumerGone = func(id uint32) { _ = cs.t.runOwned(func() { h.s.consumerGone(cs, id) }) }
	if t, ok := cs.t.(*tlsConn); ok {
		t.setGauge(&cs.sess.OutBuffered)
	}
	addr := h.s.addr
	if cs.tls {
		addr = h.s.TLSAddr() // a TLS client fails over to TLS addresses
	}
	addrs := [][]byte{[]byte(addr)}
	if p := h.s.welcomeAddrs.Load(); p != nil && !cs.tls {
		addrs = *p // this broker's, then every other registered broker's
	}
	w := wire.Welcome{Version: l.version, FrameSizeMax: l.frameMax, HeartbeatMs: l.heartbeatMs, CreditMax: cfg.CreditMax,
		WindowMax: cfg.WindowMax, ServerName: []byte(cfg.ServerName), Addrs: addrs}
	cs.out = wire.AppendWelcome(cs.out, &w)
	if !u.builtin {
		h.s.log.Debug("server: login", "user", u.name, "mechanism", l.mechanism, "remote", addrString(cs))
	}
	return gnet.None
}

// loginFailed counts the failure and answers ERROR + CLOSE(auth-failed)
// once the source's delay has passed. The connection takes no more
// frames; it closes after the answer (or when the client gives up).
func (h *handler) loginFailed(cs *connState, user, why string) gnet.Action {
	s := h.s
	s.sec.authFailures.Inc()
	src := remoteIP(cs.t.RemoteAddr())
	delay := s.auth.limiter.failed(src, time.Now())
	s.log.Info("server: login failed", "remote", addrString(cs), "mechanism", cs.login.mechanism, "user", user, "why", why, "delay", delay)
	v := cs.login.version
	if v == 0 {
		v = wire.Version10
	}
	cs.login = loginState{version: v}
	cs.closing.Store(true)
	frames := wire.AppendError(nil, v, 0, wire.CodeAuthFailed, why)
	frames = wire.AppendClose(frames, v, wire.CodeAuthFailed, why)
	time.AfterFunc(delay, func() { _ = cs.t.send(frames, true) })
	return gnet.None
}

func addrString(cs *connState) string {
	if a := cs.t.RemoteAddr(); a != nil {
		return a.String()
	}
	return ""
}
