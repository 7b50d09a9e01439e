package server

import (
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"regexp"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/xdg-go/scram"

	"github.com/berthmq/berth/controlplane/ctlapi"
)

// Authentication of client sessions. Users live in the controller
// (ctlapi/users.go); the broker keeps a copy (userSet) that HELLO reads
// without a round trip:
//
//  1. Start reads the users with a follower read (linearizable, served by
//     the nearest controller member) before the client listener serves
//     anyone, and refuses to start on a non-loopback client address when
//     there are none.
//  2. watchUsers long-polls the controller's applied index (WaitChange)
//     and reads the users again whenever it moves, at most once per
//     authUsersRefreshMin. A user added, removed or given a new password
//     through any controller reaches the broker within one long-poll round
//     (milliseconds), not after a fixed TTL; a TTL would make every change
//     wait for it and still poll when nothing changes.
//  3. If the controller is unreachable the broker keeps the users it has:
//     clients keep logging in with the credentials last known.
//
// A login never waits on the controller, so an unknown user and a wrong
// password cost the same: the unknown user is checked against keys
// derived from a per-process secret and its name (fakeCredentials).

const (
	// authDelayBase is the delay of the answer to a source's first failed
	// login; each further failure within authFailureWindow doubles it, up
	// to authDelayMax.
	authDelayBase = 50 * time.Millisecond
	authDelayMax  = 5 * time.Second
	// authFailureWindow: a source whose last failure is older than this
	// starts again from authDelayBase.
	authFailureWindow = time.Minute
	// authSourcesMax bounds the source addresses remembered; while the
	// table is full of recent failures, other sources get authDelayMax.
	authSourcesMax = 4096
	// authUsersRefreshMin spaces two reads of the users, however fast the
	// controller's applied index moves (durable declares move it too).
	authUsersRefreshMin = 50 * time.Millisecond
	// authUsersRetry is the pause after a failed WaitChange or read.
	authUsersRetry = 500 * time.Millisecond
	// plainWorkersMax bounds the PLAIN checks (a PBKDF2 derivation each,
	// about a millisecond of CPU) running at once.
	plainWorkersMax = 4
	// defaultUserName names the user of mechanism none in logs and errors.
	defaultUserName = "default"
)

// authUser is one user as the broker checks it: credentials and compiled
// permissions. It is immutable once in a userSet.
type authUser struct {
	name                   string
	creds                  scram.StoredCredentials
	configure, write, read permPattern
	// builtin marks the default user (mechanism none, loopback only, no
	// users defined).
	builtin bool
	// removed marks a user that no longer exists: open sessions of it
	// are refused every command.
	removed bool
}

// permPattern is a permission regular expression matched against a whole
// name, as RabbitMQ matches them. "" matches nothing; ".*" everything
// (checked without the regexp engine).
type permPattern struct {
	source string
	re     *regexp.Regexp
	all    bool
}

func compilePattern(p string) permPattern {
	switch p {
	case "":
		return permPattern{}
	case ".*", "(.*)", ".*?":
		return permPattern{source: p, all: true}
	}
	re, err := regexp.Compile("^(?:" + p + ")$")
	if err != nil {
		// The controller validated it; a pattern it let through that we
		// cannot compile allows nothing.
		return permPattern{source: p}
	}
	return permPattern{source: p, re: re}
}

func (p *permPattern) match(name []byte) bool {
	if p.all {
		return true
	}
	return p.re != nil && p.re.Match(name)
}

var (
	defaultUser = &authUser{name: defaultUserName, builtin: true,
		configure: permPattern{source: ".*", all: true}, write: permPattern{source: ".*", all: true}, read: permPattern{source: ".*", all: true}}
)

// userSet is the users as last read from the controller. gen changes
// whenever they do, so sessions know to look their user up again.
type userSet struct {
	gen   uint64
	raw   []ctlapi.User
	users map[string]*authUser
}

func newUserSet(gen uint64, raw []ctlapi.User) *userSet {
	set := &userSet{gen: gen, raw: raw, users: make(map[string]*authUser, len(raw))}
	for _, u := range raw {
		c := u.Credentials
		set.users[u.Name] = &authUser{
			name: u.Name,
			creds: scram.StoredCredentials{KeyFactors: scram.KeyFactors{Salt: string(c.Salt), Iters: int(c.Iterations)},
				StoredKey: c.StoredKey, ServerKey: c.ServerKey},
			configure: compilePattern(u.Permissions.Configure),
			write:     compilePattern(u.Permissions.Write),
			read:      compilePattern(u.Permissions.Read),
		}
	}
	return set
}

// lookup is the user a session logged in as (name, builtin), as this set
// has it now.
func (set *userSet) lookup(name string, builtin bool) *authUser {
	if builtin {
		if len(set.users) == 0 {
			return defaultUser
		}
		return &authUser{name: name, builtin: true, removed: true}
	}
	if u := set.users[name]; u != nil {
		return u
	}
	return &authUser{name: name, removed: true}
}

