// Package peerauth proves, when a connection between members of a Berth
// cluster opens and before either end reads a frame from it, that the
// other end belongs to the cluster. It guards the broker-to-broker port
// (replication/groups) and the controller port (controlplane, and its clients:
// brokers and berthctl).
//
// Two proofs, either or both:
//
//   - Mutual TLS with a cluster CA (Options.CAFile, CertFile, KeyFile):
//     each end presents a certificate the cluster CA signed, and the
//     traffic that follows is encrypted and integrity-checked. TLS 1.3
//     only: every member is Berth, built with Go.
//   - A shared cluster secret (Options.SecretFile), proven by an HMAC-SHA256
//     challenge-response with a fresh random nonce from each end. The
//     secret never crosses the network; proofs are compared in constant
//     time. It authenticates the connection when it opens, and nothing
//     after: the traffic that follows is neither encrypted nor protected
//     against an attacker who can rewrite packets on the path. It keeps
//     strangers and misconfigured processes out of a trusted network.
//
// With both, the secret exchange runs inside the TLS session.
//
// # The secret exchange
//
// K is the secret file's content without surrounding white space.
//
//  1. Client: the 8-byte magic "BPAUTH\x00\x01", then its nonce Nc (32 random bytes).
//  2. Server: checks the magic, then sends its nonce Ns (32 random bytes) and
//     HMAC-SHA256(K, "berth peer server" || Nc || Ns).
//  3. Client: checks the server's proof (a server without K cannot make
//     it), then sends HMAC-SHA256(K, "berth peer client" || Nc || Ns).
//  4. Server: checks the client's proof and answers one byte, 1 for
//     accepted, 0 for refused (then closes).
//
// The labels differ by role, so a proof taken from one direction is no
// good in the other, and each proof covers both nonces, so none can be
// replayed on another connection. A server refuses anything that does not
// start with the magic, which is how a peer with no secret (it starts with
// a Berth frame header) or a client speaking garbage is turned away.
//
// # Use
//
// A nil *Auth is valid and proves nothing: Server and Client return the
// connection as it is. Both set a deadline of HandshakeTimeout on the
// connection for the handshake and clear it afterwards; on an error the
// caller closes the connection.
package peerauth

import (
	"bytes"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"sync/atomic"
	"time"
)

const (
	// HandshakeTimeout bounds the whole handshake on either end.
	HandshakeTimeout = 5 * time.Second
	// PendingMax bounds the inbound handshakes in progress at once on one
	// Auth; a connection past it is refused at once, so strangers that
	// open connections and send nothing hold at most this many
	// goroutines for HandshakeTimeout.
	PendingMax = 256
	// SecretLenMin is the shortest secret accepted: 16 bytes (128 bits if
	// random; `berthctl certs init` writes 32 random bytes in hex).
	SecretLenMin = 16
	// secretFileMax bounds what Load reads from a secret file.
	secretFileMax = 4096

	nonceLen = 32
	macLen   = sha256.Size
)

var magic = [8]byte{'B', 'P', 'A', 'U', 'T', 'H', 0, 1}

// ErrRefused is returned to a client whose proof the server refused.
var ErrRefused = errors.New("peerauth: the peer refused our cluster secret")

// Options names the files that hold the cluster credentials. Empty
// CAFile and SecretFile mean no proof at all.
type Options struct {
	// CAFile is the cluster CA (PEM); every member's certificate must be
	// signed by it. CertFile and KeyFile are this member's certificate
	// (for both server and client authentication) and key.
	CAFile, CertFile, KeyFile string
	// SecretFile holds the shared cluster secret.
	SecretFile string
}

// Auth holds loaded cluster credentials. Safe for concurrent use.
type Auth struct {
	opts   Options
	secret []byte
	tls    atomic.Pointer[material] // nil without TLS

	// Refused counts inbound connections refused by Server.
	Refused atomic.Uint64
	pending atomic.Int32 // inbound handshakes in progress
	// lastLog holds, for inbound refusals [0] and outbound failures [1],
	// the time (UnixNano) of the last one logged (AllowLog).
	lastLog [2]atomic.Int64
}

// logInterval spaces the log lines about failed handshakes: a peer that
// redials every few milliseconds must not flood the log. Every refusal is
// still counted in Refused.
const logInterval = time.Second

// AllowLog reports whether a failed handshake may be logged now: at most
// one a second for inbound refusals, and one for outbound failures.
func (a *Auth) AllowLog(outbound bool) bool {
	if a == nil {
		return true
	}
	i := 0
	if outbound {
		i = 1
	}
	now := time.Now().UnixNano()
	last := a.lastLog[i].Load()
	return now-last >= int64(logInterval) && a.lastLog[i].CompareAndSwap(last, now)
}

type material struct {
	pool *x509.CertPool
	cert tls.Certificate
}

