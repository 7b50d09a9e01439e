package server_test

import (
	"crypto/tls"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/berthmq/berth/internal/testutil"
	"github.com/berthmq/berth/server"
)

const adminToken = "test-admin-token-0123456789"

type adminReq struct {
	t      *testing.T
	client *http.Client
	base   string
}

func (a adminReq) get(path string, set func(*http.Request)) (int, http.Header) {
	a.t.Helper()
	req, err := http.NewRequest(http.MethodGet, a.base+path, nil)
	if err != nil {
		a.t.Fatal(err)
	}
	if set != nil {
		set(req)
	}
	resp, err := a.client.Do(req)
	if err != nil {
		a.t.Fatalf("GET %s: %v", path, err)
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<20))
	resp.Body.Close()
	return resp.StatusCode, resp.Header
}

func bearer(tok string) func(*http.Request) {
	return func(r *http.Request) { r.Header.Set("Authorization", "Bearer "+tok) }
}

func basic(user, pw string) func(*http.Request) {
	return func(r *http.Request) { r.SetBasicAuth(user, pw) }
}

// TestAdminAuth: with an admin token and a certificate, the admin port
// serves HTTPS only; /healthz, /readyz and /metrics answer anyone; every
// /v1 endpoint, the console and pprof answer the token or an
// administrator's basic auth, refuse a user without configure .* (403)
// and everyone else (401 with a Basic challenge).
func TestAdminAuth(t *testing.T) {
	certs := testutil.NewCerts(t, "alice")
	s := startUsersServer(t, func(c *server.Config) {
		c.AdminToken = adminToken
		c.AdminTLSCert, c.AdminTLSKey = certs.CertFile, certs.KeyFile
	})
	a := adminReq{t: t, base: "https://" + s.AdminAddr(),
		client: &http.Client{Timeout: 15 * time.Second, Transport: &http.Transport{TLSClientConfig: certs.ClientTLS(false)}}}

	// Plain HTTP on the HTTPS port gets nothing served.
	if resp, err := http.Get("http://" + s.AdminAddr() + "/v1/status"); err == nil {
		resp.Body.Close()
		if resp.StatusCode == http.StatusOK {
			t.Fatal("plain HTTP served on the HTTPS admin port")
		}
	}
	for _, p := range []string{"/healthz", "/readyz", "/metrics"} {
		if code, _ := a.get(p, nil); code == http.StatusUnauthorized || code == http.StatusForbidden {
			t.Errorf("%s: %d without credentials, want it open", p, code)
		}
	}
	// The admin certificate's expiry is exported, as the certificate says.
	resp, err := a.client.Get(a.base + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	pair, err := tls.LoadX509KeyPair(certs.CertFile, certs.KeyFile)
	if err != nil {
		t.Fatal(err)
	}
	want := fmt.Sprintf(`berth_tls_certificate_expiry_timestamp_seconds{port="admin"} %g`, float64(pair.Leaf.NotAfter.Unix()))
	if !strings.Contains(string(body), want) {
		t.Errorf("/metrics lacks %q", want)
	}
	for _, p := range []string{"/v1/status", "/v1/queues", "/ui/", "/debug/pprof/cmdline"} {
		code, h := a.get(p, nil)
		if code != http.StatusUnauthorized || !strings.HasPrefix(h.Get("WWW-Authenticate"), "Basic") {
			t.Errorf("%s without credentials: %d %q, want 401 with a Basic challenge", p, code, h.Get("WWW-Authenticate"))
		}
		if code, _ := a.get(p, bearer(adminToken)); code == http.StatusUnauthorized || code == http.StatusForbidden {
			t.Errorf("%s with the token: %d", p, code)
		}
		if code, _ := a.get(p, bearer(adminToken+"x")); code != http.StatusUnauthorized {
			t.Errorf("%s with a wrong token: %d, want 401", p, code)
		}
		if code, _ := a.get(p, basic("admin", "admin-pw")); code == http.StatusUnauthorized || code == http.StatusForbidden {
			t.Errorf("%s as admin: %d", p, code)
		}
		if code, _ := a.get(p, basic("alice", "alice-pw")); code != http.StatusForbidden {
			t.Errorf("%s as alice (configure alice-.*): %d, want 403", p, code)
		}
		if code, _ := a.get(p, basic("admin", "wrong")); code != http.StatusUnauthorized {
			t.Errorf("%s with a wrong password: %d, want 401", p, code)
		}
		if code, _ := a.get(p, basic("nobody", "admin-pw")); code != http.StatusUnauthorized {
			t.Errorf("%s as an unknown user: %d, want 401", p, code)
		}
		if code, _ := a.get(p, bearer(adminToken)); code == http.StatusUnauthorized {
			t.Errorf("%s: the token stopped working", p)
		}
	}
}

// TestAdminLoopbackOpen: on loopback with no token, the admin HTTP stays
// open as before (single-node development), over plain HTTP.
func TestAdminLoopbackOpen(t *testing.T) {
	s := startServer(t, func(c *server.Config) { c.AdminAddr = "127.0.0.1:0" })
	resp, err := http.Get("http://" + s.AdminAddr() + "/v1/status")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("/v1/status on loopback without a token: %d", resp.StatusCode)
	}
}

