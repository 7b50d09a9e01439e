package server

import (
	"log/slog"
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/berthmq/berth/controlplane/ctlapi"
	"github.com/berthmq/berth/wire"
)

// fakeTransport stands for a connection from any address, which loopback
// tests cannot open; it hands what is sent to sent.
type fakeTransport struct {
	remote net.Addr
	sent   chan []byte
}

func (f *fakeTransport) WriteAsync(bufs [][]byte, done func()) error { done(); return nil }
func (f *fakeTransport) send(frame []byte, _ bool) error             { f.sent <- frame; return nil }
func (f *fakeTransport) writeOwned(b []byte)                         {}
func (f *fakeTransport) runOwned(fn func()) error                    { fn(); return nil }
func (f *fakeTransport) outBuffered() int64                          { return 0 }
func (f *fakeTransport) wake()                                       {}
func (f *fakeTransport) abort()                                      {}
func (f *fakeTransport) RemoteAddr() net.Addr                        { return f.remote }

// TestDefaultUserOnlyFromLoopback: mechanism none logs in from 127.0.0.1
// and ::1, and is refused from any other address.
func TestDefaultUserOnlyFromLoopback(t *testing.T) {
	s := &Server{cfg: DefaultConfig(), log: slog.New(slog.DiscardHandler), auth: newAuthState(false)}
	s.sec = newSecurityMetrics(prometheus.NewRegistry(), false)
	h := &handler{s: s}
	for _, tc := range []struct {
		remote string
		ok     bool
	}{{"127.0.0.1:5000", true}, {"[::1]:5000", true}, {"192.0.2.7:5000", false}, {"[2001:db8::1]:5000", false}, {"10.0.0.1:5000", false}} {
		ft := &fakeTransport{remote: net.TCPAddrFromAddrPort(netipAddrPort(t, tc.remote)), sent: make(chan []byte, 1)}
		cs := &connState{s: s, t: ft}
		h.hello(cs, wire.AppendHello(nil, []wire.Version{wire.Current}, "t", wire.MechNone, nil, 0, 0)[wire.HeaderSize:])
		if tc.ok {
			if cs.sess == nil || cs.closing.Load() {
				t.Fatalf("%s: default user refused from loopback", tc.remote)
			}
			continue
		}
		if cs.sess != nil {
			t.Fatalf("%s: default user logged in from a non-loopback address", tc.remote)
		}
		select {
		case frame := <-ft.sent:
			_, body, _, err := wire.Next(frame, wire.FrameSizeMax)
			var e wire.Error
			if err != nil || wire.DecodeError(body, &e) != nil || e.Code != wire.CodeAuthFailed || !strings.Contains(string(e.Text), "loopback only") {
				t.Fatalf("%s: answer %q (%v), want auth-failed saying loopback only", tc.remote, body, err)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("%s: no answer to a refused login", tc.remote)
		}
	}
}

func TestAuthDelayGrowsAndIsBounded(t *testing.T) {
	prev := time.Duration(0)
	for n := 1; n < 40; n++ {
		d := authDelay(n)
		if d < prev || d > authDelayMax || d < authDelayBase {
			t.Fatalf("authDelay(%d) = %v after %v", n, d, prev)
		}
		prev = d
	}
	if prev != authDelayMax {
		t.Fatalf("the delay never reaches its bound: %v", prev)
	}
}

func TestFakeCredentialsStablePerName(t *testing.T) {
	a := newAuthState(false)
	x, y, z := a.fakeCredentials("mallory"), a.fakeCredentials("mallory"), a.fakeCredentials("trent")
	if x.Salt != y.Salt || string(x.StoredKey) != string(y.StoredKey) || x.Salt == z.Salt || x.Iters != 4096 {
		t.Fatal("fake credentials are not a stable function of the name")
	}
}

func netipAddrPort(t *testing.T, s string) netip.AddrPort {
	ap, err := netip.ParseAddrPort(s)
	if err != nil {
		t.Fatal(err)
	}
	return ap
}

// BenchmarkCanPublish is the permission check PUBLISH makes per message,
// for a user whose write pattern needs the regexp: once the names are
// cached it allocates nothing.
//
//	go test ./server -run '^$' -bench CanPublish -benchmem
func BenchmarkCanPublish(b *testing.B) {
	s := &Server{auth: newAuthState(false)}
	s.auth.setUsers([]ctlapi.User{{Name: "u", Permissions: ctlapi.Permissions{Write: "orders-[0-9]+|audit"}}})
	cs := &connState{s: s}
	cs.authz.name = "u"
	names := [][]byte{[]byte("orders-1"), []byte("orders-2"), []byte("audit"), []byte("orders-3")}
	for _, bench := range []struct {
		name     string
		exchange []byte
	}{{"target=exchange", []byte("audit")}, {"target=queues-rotating", nil}} {
		b.Run(bench.name, func(b *testing.B) {
			b.ReportAllocs()
			for i := 0; b.Loop(); i++ {
				if !cs.canPublish(bench.exchange, names[i%len(names)], uint64(i)+1) {
					b.Fatal("denied")
				}
			}
		})
	}
}
