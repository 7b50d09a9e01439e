package server

import (
	"crypto/sha256"
	"crypto/subtle"
	"crypto/tls"
	"errors"
	"fmt"
	"net/http"
	"net/netip"
	"time"
)

// Access to the admin HTTP. /healthz, /readyz, /metrics and /metrics/queues stay open (load
// balancers and Prometheus scrape them); everything else (/v1/*, /ui/,
// /debug/pprof/*) needs credentials when the admin address is not
// loopback, or whenever an admin token is set:
//
//   - "Authorization: Bearer TOKEN" with Config.AdminToken, compared in
//     constant time; or
//   - HTTP basic auth as a broker user (the controller's users, checked as
//     a PLAIN login is) whose configure permission is ".*": an
//     administrator, who may declare and delete anything anyway.
//
// A failed attempt is answered 401 after the same growing per-source delay
// as a failed client login, and counted in berth_auth_failures_total.
// With Config.AdminTLSCert and AdminTLSKey the admin port serves HTTPS
// only (reread on SIGHUP with the client port's material).

// adminOpen are the paths served without credentials.
var adminOpen = map[string]bool{"/healthz": true, "/readyz": true, "/metrics": true, "/metrics/queues": true}

// adminAuthRequired reports whether the admin HTTP on addr wants
// credentials.
func adminAuthRequired(addr, token string) bool {
	return token != "" || !loopbackListen(addr)
}

// validateAdmin refuses an admin token shorter than adminTokenLenMin, a
// certificate without its key or a key without its certificate, and an
// admin address off loopback that nobody could use: no token, and no
// controller to hold users.
func (c *Config) validateAdmin() error {
	if c.AdminAddr == "" {
		return nil
	}
	if c.AdminToken != "" && len(c.AdminToken) < adminTokenLenMin {
		return configErrorf([]string{"admin-token"}, "the admin token is %d characters, want at least %d (berthctl certs init writes one)", len(c.AdminToken), adminTokenLenMin)
	}
	if (c.AdminTLSCert == "") != (c.AdminTLSKey == "") {
		return configErrorf([]string{"admin-tls-cert", "admin-tls-key"}, "HTTPS on the admin port needs both -admin-tls-cert and -admin-tls-key")
	}
	if !adminAuthRequired(c.AdminAddr, c.AdminToken) {
		return nil
	}
	if c.AdminToken == "" && !c.controllerEmbedded() {
		return configErrorf([]string{"admin", "admin-token", "controller"}, "-admin %s is not a loopback address, and without users (a broker with a controller) only an admin token could open it: give -admin-token (BERTH_ADMIN_TOKEN), or a loopback -admin", c.AdminAddr)
	}
	return nil
}

// adminTokenLenMin is the shortest admin token accepted.
const adminTokenLenMin = 16

// guardAdmin wraps the admin mux with the access check.
func (s *Server) guardAdmin(next http.Handler) http.Handler {
	if !adminAuthRequired(s.cfg.AdminAddr, s.cfg.AdminToken) {
		return next
	}
	tokenSum := sha256.Sum256([]byte(s.cfg.AdminToken))
	s.adminLimiter.sources = map[netip.Addr]authFailures{}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if adminOpen[r.URL.Path] {
			next.ServeHTTP(w, r)
			return
		}
		src := netip.Addr{}
		if ap, err := netip.ParseAddrPort(r.RemoteAddr); err == nil {
			src = ap.Addr().Unmap()
		}
		status, why := s.adminAuthorized(r, &tokenSum)
		if status == http.StatusOK {
			s.adminLimiter.succeeded(src)
			next.ServeHTTP(w, r)
			return
		}
		s.sec.authFailures.Inc()
		if status == http.StatusUnauthorized {
			// Wrong credentials wait; a known user without the
			// permission does not (the password was right).
			t := time.NewTimer(s.adminLimiter.failed(src, time.Now()))
			select {
			case <-t.C:
			case <-r.Context().Done():
				t.Stop()
				return
			}
			w.Header().Set("WWW-Authenticate", `Basic realm="berth admin", charset="UTF-8"`)
		}
		http.Error(w, why, status)
	})
}

// adminAuthorized checks a request's credentials: 200, or 401/403 and why.
func (s *Server) adminAuthorized(r *http.Request, tokenSum *[32]byte) (int, string) {
	h := r.Header.Get("Authorization")
	if h == "" {
		return http.StatusUnauthorized, "credentials required: an admin token (Authorization: Bearer) or a user with configure permission .* (basic auth)"
	}
	if len(h) > 7 && (h[:7] == "Bearer " || h[:7] == "bearer ") {
		got := sha256.Sum256([]byte(h[7:]))
		if s.cfg.AdminToken != "" && subtle.ConstantTimeCompare(got[:], tokenSum[:]) == 1 {
			return http.StatusOK, ""
		}
		return http.StatusUnauthorized, "wrong admin token"
	}
	name, password, ok := r.BasicAuth()
	if !ok {
		return http.StatusUnauthorized, "unsupported Authorization scheme: use Bearer or Basic"
	}
	a := s.auth
	u := a.checkPlain(a.users.Load(), name, password)
	if u == nil {
		return http.StatusUnauthorized, "authentication failed: " + errBadCredentials.Error()
	}
	if !u.configure.all {
		return http.StatusForbidden, fmt.Sprintf("user %q may not use the admin API: it needs configure permission .* (has %q)", name, u.configure.source)
	}
	return http.StatusOK, ""
}

// adminTLS loads the admin HTTPS certificate, or returns nil without one.
func (s *Server) adminTLS() (*tls.Config, error) {
	if s.cfg.AdminTLSCert == "" {
		return nil, nil
	}
	m := &tlsMaterial{certFile: s.cfg.AdminTLSCert, keyFile: s.cfg.AdminTLSKey}
	if err := m.load(); err != nil {
		return nil, fmt.Errorf("server: admin HTTPS: %w", err)
	}
	s.adminTLSMat = m
	s.registerCertExpiry("admin", func() time.Time { return leafNotAfter(m.current.Load()) })
	return m.listenerConfig(), nil
}

// ReloadAdminTLS rereads the admin HTTPS certificate and key; open
// connections keep theirs. On an error the material in use stays.
func (s *Server) ReloadAdminTLS() error {
	if s.adminTLSMat == nil {
		return errors.New("server: the admin port serves no HTTPS")
	}
	if err := s.adminTLSMat.load(); err != nil {
		return err
	}
	s.log.Info("server: admin HTTPS certificate reloaded", "cert", s.adminTLSMat.certFile)
	return nil
}
