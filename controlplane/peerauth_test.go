package controlplane

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/berthmq/berth/controlplane/ctlapi"
	"github.com/berthmq/berth/controlplane/ctlclient"
	"github.com/berthmq/berth/internal/certgen"
	"github.com/berthmq/berth/internal/peerauth"
	"github.com/berthmq/berth/internal/testutil"
	"github.com/berthmq/berth/wire"
)

func mustAuth(t *testing.T, o peerauth.Options) *peerauth.Auth {
	t.Helper()
	a, err := peerauth.Load(o)
	if err != nil {
		t.Fatal(err)
	}
	return a
}

// refusedQuickly checks that a client with auth (nil: none) gets nothing
// from the controllers at addrs.
func refusedQuickly(t *testing.T, what string, addrs []string, auth *peerauth.Auth) {
	t.Helper()
	cl := ctlclient.NewClientAuth(addrs, auth)
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 150*time.Millisecond)
	defer cancel()
	if _, err := cl.GetClusterInfo(ctx, ctlapi.ReadUnsafe); err == nil {
		t.Fatalf("%s: the controller answered", what)
	}
}

// rawRefused sends data with no handshake and checks that the connection
// is closed without a reply.
func rawRefused(t *testing.T, what, addr string, data []byte) {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_, _ = c.Write(data)
	c.SetReadDeadline(time.Now().Add(10 * time.Second))
	buf := make([]byte, 512)
	for {
		n, err := c.Read(buf)
		if err != nil {
			if ne, ok := err.(net.Error); ok && ne.Timeout() {
				t.Fatalf("%s: the connection stayed open", what)
			}
			return
		}
		// A TLS server may answer a bad hello with an alert, never with a
		// controller reply.
		if n >= 2 && buf[0] == wire.Magic0 && buf[1] == wire.Magic1 {
			t.Fatalf("%s: got a frame back", what)
		}
	}
}

// TestControllerClusterSecret: a 3-member controller group whose members
// share a secret elects a leader and serves clients holding it (raft
// traffic and client requests both pass the handshake); a client with no
// secret or the wrong one, a raw request, a raft message and garbage are
// refused before any frame is read.
func TestControllerClusterSecret(t *testing.T) {
	files, err := certgen.Init(t.TempDir(), certgen.Spec{Nodes: 1})
	if err != nil {
		t.Fatal(err)
	}
	auth := mustAuth(t, peerauth.Options{SecretFile: files.Secret})
	c := newTestCluster(t, 3, func(cfg *Config) { cfg.Auth = auth })
	leader := c.leader()
	good := ctlclient.NewClientAuth(c.addrList(), auth)
	defer good.Close()
	if err := good.DeclareQueue(ctxT(t, 10*time.Second), "guarded", ctlapi.QueueOptions{}); err != nil {
		t.Fatal(err)
	}
	before := auth.Refused.Load()
	refusedQuickly(t, "no secret", []string{leader.Addr()}, nil)
	wrong := filepath.Join(t.TempDir(), "wrong")
	if err := os.WriteFile(wrong, []byte("0123456789abcdef0123456789abcdef"), 0o600); err != nil {
		t.Fatal(err)
	}
	refusedQuickly(t, "wrong secret", []string{leader.Addr()}, mustAuth(t, peerauth.Options{SecretFile: wrong}))
	req := wire.AppendCtlRequest(nil, wire.CtlRequest{ID: 1, Op: ctlapi.OpPropose, Body: ctlapi.EncodeEvent(nil, &ctlapi.DeclareQueue{Name: "intruder"})})
	rawRefused(t, "raw request", leader.Addr(), req)
	rawRefused(t, "raft hello", leader.Addr(), wire.AppendRaftHello(nil, 9, "127.0.0.1:1"))
	rawRefused(t, "garbage", leader.Addr(), []byte("\x00\x01garbage garbage garbage garbage garbage garbage"))
	testutil.WaitUntil(t, 5*time.Second, "five refusals counted", func() bool { return auth.Refused.Load() >= before+5 })
	w, err := good.GetWiring(ctxT(t, 5*time.Second), ctlapi.ReadConsistent)
	if err != nil {
		t.Fatal(err)
	}
	for _, q := range w.Queues {
		if q.Name == "intruder" {
			t.Fatal("a request without the handshake was applied")
		}
	}
	c.nodes[leader.ID()].peersMu.RLock()
	_, learned := c.nodes[leader.ID()].peers[9]
	c.nodes[leader.ID()].peersMu.RUnlock()
	if learned {
		t.Fatal("a raft hello without the handshake was taken")
	}
}

// TestControllerMutualTLS: a one-member controller with the cluster CA
// serves a client certificate the CA signed (berthctl's) and refuses
// another CA's, a client without a certificate, and plaintext.
func TestControllerMutualTLS(t *testing.T) {
	files, err := certgen.Init(t.TempDir(), certgen.Spec{Nodes: 1})
	if err != nil {
		t.Fatal(err)
	}
	other, err := certgen.Init(t.TempDir(), certgen.Spec{Nodes: 1})
	if err != nil {
		t.Fatal(err)
	}
	auth := mustAuth(t, peerauth.Options{CAFile: files.CA, CertFile: files.NodeCerts[0], KeyFile: files.NodeKey[0]})
	n, err := StartSingleAuth(t.TempDir(), testutil.FreeAddr(t), auth, quietLogger())
	if err != nil {
		t.Fatal(err)
	}
	defer n.Stop()
	admin := ctlclient.NewClientAuth([]string{n.Addr()}, mustAuth(t, peerauth.Options{CAFile: files.CA, CertFile: files.ClientCert, KeyFile: files.ClientKey}))
	defer admin.Close()
	if _, err := admin.GetClusterInfo(ctxT(t, 5*time.Second), ctlapi.ReadConsistent); err != nil {
		t.Fatalf("a client certificate of the cluster CA: %v", err)
	}
	refusedQuickly(t, "plaintext", []string{n.Addr()}, nil)
	refusedQuickly(t, "another CA", []string{n.Addr()}, mustAuth(t, peerauth.Options{CAFile: other.CA, CertFile: other.ClientCert, KeyFile: other.ClientKey}))
	refusedQuickly(t, "foreign certificate", []string{n.Addr()}, mustAuth(t, peerauth.Options{CAFile: files.CA, CertFile: other.ClientCert, KeyFile: other.ClientKey}))
	rawRefused(t, "garbage", n.Addr(), []byte("GET / HTTP/1.1\r\n\r\n"))
	testutil.WaitUntil(t, 5*time.Second, "four refusals counted", func() bool { return auth.Refused.Load() >= 4 })
}
