package server_test

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/berthmq/berth/client"
	"github.com/berthmq/berth/controlplane/ctlapi"
	"github.com/berthmq/berth/internal/testutil"
	"github.com/berthmq/berth/server"
	"github.com/berthmq/berth/wire"
)

var (
	allPerms   = ctlapi.Permissions{Configure: ".*", Write: ".*", Read: ".*"}
	alicePerms = ctlapi.Permissions{Configure: "alice-.*", Write: "alice-.*|pub-.*", Read: "alice-.*"}
)

// startUsersServer starts a broker with a controller and two users:
// admin, who may do anything, and alice (alicePerms). It returns once
// the broker knows them.
func startUsersServer(t *testing.T, mutate ...func(*server.Config)) *server.Server {
	t.Helper()
	s := startServer(t, append([]func(*server.Config){func(c *server.Config) {
		c.ControllerAddr = testutil.FreeAddr(t)
		c.AdminAddr = "127.0.0.1:0"
	}}, mutate...)...)
	testutil.AddUser(t, s.ControllerAddr(), "admin", "admin-pw", allPerms)
	testutil.AddUser(t, s.ControllerAddr(), "alice", "alice-pw", alicePerms)
	testutil.WaitFor(t, 10*time.Second, func() error {
		return login(s.ClientAddr(), client.Config{User: "alice", Password: "alice-pw"})
	})
	return s
}

// login dials, and closes the session at once if it opened.
func login(addr string, cfg client.Config) error {
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	c, err := client.DialConfig(ctx, cfg, addr)
	if err != nil {
		return err
	}
	return c.Close()
}

