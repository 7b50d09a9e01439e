package server

import (
	"bufio"
	"io"
	"log/slog"
	"net"
	"testing"
	"time"

	"github.com/berthmq/berth/wire"
)

// startOneShard runs a broker of one shard and one loop on a random
// loopback port, without admin endpoint, for one test.
func startOneShard(t *testing.T) *Server {
	t.Helper()
	cfg := DefaultConfig()
	cfg.ClientAddr, cfg.AdminAddr, cfg.DataDir, cfg.Shards, cfg.Loops = "127.0.0.1:0", "", t.TempDir(), 1, 1
	cfg.Logger = slog.New(slog.DiscardHandler)
	s, err := Start(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s
}

// rawSession is a client connection spoken frame by frame.
type rawSession struct {
	t  *testing.T
	nc net.Conn
	r  *bufio.Reader
	v  wire.Version
}

func rawDial(t *testing.T, s *Server, v wire.Version) *rawSession {
	t.Helper()
	nc, err := net.Dial("tcp", s.ClientAddr())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { nc.Close() })
	rs := &rawSession{t: t, nc: nc, r: bufio.NewReader(nc), v: v}
	rs.write(wire.AppendHello(nil, []wire.Version{v}, "raw", wire.MechNone, nil, 0, 0))
	if h, body := rs.read(); h.Type != wire.TypeWelcome {
		t.Fatalf("answer to HELLO: %v % x", h.Type, body)
	}
	return rs
}

func (rs *rawSession) write(b []byte) {
	rs.t.Helper()
	if _, err := rs.nc.Write(b); err != nil {
		rs.t.Fatal(err)
	}
}

// read returns the next frame that is not a HEARTBEAT.
func (rs *rawSession) read() (wire.Header, []byte) {
	rs.t.Helper()
	for {
		rs.nc.SetReadDeadline(time.Now().Add(10 * time.Second))
		hb := make([]byte, wire.HeaderSize)
		if _, err := io.ReadFull(rs.r, hb); err != nil {
			rs.t.Fatal(err)
		}
		h, err := wire.ReadHeader(hb, wire.FrameSizeMax)
		if err != nil {
			rs.t.Fatal(err)
		}
		body := make([]byte, h.Length)
		if _, err := io.ReadFull(rs.r, body); err != nil {
			rs.t.Fatal(err)
		}
		if h.Type != wire.TypeHeartbeat {
			return h, body
		}
	}
}

// connOf waits for the server's state of the one logged-in connection of
// version v.
func connOf(t *testing.T, s *Server, v wire.Version) *connState {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		s.conns.Lock()
		for cs := range s.conns.set {
			if cs.sessAt.Load() != nil && wire.Version(cs.helloVer.Load()) == v {
				s.conns.Unlock()
				return cs
			}
		}
		s.conns.Unlock()
		time.Sleep(5 * time.Millisecond)
	}
	t.Fatalf("no connection of version %v", v)
	return nil
}

// proxyFake opens a proxy session of cs on master as proxySubscribe would
// (without sending anything: the test plays the master), with consumers
// and command ids in flight.
func proxyFake(s *Server, cs *connState, master uint32, group uint32, consumers []uint32, pending []uint64, subscribes map[uint32]uint64) *proxySession {
	t := &s.proxies
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.byID == nil {
		t.byID, t.byConn, t.consumers = map[uint64]*proxySession{}, map[*connState]map[uint32]*proxySession{}, map[proxyConsumer]*proxySession{}
		t.groupOf = map[proxyConsumer]uint32{}
	}
	t.next++
	ps := &proxySession{id: t.next, master: master, cs: cs}
	ps.mu.pending = map[uint64]struct{}{}
	for _, id := range pending {
		ps.mu.pending[id] = struct{}{}
	}
	ps.mu.subscribes = subscribes
	if t.byConn[cs] == nil {
		t.byConn[cs] = map[uint32]*proxySession{}
	}
	t.byConn[cs][master] = ps
	t.byID[ps.id] = ps
	for _, c := range consumers {
		t.consumers[proxyConsumer{cs, c}] = ps
		t.groupOf[proxyConsumer{cs, c}] = group
	}
	return ps
}

// TestProxyEndCancelsConsumersKeepsSession: a broker whose connection to
// a master ends (proxyLost, as the forwarding connection's reader calls
// it) answers a 1.4 client's commands the master had not answered with
// outcome-unknown, but a SUBSCRIBE with unavailable (no consumer is left
// of it), and a 1.3 client's all with unavailable; it sends a CANCELLED
// for each proxied consumer but one whose SUBSCRIBE was among them, drops
// what the master sends later, and keeps the session: a command after it
// completes. A 1.2 client's connection is closed with shutdown, as before
// 1.3.
func TestProxyEndCancelsConsumersKeepsSession(t *testing.T) {
	for _, v := range []wire.Version{wire.VersionOutcome, wire.VersionCancelled} {
		t.Run(v.String(), func(t *testing.T) { testProxyEnd(t, v) })
	}
}

