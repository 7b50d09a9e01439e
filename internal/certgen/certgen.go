// Package certgen makes the credentials of a local Berth cluster with the
// standard library alone: a cluster CA, one certificate per node (good for
// serving and for dialling other members), a client certificate for
// berthctl, a cluster secret and an admin token. `berthctl certs init DIR`
// and `make certs` run it; docs/SECURITY.md says where each file goes.
//
// It is meant for development clusters and tests. A production cluster
// should take its certificates from the organisation's own CA, with keys
// made on the machines that use them.
package certgen

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"time"
)

const (
	// NodesMax bounds the node certificates one Init makes.
	NodesMax = 64
	// ValidityDefault is how long the certificates last unless told.
	ValidityDefault = 365 * 24 * time.Hour
)

// Spec says what to make.
type Spec struct {
	// Nodes is the number of node certificates (node-1 ... node-N).
	Nodes int
	// Hosts are the DNS names and IP addresses every node certificate is
	// valid for; empty means 127.0.0.1 and localhost.
	Hosts []string
	// ClientName is the subject CN of the client certificate (berthctl's,
	// and a user's name for EXTERNAL logins); empty means "admin".
	ClientName string
	// Validity is how long the certificates last; 0 means ValidityDefault.
	Validity time.Duration
}

// Files are the paths Init wrote, all in its directory.
type Files struct {
	CA, CAKey          string
	NodeCerts, NodeKey []string // node-N.pem, node-N-key.pem
	ClientCert         string
	ClientKey          string
	Secret             string // cluster-secret: 64 hex digits
	AdminToken         string // admin-token: 64 hex digits
}

// Paths are the files Init writes for spec in dir.
func Paths(dir string, nodes int) Files {
	f := Files{CA: filepath.Join(dir, "ca.pem"), CAKey: filepath.Join(dir, "ca-key.pem"),
		ClientCert: filepath.Join(dir, "client.pem"), ClientKey: filepath.Join(dir, "client-key.pem"),
		Secret: filepath.Join(dir, "cluster-secret"), AdminToken: filepath.Join(dir, "admin-token")}
	for i := 1; i <= nodes; i++ {
		n := "node-" + strconv.Itoa(i)
		f.NodeCerts = append(f.NodeCerts, filepath.Join(dir, n+".pem"))
		f.NodeKey = append(f.NodeKey, filepath.Join(dir, n+"-key.pem"))
	}
	return f
}

// Init writes a new CA, node and client certificates, a cluster secret and
// an admin token into dir (created if missing). It refuses to overwrite a
// CA key already there: a new CA would orphan every certificate the old
// one signed. Keys and secrets are written mode 0600.
func Init(dir string, spec Spec) (Files, error) {
	if spec.Nodes < 1 || spec.Nodes > NodesMax {
		return Files{}, fmt.Errorf("certgen: nodes must be 1 to %d, got %d", NodesMax, spec.Nodes)
	}
	if len(spec.Hosts) == 0 {
		spec.Hosts = []string{"127.0.0.1", "localhost"}
	}
	if spec.ClientName == "" {
		spec.ClientName = "admin"
	}
	if spec.Validity <= 0 {
		spec.Validity = ValidityDefault
	}
	f := Paths(dir, spec.Nodes)
	if _, err := os.Stat(f.CAKey); err == nil {
		return Files{}, fmt.Errorf("certgen: %s exists: remove the directory's files to make a new CA", f.CAKey)
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return Files{}, fmt.Errorf("certgen: %w", err)
	}
	now := time.Now()
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return Files{}, fmt.Errorf("certgen: CA key: %w", err)
	}
	caTmpl := &x509.Certificate{
		SerialNumber:          serial(),
		Subject:               pkix.Name{CommonName: "berth cluster CA", Organization: []string{"Berth"}},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(spec.Validity),
		IsCA:                  true,
		BasicConstraintsValid: true,
		MaxPathLenZero:        true,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign | x509.KeyUsageDigitalSignature,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		return Files{}, fmt.Errorf("certgen: CA: %w", err)
	}
	ca, err := x509.ParseCertificate(caDER)
	if err != nil {
		return Files{}, fmt.Errorf("certgen: CA: %w", err)
	}
	if err := writeKey(f.CAKey, caKey); err != nil {
		return Files{}, err
	}
	if err := writePEM(f.CA, "CERTIFICATE", caDER, 0o644); err != nil {
		return Files{}, err
	}
	var dns []string
	var ips []net.IP
	for _, h := range spec.Hosts {
		if ip := net.ParseIP(h); ip != nil {
			ips = append(ips, ip)
		} else if h != "" {
			dns = append(dns, h)
		}
	}
	for i := range spec.Nodes {
		tmpl := &x509.Certificate{
			Subject:     pkix.Name{CommonName: "berth node " + strconv.Itoa(i+1), Organization: []string{"Berth"}},
			ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
			DNSNames:    dns, IPAddresses: ips,
		}
		if err := issue(f.NodeCerts[i], f.NodeKey[i], tmpl, ca, caKey, now, spec.Validity); err != nil {
			return Files{}, err
		}
	}
	client := &x509.Certificate{
		Subject:     pkix.Name{CommonName: spec.ClientName, Organization: []string{"Berth"}},
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}
	if err := issue(f.ClientCert, f.ClientKey, client, ca, caKey, now, spec.Validity); err != nil {
		return Files{}, err
	}
	for _, p := range []string{f.Secret, f.AdminToken} {
		var b [32]byte
		if _, err := rand.Read(b[:]); err != nil {
			return Files{}, fmt.Errorf("certgen: %w", err)
		}
		if err := os.WriteFile(p, []byte(hex.EncodeToString(b[:])+"\n"), 0o600); err != nil {
			return Files{}, fmt.Errorf("certgen: %w", err)
		}
	}
	return f, nil
}

