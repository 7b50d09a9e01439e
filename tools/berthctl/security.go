package main

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"syscall"
	"time"

	"github.com/berthmq/berth/client"
	"github.com/berthmq/berth/controlplane/ctlclient"
	"github.com/berthmq/berth/internal/peerauth"
	"github.com/berthmq/berth/wire"
)

// berthctl's credentials, for each of the three endpoints it talks to
// (docs/SECURITY.md):
//
//   - the broker's client port: --user and --password (SCRAM-SHA-256), or
//     a client certificate (--tls-cert, --tls-key; EXTERNAL when no --user
//     is given), over TLS when --tls-ca or --tls-cert is given;
//   - the admin HTTP: --admin-token as a bearer token, else --user and
//     --password as basic auth; HTTPS when the address says https:// or
//     --tls-ca is given;
//   - the controller: the cluster's credentials, as a node has them:
//     --cluster-ca, --cluster-cert and --cluster-key (mutual TLS), and/or
//     --cluster-secret-file.
//
// Each secret may come from the environment instead of the command line,
// where other users of the machine can read it: BERTH_PASSWORD,
// BERTH_ADMIN_TOKEN. The other flags default from BERTH_USER,
// BERTH_TLS_CA, BERTH_TLS_CERT, BERTH_TLS_KEY, BERTH_CLUSTER_CA,
// BERTH_CLUSTER_CERT, BERTH_CLUSTER_KEY and BERTH_CLUSTER_SECRET_FILE.

// security are the global flags about credentials.
type security struct {
	tlsCA, tlsCert, tlsKey             string
	adminToken                         string
	clusterCA, clusterCert, clusterKey string
	clusterSecret                      string
}

func (s *security) register(fs *flag.FlagSet) {
	fs.StringVar(&s.tlsCA, "tls-ca", "", "PEM CA `FILE` to trust for the broker's TLS port and the admin HTTPS; turns TLS on (env BERTH_TLS_CA)")
	fs.StringVar(&s.tlsCert, "tls-cert", "", "PEM client certificate `FILE` for the broker's TLS port; without --user it logs in with EXTERNAL (env BERTH_TLS_CERT)")
	fs.StringVar(&s.tlsKey, "tls-key", "", "PEM key `FILE` of --tls-cert (env BERTH_TLS_KEY)")
	fs.StringVar(&s.adminToken, "admin-token", "", "bearer `TOKEN` for the admin HTTP; default: the BERTH_ADMIN_TOKEN environment variable")
	fs.StringVar(&s.clusterCA, "cluster-ca", "", "PEM cluster CA `FILE`, for controllers started with -cluster-ca (env BERTH_CLUSTER_CA)")
	fs.StringVar(&s.clusterCert, "cluster-cert", "", "PEM certificate `FILE` the cluster CA signed (env BERTH_CLUSTER_CERT)")
	fs.StringVar(&s.clusterKey, "cluster-key", "", "PEM key `FILE` of --cluster-cert (env BERTH_CLUSTER_KEY)")
	fs.StringVar(&s.clusterSecret, "cluster-secret-file", "", "`FILE` holding the cluster secret, for controllers started with -cluster-secret-file (env BERTH_CLUSTER_SECRET_FILE)")
}

// fromEnv fills what the command line left empty from the environment.
func (g *globals) fromEnv() {
	for _, v := range []struct {
		p   *string
		env string
	}{
		{&g.user, "BERTH_USER"}, {&g.password, "BERTH_PASSWORD"}, {&g.adminToken, "BERTH_ADMIN_TOKEN"},
		{&g.tlsCA, "BERTH_TLS_CA"}, {&g.tlsCert, "BERTH_TLS_CERT"}, {&g.tlsKey, "BERTH_TLS_KEY"},
		{&g.clusterCA, "BERTH_CLUSTER_CA"}, {&g.clusterCert, "BERTH_CLUSTER_CERT"}, {&g.clusterKey, "BERTH_CLUSTER_KEY"},
		{&g.clusterSecret, "BERTH_CLUSTER_SECRET_FILE"},
	} {
		if *v.p == "" {
			*v.p = os.Getenv(v.env)
		}
	}
}

