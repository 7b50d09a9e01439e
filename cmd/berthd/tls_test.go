package main

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/berthmq/berth/client"
	"github.com/berthmq/berth/internal/testutil"
)

// TestSIGHUPReloadsTLS runs berthd with a TLS listener, replaces its
// certificate files and sends SIGHUP: new clients get the new
// certificate, the connection opened before keeps working, and berthd
// still stops cleanly on SIGTERM.
func TestSIGHUPReloadsTLS(t *testing.T) {
	dir := t.TempDir()
	certs := testutil.NewCerts(t, "app")
	plain, tlsAddr := testutil.FreeAddr(t), testutil.FreeAddr(t)
	p := testutil.StartBerthd(t, filepath.Join(dir, "berthd.log"), "-listen", plain, "-listen-tls", tlsAddr,
		"-tls-cert", certs.CertFile, "-tls-key", certs.KeyFile, "-admin", "", "-data", "", "-shards", "1", "-loops", "1")
	p.WaitPort(t, tlsAddr, 20*time.Second)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	dial := func(certs *testutil.Certs) (*client.Conn, error) {
		return client.DialConfig(ctx, client.Config{TLS: certs.ClientTLS(false)}, tlsAddr)
	}
	before, err := dial(certs)
	if err != nil {
		t.Fatalf("%v\n%s", err, p.LogTail())
	}
	defer before.Close()
	if err := before.DeclareQueue(ctx, "q", client.QueueOptions{}); err != nil {
		t.Fatal(err)
	}
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
	if err := p.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, 10*time.Second, func() error {
		c, err := dial(fresh)
		if err != nil {
			return err
		}
		return c.Close()
	})
	if c, err := dial(certs); err == nil {
		c.Close()
		t.Fatal("after SIGHUP a client trusting only the old CA still got a session")
	}
	if err := before.Publish(ctx, "", "q", []byte("x"), client.PublishOptions{}); err != nil {
		t.Fatalf("connection from before SIGHUP: %v", err)
	}
	p.Stop(t, syscall.SIGTERM, 20*time.Second)
	if err := p.Wait(t, time.Second); err != nil {
		t.Fatalf("exit after SIGTERM: %v\n%s", err, p.LogTail())
	}
}

// TestSIGHUPWithoutTLSIsIgnored: berthd with no certificates logs a
// SIGHUP, keeps serving (OPERATIONS.md said Go would end the process on
// it) and still stops cleanly on SIGTERM.
func TestSIGHUPWithoutTLSIsIgnored(t *testing.T) {
	dir := t.TempDir()
	addr := testutil.FreeAddr(t)
	p := testutil.StartBerthd(t, filepath.Join(dir, "berthd.log"), "-listen", addr, "-admin", "", "-data", "", "-shards", "1", "-loops", "1")
	p.WaitPort(t, addr, 20*time.Second)
	if err := p.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	testutil.WaitUntil(t, 10*time.Second, "the SIGHUP logged", func() bool {
		return strings.Contains(p.LogTail(), "SIGHUP ignored: no TLS certificates in use")
	})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := client.Dial(ctx, addr)
	if err != nil {
		t.Fatalf("after SIGHUP: %v\n%s", err, p.LogTail())
	}
	if err := c.DeclareQueue(ctx, "q", client.QueueOptions{}); err != nil {
		t.Fatal(err)
	}
	c.Close()
	p.Stop(t, syscall.SIGTERM, 20*time.Second)
	if err := p.Wait(t, time.Second); err != nil {
		t.Fatalf("exit after SIGHUP and SIGTERM: %v\n%s", err, p.LogTail())
	}
}