// authState is the server's authentication: the users, the secret behind
// the fake credentials, the failure delays.
type authState struct {
	users      atomic.Pointer[userSet]
	secret     [32]byte
	allowPlain bool
	limiter    authLimiter
	plainSlots chan struct{}
}

func newAuthState(allowPlain bool) *authState {
	a := &authState{allowPlain: allowPlain, plainSlots: make(chan struct{}, plainWorkersMax)}
	if _, err := rand.Read(a.secret[:]); err != nil {
		panic("server: no randomness for the login secret: " + err.Error())
	}
	a.limiter.sources = map[netip.Addr]authFailures{}
	a.users.Store(newUserSet(1, nil))
	return a
}

// setUsers installs users read from the controller; an unchanged list
// keeps the set (and every session's permission cache).
func (a *authState) setUsers(users []ctlapi.User) bool {
	old := a.users.Load()
	if slices.EqualFunc(old.raw, users, equalUser) {
		return false
	}
	a.users.Store(newUserSet(old.gen+1, users))
	return true
}

func equalUser(x, y ctlapi.User) bool {
	cx, cy := &x.Credentials, &y.Credentials
	return x.Name == y.Name && x.Permissions == y.Permissions && cx.Iterations == cy.Iterations &&
		string(cx.Salt) == string(cy.Salt) && string(cx.StoredKey) == string(cy.StoredKey) && string(cx.ServerKey) == string(cy.ServerKey)
}

// fakeCredentials are what an unknown user is checked against: keys no
// password leads to (they come from a secret, not from a password),
// stable per name so that two probes see the same salt, and costing what
// a real user's check costs (the iteration count berthctl gives users).
func (a *authState) fakeCredentials(name string) scram.StoredCredentials {
	derive := func(label string) []byte {
		m := hmac.New(sha256.New, a.secret[:])
		m.Write([]byte(label))
		m.Write([]byte{0})
		m.Write([]byte(name))
		return m.Sum(nil)
	}
	return scram.StoredCredentials{
		KeyFactors: scram.KeyFactors{Salt: string(derive("salt")[:ctlapi.UserSaltLenMin]), Iters: ctlapi.UserIterationsMin},
		StoredKey:  derive("stored"),
		ServerKey:  derive("server"),
	}
}

// checkPlain verifies a PLAIN password: the same PBKDF2 derivation and
// comparison whether the user exists or not. It returns the user, or nil.
// It takes about a millisecond of CPU: never on an event loop.
func (a *authState) checkPlain(set *userSet, name, password string) *authUser {
	u := set.users[name]
	creds := a.fakeCredentials(name)
	if u != nil {
		creds = u.creds
	}
	a.plainSlots <- struct{}{}
	defer func() { <-a.plainSlots }()
	c, err := scram.SHA256.NewClient(name, password, "")
	if err != nil {
		return nil // the password fails SASLprep: no user has it
	}
	sc, err := c.GetStoredCredentialsWithError(creds.KeyFactors)
	if err != nil || !hmac.Equal(sc.StoredKey, creds.StoredKey) || u == nil {
		return nil
	}
	return u
}

// scramLogin is a SCRAM-SHA-256 exchange in progress, on the server side
// of the xdg-go/scram library.
type scramLogin struct {
	conv *scram.ServerConversation
	user *authUser // nil: an unknown user, checked against fake keys
}

func (a *authState) startScram(set *userSet) *scramLogin {
	l := &scramLogin{}
	srv, err := scram.SHA256.NewServer(func(name string) (scram.StoredCredentials, error) {
		if u := set.users[name]; u != nil {
			l.user = u
			return u.creds, nil
		}
		return a.fakeCredentials(name), nil
	})
	if err != nil {
		panic("server: SCRAM server: " + err.Error()) // the library never fails here
	}
	l.conv = srv.NewConversation()
	return l
}

// finish takes the client-final message; it returns the server-final one
// and the user, or an error.
func (l *scramLogin) finish(clientFinal string) (string, *authUser, error) {
	serverFinal, err := l.conv.Step(clientFinal)
	switch {
	case err != nil || !l.conv.Valid() || l.user == nil:
		// A wrong proof and an unknown user read the same (the library's
		// own words differ for malformed messages; they tell nothing).
		return "", nil, errBadCredentials
	case l.conv.AuthzID() != "" && l.conv.AuthzID() != l.user.name:
		return "", nil, fmt.Errorf("authorization identity %q is not the user", l.conv.AuthzID())
	}
	return serverFinal, l.user, nil
}

var errBadCredentials = errors.New("unknown user or wrong password")

// parsePlain splits RFC 4616's message: authzid NUL authcid NUL passwd.
func parsePlain(b []byte) (authzid, user, password string, ok bool) {
	first := -1
	for i, c := range b {
		if c != 0 {
			continue
		}
		if first >= 0 {
			return string(b[:first]), string(b[first+1 : i]), string(b[i+1:]), !slices.Contains(b[i+1:], 0)
		}
		first = i
	}
	return "", "", "", false
}

