package server

import "github.com/prometheus/client_golang/prometheus"

// securityMetrics count TLS and authentication failures.
type securityMetrics struct {
	tlsHandshakeFailures prometheus.Counter
	authFailures         prometheus.Counter
	denied               prometheus.Counter
}

func newSecurityMetrics(reg *prometheus.Registry, register bool) *securityMetrics {
	m := &securityMetrics{
		tlsHandshakeFailures: prometheus.NewCounter(prometheus.CounterOpts{Name: "berth_tls_handshake_failures_total", Help: "TLS client connections whose handshake failed or timed out."}),
		authFailures:         prometheus.NewCounter(prometheus.CounterOpts{Name: "berth_auth_failures_total", Help: "Failed client logins (bad credentials, unknown user, refused mechanism)."}),
		denied:               prometheus.NewCounter(prometheus.CounterOpts{Name: "berth_permission_denied_total", Help: "Commands refused with not-allowed by a user's permissions."}),
	}
	if register {
		reg.MustRegister(m.tlsHandshakeFailures, m.authFailures, m.denied)
	}
	return m
}
