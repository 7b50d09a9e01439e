package main

import (
	"context"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/berthmq/berth/controlplane/ctlapi"
	"github.com/berthmq/berth/controlplane/ctlclient"
	"github.com/berthmq/berth/internal/certgen"
	"github.com/berthmq/berth/internal/peerauth"
	"github.com/berthmq/berth/internal/testutil"
)

// TestSIGHUPReloadsClusterTLS runs berthd whose controller port requires
// cluster mutual TLS, rotates its CA, certificate and key on disk and
// sends SIGHUP: clients of the new CA get answers, clients of the old one
// no longer do, and berthd still stops cleanly.
func TestSIGHUPReloadsClusterTLS(t *testing.T) {
	dir := t.TempDir()
	oldCA, err := certgen.Init(filepath.Join(dir, "old"), certgen.Spec{Nodes: 1})
	if err != nil {
		t.Fatal(err)
	}
	newCA, err := certgen.Init(filepath.Join(dir, "new"), certgen.Spec{Nodes: 1})
	if err != nil {
		t.Fatal(err)
	}
	ca, cert, key := filepath.Join(dir, "ca.pem"), filepath.Join(dir, "node.pem"), filepath.Join(dir, "node-key.pem")
	install := func(f certgen.Files) {
		for dst, src := range map[string]string{ca: f.CA, cert: f.NodeCerts[0], key: f.NodeKey[0]} {
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
	ctlAddr := testutil.FreeAddr(t)
	p := testutil.StartBerthd(t, filepath.Join(dir, "berthd.log"), "-listen", testutil.FreeAddr(t), "-admin", "",
		"-data", filepath.Join(dir, "data"), "-controller", ctlAddr, "-shards", "1", "-loops", "1",
		"-cluster-ca", ca, "-cluster-cert", cert, "-cluster-key", key)
	p.WaitPort(t, ctlAddr, 20*time.Second)
	ask := func(f certgen.Files) error {
		a, err := peerauth.Load(peerauth.Options{CAFile: f.CA, CertFile: f.ClientCert, KeyFile: f.ClientKey})
		if err != nil {
			t.Fatal(err)
		}
		cl := ctlclient.NewClientAuth([]string{ctlAddr}, a)
		defer cl.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
		defer cancel()
		_, err = cl.GetClusterInfo(ctx, ctlapi.ReadUnsafe)
		return err
	}
	testutil.WaitFor(t, 10*time.Second, func() error { return ask(oldCA) })
	if ask(newCA) == nil {
		t.Fatal("a client of a CA not yet installed got an answer")
	}
	install(newCA)
	if err := p.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, 10*time.Second, func() error { return ask(newCA) })
	if ask(oldCA) == nil {
		t.Fatal("after SIGHUP a client of the old CA still got an answer")
	}
	p.Stop(t, syscall.SIGTERM, 20*time.Second)
	if err := p.Wait(t, time.Second); err != nil {
		t.Fatalf("exit after SIGTERM: %v\n%s", err, p.LogTail())
	}
}
