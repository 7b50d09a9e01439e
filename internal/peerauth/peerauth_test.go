package peerauth_test

import (
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/berthmq/berth/internal/certgen"
	"github.com/berthmq/berth/internal/peerauth"
	"github.com/berthmq/berth/internal/testutil"
)

type cluster struct {
	files certgen.Files
	dir   string
}

func newCluster(t *testing.T) cluster {
	t.Helper()
	dir := t.TempDir()
	f, err := certgen.Init(dir, certgen.Spec{Nodes: 2})
	if err != nil {
		t.Fatal(err)
	}
	return cluster{files: f, dir: dir}
}

func (c cluster) auth(t *testing.T, node int, tls, secret bool) *peerauth.Auth {
	t.Helper()
	var o peerauth.Options
	if tls {
		o.CAFile, o.CertFile, o.KeyFile = c.files.CA, c.files.NodeCerts[node], c.files.NodeKey[node]
	}
	if secret {
		o.SecretFile = c.files.Secret
	}
	a, err := peerauth.Load(o)
	if err != nil {
		t.Fatal(err)
	}
	return a
}

// serveOne accepts one connection, runs the server handshake and, if it
// succeeds, echoes one 4-byte message. The result is the handshake error.
func serveOne(t *testing.T, a *peerauth.Auth) (addr string, result chan error) {
	t.Helper()
	ln, err := net.Listen("tcp", testutil.FreeAddr(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	result = make(chan error, 1)
	go func() {
		nc, err := ln.Accept()
		if err != nil {
			result <- err
			return
		}
		defer nc.Close()
		conn, err := a.Server(nc)
		result <- err
		if err != nil {
			return
		}
		var b [4]byte
		if _, err := io.ReadFull(conn, b[:]); err == nil {
			_, _ = conn.Write(b[:])
		}
	}()
	return ln.Addr().String(), result
}

func dial(t *testing.T, addr string, a *peerauth.Auth) (net.Conn, error) {
	t.Helper()
	nc, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { nc.Close() })
	conn, err := a.Client(nc, addr)
	if err != nil {
		nc.Close()
		return nil, err
	}
	return conn, nil
}

func echo(t *testing.T, conn net.Conn) {
	t.Helper()
	if _, err := conn.Write([]byte("ping")); err != nil {
		t.Fatal(err)
	}
	var b [4]byte
	if _, err := io.ReadFull(conn, b[:]); err != nil || string(b[:]) != "ping" {
		t.Fatalf("echo after the handshake: %q, %v", b, err)
	}
}

func TestAccepted(t *testing.T) {
	c := newCluster(t)
	for _, tc := range []struct {
		name        string
		tls, secret bool
	}{{"secret", false, true}, {"mtls", true, false}, {"both", true, true}} {
		t.Run(tc.name, func(t *testing.T) {
			server := c.auth(t, 0, tc.tls, tc.secret)
			addr, result := serveOne(t, server)
			conn, err := dial(t, addr, c.auth(t, 1, tc.tls, tc.secret))
			if err != nil {
				t.Fatalf("client handshake: %v", err)
			}
			if err := <-result; err != nil {
				t.Fatalf("server handshake: %v", err)
			}
			echo(t, conn)
			if got := server.Refused.Load(); got != 0 {
				t.Fatalf("refused %d", got)
			}
		})
	}
}

func TestWrongSecret(t *testing.T) {
	c := newCluster(t)
	other := filepath.Join(t.TempDir(), "other")
	if err := os.WriteFile(other, []byte("another-secret-of-enough-length\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	wrong, err := peerauth.Load(peerauth.Options{SecretFile: other})
	if err != nil {
		t.Fatal(err)
	}
	server := c.auth(t, 0, false, true)
	addr, result := serveOne(t, server)
	if _, err := dial(t, addr, wrong); err == nil || !strings.Contains(err.Error(), "does not hold our cluster secret") {
		t.Fatalf("client with the wrong secret: %v", err)
	}
	if err := <-result; err == nil {
		t.Fatal("server accepted a client with the wrong secret")
	}
	if server.Refused.Load() != 1 {
		t.Fatalf("refused %d, want 1", server.Refused.Load())
	}
}

// TestForgedProof: a client that does not check the server's proof and
// sends a proof of its own making is refused with a verdict, not let in.
func TestForgedProof(t *testing.T) {
	c := newCluster(t)
	server := c.auth(t, 0, false, true)
	addr, result := serveOne(t, server)
	nc, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	hello := append([]byte("BPAUTH\x00\x01"), make([]byte, 32)...)
	if _, err := nc.Write(hello); err != nil {
		t.Fatal(err)
	}
	challenge := make([]byte, 64)
	if _, err := io.ReadFull(nc, challenge); err != nil {
		t.Fatal(err)
	}
	// Reflect the server's own proof back: the labels differ by role.
	if _, err := nc.Write(challenge[32:]); err != nil {
		t.Fatal(err)
	}
	var verdict [1]byte
	if _, err := io.ReadFull(nc, verdict[:]); err != nil || verdict[0] != 0 {
		t.Fatalf("verdict %v, %v; want a refusal", verdict, err)
	}
	if err := <-result; err == nil {
		t.Fatal("server accepted a reflected proof")
	}
}

func TestNoSecretOrGarbage(t *testing.T) {
	c := newCluster(t)
	for name, first := range map[string][]byte{
		"berth frame": {0xB3, 0x27, 0x01, 0x00, 0x40, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0},
		"garbage":     []byte("GET / HTTP/1.1\r\nHost: x\r\n\r\nxxxxxxxxxxxxxxxxxxxxxxx"),
	} {
		t.Run(name, func(t *testing.T) {
			for _, tls := range []bool{false, true} {
				server := c.auth(t, 0, tls, true)
				addr, result := serveOne(t, server)
				nc, err := net.Dial("tcp", addr)
				if err != nil {
					t.Fatal(err)
				}
				_, _ = nc.Write(first)
				if err := <-result; err == nil {
					t.Fatalf("tls=%v: server accepted %s", tls, name)
				}
				nc.Close()
				if server.Refused.Load() != 1 {
					t.Fatalf("refused %d, want 1", server.Refused.Load())
				}
			}
		})
	}
}

func TestWrongCA(t *testing.T) {
	c := newCluster(t)
	other := newCluster(t) // another cluster's CA and certificates
	server := c.auth(t, 0, true, false)

	// A client whose certificate another CA signed.
	addr, result := serveOne(t, server)
	conn, err := dial(t, addr, other.auth(t, 1, true, false))
	if err == nil {
		// TLS 1.3: the client finishes before the server checks its
		// certificate; the refusal shows on the first read.
		_, _ = conn.Write([]byte("ping"))
		var b [4]byte
		if _, err = io.ReadFull(conn, b[:]); err == nil {
			t.Fatal("a client of another CA got an echo")
		}
	}
	if err := <-result; err == nil {
		t.Fatal("server accepted a certificate of another CA")
	}

	// A client that trusts another CA refuses our server.
	addr, result = serveOne(t, server)
	if _, err := dial(t, addr, other.auth(t, 1, true, false)); err == nil {
		t.Fatal("client accepted a server of another CA")
	}
	<-result

	// A TLS client with no certificate at all.
	addr, result = serveOne(t, server)
	nc, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	plain, _ := peerauth.Load(peerauth.Options{})
	if plain != nil {
		t.Fatal("Load of no options is not nil")
	}
	if _, err := nc.Write([]byte{0x16, 0x03, 0x01, 0x00, 0x05, 1, 2, 3, 4, 5}); err != nil {
		t.Fatal(err)
	}
	if err := <-result; err == nil {
		t.Fatal("server accepted a broken TLS hello")
	}
	if got := server.Refused.Load(); got != 3 {
		t.Fatalf("refused %d, want 3", got)
	}
}

// TestServerWithoutSecret: a client with a secret meets a server without
// one: the server never sends a challenge, and the client says so.
func TestServerWithoutSecret(t *testing.T) {
	c := newCluster(t)
	ln, err := net.Listen("tcp", testutil.FreeAddr(t))
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		nc, err := ln.Accept()
		if err == nil {
			_, _ = io.Copy(io.Discard, io.LimitReader(nc, 40))
			nc.Close()
		}
	}()
	_, err = dial(t, ln.Addr().String(), c.auth(t, 1, false, true))
	if err == nil || !strings.Contains(err.Error(), "sent no challenge") {
		t.Fatalf("client: %v", err)
	}
}

func TestLoadErrors(t *testing.T) {
	c := newCluster(t)
	short := filepath.Join(t.TempDir(), "short")
	_ = os.WriteFile(short, []byte("tiny\n"), 0o600)
	for name, o := range map[string]peerauth.Options{
		"short secret":   {SecretFile: short},
		"missing secret": {SecretFile: filepath.Join(c.dir, "nope")},
		"ca only":        {CAFile: c.files.CA},
		"bad ca":         {CAFile: c.files.Secret, CertFile: c.files.NodeCerts[0], KeyFile: c.files.NodeKey[0]},
		"key mismatch":   {CAFile: c.files.CA, CertFile: c.files.NodeCerts[0], KeyFile: c.files.NodeKey[1]},
	} {
		if _, err := peerauth.Load(o); err == nil {
			t.Errorf("%s: loaded", name)
		}
	}
}

// TestAllowLog: one log line a second per direction, however many
// refusals.
func TestAllowLog(t *testing.T) {
	c := newCluster(t)
	a := c.auth(t, 0, false, true)
	if !a.AllowLog(false) || !a.AllowLog(true) {
		t.Fatal("the first refusal of each direction is not logged")
	}
	for range 100 {
		if a.AllowLog(false) || a.AllowLog(true) {
			t.Fatal("a second line within the interval")
		}
	}
}

// TestPendingBound: connections that open and say nothing hold at most
// PendingMax handshakes; the next is refused at once, not after the
// timeout.
func TestPendingBound(t *testing.T) {
	c := newCluster(t)
	a := c.auth(t, 0, false, true)
	ln, err := net.Listen("tcp", testutil.FreeAddr(t))
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	results := make(chan error, peerauth.PendingMax+1)
	go func() {
		for {
			nc, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer nc.Close()
				_, err := a.Server(nc)
				results <- err
			}()
		}
	}()
	var idle []net.Conn
	defer func() {
		for _, nc := range idle {
			nc.Close()
		}
	}()
	for range peerauth.PendingMax {
		nc, err := net.Dial("tcp", ln.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		idle = append(idle, nc)
	}
	// Wait for the listener to have started every handshake: the next
	// one is the one over the bound.
	testutil.WaitUntil(t, 5*time.Second, "idle handshakes pending", func() bool {
		return a.Pending() == peerauth.PendingMax
	})
	extra, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer extra.Close()
	select {
	case err := <-results:
		if err == nil || !strings.Contains(err.Error(), "in progress") {
			t.Fatalf("the connection over the bound: %v", err)
		}
	case <-time.After(3 * time.Second):
		t.Fatal("the connection over the bound waited for its handshake")
	}
}

// TestReload: Reload takes new certificate files; the next handshake uses
// them, so a rotated CA admits its members and no longer the old ones.
func TestReload(t *testing.T) {
	oldCA, newCA := newCluster(t), newCluster(t)
	dir := t.TempDir()
	ca, cert, key := filepath.Join(dir, "ca.pem"), filepath.Join(dir, "node.pem"), filepath.Join(dir, "node-key.pem")
	install := func(c cluster) {
		for dst, src := range map[string]string{ca: c.files.CA, cert: c.files.NodeCerts[0], key: c.files.NodeKey[0]} {
			b, err := os.ReadFile(src)
			if err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(dst, b, 0o600); err != nil {
				t.Fatal(err)
			}
		}
	}
	install(oldCA)
	server, err := peerauth.Load(peerauth.Options{CAFile: ca, CertFile: cert, KeyFile: key})
	if err != nil {
		t.Fatal(err)
	}
	try := func(client cluster) error {
		addr, result := serveOne(t, server)
		conn, err := dial(t, addr, client.auth(t, 1, true, false))
		if err == nil {
			echo(t, conn)
		}
		if serr := <-result; err == nil {
			err = serr
		}
		return err
	}
	if err := try(oldCA); err != nil {
		t.Fatalf("before the reload, a member of the old CA: %v", err)
	}
	install(newCA)
	if err := server.Reload(); err != nil {
		t.Fatal(err)
	}
	if err := try(newCA); err != nil {
		t.Fatalf("after the reload, a member of the new CA: %v", err)
	}
	addr, result := serveOne(t, server)
	if conn, err := dial(t, addr, oldCA.auth(t, 1, true, false)); err == nil {
		_, _ = conn.Write([]byte("ping"))
		var b [4]byte
		if _, err := io.ReadFull(conn, b[:]); err == nil {
			t.Fatal("after the reload, a member of the old CA got through")
		}
	}
	if err := <-result; err == nil {
		t.Fatal("after the reload, the server accepted the old CA")
	}
}