func testProxyEnd(t *testing.T, v wire.Version) {
	s := startOneShard(t)
	newer := rawDial(t, s, v)
	older := rawDial(t, s, wire.VersionProducer)
	csNew, csOld := connOf(t, s, v), connOf(t, s, wire.VersionProducer)
	const master = 3
	// Consumers 1 and 2 are served; 3's SUBSCRIBE (id 12) is out; an
	// ACCEPT (10) and a RELEASE (11) are out.
	ps := proxyFake(s, csNew, master, 0, []uint32{1, 2, 3}, []uint64{10, 11, 12}, map[uint32]uint64{1: 1, 2: 2, 3: 12})
	proxyFake(s, csOld, master, 0, []uint32{1}, nil, nil)
	owned := make(chan struct{})
	if err := csNew.t.runOwned(func() { csNew.ss.MarkRemote(1); close(owned) }); err != nil { // as SUBSCRIBE records it
		t.Fatal(err)
	}
	<-owned

	// The master answers the ACCEPT and delivers to consumer 1: the
	// frames reach the client and 10 is no longer in flight.
	db, ds := wire.AppendDeliverStart(nil, v, 1, 1)
	db = wire.AppendDeliverMessageHead(db, 1, 0, 0, nil, []byte("q"), nil, 2)
	db = append(db, "hi"...)
	wire.EndFrame(db, ds, 0)
	s.proxyOutput(master, ps.id, append(wire.AppendComplete(nil, v, []wire.Range{{First: 10, Last: 10}}), db...))
	if h, _ := newer.read(); h.Type != wire.TypeComplete {
		t.Fatalf("first frame of the master's output: %v", h.Type)
	}
	if h, _ := newer.read(); h.Type != wire.TypeDeliver {
		t.Fatalf("second frame of the master's output: %v", h.Type)
	}

	s.proxyLost(master)
	s.proxyOutput(master, ps.id, db) // too late: dropped

	failed := map[uint64]wire.ErrorCode{}
	cancelled := map[uint32]wire.ErrorCode{}
	for range 4 {
		h, body := newer.read()
		switch h.Type {
		case wire.TypeError:
			var e wire.Error
			if err := wire.DecodeError(body, &e); err != nil {
				t.Fatal(err)
			}
			if len(cancelled) > 0 {
				t.Fatalf("ERROR for %d after a CANCELLED", e.CommandID)
			}
			failed[e.CommandID] = e.Code
		case wire.TypeCancelled:
			if h.Version != v {
				t.Fatalf("CANCELLED in version %v", h.Version)
			}
			var c wire.Cancelled
			if err := wire.DecodeCancelled(body, &c); err != nil {
				t.Fatal(err)
			}
			cancelled[c.ConsumerID] = c.Code
		default:
			t.Fatalf("after the master was lost: %v", h.Type)
		}
	}
	// The RELEASE's outcome is unknown; the SUBSCRIBE made no consumer.
	wantRelease := wire.CodeOutcomeUnknown
	if v < wire.VersionOutcome {
		wantRelease = wire.CodeUnavailable
	}
	if len(failed) != 2 || failed[11] != wantRelease || failed[12] != wire.CodeUnavailable {
		t.Fatalf("commands failed: %v; want 11 %v and 12 unavailable (10 was answered)", failed, wantRelease)
	}
	if len(cancelled) != 2 || cancelled[1] != wire.CodeUnavailable || cancelled[2] != wire.CodeUnavailable {
		t.Fatalf("consumers cancelled: %v; want 1 and 2, unavailable (3's SUBSCRIBE failed)", cancelled)
	}
	// The session goes on: a settle of the ended consumer fails, a
	// declare completes, and nothing of the master came in between.
	newer.write(wire.AppendSettle(nil, v, wire.TypeAccept, 20, 1, []wire.Range{{First: 1, Last: 1}}))
	newer.write(wire.AppendDeclareQueue(nil, v, &wire.DeclareQueue{CommandID: 21, Name: []byte("after")}))
	var settled, declared bool
	for !settled || !declared {
		h, body := newer.read()
		switch h.Type {
		case wire.TypeError:
			var e wire.Error
			if err := wire.DecodeError(body, &e); err != nil || e.CommandID != 20 || e.Code != wire.CodeNotFound {
				t.Fatalf("error %+v %v; want not-found for the settle 20", e, err)
			}
			settled = true
		case wire.TypeComplete:
			rl, err := wire.DecodeComplete(body)
			if err != nil || rl.Len() != 1 || rl.At(0) != (wire.Range{First: 21, Last: 21}) {
				t.Fatalf("complete %v %v; want 21", rl, err)
			}
			declared = true
		default:
			t.Fatalf("after the cancel: %v", h.Type)
		}
	}

	// The 1.2 session is closed.
	h, body := older.read()
	var cl wire.Close
	if h.Type != wire.TypeClose || wire.DecodeClose(body, &cl) != nil || cl.Code != wire.CodeShutdown {
		t.Fatalf("the 1.2 session got %v %+v; want CLOSE(shutdown)", h.Type, cl)
	}
}

