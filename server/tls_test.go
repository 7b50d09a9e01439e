package server_test

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"os"
	"testing"
	"time"

	"github.com/berthmq/berth/client"
	"github.com/berthmq/berth/internal/testutil"
	"github.com/berthmq/berth/server"
	"github.com/berthmq/berth/wire"
)

func startTLSServer(t *testing.T, certs *testutil.Certs, mutual bool, mutate ...func(*server.Config)) *server.Server {
	t.Helper()
	return startServer(t, append([]func(*server.Config){func(c *server.Config) {
		c.TLSAddr, c.TLSCert, c.TLSKey = "127.0.0.1:0", certs.CertFile, certs.KeyFile
		if mutual {
			c.TLSClientCA = certs.CAFile
		}
	}}, mutate...)...)
}

func dialTLS(t *testing.T, addr string, cfg *tls.Config) (*client.Conn, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c, err := client.DialConfig(ctx, client.Config{TLS: cfg}, addr)
	if err == nil {
		t.Cleanup(func() { _ = c.Close() })
	}
	return c, err
}

// Plaintext and TLS clients share the queues: what one publishes the other
// consumes, in order, and WELCOME lists the TLS address to a TLS client.
func TestTLSBesidePlaintext(t *testing.T) {
	certs := testutil.NewCerts(t, "app")
	s := startTLSServer(t, certs, false)
	if s.TLSAddr() == "" || s.TLSAddr() == s.ClientAddr() {
		t.Fatalf("TLS address %q beside plaintext %q", s.TLSAddr(), s.ClientAddr())
	}
	ctx := ctxT(t)
	tc, err := dialTLS(t, s.TLSAddr(), certs.ClientTLS(false))
	if err != nil {
		t.Fatal(err)
	}
	if got := tc.ServerAddrs(); len(got) != 1 || got[0] != s.TLSAddr() {
		t.Fatalf("WELCOME addresses %v over TLS, want [%s]", got, s.TLSAddr())
	}
	pc := dial(t, s)
	if err := tc.DeclareQueue(ctx, "q", client.QueueOptions{}); err != nil {
		t.Fatal(err)
	}
	const n = 3000
	payload := make([]byte, 1024)
	for i := 0; i < n; i++ {
		copy(payload, fmt.Sprint(i, "."))
		if err := pc.PublishAsync(ctx, "", "q", payload, client.PublishOptions{}, nil); err != nil {
			t.Fatal(err)
		}
	}
	if err := pc.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	con, err := tc.Subscribe(ctx, "q", client.SubscribeOptions{Credit: 500, AutoCredit: true})
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < n; i++ {
		d := next(t, con, 5*time.Second)
		want := fmt.Sprint(i, ".")
		if string(d.Payload[:len(want)]) != want || len(d.Payload) != 1024 {
			t.Fatalf("message %d over TLS: got %q... (%d bytes)", i, d.Payload[:8], len(d.Payload))
		}
		if err := d.Accept(ctx); err != nil {
			t.Fatal(err)
		}
	}
	// And the other way: TLS publishes, plaintext consumes.
	if err := con.Cancel(ctx); err != nil {
		t.Fatal(err)
	}
	if err := tc.Publish(ctx, "", "q", []byte("back"), client.PublishOptions{}); err != nil {
		t.Fatal(err)
	}
	pcon, err := pc.Subscribe(ctx, "q", client.SubscribeOptions{Credit: 1})
	if err != nil {
		t.Fatal(err)
	}
	if d := next(t, pcon, 5*time.Second); string(d.Payload) != "back" {
		t.Fatalf("plaintext consumer got %q", d.Payload)
	}
}

