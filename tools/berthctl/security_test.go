package main

import (
	"bytes"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/berthmq/berth/internal/certgen"
	"github.com/berthmq/berth/internal/testutil"
	"github.com/berthmq/berth/journal"
	"github.com/berthmq/berth/server"
)

// TestSecuredBroker: credentials made by "berthctl certs init" verify and
// run a broker with TLS on every port: the client port (mutual TLS), the
// controller (cluster mutual TLS and secret) and the admin HTTPS (token).
// berthctl reaches each with the matching flags and is refused without
// them.
func TestSecuredBroker(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "certs")
	var stdout, stderr bytes.Buffer
	if code := run([]string{"certs", "init", dir, "--nodes", "2"}, &stdout, &stderr); code != exitOK {
		t.Fatalf("certs init: exit %d: %s", code, stderr.String())
	}
	f := certgen.Paths(dir, 2)
	if err := certgen.Verify(f, "127.0.0.1"); err != nil {
		t.Fatal(err)
	}
	if code := run([]string{"certs", "init", dir}, &stdout, &stderr); code == exitOK {
		t.Fatal("a second certs init into the same directory succeeded")
	}
	token, err := os.ReadFile(f.AdminToken)
	if err != nil {
		t.Fatal(err)
	}
	cfg := server.DefaultConfig()
	cfg.ClientAddr, cfg.TLSAddr, cfg.AdminAddr, cfg.ControllerAddr = "127.0.0.1:0", "127.0.0.1:0", "127.0.0.1:0", testutil.FreeAddr(t)
	cfg.TLSCert, cfg.TLSKey, cfg.TLSClientCA = f.NodeCerts[0], f.NodeKey[0], f.CA
	cfg.ClusterCA, cfg.ClusterCert, cfg.ClusterKey, cfg.ClusterSecretFile = f.CA, f.NodeCerts[0], f.NodeKey[0], f.Secret
	cfg.AdminToken, cfg.AdminTLSCert, cfg.AdminTLSKey = strings.TrimSpace(string(token)), f.NodeCerts[0], f.NodeKey[0]
	cfg.DataDir, cfg.Fsync = t.TempDir(), journal.FsyncNever
	cfg.Logger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelError}))
	s, err := server.Start(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()

	cluster := []string{"--cluster-ca", f.CA, "--cluster-cert", f.ClientCert, "--cluster-key", f.ClientKey, "--cluster-secret-file", f.Secret}
	ctlRun := func(stdin string, args ...string) (int, string) {
		full := append([]string{"--controller", s.ControllerAddr(), "--admin", s.AdminAddr(), "--broker", s.TLSAddr(), "--tls-ca", f.CA, "--timeout", "5s"}, args...)
		var out, errOut bytes.Buffer
		code := runIO(full, strings.NewReader(stdin), &out, &errOut)
		return code, out.String() + errOut.String()
	}
	with := func(extra []string, args ...string) []string { return append(append([]string(nil), extra...), args...) }

	if code, out := ctlRun("pw-of-admin\n", "users", "add", "admin"); code == exitOK || !strings.Contains(out, "--cluster-secret-file") {
		t.Fatalf("users add without the cluster credentials: exit %d, %s; want a failure naming the flags", code, out)
	}
	if code, out := ctlRun("pw-of-admin\n", with(cluster, "users", "--configure", ".*", "--write", ".*", "--read", ".*", "add", "admin")...); code != exitOK {
		t.Fatalf("users add: %d %s", code, out)
	}
	adminToken := []string{"--admin-token", cfg.AdminToken}
	if code, out := ctlRun("", with(cluster, "status")...); code == exitOK {
		t.Fatalf("status without the admin token succeeded: %s", out)
	} else if !strings.Contains(out, "401") {
		t.Fatalf("status without the admin token: %s, want a 401", out)
	}
	if code, out := ctlRun("", with(append(cluster, adminToken...), "status")...); code != exitOK {
		t.Fatalf("status: %d %s", code, out)
	}
	// The token from the environment.
	t.Setenv("BERTH_ADMIN_TOKEN", cfg.AdminToken)
	if code, out := ctlRun("", "queues"); code != exitOK {
		t.Fatalf("queues with BERTH_ADMIN_TOKEN: %d %s", code, out)
	}
	t.Setenv("BERTH_ADMIN_TOKEN", "")

	// The client port over mutual TLS: EXTERNAL maps the certificate's CN
	// ("admin") to the user, once the broker has read it.
	external := []string{"--tls-cert", f.ClientCert, "--tls-key", f.ClientKey}
	testutil.WaitFor(t, 10*time.Second, func() error {
		if code, out := ctlRun("", with(external, "declare-queue", "q-external")...); code != exitOK {
			return &cmdError{out}
		}
		return nil
	})
	if code, out := ctlRun("", with(external, "--user", "admin", "--password", "pw-of-admin", "declare-queue", "q-scram")...); code != exitOK {
		t.Fatalf("declare-queue with SCRAM over TLS: %d %s", code, out)
	}
	if code, out := ctlRun("", with(external, "--user", "admin", "--password", "wrong", "declare-queue", "q-bad")...); code == exitOK {
		t.Fatalf("a wrong password declared a queue: %s", out)
	}
	// Without a client certificate the broker's mutual TLS refuses us.
	if code, out := ctlRun("", "--user", "admin", "--password", "pw-of-admin", "declare-queue", "q-nocert"); code == exitOK {
		t.Fatalf("declare-queue without a client certificate succeeded: %s", out)
	}
	// The admin HTTPS with basic auth as the administrator.
	code, out := ctlRun("", "--user", "admin", "--password", "pw-of-admin", "queues")
	if code != exitOK || !strings.Contains(out, "q-external") || !strings.Contains(out, "q-scram") || strings.Contains(out, "q-bad") {
		t.Fatalf("queues as admin: %d %s", code, out)
	}
}

type cmdError struct{ out string }

func (e *cmdError) Error() string { return e.out }
