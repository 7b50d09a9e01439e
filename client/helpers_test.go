package client

import (
	"context"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/berthmq/berth/internal/testutil"
	"github.com/berthmq/berth/server"
)

// testTimeout bounds every wait in these tests, so a bug fails a test
// instead of hanging the run.
const testTimeout = 20 * time.Second

func startServer(t testing.TB, mod ...func(*server.Config)) *server.Server {
	t.Helper()
	cfg := server.DefaultConfig()
	cfg.ClientAddr = "127.0.0.1:0"
	cfg.AdminAddr = ""
	cfg.DataDir = t.TempDir()
	cfg.Shards = 2
	cfg.Loops = 2
	for _, m := range mod {
		m(&cfg)
	}
	s, err := server.Start(cfg)
	if err != nil {
		t.Fatalf("server.Start: %v", err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func testCtx(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	t.Cleanup(cancel)
	return ctx
}

func dialTest(t testing.TB, addr string, cfg ...Config) *Conn {
	t.Helper()
	var c Config
	if len(cfg) > 0 {
		c = cfg[0]
	}
	conn, err := DialConfig(testCtx(t), c, addr)
	if err != nil {
		t.Fatalf("dial %s: %v", addr, err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

// proxy is a fault-injecting TCP relay between a client and a real server:
// it can hold back everything the server sends, to fill the client's
// window or starve its heartbeat detector, or everything the client sends,
// and it can cut the connections without letting held bytes through.
type proxy struct {
	ln       net.Listener
	target   string
	mu       sync.Mutex
	paused   bool // server to client held
	upPaused bool // client to server held
	resume   chan struct{}
	conns    []net.Conn
}

func startProxy(t testing.TB, target string) *proxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &proxy{ln: ln, target: target, resume: make(chan struct{})}
	go p.serve()
	t.Cleanup(p.close)
	return p
}

func (p *proxy) addr() string { return p.ln.Addr().String() }

func (p *proxy) serve() {
	for {
		cc, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.mu.Lock()
		target := p.target
		p.mu.Unlock()
		sc, err := net.Dial("tcp", target)
		if err != nil {
			cc.Close()
			continue
		}
		p.mu.Lock()
		p.conns = append(p.conns, cc, sc)
		p.mu.Unlock()
		go p.relay(cc, sc, &p.upPaused)
		go p.relay(sc, cc, &p.paused)
	}
}

// relay copies from to to, holding what it read while *held. Once it holds
// a buffer it reads no more, so the sender's writes back up.
func (p *proxy) relay(from, to net.Conn, held *bool) {
	defer to.Close()
	buf := make([]byte, 64<<10)
	for {
		n, err := from.Read(buf)
		if n > 0 {
			p.mu.Lock()
			for *held {
				ch := p.resume
				p.mu.Unlock()
				<-ch
				p.mu.Lock()
			}
			p.mu.Unlock()
			if _, werr := to.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

// pauseUp holds everything the client sends from now on.
func (p *proxy) pauseUp() {
	p.mu.Lock()
	p.upPaused = true
	p.mu.Unlock()
}

// retarget sends the connections accepted from now on to addr.
func (p *proxy) retarget(addr string) {
	p.mu.Lock()
	p.target = addr
	p.mu.Unlock()
}

// kill cuts every relayed connection at once; bytes held stay held.
func (p *proxy) kill() {
	p.mu.Lock()
	for _, c := range p.conns {
		c.Close()
	}
	p.mu.Unlock()
}

func (p *proxy) pause() {
	p.mu.Lock()
	p.paused = true
	p.mu.Unlock()
}

func (p *proxy) unpause() {
	p.mu.Lock()
	if p.paused || p.upPaused {
		p.paused, p.upPaused = false, false
		close(p.resume)
		p.resume = make(chan struct{})
	}
	p.mu.Unlock()
}

func (p *proxy) close() {
	p.unpause()
	p.ln.Close()
	p.mu.Lock()
	for _, c := range p.conns {
		c.Close()
	}
	p.mu.Unlock()
}

// waitFor polls cond until it holds or the test timeout passes.
func waitFor(t testing.TB, what string, cond func() bool) {
	t.Helper()
	testutil.WaitUntil(t, testTimeout, what, cond)
}