// The TLS port speaks nothing but TLS 1.2 or later.
func TestTLSRefusesPlaintextAndOldVersions(t *testing.T) {
	certs := testutil.NewCerts(t, "app")
	s := startTLSServer(t, certs, false)
	nc, err := net.DialTimeout("tcp", s.TLSAddr(), 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	if _, err := nc.Write(wire.AppendHello(nil, []wire.Version{wire.Current}, "plain", "none", nil, 0, 0)); err != nil {
		t.Fatal(err)
	}
	_ = nc.SetReadDeadline(time.Now().Add(5 * time.Second))
	buf := make([]byte, 512)
	n, _ := nc.Read(buf)
	if _, _, m, err := wire.Next(buf[:n], wire.FrameSizeMax); err == nil && m > 0 {
		t.Fatalf("the TLS port answered a plaintext HELLO with a frame: % x", buf[:n])
	}
	old := certs.ClientTLS(false)
	old.MinVersion, old.MaxVersion = tls.VersionTLS10, tls.VersionTLS11
	if _, err := dialTLS(t, s.TLSAddr(), old); err == nil {
		t.Fatal("a TLS 1.1 client got a session")
	}
	untrusting := &tls.Config{MinVersion: tls.VersionTLS12} // system roots only
	if _, err := dialTLS(t, s.TLSAddr(), untrusting); err == nil {
		t.Fatal("a client that does not trust the test CA got a session")
	}
	// The broker still serves.
	if _, err := dialTLS(t, s.TLSAddr(), certs.ClientTLS(false)); err != nil {
		t.Fatal(err)
	}
}

func TestTLSMutualNeedsClientCertificate(t *testing.T) {
	certs := testutil.NewCerts(t, "app")
	s := startTLSServer(t, certs, true)
	if c, err := dialTLS(t, s.TLSAddr(), certs.ClientTLS(false)); err == nil {
		// TLS 1.3 reports the refusal on the first read: the handshake
		// itself may look done to the client.
		ctx := ctxT(t)
		if err := c.DeclareQueue(ctx, "nocert", client.QueueOptions{}); err == nil {
			t.Fatal("a client without a certificate got a session on a mutual-TLS port")
		}
	}
	// A certificate from another CA is refused too.
	other := testutil.NewCerts(t, "intruder")
	cfg := certs.ClientTLS(false)
	cfg.Certificates = []tls.Certificate{other.Client}
	if c, err := dialTLS(t, s.TLSAddr(), cfg); err == nil {
		if err := c.DeclareQueue(ctxT(t), "othercert", client.QueueOptions{}); err == nil {
			t.Fatal("a client certificate from another CA got a session")
		}
	}
	c, err := dialTLS(t, s.TLSAddr(), certs.ClientTLS(true))
	if err != nil {
		t.Fatal(err)
	}
	if err := c.DeclareQueue(ctxT(t), "withcert", client.QueueOptions{}); err != nil {
		t.Fatal(err)
	}
}

// ReloadTLS swaps the certificate for new handshakes and leaves open
// connections alone.
func TestTLSReloadKeepsConnections(t *testing.T) {
	certs := testutil.NewCerts(t, "app")
	s := startTLSServer(t, certs, false)
	ctx := ctxT(t)
	old, err := dialTLS(t, s.TLSAddr(), certs.ClientTLS(false))
	if err != nil {
		t.Fatal(err)
	}
	if err := old.DeclareQueue(ctx, "r", client.QueueOptions{}); err != nil {
		t.Fatal(err)
	}
	// A new CA's server certificate, written over the same files.
	fresh := testutil.NewCerts(t, "app")
	for src, dst := range map[string]string{fresh.CertFile: certs.CertFile, fresh.KeyFile: certs.KeyFile} {
		b, err := os.ReadFile(src)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(dst, b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.ReloadTLS(); err != nil {
		t.Fatal(err)
	}
	if _, err := dialTLS(t, s.TLSAddr(), certs.ClientTLS(false)); err == nil {
		t.Fatal("after the reload a client trusting only the old CA still got a session")
	}
	if _, err := dialTLS(t, s.TLSAddr(), fresh.ClientTLS(false)); err != nil {
		t.Fatalf("after the reload, the new certificate: %v", err)
	}
	// The connection from before the reload still works.
	if err := old.Publish(ctx, "", "r", []byte("still here"), client.PublishOptions{}); err != nil {
		t.Fatalf("connection opened before the reload: %v", err)
	}
	// A broken file keeps the material in use.
	if err := os.WriteFile(certs.KeyFile, []byte("not a key"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := s.ReloadTLS(); err == nil {
		t.Fatal("ReloadTLS took a broken key")
	}
	if _, err := dialTLS(t, s.TLSAddr(), fresh.ClientTLS(false)); err != nil {
		t.Fatalf("after a failed reload: %v", err)
	}
}

// Close tells TLS clients it shuts down, as it tells plaintext ones.
func TestTLSCloseTellsClients(t *testing.T) {
	certs := testutil.NewCerts(t, "app")
	s := startTLSServer(t, certs, false)
	c, err := dialTLS(t, s.TLSAddr(), certs.ClientTLS(false))
	if err != nil {
		t.Fatal(err)
	}
	// A connection that never finishes its TLS handshake must not hold
	// Close up.
	idle, err := net.Dial("tcp", s.TLSAddr())
	if err != nil {
		t.Fatal(err)
	}
	defer idle.Close()
	done := make(chan error, 1)
	go func() { done <- s.Close() }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(8 * time.Second):
		t.Fatal("Close waited on a TLS connection")
	}
	select {
	case <-c.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("the TLS client did not see the server close")
	}
	var e *client.Error
	if !errors.As(c.Err(), &e) || e.Code != wire.CodeShutdown {
		t.Fatalf("client error %v, want shutdown", c.Err())
	}
}

// TestTLSPublisherWaitsForRoom: a TLS publisher far ahead of a shard
// whose ring holds 4 commands finds the ring full again and again; its
// reader parks until the ring has room (waitStalled) rather than sleeping
// and trying again, and every publish completes and is delivered once,
// in order.
func TestTLSPublisherWaitsForRoom(t *testing.T) {
	certs := testutil.NewCerts(t, "app")
	s := startTLSServer(t, certs, false, func(c *server.Config) {
		c.Shards, c.RingSize, c.AdminAddr = 1, 4, "127.0.0.1:0"
	})
	ctx := ctxT(t)
	tc, err := dialTLS(t, s.TLSAddr(), certs.ClientTLS(false))
	if err != nil {
		t.Fatal(err)
	}
	if err := tc.DeclareQueue(ctx, "q", client.QueueOptions{}); err != nil {
		t.Fatal(err)
	}
	const n = 20000
	for i := 0; i < n; i++ {
		if err := tc.PublishAsync(ctx, "", "q", []byte(fmt.Sprint(i)), client.PublishOptions{}, nil); err != nil {
			t.Fatal(err)
		}
	}
	if err := tc.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	full := scrape(t, s.AdminAddr())["berth_shard_ring_full_total{shard=\"0\"}"]
	t.Logf("the shard's ring was found full %v times", full)
	if full == 0 {
		t.Fatal("the ring was never full: the test did not reach the wait")
	}
	con, err := tc.Subscribe(ctx, "q", client.SubscribeOptions{Credit: 500, AutoCredit: true, AckMode: client.AckNone})
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < n; i++ {
		if d := next(t, con, 5*time.Second); string(d.Payload) != fmt.Sprint(i) {
			t.Fatalf("delivery %d over TLS: %q", i, d.Payload)
		}
	}
}