// authFailures is one source's recent failed logins.
type authFailures struct {
	count int
	last  time.Time
}

// authLimiter delays the answers to failed logins per source address.
type authLimiter struct {
	mu      sync.Mutex
	sources map[netip.Addr]authFailures // guarded by mu
}

// failed records a failed login from src and returns how long to wait
// before answering it.
func (l *authLimiter) failed(src netip.Addr, now time.Time) time.Duration {
	l.mu.Lock()
	defer l.mu.Unlock()
	f, ok := l.sources[src]
	if ok && now.Sub(f.last) > authFailureWindow {
		f = authFailures{}
	}
	if !ok && len(l.sources) >= authSourcesMax {
		for a, g := range l.sources {
			if now.Sub(g.last) > authFailureWindow {
				delete(l.sources, a)
			}
		}
		if len(l.sources) >= authSourcesMax {
			return authDelayMax
		}
	}
	f.count++
	f.last = now
	l.sources[src] = f
	return authDelay(f.count)
}

// succeeded forgets src's failures.
func (l *authLimiter) succeeded(src netip.Addr) {
	l.mu.Lock()
	delete(l.sources, src)
	l.mu.Unlock()
}

// authDelay is the delay after n failures in a row: authDelayBase
// doubled n-1 times, at most authDelayMax.
func authDelay(n int) time.Duration {
	if n < 1 {
		return 0
	}
	d := authDelayBase
	for i := 1; i < n && d < authDelayMax; i++ {
		d *= 2
	}
	return min(d, authDelayMax)
}

// remoteIP is the client's address without port (unspecified if unknown).
func remoteIP(a net.Addr) netip.Addr {
	if t, ok := a.(*net.TCPAddr); ok {
		return t.AddrPort().Addr().Unmap()
	}
	if a == nil {
		return netip.Addr{}
	}
	ap, err := netip.ParseAddrPort(a.String())
	if err != nil {
		return netip.Addr{}
	}
	return ap.Addr().Unmap()
}

// loopbackListen reports whether a listen address only takes clients on
// this machine: a loopback IP or "localhost". An empty host listens on
// every interface.
func loopbackListen(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false
	}
	if host == "localhost" {
		return true
	}
	ip, err := netip.ParseAddr(host)
	return err == nil && ip.IsLoopback()
}

// startAuth reads the users (when there is a controller) and refuses a
// client address off loopback when there are none. It runs in Start
// before the client listeners.
func (s *Server) startAuth() (applied uint64, err error) {
	if s.ctl != nil || s.ctlClient != nil {
		ctx, cancel := context.WithTimeout(context.Background(), wiringTimeout)
		defer cancel()
		cl := s.brokerClient()
		for {
			var users []ctlapi.User
			applied, err = cl.WaitChange(ctx, 0) // answers at once with the applied index
			if err == nil {
				users, err = cl.GetUsers(ctx, ctlapi.ReadFollower)
			}
			if err == nil {
				s.auth.setUsers(users)
				break
			}
			if ctx.Err() != nil {
				return 0, fmt.Errorf("server: reading the users from the controller: %w", err)
			}
			time.Sleep(authUsersRetry / 5)
		}
	}
	if len(s.auth.users.Load().users) > 0 {
		return applied, nil
	}
	for _, l := range []struct{ flag, addr string }{{"-listen", s.cfg.ClientAddr}, {"-listen-tls", s.cfg.TLSAddr}} {
		if l.addr == "" || loopbackListen(l.addr) {
			continue
		}
		how := "start berthd with a loopback " + l.flag + " (127.0.0.1:7400), add a user with 'berthctl users add NAME' (password on standard input), then restart it on " + l.addr
		if s.ctl == nil && s.ctlClient == nil {
			how = "users live in the controller: run berthd with -data and -controller, " + how
		}
		return 0, fmt.Errorf("server: %s %s is not a loopback address and no users are defined, so no client could log in there (the default user logs in from loopback only): %s", l.flag, l.addr, how)
	}
	return applied, nil
}

// watchUsers keeps s.auth's users in step with the controller (see the
// top of this file). It runs until Close, counted in regWG.
func (s *Server) watchUsers(applied uint64) {
	defer s.regWG.Done()
	cl := s.brokerClient()
	s.followApplied(applied, authUsersRetry, func() time.Duration { return authUsersRefreshMin }, func() bool {
		ctx, cancel := context.WithTimeout(s.regCtx, wiringTimeout)
		users, err := cl.GetUsers(ctx, ctlapi.ReadFollower)
		cancel()
		if err != nil {
			if s.regCtx.Err() == nil {
				s.log.Warn("server: reading the users from the controller failed; keeping the ones known", "err", err)
				s.pauseReg(authUsersRetry)
			}
			return false
		}
		if s.auth.setUsers(users) {
			s.log.Info("server: users changed", "users", len(users))
		}
		return true
	})
}
