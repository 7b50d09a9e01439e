package server

import (
	"errors"
	"fmt"
	"maps"
	"slices"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/berthmq/berth/internal/peerauth"
)

// Proof of cluster membership on the peer port (replication/groups) and the
// controller port (controlplane): with Config.ClusterCA/ClusterCert/
// ClusterKey (mutual TLS) or ClusterSecretFile (a shared secret), every
// connection proves it before its first frame, both ways
// (internal/peerauth says how). Without them the ports are open, which
// Start allows on loopback addresses only.

// startClusterAuth loads the cluster credentials. Start runs it before
// anything listens.
func (s *Server) startClusterAuth() error {
	c := &s.cfg
	a, err := peerauth.Load(peerauth.Options{CAFile: c.ClusterCA, CertFile: c.ClusterCert, KeyFile: c.ClusterKey, SecretFile: c.ClusterSecretFile})
	if err != nil {
		return fmt.Errorf("server: %w", err)
	}
	s.peerAuth = a
	if a == nil {
		return nil // open ports, on loopback only (validateClusterPorts)
	}
	s.metrics.reg.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "berth_cluster_handshake_refusals_total",
		Help: "Connections to the peer or controller port refused for want of proof of cluster membership."},
		func() float64 { return float64(a.Refused.Load()) }))
	if a.TLS() {
		s.registerCertExpiry("cluster", a.NotAfter)
	}
	s.log.Info("server: the peer and controller ports require proof of cluster membership", "mode", a.Mode())
	return nil
}

// validateClusterPorts refuses a peer or controller address off loopback
// when no cluster credentials are given (peerauth.Load loads none).
func (c *Config) validateClusterPorts() error {
	if c.ClusterCA != "" || c.ClusterCert != "" || c.ClusterKey != "" || c.ClusterSecretFile != "" {
		return nil
	}
	type port struct{ key, addr string }
	var open []port
	if c.PeerAddr != "" && c.Role != RoleController {
		open = append(open, port{"peer", c.PeerAddr})
	}
	if c.controllerEmbedded() {
		switch {
		case len(c.ControllerPeers) > 0:
			for _, id := range slices.Sorted(maps.Keys(c.ControllerPeers)) {
				if id == c.ControllerID {
					open = append(open, port{"controller-peers", c.ControllerPeers[id]})
				}
			}
		default:
			open = append(open, port{"controller", c.ControllerAddr})
		}
	}
	for _, p := range open {
		if !loopbackListen(p.addr) {
			return configErrorf([]string{p.key}, "-%s %s is not a loopback address and the cluster ports require no proof of membership, so anyone who reaches it could join the cluster: give -cluster-secret-file, or -cluster-ca, -cluster-cert and -cluster-key (berthctl certs init DIR makes them; see docs/SECURITY.md)", p.key, p.addr)
		}
	}
	return nil
}

// ReloadClusterTLS rereads the cluster CA, certificate and key. New peer
// and controller connections use them; open ones are not touched. On an
// error the material in use stays.
func (s *Server) ReloadClusterTLS() error {
	if !s.peerAuth.TLS() {
		return errors.New("server: no cluster certificates (-cluster-ca)")
	}
	if err := s.peerAuth.Reload(); err != nil {
		return fmt.Errorf("server: %w", err)
	}
	s.log.Info("server: cluster certificates reloaded", "cert", s.cfg.ClusterCert)
	return nil
}
