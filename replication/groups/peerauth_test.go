package groups

import (
	"net"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/berthmq/berth/internal/certgen"
	"github.com/berthmq/berth/internal/peerauth"
	"github.com/berthmq/berth/internal/testutil"
	"github.com/berthmq/berth/wire"
)

func loadAuth(t *testing.T, o peerauth.Options) *peerauth.Auth {
	t.Helper()
	a, err := peerauth.Load(o)
	if err != nil {
		t.Fatal(err)
	}
	return a
}

// TestTransportClusterAuth: with cluster credentials the peer port takes
// messages only from brokers that prove them. A peer with no secret, the
// wrong secret, a certificate of another CA, or garbage is refused before
// its first frame: nothing reaches the handler, and the refusals are
// counted. Brokers holding the credentials exchange messages as before.
func TestTransportClusterAuth(t *testing.T) {
	files, err := certgen.Init(t.TempDir(), certgen.Spec{Nodes: 2})
	if err != nil {
		t.Fatal(err)
	}
	otherCA, err := certgen.Init(t.TempDir(), certgen.Spec{Nodes: 1})
	if err != nil {
		t.Fatal(err)
	}
	wrongSecret := filepath.Join(t.TempDir(), "secret")
	if err := os.WriteFile(wrongSecret, []byte("not-the-cluster-secret-0123456789"), 0o600); err != nil {
		t.Fatal(err)
	}
	node := func(i int, secret string) peerauth.Options {
		return peerauth.Options{CAFile: files.CA, CertFile: files.NodeCerts[i], KeyFile: files.NodeKey[i], SecretFile: secret}
	}
	for _, mode := range []struct {
		name     string
		server   peerauth.Options
		good     peerauth.Options
		refusals map[string]*peerauth.Auth // nil: a peer with no credentials
	}{
		{"secret", peerauth.Options{SecretFile: files.Secret}, peerauth.Options{SecretFile: files.Secret}, map[string]*peerauth.Auth{
			"no secret":    nil,
			"wrong secret": loadAuth(t, peerauth.Options{SecretFile: wrongSecret}),
		}},
		{"mtls", node(0, ""), node(1, ""), map[string]*peerauth.Auth{
			"no certificate": nil,
			"wrong CA":       loadAuth(t, peerauth.Options{CAFile: otherCA.CA, CertFile: otherCA.NodeCerts[0], KeyFile: otherCA.NodeKey[0]}),
			// Trusts our CA but has another CA's certificate.
			"foreign cert": loadAuth(t, peerauth.Options{CAFile: files.CA, CertFile: otherCA.NodeCerts[0], KeyFile: otherCA.NodeKey[0]}),
		}},
	} {
		t.Run(mode.name, func(t *testing.T) {
			got := make(chan *wire.GroupMessage, 16)
			auth := loadAuth(t, mode.server)
			tr, err := ListenAuth("127.0.0.1:0", 1, auth, func(m *wire.GroupMessage) { got <- m }, quiet())
			if err != nil {
				t.Fatal(err)
			}
			defer tr.Close()
			msg := wire.GroupMessage{Group: 3, Kind: wire.GroupAppendResp, From: 2, To: 1, Epoch: 4, OK: true, Match: 9}
			refused := uint64(0)
			for name, peerAuth := range mode.refusals {
				peer, err := ListenAuth("127.0.0.1:0", 2, peerAuth, func(*wire.GroupMessage) {}, quiet())
				if err != nil {
					t.Fatal(err)
				}
				peer.SetPeer(1, tr.Addr())
				peer.Send(&msg)
				refused++
				testutil.WaitUntil(t, 10*time.Second, name+" refused", func() bool { return auth.Refused.Load() >= refused })
				peer.Close()
				refused = auth.Refused.Load() // a redial may have been refused too
				select {
				case m := <-got:
					t.Fatalf("%s: a message got through: %+v", name, m)
				default:
				}
			}
			// Garbage on the port: refused too.
			conn, err := net.Dial("tcp", tr.Addr())
			if err != nil {
				t.Fatal(err)
			}
			_, _ = conn.Write([]byte("GET / HTTP/1.1\r\nHost: berth\r\n\r\n" + string(make([]byte, 64))))
			conn.SetReadDeadline(time.Now().Add(10 * time.Second))
			if _, err := conn.Read(make([]byte, 1)); err == nil {
				// A TLS server answers a bad hello with an alert; it must
				// then close.
				if _, err := conn.Read(make([]byte, 512)); err == nil {
					t.Fatal("garbage: the connection stayed open")
				}
			} else if ne, ok := err.(net.Error); ok && ne.Timeout() {
				t.Fatal("garbage: the connection stayed open")
			}
			conn.Close()
			testutil.WaitUntil(t, 5*time.Second, "garbage refused", func() bool { return auth.Refused.Load() > refused })

			good, err := ListenAuth("127.0.0.1:0", 2, loadAuth(t, mode.good), func(*wire.GroupMessage) {}, quiet())
			if err != nil {
				t.Fatal(err)
			}
			defer good.Close()
			good.SetPeer(1, tr.Addr())
			good.Send(&msg)
			select {
			case m := <-got:
				if m.Match != 9 || m.From != 2 {
					t.Fatalf("got %+v", m)
				}
			case <-time.After(10 * time.Second):
				t.Fatal("a member holding the credentials got no message through")
			}
		})
	}
}