func dialAs(t *testing.T, addr string, cfg client.Config) *client.Conn {
	t.Helper()
	c, err := client.DialConfig(ctxT(t), cfg, addr)
	if err != nil {
		t.Fatalf("login %s/%s: %v", cfg.User, cfg.Mechanism, err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// wantAuthFailed checks that err is a refused login whose text holds want.
func wantAuthFailed(t *testing.T, err error, want string) {
	t.Helper()
	var e *client.Error
	if !errors.As(err, &e) || e.Code != wire.CodeAuthFailed || !strings.Contains(e.Text, want) {
		t.Fatalf("got %v, want auth-failed saying %q", err, want)
	}
}

// rawHello sends a HELLO by hand and returns the first ERROR's code and
// text (or the frame type that came instead).
func rawHello(t *testing.T, addr string, versions []wire.Version, mechanism string, auth []byte) (wire.ErrorCode, string) {
	t.Helper()
	nc, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	_ = nc.SetDeadline(time.Now().Add(15 * time.Second))
	if _, err := nc.Write(wire.AppendHello(nil, versions, "raw", mechanism, auth, 0, 0)); err != nil {
		t.Fatal(err)
	}
	buf, _ := io.ReadAll(nc)
	h, body, _, err := wire.Next(buf, wire.FrameSizeMax)
	if err != nil || h.Type != wire.TypeError {
		t.Fatalf("answer to HELLO %s: %v (%v), want ERROR", mechanism, h.Type, err)
	}
	var e wire.Error
	if err := wire.DecodeError(body, &e); err != nil {
		t.Fatal(err)
	}
	return e.Code, string(e.Text)
}

func TestLoginMechanisms(t *testing.T) {
	certs := testutil.NewCerts(t, "alice")
	s := startUsersServer(t, func(c *server.Config) {
		c.TLSAddr, c.TLSCert, c.TLSKey, c.TLSClientCA = "127.0.0.1:0", certs.CertFile, certs.KeyFile, certs.CAFile
	})
	plain, tlsAddr := s.ClientAddr(), s.TLSAddr()
	mutual := certs.ClientTLS(true)
	// A success resets the source's failure delay, so each refusal below
	// waits the first delay only.
	reset := func() {
		t.Helper()
		if err := login(plain, client.Config{User: "admin", Password: "admin-pw"}); err != nil {
			t.Fatal(err)
		}
	}
	refused := func(addr string, cfg client.Config, want string) {
		t.Helper()
		wantAuthFailed(t, login(addr, cfg), want)
		reset()
	}

	t.Run("scram", func(t *testing.T) {
		if err := login(plain, client.Config{User: "alice", Password: "alice-pw", Mechanism: wire.MechScramSHA256}); err != nil {
			t.Fatal(err)
		}
		if err := login(tlsAddr, client.Config{User: "alice", Password: "alice-pw", TLS: mutual}); err != nil {
			t.Fatal(err)
		}
		wrong := login(plain, client.Config{User: "alice", Password: "nope"})
		reset()
		unknown := login(plain, client.Config{User: "mallory", Password: "nope"})
		reset()
		wantAuthFailed(t, wrong, "unknown user or wrong password")
		wantAuthFailed(t, unknown, "unknown user or wrong password")
		if wrong.Error() != unknown.Error() {
			t.Fatalf("an unknown user is told apart from a wrong password:\n%v\n%v", wrong, unknown)
		}
		// SCRAM needs the AUTH frames of 1.1: a 1.0 session is refused.
		code, text := rawHello(t, plain, []wire.Version{wire.Version10}, wire.MechScramSHA256, []byte("n,,n=alice,r=abcdefgh"))
		if code != wire.CodeAuthFailed || !strings.Contains(text, "1.1") {
			t.Fatalf("SCRAM on 1.0: %v %q", code, text)
		}
		reset()
	})
	t.Run("plain", func(t *testing.T) {
		refused(plain, client.Config{User: "alice", Password: "alice-pw", Mechanism: wire.MechPlain}, "plaintext listener")
		if err := login(tlsAddr, client.Config{User: "alice", Password: "alice-pw", Mechanism: wire.MechPlain, TLS: mutual}); err != nil {
			t.Fatal(err)
		}
		refused(tlsAddr, client.Config{User: "alice", Password: "nope", Mechanism: wire.MechPlain, TLS: mutual}, "unknown user or wrong password")
		refused(tlsAddr, client.Config{User: "mallory", Password: "alice-pw", Mechanism: wire.MechPlain, TLS: mutual}, "unknown user or wrong password")
	})
	t.Run("external", func(t *testing.T) {
		c := dialAs(t, tlsAddr, client.Config{Mechanism: wire.MechExternal, TLS: mutual})
		// The session is alice's: her permissions apply.
		if err := c.DeclareQueue(ctxT(t), "alice-ext", client.QueueOptions{}); err != nil {
			t.Fatal(err)
		}
		if err := c.DeclareQueue(ctxT(t), "bob-ext", client.QueueOptions{}); client.Code(err) != wire.CodeNotAllowed {
			t.Fatalf("alice by certificate declared bob-ext: %v", err)
		}
		// A certificate whose CN is no user.
		certFile, keyFile := certs.Issue(t, "bob", "bob", 0)
		pair, err := tls.LoadX509KeyPair(certFile, keyFile)
		if err != nil {
			t.Fatal(err)
		}
		bob := certs.ClientTLS(true)
		bob.Certificates = []tls.Certificate{pair}
		refused(tlsAddr, client.Config{Mechanism: wire.MechExternal, TLS: bob}, `no user "bob"`)
		// Claiming another identity than the certificate's.
		refused(tlsAddr, client.Config{Mechanism: wire.MechExternal, User: "admin", TLS: mutual}, "not the certificate's subject CN")
		// No certificate on the plaintext port.
		code, text := rawHello(t, plain, []wire.Version{wire.Current}, wire.MechExternal, nil)
		if code != wire.CodeAuthFailed || !strings.Contains(text, "certificate") {
			t.Fatalf("EXTERNAL on plaintext: %v %q", code, text)
		}
		reset()
	})
	t.Run("none", func(t *testing.T) {
		refused(plain, client.Config{}, "disabled once users exist")
		code, text := rawHello(t, plain, []wire.Version{wire.Current}, "KERBEROS_V5", nil)
		if code != wire.CodeAuthFailed || !strings.Contains(text, "unknown mechanism") {
			t.Fatalf("unknown mechanism: %v %q", code, text)
		}
		reset()
	})
	if n := metric(t, s, "berth_auth_failures_total"); n < 10 {
		t.Fatalf("berth_auth_failures_total %v after 10 failed logins", n)
	}
}

func TestPlainWithoutTLSWhenAllowed(t *testing.T) {
	s := startUsersServer(t, func(c *server.Config) { c.AllowPlainWithoutTLS = true })
	if err := login(s.ClientAddr(), client.Config{User: "alice", Password: "alice-pw", Mechanism: wire.MechPlain}); err != nil {
		t.Fatal(err)
	}
}

func TestDefaultUserWithoutUsers(t *testing.T) {
	s := startServer(t, func(c *server.Config) { c.ControllerAddr = testutil.FreeAddr(t) })
	c := dial(t, s) // mechanism none, from 127.0.0.1
	if err := c.DeclareQueue(ctxT(t), "anything", client.QueueOptions{}); err != nil {
		t.Fatal(err)
	}
	wantAuthFailed(t, login(s.ClientAddr(), client.Config{User: "alice", Password: "x"}), "unknown user or wrong password")
	// The first user disables the default one, for new sessions and for
	// the commands of open ones.
	testutil.AddUser(t, s.ControllerAddr(), "alice", "alice-pw", alicePerms)
	testutil.WaitFor(t, 10*time.Second, func() error {
		if err := c.DeclareQueue(ctxT(t), "anything-else", client.QueueOptions{}); client.Code(err) != wire.CodeNotAllowed {
			return fmt.Errorf("default user's declare after a user was added: %v", err)
		}
		return nil
	})
	wantAuthFailed(t, login(s.ClientAddr(), client.Config{}), "disabled once users exist")
}

func TestNonLoopbackStartNeedsUsers(t *testing.T) {
	for name, mutate := range map[string]func(*server.Config){
		"listen":             func(c *server.Config) { c.ClientAddr = "0.0.0.0:0" },
		"listen-controller":  func(c *server.Config) { c.ClientAddr = ":0"; c.ControllerAddr = testutil.FreeAddr(t) },
		"listen-tls-nowhere": func(c *server.Config) { c.TLSAddr = "0.0.0.0:0"; c.TLSCert, c.TLSKey = "x", "y" },
	} {
		t.Run(name, func(t *testing.T) {
			cfg := server.DefaultConfig()
			cfg.ClientAddr, cfg.AdminAddr, cfg.DataDir, cfg.Logger = "127.0.0.1:0", "", t.TempDir(), testLogger(t)
			mutate(&cfg)
			s, err := server.Start(cfg)
			if err == nil {
				_ = s.Close()
				t.Fatal("started on a non-loopback address with no users")
			}
			if !strings.Contains(err.Error(), "no users are defined") || !strings.Contains(err.Error(), "berthctl users add") {
				t.Fatalf("error does not say what to do: %v", err)
			}
		})
	}
}

func TestFailedLoginsSlowDown(t *testing.T) {
	s := startUsersServer(t)
	addr := s.ClientAddr()
	bad := client.Config{User: "alice", Password: "wrong"}
	// The delays double from 50 ms: a timer never fires early, so each
	// answer takes at least its delay, however slow the machine.
	const base = 50 * time.Millisecond
	var took []time.Duration
	for i := range 4 {
		start := time.Now()
		wantAuthFailed(t, login(addr, bad), "wrong password")
		took = append(took, time.Since(start))
		if min := base << i; took[i] < min {
			t.Fatalf("failure %d answered after %v, before its delay %v (all: %v)", i+1, took[i], min, took)
		}
	}
	if took[3] <= took[0] {
		t.Fatalf("repeated failures did not get slower: %v", took)
	}
	// While a refused login waits for its answer, the loops serve others.
	failures := metric(t, s, "berth_auth_failures_total")
	slow := make(chan time.Time, 1)
	go func() { _ = login(addr, bad); slow <- time.Now() }()
	testutil.WaitFor(t, 10*time.Second, func() error { // refused, answer pending
		if metric(t, s, "berth_auth_failures_total") == failures {
			return errors.New("the fifth failure is not counted yet")
		}
		return nil
	})
	c := dialAs(t, addr, client.Config{User: "admin", Password: "admin-pw"})
	if err := c.DeclareQueue(ctxT(t), "served-meanwhile", client.QueueOptions{}); err != nil {
		t.Fatal(err)
	}
	served := time.Now()
	if answered := <-slow; !served.Before(answered) {
		t.Fatalf("another client was served only after the delayed refusal")
	}
	// The success reset the delay.
	start := time.Now()
	wantAuthFailed(t, login(addr, bad), "wrong password")
	if d := time.Since(start); d >= took[3] {
		t.Fatalf("after a success a failure took %v, as long as the 4th in a row (%v)", d, took[3])
	}
}

// metric reads one counter from the admin endpoint.
func metric(t *testing.T, s *server.Server, name string) float64 {
	t.Helper()
	resp, err := http.Get("http://" + s.AdminAddr() + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	for _, line := range strings.Split(string(b), "\n") {
		var v float64
		if strings.HasPrefix(line, name+" ") {
			if _, err := fmt.Sscan(strings.TrimPrefix(line, name+" "), &v); err == nil {
				return v
			}
		}
	}
	t.Fatalf("no metric %s", name)
	return 0
}

// TestPermissions runs each class of command as alice (configure
// alice-.*, write alice-.*|pub-.*, read alice-.*) on names her patterns
// allow and on names they do not; a denial leaves the session open.
func TestPermissions(t *testing.T) {
	s := startUsersServer(t)
	addr := s.ClientAddr()
	admin := dialAs(t, addr, client.Config{User: "admin", Password: "admin-pw"})
	ctx := ctxT(t)
	for _, q := range []string{"alice-q", "alice-gone", "bob-q"} {
		if err := admin.DeclareQueue(ctx, q, client.QueueOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	for _, ex := range []string{"alice-ex", "pub-ex", "bob-ex"} {
		if err := admin.DeclareExchange(ctx, ex, client.Direct, client.ExchangeOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	for _, b := range [][2]string{{"alice-ex", "alice-q"}, {"bob-ex", "alice-q"}, {"alice-ex", "bob-q"}} {
		if err := admin.Bind(ctx, b[0], b[1], "k"); err != nil {
			t.Fatal(err)
		}
	}
	alice := dialAs(t, addr, client.Config{User: "alice", Password: "alice-pw"})
	subscribe := func(q string) error {
		c, err := alice.Subscribe(ctx, q, client.SubscribeOptions{})
		if err == nil {
			err = c.Cancel(ctx)
		}
		return err
	}
	cases := []struct {
		what   string
		denied string // "" = allowed; else what the error names
		run    func() error
	}{
		{"declare queue alice-new", "", func() error { return alice.DeclareQueue(ctx, "alice-new", client.QueueOptions{}) }},
		{"declare queue bob-new", `configure queue "bob-new"`, func() error { return alice.DeclareQueue(ctx, "bob-new", client.QueueOptions{}) }},
		{"declare queue dead-lettering to bob-ex", `write to exchange "bob-ex"`, func() error {
			return alice.DeclareQueue(ctx, "alice-dl", client.QueueOptions{DeadLetterExchange: "bob-ex"})
		}},
		{"declare exchange alice-x", "", func() error { return alice.DeclareExchange(ctx, "alice-x", client.Topic, client.ExchangeOptions{}) }},
		{"declare exchange bob-x", `configure exchange "bob-x"`, func() error { return alice.DeclareExchange(ctx, "bob-x", client.Topic, client.ExchangeOptions{}) }},
		{"bind alice-ex alice-new", "", func() error { return alice.Bind(ctx, "alice-ex", "alice-new", "k") }},
		{"bind bob-ex alice-new", `configure exchange "bob-ex"`, func() error { return alice.Bind(ctx, "bob-ex", "alice-new", "k") }},
		{"bind alice-ex bob-q", `configure queue "bob-q"`, func() error { return alice.Bind(ctx, "alice-ex", "bob-q", "x") }},
		{"unbind alice-ex alice-new", "", func() error { return alice.Unbind(ctx, "alice-ex", "alice-new", "k") }},
		{"unbind bob-ex alice-q", `configure exchange "bob-ex"`, func() error { return alice.Unbind(ctx, "bob-ex", "alice-q", "k") }},
		{"unbind alice-ex bob-q", `configure queue "bob-q"`, func() error { return alice.Unbind(ctx, "alice-ex", "bob-q", "k") }},
		{"publish to queue alice-q", "", func() error { return alice.Publish(ctx, "", "alice-q", []byte("m"), client.PublishOptions{}) }},
		{"publish to queue bob-q", `write to queue "bob-q"`, func() error { return alice.Publish(ctx, "", "bob-q", []byte("m"), client.PublishOptions{}) }},
		{"publish to exchange pub-ex", "", func() error { return alice.Publish(ctx, "pub-ex", "k", []byte("m"), client.PublishOptions{}) }},
		{"publish to exchange alice-ex", "", func() error { return alice.Publish(ctx, "alice-ex", "k", []byte("m"), client.PublishOptions{}) }},
		{"publish to exchange bob-ex", `write to exchange "bob-ex"`, func() error { return alice.Publish(ctx, "bob-ex", "k", []byte("m"), client.PublishOptions{}) }},
		{"subscribe alice-q", "", func() error { return subscribe("alice-q") }},
		{"subscribe bob-q", `read from queue "bob-q"`, func() error { return subscribe("bob-q") }},
		{"purge alice-q", "", func() error { return alice.Purge(ctx, "alice-q") }},
		{"purge bob-q", `read from queue "bob-q"`, func() error { return alice.Purge(ctx, "bob-q") }},
		{"delete queue alice-gone", "", func() error { return alice.DeleteQueue(ctx, "alice-gone", client.QueueDeleteOptions{}) }},
		{"delete queue bob-q", `configure queue "bob-q"`, func() error { return alice.DeleteQueue(ctx, "bob-q", client.QueueDeleteOptions{}) }},
		{"delete exchange alice-x", "", func() error { return alice.DeleteExchange(ctx, "alice-x", client.ExchangeDeleteOptions{}) }},
		{"delete exchange bob-ex", `configure exchange "bob-ex"`, func() error { return alice.DeleteExchange(ctx, "bob-ex", client.ExchangeDeleteOptions{}) }},
	}
	denials := metric(t, s, "berth_permission_denied_total")
	denied := 0
	for _, c := range cases {
		err := c.run()
		switch {
		case c.denied == "" && err != nil:
			t.Errorf("%s: refused: %v", c.what, err)
		case c.denied != "" && (client.Code(err) != wire.CodeNotAllowed || !strings.Contains(err.Error(), c.denied)):
			t.Errorf("%s: got %v, want not-allowed naming %s", c.what, err, c.denied)
		case c.denied != "":
			denied++
		}
	}
	if err := alice.Err(); err != nil {
		t.Fatalf("a denial closed the session: %v", err)
	}
	if got := metric(t, s, "berth_permission_denied_total") - denials; got != float64(denied) {
		t.Fatalf("berth_permission_denied_total grew by %v for %d denials", got, denied)
	}
	// Pipelined publishes to allowed and denied queues interleaved: each
	// message gets its own verdict.
	errs := make(chan error, 200)
	for i := range 200 {
		q := "alice-q"
		if i%2 == 1 {
			q = "bob-q"
		}
		if err := alice.PublishAsync(ctx, "", q, []byte("m"), client.PublishOptions{}, func(err error) { errs <- err }); err != nil {
			t.Fatal(err)
		}
	}
	okN, deniedN := 0, 0
	for range 200 {
		switch err := <-errs; client.Code(err) {
		case wire.CodeOK:
			okN++
		case wire.CodeNotAllowed:
			deniedN++
		default:
			t.Fatal(err)
		}
	}
	if okN != 100 || deniedN != 100 {
		t.Fatalf("pipelined publishes: %d completed, %d denied; want 100 and 100", okN, deniedN)
	}
}

// TestPermissionChangesReachOpenSessions changes and removes a user while
// its session is open.
func TestPermissionChangesReachOpenSessions(t *testing.T) {
	s := startUsersServer(t)
	ctx := ctxT(t)
	alice := dialAs(t, s.ClientAddr(), client.Config{User: "alice", Password: "alice-pw"})
	if err := alice.DeclareQueue(ctx, "alice-q", client.QueueOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := alice.Publish(ctx, "", "alice-q", []byte("m"), client.PublishOptions{}); err != nil {
		t.Fatal(err)
	}
	testutil.Propose(t, s.ControllerAddr(), &ctlapi.SetPermissions{Name: "alice", Permissions: ctlapi.Permissions{Configure: "alice-.*", Read: "alice-.*"}})
	testutil.WaitFor(t, 10*time.Second, func() error { // the cached verdict goes too
		if err := alice.Publish(ctx, "", "alice-q", []byte("m"), client.PublishOptions{}); client.Code(err) != wire.CodeNotAllowed {
			return fmt.Errorf("publish after write was taken away: %v", err)
		}
		return nil
	})
	testutil.Propose(t, s.ControllerAddr(), &ctlapi.RemoveUser{Name: "alice"})
	testutil.WaitFor(t, 10*time.Second, func() error {
		if err := alice.Purge(ctx, "alice-q"); client.Code(err) != wire.CodeNotAllowed || !strings.Contains(err.Error(), "no longer exists") {
			return fmt.Errorf("purge by a removed user: %v", err)
		}
		return nil
	})
	wantAuthFailed(t, login(s.ClientAddr(), client.Config{User: "alice", Password: "alice-pw"}), "wrong password")
}