// Load reads the files o names. It returns nil, nil when o names none.
func Load(o Options) (*Auth, error) {
	if o.CAFile == "" && o.CertFile == "" && o.KeyFile == "" && o.SecretFile == "" {
		return nil, nil
	}
	a := &Auth{opts: o}
	if o.SecretFile != "" {
		s, err := readSecret(o.SecretFile)
		if err != nil {
			return nil, err
		}
		a.secret = s
	}
	if o.CAFile != "" || o.CertFile != "" || o.KeyFile != "" {
		if o.CAFile == "" || o.CertFile == "" || o.KeyFile == "" {
			return nil, errors.New("peerauth: mutual TLS between members needs all three of the cluster CA, certificate and key (-cluster-ca, -cluster-cert, -cluster-key)")
		}
		if err := a.Reload(); err != nil {
			return nil, err
		}
	}
	return a, nil
}

func readSecret(path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("peerauth: cluster secret: %w", err)
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, secretFileMax+1))
	if err != nil {
		return nil, fmt.Errorf("peerauth: cluster secret %s: %w", path, err)
	}
	if len(b) > secretFileMax {
		return nil, fmt.Errorf("peerauth: cluster secret %s: longer than %d bytes", path, secretFileMax)
	}
	b = bytes.TrimSpace(b)
	if len(b) < SecretLenMin {
		return nil, fmt.Errorf("peerauth: cluster secret %s: %d bytes, want at least %d (berthctl certs init writes one)", path, len(b), SecretLenMin)
	}
	return b, nil
}