// BenchmarkTransportAuth: appends of one 1 KiB entry each from broker 2 to
// broker 1 over loopback, with no proof, the cluster secret (checked at
// connection set-up only) and mutual TLS (every byte encrypted), 1024 in
// flight. What mutual TLS costs the replication traffic.
//
//	go test ./replication/groups -run '^$' -bench TransportAuth -benchmem
func BenchmarkTransportAuth(b *testing.B) {
	files, err := certgen.Init(b.TempDir(), certgen.Spec{Nodes: 2})
	if err != nil {
		b.Fatal(err)
	}
	load := func(o peerauth.Options) *peerauth.Auth {
		a, err := peerauth.Load(o)
		if err != nil {
			b.Fatal(err)
		}
		return a
	}
	for _, mode := range []struct {
		name       string
		recv, send *peerauth.Auth
	}{
		{"none", nil, nil},
		{"secret", load(peerauth.Options{SecretFile: files.Secret}), load(peerauth.Options{SecretFile: files.Secret})},
		{"mtls", load(peerauth.Options{CAFile: files.CA, CertFile: files.NodeCerts[0], KeyFile: files.NodeKey[0]}),
			load(peerauth.Options{CAFile: files.CA, CertFile: files.NodeCerts[1], KeyFile: files.NodeKey[1]})},
	} {
		b.Run("auth="+mode.name, func(b *testing.B) {
			const inflight = 1024
			tokens := make(chan struct{}, inflight)
			got := make(chan struct{}, 1)
			var received int
			recv, err := ListenAuth("127.0.0.1:0", 1, mode.recv, func(*wire.GroupMessage) {
				<-tokens
				received++ // the handler runs on the one inbound connection's goroutine
				if received == b.N {
					got <- struct{}{}
				}
			}, quiet())
			if err != nil {
				b.Fatal(err)
			}
			defer recv.Close()
			send, err := ListenAuth("127.0.0.1:0", 2, mode.send, func(*wire.GroupMessage) {}, quiet())
			if err != nil {
				b.Fatal(err)
			}
			defer send.Close()
			send.SetPeer(1, recv.Addr())
			msg := wire.GroupMessage{Group: 1, Kind: wire.GroupAppend, From: 2, To: 1, Epoch: 1,
				Entries: []wire.GroupEntry{{Epoch: 1, Index: 1, Data: make([]byte, 1024)}}}
			b.SetBytes(1024)
			b.ReportAllocs()
			b.ResetTimer()
			cpu0 := processCPU(b)
			for range b.N {
				tokens <- struct{}{}
				send.Send(&msg)
			}
			select {
			case <-got:
			case <-time.After(30 * time.Second):
				b.Fatalf("%d messages did not arrive (%d dropped)", len(tokens), send.Dropped.Load())
			}
			// CPU per message of both ends, which a machine shared with
			// other work shows more steadily than the wall clock.
			b.ReportMetric(float64(processCPU(b)-cpu0)/float64(b.N), "cpu-ns/op")
		})
	}
}

// processCPU is the user and system CPU time this process used, in ns.
func processCPU(b *testing.B) int64 {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return ru.Utime.Nano() + ru.Stime.Nano()
}
