package server

import (
	"crypto/tls"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// registerCertExpiry exports when the certificate a port presents
// expires, as berth_tls_certificate_expiry_timestamp_seconds{port=...}:
// an expired certificate fails every handshake on that port, so it is
// worth an alert well before. notAfter reads the certificate in use now
// (reloads change it); a zero time exports nothing.
func (s *Server) registerCertExpiry(port string, notAfter func() time.Time) {
	s.metrics.reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name:        "berth_tls_certificate_expiry_timestamp_seconds",
		Help:        "Unix time at which the certificate this port presents expires.",
		ConstLabels: prometheus.Labels{"port": port},
	}, func() float64 {
		t := notAfter()
		if t.IsZero() {
			return 0
		}
		return float64(t.Unix())
	}))
}

// leafNotAfter is the expiry of the first certificate of cfg, if loaded.
func leafNotAfter(cfg *tls.Config) time.Time {
	if cfg == nil || len(cfg.Certificates) == 0 || cfg.Certificates[0].Leaf == nil {
		return time.Time{}
	}
	return cfg.Certificates[0].Leaf.NotAfter
}
