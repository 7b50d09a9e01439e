//go:build !race

// The suite drives a separate berthd process; under the race detector it
// would only slow down the test process's side, so `make test` runs it
// once, in test-plain.

package hostiletest

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/berthmq/berth/client"
	"github.com/berthmq/berth/controlplane/ctlapi"
	"github.com/berthmq/berth/internal/testutil"
	"github.com/berthmq/berth/wire"
)

func TestMain(m *testing.M) {
	// The 10,000-connection case needs as many descriptors here and in
	// berthd, which inherits the limit raised by hand (Go restores the
	// original soft limit in children unless the program set it).
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err == nil && lim.Cur < lim.Max {
		lim.Cur = lim.Max
		_ = syscall.Setrlimit(syscall.RLIMIT_NOFILE, &lim)
	}
	testutil.Main(m)
}

const (
	// answerBound is how long the well-behaved client may take to get a
	// message through while (or just after) a hostile client plays.
	answerBound = 3 * time.Second
	// rssBound bounds berthd's RSS throughout; the measured peaks are in
	// docs/BENCHMARKS.md ("Hostile clients").
	rssBound = 768 << 20
	// The broker's limits, short to show within the test.
	handshakeTimeout = 2 * time.Second
	outboundMax      = 1 << 20
	outboundTimeout  = 2 * time.Second
	memoryLimit      = "128MiB"
)

type broker struct {
	p                *testutil.Proc
	addr, admin, ctl string
	probe            *client.Conn
	probeSub         *client.Consumer
	maxRSS           atomic.Int64
	stop             chan struct{}
	sampler          sync.WaitGroup
}

func startBroker(t *testing.T) *broker {
	dir := t.TempDir()
	b := &broker{addr: testutil.FreeAddr(t), admin: testutil.FreeAddr(t), ctl: testutil.FreeAddr(t), stop: make(chan struct{})}
	b.p = testutil.StartBerthd(t, filepath.Join(dir, "berthd.log"), "-listen", b.addr, "-admin", b.admin,
		"-data", filepath.Join(dir, "data"), "-controller", b.ctl, "-shards", "2", "-loops", "2",
		"-memory-limit", memoryLimit, "-fsync", "never",
		"-handshake-timeout", handshakeTimeout.String(), "-outbound-max", strconv.Itoa(outboundMax),
		"-outbound-timeout", outboundTimeout.String())
	testutil.WaitReady(t, b.admin, 60*time.Second)
	b.sampler.Add(1)
	go func() {
		defer b.sampler.Done()
		tick := time.NewTicker(20 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-b.stop:
				return
			case <-tick.C:
			}
			if rss, err := rssBytes(b.p.Pid()); err == nil && rss > b.maxRSS.Load() {
				b.maxRSS.Store(rss)
			}
		}
	}()
	t.Cleanup(func() {
		close(b.stop)
		b.sampler.Wait()
		t.Logf("berthd peak RSS over the suite: %d MiB", b.maxRSS.Load()>>20)
	})
	b.probe = b.dial(t, client.Config{})
	if err := b.probe.DeclareQueue(ctx(t), "probe", client.QueueOptions{}); err != nil {
		t.Fatal(err)
	}
	var err error
	b.probeSub, err = b.probe.Subscribe(ctx(t), "probe", client.SubscribeOptions{Credit: 100, AutoCredit: true, AckMode: client.AckNone})
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func ctx(t *testing.T) context.Context {
	c, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return c
}