// clientTLS is the TLS configuration for the broker and the admin HTTPS,
// or nil when neither --tls-ca nor --tls-cert is given.
func (g *globals) clientTLS() (*tls.Config, error) {
	if g.tlsCA == "" && g.tlsCert == "" && g.tlsKey == "" {
		return nil, nil
	}
	cfg := &tls.Config{MinVersion: tls.VersionTLS12}
	if g.tlsCA != "" {
		pem, err := os.ReadFile(g.tlsCA)
		if err != nil {
			return nil, fmt.Errorf("--tls-ca: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("--tls-ca %s: no PEM certificate in it", g.tlsCA)
		}
		cfg.RootCAs = pool
	}
	if (g.tlsCert == "") != (g.tlsKey == "") {
		return nil, usageErrorf("--tls-cert and --tls-key go together")
	}
	if g.tlsCert != "" {
		pair, err := tls.LoadX509KeyPair(g.tlsCert, g.tlsKey)
		if err != nil {
			return nil, fmt.Errorf("--tls-cert/--tls-key: %w", err)
		}
		cfg.Certificates = []tls.Certificate{pair}
	}
	return cfg, nil
}

// brokerConfig is the client configuration for the broker's client port.
func (g *globals) brokerConfig() (client.Config, error) {
	// The largest frame there is: the server lowers it to its own limit
	// (berthd -frame-size-max), so publish takes what the broker takes.
	cfg := client.Config{Name: "berthctl", DialTimeout: g.timeout, HandshakeTimeout: g.timeout, CloseTimeout: g.timeout,
		User: g.user, Password: g.password, MaxFrameSize: wire.FrameSizeMax}
	t, err := g.clientTLS()
	if err != nil {
		return cfg, err
	}
	cfg.TLS = t
	if t != nil && len(t.Certificates) > 0 && g.user == "" {
		cfg.Mechanism = wire.MechExternal
	}
	return cfg, nil
}

// adminRequest adds the admin credentials to req and returns the HTTP
// client to send it with.
func (g *globals) adminRequest(req *http.Request) (*http.Client, error) {
	switch {
	case g.adminToken != "":
		req.Header.Set("Authorization", "Bearer "+g.adminToken)
	case g.user != "":
		req.SetBasicAuth(g.user, g.password)
	}
	t, err := g.clientTLS()
	if err != nil {
		return nil, err
	}
	if t == nil {
		return http.DefaultClient, nil
	}
	t.Certificates = nil // the admin HTTPS asks for none
	return &http.Client{Transport: &http.Transport{TLSClientConfig: t, TLSHandshakeTimeout: 10 * time.Second}}, nil
}

// adminBase is the admin HTTP's base URL: the address as given when it
// names a scheme, else https:// with --tls-ca and http:// without.
func (g *globals) adminBase(addr string) string {
	if strings.Contains(addr, "://") {
		return strings.TrimRight(addr, "/")
	}
	if g.tlsCA != "" {
		return "https://" + strings.TrimRight(addr, "/")
	}
	return "http://" + strings.TrimRight(addr, "/")
}

// controllerClient is a client of the controllers at addrs with the
// cluster's credentials.
func (g *globals) controllerClient(addrs []string) (*ctlclient.Client, error) {
	a, err := peerauth.Load(peerauth.Options{CAFile: g.clusterCA, CertFile: g.clusterCert, KeyFile: g.clusterKey, SecretFile: g.clusterSecret})
	if err != nil {
		return nil, err
	}
	return ctlclient.NewClientAuth(addrs, a), nil
}

// credentialHint explains an error that a missing cluster credential
// causes: a controller that requires one closes the connection at once,
// which reaches us as an end of file.
func (g *globals) credentialHint(err error) string {
	if g.clusterCA != "" || g.clusterSecret != "" {
		return ""
	}
	if !errors.Is(err, io.EOF) && !errors.Is(err, syscall.ECONNRESET) {
		return ""
	}
	return " (a controller started with -cluster-ca or -cluster-secret-file closes connections that do not prove them: give --cluster-ca, --cluster-cert and --cluster-key, or --cluster-secret-file)"
}