// TestAdminRefusedConfigs: an admin address off loopback that nobody
// could open (no token, no controller for users), a short token, a
// certificate without its key: each stops the start with what to do,
// before anything listens.
func TestAdminRefusedConfigs(t *testing.T) {
	for name, tc := range map[string]struct {
		mutate func(*server.Config)
		want   string
	}{
		"wildcard without token": {func(c *server.Config) { c.AdminAddr = "0.0.0.0:0"; c.ControllerAddr = "" }, "-admin-token"},
		"short token":            {func(c *server.Config) { c.AdminAddr = "127.0.0.1:0"; c.AdminToken = "short" }, "at least"},
		"cert without key":       {func(c *server.Config) { c.AdminAddr = "127.0.0.1:0"; c.AdminTLSCert = "x.pem" }, "-admin-tls-key"},
	} {
		cfg := server.DefaultConfig()
		cfg.ClientAddr, cfg.DataDir, cfg.ControllerAddr = "127.0.0.1:0", t.TempDir(), testutil.FreeAddr(t)
		cfg.Logger = testLogger(t)
		tc.mutate(&cfg)
		s, err := server.Start(cfg)
		if err == nil {
			s.Close()
			t.Fatalf("%s: started", name)
		}
		if !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want it to say %q", name, err, tc.want)
		}
	}
}

// TestAdminAuthControllerOnly: a controller-only node's admin HTTP checks
// basic auth against the users of its own controller, as a broker's does.
func TestAdminAuthControllerOnly(t *testing.T) {
	cfg := server.DefaultConfig()
	cfg.Role, cfg.ControllerAddr, cfg.AdminAddr, cfg.AdminToken = server.RoleController, testutil.FreeAddr(t), "127.0.0.1:0", adminToken
	cfg.DataDir, cfg.Logger = t.TempDir(), testLogger(t)
	s, err := server.Start(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	testutil.AddUser(t, s.ControllerAddr(), "admin", "admin-pw", allPerms)
	a := adminReq{t: t, base: "http://" + s.AdminAddr(), client: &http.Client{Timeout: 15 * time.Second}}
	if code, _ := a.get("/v1/status", nil); code != http.StatusUnauthorized {
		t.Fatalf("/v1/status without credentials: %d, want 401", code)
	}
	testutil.WaitUntil(t, 10*time.Second, "the admin user is known", func() bool {
		code, _ := a.get("/v1/status", basic("admin", "admin-pw"))
		return code == http.StatusOK
	})
	if code, _ := a.get("/v1/status", basic("admin", "wrong")); code != http.StatusUnauthorized {
		t.Fatalf("a wrong password: %d, want 401", code)
	}
	if code, _ := a.get("/v1/status", bearer(adminToken)); code != http.StatusOK {
		t.Fatalf("the token: %d", code)
	}
}