func (b *broker) dial(t *testing.T, cfg client.Config) *client.Conn {
	t.Helper()
	c, err := client.DialConfig(ctx(t), cfg, b.addr)
	if err != nil {
		t.Fatalf("dial: %v", err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// check fails t unless berthd runs, a message goes through the probe
// queue within answerBound, and RSS is under rssBound.
func (b *broker) check(t *testing.T, what string) {
	t.Helper()
	if !b.p.Running() {
		t.Fatalf("%s: berthd exited:\n%s", what, b.p.LogTail())
	}
	if err := b.roundTrip(b.probe, b.probeSub); err != nil {
		t.Fatalf("%s: the well-behaved client: %v", what, err)
	}
	rss, err := rssBytes(b.p.Pid())
	if err != nil {
		t.Fatal(err)
	}
	if rss > rssBound || b.maxRSS.Load() > rssBound {
		t.Fatalf("%s: berthd RSS %d MiB (peak %d MiB), bound %d MiB", what, rss>>20, b.maxRSS.Load()>>20, rssBound>>20)
	}
	t.Logf("%s: probe answered, RSS %d MiB (peak so far %d MiB)", what, rss>>20, b.maxRSS.Load()>>20)
}

func (b *broker) roundTrip(c *client.Conn, sub *client.Consumer) error {
	cx, cancel := context.WithTimeout(context.Background(), answerBound)
	defer cancel()
	want := strconv.FormatInt(time.Now().UnixNano(), 10)
	if err := c.Publish(cx, "", "probe", []byte(want), client.PublishOptions{}); err != nil {
		return fmt.Errorf("publish: %w", err)
	}
	for {
		d, err := sub.Next(cx)
		if err != nil {
			return fmt.Errorf("consume within %v: %w", answerBound, err)
		}
		if string(d.Payload) == want {
			return nil
		}
	}
}

// metric reads one unlabelled sample from /metrics.
func (b *broker) metric(t *testing.T, name string) float64 {
	t.Helper()
	resp, err := http.Get("http://" + b.admin + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	for _, line := range strings.Split(string(body), "\n") {
		if rest, ok := strings.CutPrefix(line, name+" "); ok {
			v, err := strconv.ParseFloat(strings.TrimSpace(rest), 64)
			if err != nil {
				t.Fatalf("%s: %v", line, err)
			}
			return v
		}
	}
	t.Fatalf("/metrics has no %s", name)
	return 0
}

func (b *broker) waitMetric(t *testing.T, name string, within time.Duration, ok func(float64) bool) float64 {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		v := b.metric(t, name)
		if ok(v) {
			return v
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s is %v after %v", name, v, within)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// outboundBytes reads memory.outbound_bytes from /v1/status.
func (b *broker) outboundBytes(t *testing.T) int64 {
	t.Helper()
	resp, err := http.Get("http://" + b.admin + "/v1/status")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var st struct {
		Memory struct {
			OutboundBytes int64 `json:"outbound_bytes"`
		} `json:"memory"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&st); err != nil {
		t.Fatal(err)
	}
	return st.Memory.OutboundBytes
}

// rssBytes reads VmRSS of process pid.
func rssBytes(pid int) (int64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(string(b), "\n") {
		if rest, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(rest), "kB")), 10, 64)
			return kb << 10, err
		}
	}
	return 0, fmt.Errorf("no VmRSS in /proc/%d/status", pid)
}

// raw is a client connection spoken frame by frame.
type raw struct {
	c  net.Conn
	r  *bufio.Reader
	id uint64
}

func dialRaw(t testing.TB, addr string) *raw {
	t.Helper()
	return dialRawWith(t, net.Dialer{Timeout: 5 * time.Second}, addr)
}

func dialRawWith(t testing.TB, d net.Dialer, addr string) *raw {
	t.Helper()
	c, err := d.Dial("tcp", addr)
	if err != nil {
		t.Fatalf("dial %s: %v", addr, err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return &raw{c: c, r: bufio.NewReaderSize(c, 64<<10)}
}

func (r *raw) write(t testing.TB, b []byte) {
	t.Helper()
	_ = r.c.SetWriteDeadline(time.Now().Add(5 * time.Second))
	if _, err := r.c.Write(b); err != nil {
		t.Fatalf("write: %v", err)
	}
}

// read returns the next frame other than a heartbeat.
func (r *raw) read(within time.Duration) (wire.Header, []byte, error) {
	_ = r.c.SetReadDeadline(time.Now().Add(within))
	for {
		hb, err := r.r.Peek(wire.HeaderSize)
		if err != nil {
			return wire.Header{}, nil, err
		}
		h, err := wire.ReadHeader(hb, wire.FrameSizeMax)
		if err != nil {
			return h, nil, err
		}
		body := make([]byte, wire.HeaderSize+int(h.Length))
		if _, err := io.ReadFull(r.r, body); err != nil {
			return h, nil, err
		}
		if h.Type != wire.TypeHeartbeat {
			return h, body[wire.HeaderSize:], nil
		}
	}
}

func (r *raw) hello(t testing.TB, name string) {
	t.Helper()
	r.write(t, wire.AppendHello(nil, []wire.Version{wire.Current}, name, "none", nil, 0, 0))
	h, _, err := r.read(5 * time.Second)
	if err != nil || h.Type != wire.TypeWelcome {
		t.Fatalf("HELLO answered %v, %v", h.Type, err)
	}
}

func (r *raw) nextID() uint64 { r.id++; return r.id }

// expectRefusal reads until the connection ends and returns the code of
// the first ERROR or CLOSE; it fails t if the connection stays open.
func (r *raw) expectRefusal(t testing.TB, within time.Duration) (wire.ErrorCode, string) {
	t.Helper()
	deadline := time.Now().Add(within)
	code, text := wire.CodeOK, ""
	seen := false
	for {
		h, body, err := r.read(time.Until(deadline))
		if err != nil {
			if errors.Is(err, io.EOF) || errors.Is(err, syscall.ECONNRESET) {
				if !seen {
					t.Fatal("connection closed without ERROR or CLOSE")
				}
				return code, text
			}
			t.Fatalf("connection not closed within %v: %v", within, err)
		}
		switch h.Type {
		case wire.TypeError:
			var e wire.Error
			if wire.DecodeError(body, &e) == nil && !seen {
				code, text, seen = e.Code, string(e.Text), true
			}
		case wire.TypeClose:
			var c wire.Close
			if wire.DecodeClose(body, &c) == nil && !seen {
				code, text, seen = c.Code, string(c.Reason), true
			}
		}
	}
}

// expectAnswer reads until the command id completes or fails; it returns
// the error code (CodeOK for a completion).
func (r *raw) expectAnswer(t testing.TB, id uint64) wire.ErrorCode {
	t.Helper()
	for {
		h, body, err := r.read(5 * time.Second)
		if err != nil {
			t.Fatalf("waiting for command %d: %v", id, err)
		}
		switch h.Type {
		case wire.TypeComplete:
			l, err := wire.DecodeComplete(body)
			if err != nil {
				t.Fatal(err)
			}
			for i := 0; i < l.Len(); i++ {
				if rg := l.At(i); rg.First <= id && id <= rg.Last {
					return wire.CodeOK
				}
			}
		case wire.TypeError:
			var e wire.Error
			if err := wire.DecodeError(body, &e); err != nil {
				t.Fatal(err)
			}
			if e.CommandID == id || e.CommandID == 0 {
				return e.Code
			}
		case wire.TypeClose:
			t.Fatalf("connection closed waiting for command %d", id)
		}
	}
}

func TestHostileClients(t *testing.T) {
	testutil.Long(t, "the hostile clients suite")
	start := time.Now()
	b := startBroker(t)
	b.check(t, "start")
	for _, c := range []struct {
		name string
		f    func(*testing.T, *broker)
	}{
		{"HugeLengths", hugeLengths},
		{"LoginNeverFinishes", loginNeverFinishes},
		{"ManyConnections", manyConnections},
		{"Churn", churn},
		{"NonReadingConsumer", nonReadingConsumer},
		{"SlowConsumerResumes", slowConsumerResumes},
		{"UnacceptedFlood", unacceptedFlood},
		{"NameLimits", nameLimits},
		{"SlowTopicPatterns", slowTopicPatterns},
		{"DeniedCommands", deniedCommands}, // last: it adds users
	} {
		if !t.Run(c.name, func(t *testing.T) { c.f(t, b); b.check(t, c.name) }) {
			return
		}
	}
	t.Logf("suite took %v", time.Since(start).Round(time.Millisecond))
}

// hugeLengths: frame headers claiming 4 GiB bodies, before and after
// HELLO, get frame-too-large and a close at once; nothing is buffered.
func hugeLengths(t *testing.T, b *broker) {
	for _, typ := range []wire.Type{wire.TypeHello, wire.TypePublish, wire.TypeDeclareQueue} {
		r := dialRaw(t, b.addr)
		if typ != wire.TypeHello {
			r.hello(t, "huge")
		}
		r.write(t, wire.AppendHeader(nil, wire.Header{Version: wire.Current, Type: typ, Length: 0xFFFFFFFF}))
		// Then a megabyte of what could be the body, which must not be
		// waited for (the write may fail once the broker has closed).
		_, _ = r.c.Write(make([]byte, 1<<20))
		if code, text := r.expectRefusal(t, 3*time.Second); code != wire.CodeFrameTooLarge {
			t.Fatalf("%v claiming 4 GiB: %v %q, want frame-too-large", typ, code, text)
		}
	}
}

// loginNeverFinishes: a connection that sends nothing, and one that sends
// a HELLO a byte at a time, are closed by the handshake timeout.
func loginNeverFinishes(t *testing.T, b *broker) {
	before := b.metric(t, "berth_handshake_timeouts_total")
	opened := time.Now() // before the broker accepts either
	silent := dialRaw(t, b.addr)
	trickle := dialRaw(t, b.addr)
	hello := wire.AppendHello(nil, []wire.Version{wire.Current}, "slow", "none", nil, 0, 0)
	stop := make(chan struct{})
	defer close(stop)
	go func() {
		for i := 0; i < len(hello)-1; i++ { // never the last byte
			select {
			case <-stop:
				return
			case <-time.After(100 * time.Millisecond):
			}
			if _, err := trickle.c.Write(hello[i : i+1]); err != nil {
				return
			}
		}
	}()
	for _, r := range []*raw{silent, trickle} {
		code, text := r.expectRefusal(t, handshakeTimeout+3*time.Second)
		if code != wire.CodeHeartbeatTimeout || !strings.Contains(text, "login") {
			t.Fatalf("unfinished login closed with %v %q", code, text)
		}
	}
	if took := time.Since(opened); took < handshakeTimeout {
		t.Fatalf("closed after %v, before the handshake timeout", took)
	}
	b.waitMetric(t, "berth_handshake_timeouts_total", 2*time.Second, func(v float64) bool { return v >= before+2 })
}

// manyConnections opens and logs in 10,000 connections (fewer if the
// descriptor limit is lower: it is logged), holds them while the probe
// runs, then closes them; the broker's connection gauge follows.
func manyConnections(t *testing.T, b *broker) {
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		t.Fatal(err)
	}
	n := 10000
	if max := int(lim.Cur) - 512; max < n {
		n = max
		t.Logf("descriptor limit %d: holding %d connections, not 10,000", lim.Cur, n)
	}
	base := b.metric(t, "berth_connections")
	rssBefore, _ := rssBytes(b.p.Pid())
	conns := make([]net.Conn, n)
	hello := wire.AppendHello(nil, []wire.Version{wire.Current}, "many", "none", nil, 0, 0)
	var wg sync.WaitGroup
	var failed atomic.Value
	const workers = 8
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			buf := make([]byte, 4096)
			for i := w; i < n; i += workers {
				c, err := net.DialTimeout("tcp", b.addr, 5*time.Second)
				if err != nil {
					failed.Store(err)
					return
				}
				conns[i] = c
				_ = c.SetDeadline(time.Now().Add(10 * time.Second))
				if _, err := c.Write(hello); err != nil {
					failed.Store(err)
					return
				}
				// WELCOME: read its header and body.
				if _, err := io.ReadFull(c, buf[:wire.HeaderSize]); err != nil {
					failed.Store(err)
					return
				}
				h, err := wire.ReadHeader(buf, wire.FrameSizeMax)
				if err != nil || h.Type != wire.TypeWelcome || int(h.Length) > len(buf) {
					failed.Store(fmt.Errorf("HELLO answered %v %v", h.Type, err))
					return
				}
				if _, err := io.ReadFull(c, buf[:h.Length]); err != nil {
					failed.Store(err)
					return
				}
			}
		}(w)
	}
	wg.Wait()
	defer func() {
		for _, c := range conns {
			if c != nil {
				c.Close()
			}
		}
	}()
	if err, _ := failed.Load().(error); err != nil {
		t.Fatalf("opening %d connections: %v", n, err)
	}
	b.waitMetric(t, "berth_connections", 5*time.Second, func(v float64) bool { return v >= base+float64(n) })
	b.check(t, fmt.Sprintf("%d connections held", n))
	rss, _ := rssBytes(b.p.Pid())
	t.Logf("RSS %d MiB before, %d MiB with %d connections logged in and held (%.1f KiB each)",
		rssBefore>>20, rss>>20, n, float64(rss-rssBefore)/float64(n)/1024)
	for i, c := range conns {
		c.Close()
		conns[i] = nil
	}
	b.waitMetric(t, "berth_connections", 10*time.Second, func(v float64) bool { return v <= base })
}

// churn opens and drops connections as fast as 4 workers can, in three
// ways (closed at once, closed after HELLO, reset in the middle of a
// frame), 6,000 in all or 10 s; afterwards no connection is left behind.
func churn(t *testing.T, b *broker) {
	base := b.metric(t, "berth_connections")
	hello := wire.AppendHello(nil, []wire.Version{wire.Current}, "churn", "none", nil, 0, 0)
	deadline := time.Now().Add(10 * time.Second)
	var done atomic.Int64
	var wg sync.WaitGroup
	for w := 0; w < 4; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			for i := 0; i < 1500 && time.Now().Before(deadline); i++ {
				c, err := net.DialTimeout("tcp", b.addr, 5*time.Second)
				if err != nil {
					continue // a full accept queue: the next one tries again
				}
				switch i % 3 {
				case 1:
					_, _ = c.Write(hello)
				case 2:
					_, _ = c.Write(hello[:len(hello)/2])
					_ = c.(*net.TCPConn).SetLinger(0) // RST
				}
				c.Close()
				done.Add(1)
			}
		}(w)
	}
	wg.Wait()
	if done.Load() < 1000 {
		t.Fatalf("only %d connections in 10 s", done.Load())
	}
	t.Logf("%d connections opened and dropped", done.Load())
	b.waitMetric(t, "berth_connections", 10*time.Second, func(v float64) bool { return v <= base })
}

// subscribeRaw logs in r and subscribes it to queue with credit.
func subscribeRaw(t *testing.T, r *raw, queue string, ack uint8) {
	t.Helper()
	r.hello(t, "raw-consumer")
	id := r.nextID()
	r.write(t, wire.AppendSubscribe(nil, wire.Current, &wire.Subscribe{CommandID: id, ConsumerID: 1, Queue: []byte(queue), Credit: 65535, AckMode: ack}))
	if code := r.expectAnswer(t, id); code != wire.CodeOK {
		t.Fatalf("SUBSCRIBE %s: %v", queue, code)
	}
}

// grantForever sends CREDIT for consumer 1 every 10 ms until stop: the
// consumer asks for everything, whether or not it reads.
func grantForever(r *raw, stop <-chan struct{}) {
	frame := wire.AppendCredit(nil, wire.Current, 1, 65535)
	for {
		select {
		case <-stop:
			return
		case <-time.After(10 * time.Millisecond):
		}
		_ = r.c.SetWriteDeadline(time.Now().Add(time.Second))
		if _, err := r.c.Write(frame); err != nil && !errors.Is(err, os.ErrDeadlineExceeded) {
			return
		}
	}
}

// publishN publishes n messages of size bytes to queue and waits for all
// to complete.
func publishN(t *testing.T, c *client.Conn, queue string, n, size int) {
	t.Helper()
	payload := bytes.Repeat([]byte{'m'}, size)
	var failed atomic.Value
	for i := 0; i < n; i++ {
		if err := c.PublishAsync(ctx(t), "", queue, payload, client.PublishOptions{}, func(err error) {
			if err != nil {
				failed.Store(err)
			}
		}); err != nil {
			t.Fatal(err)
		}
	}
	if err := c.Flush(ctx(t)); err != nil {
		t.Fatal(err)
	}
	if err, _ := failed.Load().(error); err != nil {
		t.Fatal(err)
	}
}

// nonReadingConsumer: a consumer takes all the credit it can and never
// reads its socket, beside a well-behaved consumer of the same queue.
// The broker stops delivering to it at -outbound-max, so the other
// consumer gets the rest (without the cap each would get half), and
// closes it after -outbound-timeout.
func nonReadingConsumer(t *testing.T, b *broker) {
	// It may be handed the cap, what the broker's socket buffer takes and
	// its own 64 KiB; without the cap, half of n.
	const size = 1024
	bound := outboundMax + testutil.TCPSendBufferMax() + 1<<20
	n := max(60000, 2*bound/size+4000)
	if err := b.probe.DeclareQueue(ctx(t), "shared", client.QueueOptions{}); err != nil {
		t.Fatal(err)
	}
	before := b.metric(t, "berth_outbound_timeouts_total")
	// A small receive buffer: the kernel holds little for the client.
	slow := dialRawWith(t, net.Dialer{Timeout: 5 * time.Second, Control: func(_, _ string, rc syscall.RawConn) error {
		return rc.Control(func(fd uintptr) { _ = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, 64<<10) })
	}}, b.addr)
	subscribeRaw(t, slow, "shared", wire.AckNone)
	stop := make(chan struct{})
	var grants sync.WaitGroup
	grants.Add(1)
	go func() { defer grants.Done(); grantForever(slow, stop) }()
	defer func() { close(stop); grants.Wait() }()

	good := b.dial(t, client.Config{})
	sub, err := good.Subscribe(ctx(t), "shared", client.SubscribeOptions{Credit: 2000, AutoCredit: true, AckMode: client.AckNone})
	if err != nil {
		t.Fatal(err)
	}
	var got atomic.Int64
	go func() {
		for {
			if _, err := sub.Next(context.Background()); err != nil {
				return
			}
			got.Add(1)
		}
	}()
	pub := b.dial(t, client.Config{})
	publishN(t, pub, "shared", n, size)
	// Everything published goes to one consumer or the other.
	deadline := time.Now().Add(15 * time.Second)
	for got.Load() < int64(n/2) && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	b.check(t, "non-reading consumer subscribed")
	waitDepth := time.Now().Add(5 * time.Second)
	for time.Now().Before(waitDepth) {
		prev := got.Load()
		time.Sleep(200 * time.Millisecond)
		if got.Load() == prev {
			break
		}
	}
	toSlow := n - int(got.Load())
	t.Logf("of %d messages of %d bytes, the well-behaved consumer got %d, the one that does not read %d (%d KiB)",
		n, size, got.Load(), toSlow, toSlow*size>>10)
	if toSlow*size > bound {
		t.Fatalf("the non-reading consumer was handed %d of %d messages", toSlow, n)
	}
	// What it holds counts in the memory budget, and no more than the cap
	// (and one batch) of it. A berthd built with -race is slow enough that
	// the wait above can outlast outboundTimeout, which closes the
	// connection and frees what it held: there only the cap is checked.
	// A loaded machine can do the same (the waits above outlast the
	// timeout): then the timeout's counter has risen, and what it held is
	// gone with the connection.
	var held int64
	if testutil.RaceBerthd {
		held = b.outboundBytes(t)
	} else {
		testutil.WaitFor(t, 2*time.Second, func() error {
			if held = b.outboundBytes(t); held <= 0 {
				if b.metric(t, "berth_outbound_timeouts_total") >= before+1 {
					t.Logf("the non-reading consumer's connection was closed by the outbound timeout before its holding was read")
					return nil
				}
				return fmt.Errorf("/v1/status memory.outbound_bytes is %d", held)
			}
			return nil
		})
	}
	if held > 2*outboundMax {
		t.Fatalf("/v1/status memory.outbound_bytes is %d, over twice the cap", held)
	}
	t.Logf("outbound bytes in the memory budget while it does not read: %d KiB", held>>10)
	b.waitMetric(t, "berth_outbound_timeouts_total", outboundTimeout+5*time.Second, func(v float64) bool { return v >= before+1 })
	// It was closed: reading drains what it was sent, then ends.
	_ = slow.c.SetReadDeadline(time.Now().Add(10 * time.Second))
	nread, err := io.Copy(io.Discard, slow.c)
	if err != nil && !errors.Is(err, syscall.ECONNRESET) {
		t.Fatalf("the non-reading consumer's connection did not end: %v after %d bytes", err, nread)
	}
	t.Logf("the non-reading consumer's socket held %d KiB when it was closed", nread>>10)
}

// slowConsumerResumes: the only consumer of a queue stops reading past
// the cap; once it reads again, delivery resumes and it gets every
// message.
func slowConsumerResumes(t *testing.T, b *broker) {
	const n, size = 16000, 1024
	if err := b.probe.DeclareQueue(ctx(t), "resume", client.QueueOptions{}); err != nil {
		t.Fatal(err)
	}
	r := dialRawWith(t, net.Dialer{Timeout: 5 * time.Second, Control: func(_, _ string, rc syscall.RawConn) error {
		return rc.Control(func(fd uintptr) { _ = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, 64<<10) })
	}}, b.addr)
	subscribeRaw(t, r, "resume", wire.AckNone)
	stop := make(chan struct{})
	var grants sync.WaitGroup
	grants.Add(1)
	go func() { defer grants.Done(); grantForever(r, stop) }()
	defer func() { close(stop); grants.Wait() }()
	pub := b.dial(t, client.Config{})
	publishN(t, pub, "resume", n, size)
	time.Sleep(outboundTimeout / 3) // not reading, under the timeout
	got := 0
	deadline := time.Now().Add(15 * time.Second)
	for got < n {
		h, body, err := r.read(time.Until(deadline))
		if err != nil {
			t.Fatalf("after %d of %d deliveries: %v", got, n, err)
		}
		if h.Type != wire.TypeDeliver {
			continue
		}
		var d wire.Deliver
		if err := wire.DecodeDeliver(body, &d); err != nil {
			t.Fatal(err)
		}
		got += d.Count
	}
}

// unacceptedFlood: a consumer takes every message and accepts none
// while granting credit without end, and floods RELEASEs and REJECTs of
// tags it was never given. The broker keeps serving; when the consumer
// goes, every message comes back to the queue.
func unacceptedFlood(t *testing.T, b *broker) {
	const n, size = 20000, 1024
	if err := b.probe.DeclareQueue(ctx(t), "unacked", client.QueueOptions{}); err != nil {
		t.Fatal(err)
	}
	r := dialRaw(t, b.addr)
	subscribeRaw(t, r, "unacked", wire.AckExplicit)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { defer wg.Done(); grantForever(r, stop) }()
	var delivered atomic.Int64
	go func() { // reads (it is not slow), never accepts
		defer wg.Done()
		for {
			h, body, err := r.read(30 * time.Second)
			if err != nil {
				return
			}
			var d wire.Deliver
			if h.Type == wire.TypeDeliver && wire.DecodeDeliver(body, &d) == nil {
				delivered.Add(int64(d.Count))
			}
		}
	}()
	pub := b.dial(t, client.Config{})
	publishN(t, pub, "unacked", n, size)
	deadline := time.Now().Add(15 * time.Second)
	for delivered.Load() < n && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if delivered.Load() < n {
		t.Fatalf("%d of %d delivered", delivered.Load(), n)
	}
	// Settles of tags far past any delivered, wide and narrow, at full
	// speed for a second, with the probe running meanwhile.
	flood := time.Now().Add(time.Second)
	var frames []byte
	for i := uint64(0); i < 64; i++ {
		frames = wire.AppendSettle(frames, wire.Current, wire.TypeRelease, 0, 1, []wire.Range{{First: 1 << 40, Last: 1<<63 + i}})
		frames = wire.AppendSettle(frames, wire.Current, wire.TypeReject, 0, 1, []wire.Range{{First: 1<<50 + i, Last: 1<<50 + i}})
	}
	sent := 0
	for time.Now().Before(flood) {
		r.write(t, frames)
		sent += 128
	}
	b.check(t, fmt.Sprintf("%d unaccepted deliveries, %d settles of unknown tags", n, sent))
	// The consumer goes: all of it returns to the queue.
	r.c.Close()
	close(stop)
	wg.Wait()
	drain := b.dial(t, client.Config{})
	sub, err := drain.Subscribe(ctx(t), "unacked", client.SubscribeOptions{Credit: 5000, AutoCredit: true, AckMode: client.AckNone})
	if err != nil {
		t.Fatal(err)
	}
	cx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	for i := 0; i < n; i++ {
		d, err := sub.Next(cx)
		if err != nil {
			t.Fatalf("after %d of %d requeued: %v", i, n, err)
		}
		if !d.Redelivered {
			t.Fatalf("message %d not marked redelivered", i)
		}
	}
}

// nameLimits: every name, key and the properties at their length limit
// are taken; one byte more gets ERROR malformed and a close, and nothing
// else breaks.
func nameLimits(t *testing.T, b *broker) {
	name := func(n int) []byte { return bytes.Repeat([]byte{'n'}, n) }
	key := func(n int) []byte { return bytes.Repeat([]byte{'k'}, n) }
	declareQ := func(q []byte) func(uint64) []byte {
		return func(id uint64) []byte {
			return wire.AppendDeclareQueue(nil, wire.Current, &wire.DeclareQueue{CommandID: id, Name: q})
		}
	}
	declareX := func(x []byte) func(uint64) []byte {
		return func(id uint64) []byte {
			return wire.AppendDeclareExchange(nil, wire.Current, &wire.DeclareExchange{CommandID: id, Name: x, Kind: wire.ExchangeTopic})
		}
	}
	bind := func(k []byte) func(uint64) []byte {
		return func(id uint64) []byte {
			return wire.AppendBind(nil, wire.Current, wire.TypeBind, &wire.Bind{CommandID: id, Exchange: name(wire.NameLenMax), Queue: name(wire.NameLenMax), Key: k})
		}
	}
	publish := func(k []byte) func(uint64) []byte {
		return func(id uint64) []byte {
			f, s := wire.AppendPublishStart(nil, wire.Current, id, string(name(wire.NameLenMax)), 1)
			f = wire.AppendPublishMessage(f, 0, 0, string(k), nil, []byte("x"))
			wire.EndFrame(f, s, 0)
			return f
		}
	}
	subscribe := func(q []byte) func(uint64) []byte {
		return func(id uint64) []byte {
			return wire.AppendSubscribe(nil, wire.Current, &wire.Subscribe{CommandID: id, ConsumerID: uint32(id), Queue: q, Credit: 1})
		}
	}
	deadLetter := func(x, k []byte) func(uint64) []byte {
		return func(id uint64) []byte {
			return wire.AppendDeclareQueue(nil, wire.Current, &wire.DeclareQueue{CommandID: id, Name: []byte("dl-limits"),
				Options: wire.QueueOptions{DeadLetterExchange: string(x), DeadLetterKey: string(k)}})
		}
	}
	props := func(n int) func(uint64) []byte {
		return func(id uint64) []byte {
			f, s := wire.AppendPublishStart(nil, wire.Current, id, "", 1)
			f = wire.AppendPublishMessage(f, 0, 0, "probe", make([]byte, n), []byte("x"))
			wire.EndFrame(f, s, 0)
			return f
		}
	}
	cases := []struct {
		what      string
		atLimit   func(uint64) []byte
		pastLimit func(uint64) []byte
	}{
		{"dead-letter exchange", deadLetter(name(wire.NameLenMax), nil), deadLetter(name(wire.NameLenMax+1), nil)},
		{"dead-letter key", deadLetter(nil, key(wire.RoutingKeyLenMax)), deadLetter(nil, key(wire.RoutingKeyLenMax+1))},
		{"message properties", props(wire.PropsLenMax), props(wire.PropsLenMax + 1)},
		{"queue name", declareQ(name(wire.NameLenMax)), declareQ(name(wire.NameLenMax + 1))},
		{"exchange name", declareX(name(wire.NameLenMax)), declareX(name(wire.NameLenMax + 1))},
		{"binding key", bind(key(wire.RoutingKeyLenMax)), bind(key(wire.RoutingKeyLenMax + 1))},
		{"routing key", publish(key(wire.RoutingKeyLenMax)), publish(key(wire.RoutingKeyLenMax + 1))},
		{"subscribed queue", subscribe(name(wire.NameLenMax)), subscribe(name(wire.NameLenMax + 1))},
	}
	ok := dialRaw(t, b.addr)
	ok.hello(t, string(name(wire.NameLenMax)))
	for _, c := range cases {
		id := ok.nextID()
		ok.write(t, c.atLimit(id))
		if code := ok.expectAnswer(t, id); code == wire.CodeMalformed || code == wire.CodeInvalid {
			t.Fatalf("%s at its limit refused: %v", c.what, code)
		}
		bad := dialRaw(t, b.addr)
		bad.hello(t, "past")
		bad.write(t, c.pastLimit(bad.nextID()))
		if code, text := bad.expectRefusal(t, 3*time.Second); code != wire.CodeMalformed || text == "" {
			t.Fatalf("%s one byte past its limit: %v %q, want malformed with a reason", c.what, code, text)
		}
	}
	// The client name in HELLO, past its limit.
	bad := dialRaw(t, b.addr)
	bad.write(t, wire.AppendHello(nil, []wire.Version{wire.Current}, string(name(wire.NameLenMax+1)), "none", nil, 0, 0))
	if code, _ := bad.expectRefusal(t, 3*time.Second); code != wire.CodeMalformed {
		t.Fatalf("client name past its limit: %v", code)
	}
}

// slowTopicPatterns: 2,000 bindings whose patterns are runs of "#" (the
// worst case for a backtracking matcher), publishes of 32-word keys at
// full speed that match none, and patterns past the word cap.
func slowTopicPatterns(t *testing.T, b *broker) {
	c := b.dial(t, client.Config{})
	if err := c.DeclareExchange(ctx(t), "slow-topics", client.Topic, client.ExchangeOptions{}); err != nil {
		t.Fatal(err)
	}
	const queues, bindings = 4, 2000
	for q := 0; q < queues; q++ {
		if err := c.DeclareQueue(ctx(t), fmt.Sprintf("topics-%d", q), client.QueueOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	var wg sync.WaitGroup
	var failed atomic.Value
	for w := 0; w < 8; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			for i := w; i < bindings; i += 8 {
				hashes := 2 + i%29
				pattern := strings.Repeat("#.", hashes) + "z" + strconv.Itoa(i)
				if err := c.Bind(ctx(t), "slow-topics", fmt.Sprintf("topics-%d", i%queues), pattern); err != nil {
					failed.Store(fmt.Errorf("bind %q: %w", pattern, err))
					return
				}
			}
		}(w)
	}
	wg.Wait()
	if err, _ := failed.Load().(error); err != nil {
		t.Fatal(err)
	}
	// A pattern past the word cap is refused with a reason; the
	// connection carries on.
	if err := c.Bind(ctx(t), "slow-topics", "topics-0", strings.Repeat("#.", 200)+"z"); err == nil {
		t.Log("a 201-word pattern was taken")
	} else if client.Code(err) == wire.CodeOK {
		t.Fatalf("a 201-word pattern: %v", err)
	}
	key := strings.Repeat("a.", 31) + "b" // 32 words, matches none
	began := time.Now()
	stop := began.Add(2 * time.Second)
	sent := 0
	for time.Now().Before(stop) && sent < 200000 {
		if err := c.PublishAsync(ctx(t), "slow-topics", key, []byte("x"), client.PublishOptions{}, nil); err != nil {
			t.Fatal(err)
		}
		sent++
		if sent%1000 == 0 {
			if err := b.roundTrip(b.probe, b.probeSub); err != nil {
				t.Fatalf("probe while matching: %v", err)
			}
		}
	}
	if err := c.Flush(ctx(t)); err != nil {
		t.Fatal(err)
	}
	t.Logf("%d unroutable publishes against %d worst-case bindings in %v", sent, bindings, time.Since(began).Round(time.Millisecond))
}

// deniedCommands: a user with no permissions sends, at full speed from 8
// goroutines for 1 s, every command it may not run; each is refused with
// not-allowed, its connection stays open, and nothing it asked for
// happened.
func deniedCommands(t *testing.T, b *broker) {
	testutil.AddUser(t, b.ctl, "admin", "admin-pw", ctlapi.Permissions{Configure: ".*", Write: ".*", Read: ".*"})
	testutil.AddUser(t, b.ctl, "nobody", "nobody-pw", ctlapi.Permissions{Configure: "^$", Write: "^$", Read: "^$"})
	var bad *client.Conn
	testutil.WaitFor(t, 10*time.Second, func() error {
		c, err := client.DialConfig(ctx(t), client.Config{User: "nobody", Password: "nobody-pw"}, b.addr)
		if err != nil {
			return err
		}
		bad = c
		return nil
	})
	t.Cleanup(func() { _ = bad.Close() })
	// From now on the probe logs in as admin (the old one's consumer
	// would take half the probe's messages).
	_ = b.probe.Close()
	b.probe = b.dial(t, client.Config{User: "admin", Password: "admin-pw"})
	var err error
	if b.probeSub, err = b.probe.Subscribe(ctx(t), "probe", client.SubscribeOptions{Credit: 100, AutoCredit: true, AckMode: client.AckNone}); err != nil {
		t.Fatal(err)
	}
	stop := time.Now().Add(time.Second)
	var denied, other atomic.Int64
	var otherErr atomic.Value
	note := func(err error) {
		switch {
		case client.Code(err) == wire.CodeNotAllowed:
			denied.Add(1)
		case err != nil:
			other.Add(1)
			otherErr.Store(err)
		default:
			other.Add(1)
			otherErr.Store(errors.New("a command was carried out"))
		}
	}
	var wg sync.WaitGroup
	for w := 0; w < 8; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			cx := context.Background()
			for i := 0; time.Now().Before(stop) && i < 100000; i++ {
				switch (i + w) % 6 {
				case 0:
					note(bad.DeclareQueue(cx, "forbidden-"+strconv.Itoa(w), client.QueueOptions{}))
				case 1:
					note(bad.Bind(cx, "amq.topic", "probe", "x"))
				case 2:
					note(bad.DeleteQueue(cx, "probe", client.QueueDeleteOptions{}))
				case 3:
					note(bad.Purge(cx, "probe"))
				case 4:
					_, err := bad.Subscribe(cx, "probe", client.SubscribeOptions{Credit: 1})
					note(err)
				case 5:
					for k := 0; k < 100; k++ {
						if err := bad.PublishAsync(cx, "", "probe", []byte("no"), client.PublishOptions{}, note); err != nil {
							note(err)
						}
					}
				}
			}
		}(w)
	}
	wg.Wait()
	if err := bad.Flush(context.Background()); err != nil {
		t.Fatal(err)
	}
	if other.Load() != 0 {
		t.Fatalf("%d commands not refused with not-allowed, e.g. %v", other.Load(), otherErr.Load())
	}
	if denied.Load() == 0 {
		t.Fatal("nothing was sent")
	}
	if err := bad.Err(); err != nil {
		t.Fatalf("the refused user's connection ended: %v", err)
	}
	t.Logf("%d commands refused in 1 s", denied.Load())
	if err := b.probe.DeclareQueue(ctx(t), "forbidden-0", client.QueueOptions{Passive: true}); client.Code(err) != wire.CodeNotFound {
		t.Fatalf("a queue the refused user declared exists: %v", err)
	}
}