// Reload rereads the TLS files. Connections already open keep the
// material of their handshake. On an error the material in use stays.
func (a *Auth) Reload() error {
	if a == nil || a.opts.CAFile == "" {
		return nil
	}
	pair, err := tls.LoadX509KeyPair(a.opts.CertFile, a.opts.KeyFile)
	if err != nil {
		return fmt.Errorf("peerauth: cluster certificate %s / key %s: %w", a.opts.CertFile, a.opts.KeyFile, err)
	}
	pem, err := os.ReadFile(a.opts.CAFile)
	if err != nil {
		return fmt.Errorf("peerauth: cluster CA: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return fmt.Errorf("peerauth: cluster CA %s: no PEM certificate in it", a.opts.CAFile)
	}
	a.tls.Store(&material{pool: pool, cert: pair})
	return nil
}

// Mode names the proofs in force, for logs.
func (a *Auth) Mode() string {
	switch {
	case a == nil:
		return "none"
	case a.tls.Load() != nil && a.secret != nil:
		return "mutual TLS and cluster secret"
	case a.tls.Load() != nil:
		return "mutual TLS"
	}
	return "cluster secret"
}

// TLS reports whether connections are encrypted.
func (a *Auth) TLS() bool { return a != nil && a.tls.Load() != nil }

// Server runs the server side of the handshake on a connection just
// accepted. It returns the connection to read frames from (a TLS one with
// mutual TLS), or an error, after which the caller closes nc.
func (a *Auth) Server(nc net.Conn) (net.Conn, error) {
	if a == nil {
		return nc, nil
	}
	if a.pending.Add(1) > PendingMax {
		a.pending.Add(-1)
		a.Refused.Add(1)
		return nil, fmt.Errorf("peerauth: %d handshakes already in progress", PendingMax)
	}
	conn, err := a.server(nc)
	a.pending.Add(-1)
	if err != nil {
		a.Refused.Add(1)
		return nil, err
	}
	return conn, nil
}

func (a *Auth) server(nc net.Conn) (net.Conn, error) {
	if err := nc.SetDeadline(time.Now().Add(HandshakeTimeout)); err != nil {
		return nil, err
	}
	conn := nc
	if m := a.tls.Load(); m != nil {
		tc := tls.Server(nc, &tls.Config{
			MinVersion:   tls.VersionTLS13,
			Certificates: []tls.Certificate{m.cert},
			ClientCAs:    m.pool,
			ClientAuth:   tls.RequireAndVerifyClientCert,
		})
		if err := tc.Handshake(); err != nil {
			return nil, fmt.Errorf("peerauth: TLS handshake: %w", err)
		}
		conn = tc
	}
	if a.secret != nil {
		if err := a.serverSecret(conn); err != nil {
			return nil, err
		}
	}
	if err := nc.SetDeadline(time.Time{}); err != nil {
		return nil, err
	}
	return conn, nil
}

func (a *Auth) serverSecret(conn net.Conn) error {
	var hello [len(magic) + nonceLen]byte
	// The magic first: a peer that sent a short frame instead waits for
	// an answer, and must not hold us until the deadline.
	if _, err := io.ReadFull(conn, hello[:len(magic)]); err != nil {
		return fmt.Errorf("peerauth: reading the client's hello: %w", err)
	}
	if !bytes.Equal(hello[:len(magic)], magic[:]) {
		return errors.New("peerauth: the client did not start the cluster handshake (no secret, or not a cluster member)")
	}
	if _, err := io.ReadFull(conn, hello[len(magic):]); err != nil {
		return fmt.Errorf("peerauth: reading the client's hello: %w", err)
	}
	clientNonce := hello[len(magic):]
	var out [nonceLen + macLen]byte
	serverNonce := out[:nonceLen]
	if _, err := rand.Read(serverNonce); err != nil {
		return fmt.Errorf("peerauth: nonce: %w", err)
	}
	copy(out[nonceLen:], a.proof("berth peer server", clientNonce, serverNonce))
	if _, err := conn.Write(out[:]); err != nil {
		return fmt.Errorf("peerauth: writing the challenge: %w", err)
	}
	var clientProof [macLen]byte
	if _, err := io.ReadFull(conn, clientProof[:]); err != nil {
		return fmt.Errorf("peerauth: reading the client's proof: %w", err)
	}
	if !hmac.Equal(clientProof[:], a.proof("berth peer client", clientNonce, serverNonce)) {
		_, _ = conn.Write([]byte{0})
		return errors.New("peerauth: the client's proof is wrong (another cluster secret)")
	}
	if _, err := conn.Write([]byte{1}); err != nil {
		return fmt.Errorf("peerauth: writing the verdict: %w", err)
	}
	return nil
}

// Client runs the client side of the handshake on a connection just
// dialled to addr (host:port; the host is the name the server's
// certificate must hold). On an error the caller closes nc.
func (a *Auth) Client(nc net.Conn, addr string) (net.Conn, error) {
	if a == nil {
		return nc, nil
	}
	if err := nc.SetDeadline(time.Now().Add(HandshakeTimeout)); err != nil {
		return nil, err
	}
	conn := nc
	if m := a.tls.Load(); m != nil {
		host, _, err := net.SplitHostPort(addr)
		if err != nil {
			host = addr
		}
		tc := tls.Client(nc, &tls.Config{
			MinVersion:   tls.VersionTLS13,
			RootCAs:      m.pool,
			Certificates: []tls.Certificate{m.cert},
			ServerName:   host,
		})
		if err := tc.Handshake(); err != nil {
			return nil, fmt.Errorf("peerauth: TLS handshake with %s: %w", addr, err)
		}
		conn = tc
	}
	if a.secret != nil {
		if err := a.clientSecret(conn, addr); err != nil {
			return nil, err
		}
	}
	if err := nc.SetDeadline(time.Time{}); err != nil {
		return nil, err
	}
	return conn, nil
}

func (a *Auth) clientSecret(conn net.Conn, addr string) error {
	var hello [len(magic) + nonceLen]byte
	copy(hello[:], magic[:])
	clientNonce := hello[len(magic):]
	if _, err := rand.Read(clientNonce); err != nil {
		return fmt.Errorf("peerauth: nonce: %w", err)
	}
	if _, err := conn.Write(hello[:]); err != nil {
		return fmt.Errorf("peerauth: writing the hello to %s: %w", addr, err)
	}
	var in [nonceLen + macLen]byte
	if _, err := io.ReadFull(conn, in[:]); err != nil {
		return fmt.Errorf("peerauth: %s sent no challenge (it runs without the cluster secret, or is not a cluster member): %w", addr, err)
	}
	serverNonce := in[:nonceLen]
	if !hmac.Equal(in[nonceLen:], a.proof("berth peer server", clientNonce, serverNonce)) {
		return fmt.Errorf("peerauth: %s does not hold our cluster secret", addr)
	}
	if _, err := conn.Write(a.proof("berth peer client", clientNonce, serverNonce)); err != nil {
		return fmt.Errorf("peerauth: writing the proof to %s: %w", addr, err)
	}
	var verdict [1]byte
	if _, err := io.ReadFull(conn, verdict[:]); err != nil || verdict[0] != 1 {
		return fmt.Errorf("%w (%s)", ErrRefused, addr)
	}
	return nil
}

func (a *Auth) proof(label string, clientNonce, serverNonce []byte) []byte {
	m := hmac.New(sha256.New, a.secret)
	m.Write([]byte(label))
	m.Write(clientNonce)
	m.Write(serverNonce)
	return m.Sum(nil)
}

// Pending is the number of inbound handshakes in progress.
func (a *Auth) Pending() int {
	if a == nil {
		return 0
	}
	return int(a.pending.Load())
}

// NotAfter is when this member's cluster certificate expires, or the zero
// time without one.
func (a *Auth) NotAfter() time.Time {
	if a == nil {
		return time.Time{}
	}
	m := a.tls.Load()
	if m == nil || m.cert.Leaf == nil {
		return time.Time{}
	}
	return m.cert.Leaf.NotAfter
}