func issue(certFile, keyFile string, tmpl, ca *x509.Certificate, caKey *ecdsa.PrivateKey, now time.Time, validity time.Duration) error {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return fmt.Errorf("certgen: key for %s: %w", certFile, err)
	}
	tmpl.SerialNumber = serial()
	tmpl.NotBefore, tmpl.NotAfter = now.Add(-time.Hour), now.Add(validity)
	tmpl.KeyUsage = x509.KeyUsageDigitalSignature
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
	if err != nil {
		return fmt.Errorf("certgen: %s: %w", certFile, err)
	}
	if err := writeKey(keyFile, key); err != nil {
		return err
	}
	return writePEM(certFile, "CERTIFICATE", der, 0o644)
}

func serial() *big.Int {
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 126))
	if err != nil {
		panic("certgen: no randomness: " + err.Error())
	}
	return n
}

func writeKey(path string, key *ecdsa.PrivateKey) error {
	der, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return fmt.Errorf("certgen: %s: %w", path, err)
	}
	return writePEM(path, "PRIVATE KEY", der, 0o600)
}

func writePEM(path, kind string, der []byte, mode os.FileMode) error {
	b := pem.EncodeToMemory(&pem.Block{Type: kind, Bytes: der})
	if err := os.WriteFile(path, b, mode); err != nil {
		return fmt.Errorf("certgen: %w", err)
	}
	return nil
}

// Verify checks that every certificate in f chains to f's CA with the
// usages its role needs, and that node certificates hold host.
func Verify(f Files, host string) error {
	pem, err := os.ReadFile(f.CA)
	if err != nil {
		return fmt.Errorf("certgen: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return fmt.Errorf("certgen: %s holds no certificate", f.CA)
	}
	check := func(path string, opts x509.VerifyOptions) error {
		b, err := os.ReadFile(path)
		if err != nil {
			return fmt.Errorf("certgen: %w", err)
		}
		blk, _ := decodePEM(b)
		if blk == nil {
			return fmt.Errorf("certgen: %s holds no certificate", path)
		}
		c, err := x509.ParseCertificate(blk)
		if err != nil {
			return fmt.Errorf("certgen: %s: %w", path, err)
		}
		opts.Roots = pool
		if _, err := c.Verify(opts); err != nil {
			return fmt.Errorf("certgen: %s: %w", path, err)
		}
		return nil
	}
	for _, n := range f.NodeCerts {
		if err := check(n, x509.VerifyOptions{DNSName: host, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}); err != nil {
			return err
		}
		if err := check(n, x509.VerifyOptions{KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}); err != nil {
			return err
		}
	}
	if f.ClientCert == "" {
		return errors.New("certgen: no client certificate")
	}
	return check(f.ClientCert, x509.VerifyOptions{KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}})
}

func decodePEM(b []byte) ([]byte, []byte) {
	blk, rest := pem.Decode(b)
	if blk == nil || blk.Type != "CERTIFICATE" {
		return nil, rest
	}
	return blk.Bytes, rest
}