// TestRetireAnswered: COMPLETE ranges and ERROR ids retire command ids in
// flight, small and wide ranges alike; a DELIVER is stepped over.
func TestRetireAnswered(t *testing.T) {
	pending := map[uint64]struct{}{1: {}, 2: {}, 5: {}, 9: {}, 1 << 40: {}}
	frames := wire.AppendComplete(nil, wire.Current, []wire.Range{{First: 1, Last: 2}, {First: 1 << 39, Last: 1 << 41}})
	db, ds := wire.AppendDeliverStart(nil, wire.Current, 1, 1)
	db = wire.AppendDeliverMessageHead(db, 5, 0, 0, nil, []byte("q"), nil, 0)
	wire.EndFrame(db, ds, 0)
	frames = append(frames, db...)
	frames = wire.AppendError(frames, wire.Current, 9, wire.CodeNotFound, "x")
	retireAnswered(pending, frames)
	if len(pending) != 1 {
		t.Fatalf("left in flight: %v; want only 5", pending)
	}
	if _, ok := pending[5]; !ok {
		t.Fatalf("left in flight: %v; want 5", pending)
	}
}

// BenchmarkRetireAnswered is the work a proxying broker adds to each batch
// of a master's output while commands are in flight: a DELIVER of 64
// messages of 128 bytes and a COMPLETE of 4 ACCEPTs, the 4 ids noted in
// flight first (as proxySend does).
//
//	go test ./server -run '^$' -bench RetireAnswered -benchmem
func BenchmarkRetireAnswered(b *testing.B) {
	db, ds := wire.AppendDeliverStart(nil, wire.Current, 1, 64)
	payload := make([]byte, 128)
	for i := range 64 {
		db = wire.AppendDeliverMessageHead(db, uint64(i+1), 0, 0, nil, []byte("bench-proxied"), nil, len(payload))
		db = append(db, payload...)
	}
	wire.EndFrame(db, ds, 0)
	frames := wire.AppendComplete(db, wire.Current, []wire.Range{{First: 1, Last: 4}})
	pending := map[uint64]struct{}{}
	b.SetBytes(int64(len(frames)))
	b.ReportAllocs()
	for range b.N {
		for id := range uint64(4) {
			pending[id+1] = struct{}{}
		}
		retireAnswered(pending, frames)
	}
	if len(pending) != 0 {
		b.Fatalf("%d left in flight", len(pending))
	}
}

// closedSink is a frameSink whose connection has closed.
type closedSink struct{}

func (closedSink) Write([][]byte) bool { return false }

// TestProxyWriterFailsWithoutDone: a proxied session's writer whose
// connection to the proxying broker closed returns an error and does not
// call done, as shards.Writer requires: the shard then releases the batch
// itself. Before, it called done (which releases the batch to its pool)
// and returned the error (on which the shard released it again): the pool
// then handed one batch to two writes, and in the long chaos run a
// consumer on the master got the same delivery twice and another
// consumer's messages under its own tags, after a proxying broker died.
func TestProxyWriterFailsWithoutDone(t *testing.T) {
	calls := 0
	err := proxyWriter{closedSink{}}.WriteAsync([][]byte{[]byte("frame")}, func() { calls++ })
	if err == nil || calls != 0 {
		t.Fatalf("write to a closed proxy connection: err %v, done called %d times (want an error and 0)", err, calls)
	}
	var sink recordingSink
	err = proxyWriter{&sink}.WriteAsync([][]byte{[]byte("fra"), []byte("me")}, func() { calls++ })
	if err != nil || calls != 1 || string(sink.b) != "frame" {
		t.Fatalf("write to an open proxy connection: err %v, done called %d times, wrote %q (want nil, 1, \"frame\")", err, calls, sink.b)
	}
}

// recordingSink is a frameSink that keeps what it is given.
type recordingSink struct{ b []byte }

func (r *recordingSink) Write(bufs [][]byte) bool {
	for _, b := range bufs {
		r.b = append(r.b, b...)
	}
	return true
}
