package testutil

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// Certs is a throwaway CA with a server certificate for 127.0.0.1 and
// localhost and a client certificate, made for one test: no private key
// is ever committed. The PEM files live in the test's temporary
// directory.
type Certs struct {
	Dir                       string
	CAFile, CertFile, KeyFile string // CA; server certificate and key
	ClientCertFile            string
	ClientKeyFile             string
	CAPool                    *x509.CertPool
	Client                    tls.Certificate // subject CN is ClientName
	ClientName                string

	ca    *x509.Certificate
	caKey *ecdsa.PrivateKey
}

// NewCerts makes a CA, a server certificate and a client certificate with
// subject CN clientName.
func NewCerts(t testing.TB, clientName string) *Certs {
	t.Helper()
	c := &Certs{Dir: t.TempDir(), ClientName: clientName}
	var err error
	if c.caKey, err = ecdsa.GenerateKey(elliptic.P256(), rand.Reader); err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "berth test CA"},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(24 * time.Hour),
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &c.caKey.PublicKey, c.caKey)
	if err != nil {
		t.Fatal(err)
	}
	if c.ca, err = x509.ParseCertificate(der); err != nil {
		t.Fatal(err)
	}
	c.CAFile = filepath.Join(c.Dir, "ca.pem")
	writePEM(t, c.CAFile, "CERTIFICATE", der)
	c.CAPool = x509.NewCertPool()
	c.CAPool.AddCert(c.ca)
	c.CertFile, c.KeyFile = c.Issue(t, "server", "berthd", x509.ExtKeyUsageServerAuth)
	c.ClientCertFile, c.ClientKeyFile = c.Issue(t, "client", clientName, x509.ExtKeyUsageClientAuth)
	if c.Client, err = tls.LoadX509KeyPair(c.ClientCertFile, c.ClientKeyFile); err != nil {
		t.Fatal(err)
	}
	return c
}

// Issue signs a new certificate with subject CN cn, valid for 127.0.0.1
// and localhost, and writes it and its key as name.pem and name-key.pem.
func (c *Certs) Issue(t testing.TB, name, cn string, usage x509.ExtKeyUsage) (certFile, keyFile string) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	serial, err := rand.Int(rand.Reader, big.NewInt(1<<62))
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial,
		Subject:      pkix.Name{CommonName: cn},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{usage},
		DNSNames:     []string{"localhost"},
		IPAddresses:  []net.IP{net.IPv4(127, 0, 0, 1)},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, c.ca, &key.PublicKey, c.caKey)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	certFile, keyFile = filepath.Join(c.Dir, name+".pem"), filepath.Join(c.Dir, name+"-key.pem")
	writePEM(t, certFile, "CERTIFICATE", der)
	writePEM(t, keyFile, "PRIVATE KEY", keyDER)
	return certFile, keyFile
}

// ClientTLS is a client configuration trusting the CA; with mutual it
// presents the client certificate.
func (c *Certs) ClientTLS(mutual bool) *tls.Config {
	cfg := &tls.Config{RootCAs: c.CAPool, MinVersion: tls.VersionTLS12}
	if mutual {
		cfg.Certificates = []tls.Certificate{c.Client}
	}
	return cfg
}

func writePEM(t testing.TB, path, kind string, der []byte) {
	t.Helper()
	if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: kind, Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
}
