package client

import (
	"errors"
	"net"
	"testing"

	"github.com/berthmq/berth/wire"
)

// newFrameConn is a Conn whose reader side is driven by hand, to test how
// frames the real server never sends are handled.
func newFrameConn(t *testing.T) (*Conn, net.Conn) {
	a, b := net.Pipe()
	t.Cleanup(func() { a.Close(); b.Close() })
	c := &Conn{nc: a, version: wire.Current, frameMax: wire.FrameSizeDefault, creditMax: 100, rl: &link{nc: a}}
	c.done = make(chan struct{})
	c.kick = make(chan struct{}, 1)
	c.mu.win = newWindow(8)
	c.mu.pubStart = -1
	c.mu.consumers = map[uint32]*Consumer{}
	return c, b
}

func TestHandleFrameVersionsAndTypes(t *testing.T) {
	c, _ := newFrameConn(t)
	// A frame of a newer minor version is skipped, whatever its type.
	b, s := wire.StartFrame(nil, wire.MakeVersion(wire.VersionMajor, wire.VersionMinor+1), wire.Type(0x7e), 0)
	b = append(b, 1, 2, 3)
	wire.EndFrame(b, s, 0)
	h, body, _, err := wire.Next(b, c.frameMax)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.handleFrame(h, body); err != nil {
		t.Fatalf("newer minor frame not skipped: %v", err)
	}
	// The same unknown type in our version is a protocol error.
	b, s = wire.StartFrame(nil, wire.Current, wire.Type(0x7e), 0)
	wire.EndFrame(b, s, 0)
	h, body, _, _ = wire.Next(b, c.frameMax)
	if err := c.handleFrame(h, body); err == nil {
		t.Fatal("unknown frame type accepted")
	}
	// Client-to-server types coming back are protocol errors too.
	b = wire.AppendCredit(nil, wire.Current, 1, 1)
	h, body, _, _ = wire.Next(b, c.frameMax)
	if err := c.handleFrame(h, body); err == nil {
		t.Fatal("CREDIT from the server accepted")
	}
	// A malformed COMPLETE is an error, not a panic.
	b, s = wire.StartFrame(nil, wire.Current, wire.TypeComplete, 0)
	b = append(b, 0, 9, 1)
	wire.EndFrame(b, s, 0)
	h, body, _, _ = wire.Next(b, c.frameMax)
	if err := c.handleFrame(h, body); err == nil {
		t.Fatal("malformed COMPLETE accepted")
	}
}

func TestHandleFrameCompletionsAndErrors(t *testing.T) {
	c, peer := newFrameConn(t)
	var results [5]error
	fired := make([]bool, 5)
	for i := 0; i < 5; i++ {
		i := i
		c.mu.win.add(func(err error) { results[i], fired[i] = err, true }, nil, nil)
	}
	var connErrs []error
	c.cfg.ErrorHandler = func(err error) { connErrs = append(connErrs, err) }
	feed := func(b []byte) {
		t.Helper()
		h, body, n, err := wire.Next(b, c.frameMax)
		if err != nil || n != len(b) {
			t.Fatalf("frame: %v", err)
		}
		if err := c.handleFrame(h, body); err != nil {
			t.Fatal(err)
		}
	}
	// Out of order, ranges over unknown ids ignored, one id failed.
	feed(wire.AppendComplete(nil, wire.Current, []wire.Range{{First: 4, Last: 9}, {First: 1, Last: 1}}))
	feed(wire.AppendError(nil, wire.Current, 3, wire.CodeNotFound, "no queue"))
	feed(wire.AppendError(nil, wire.Current, 0, wire.CodeInternal, "connection trouble"))
	for i, want := range []bool{true, false, true, true, true} {
		if fired[i] != want {
			t.Fatalf("id %d fired=%v", i+1, fired[i])
		}
	}
	if Code(results[2]) != wire.CodeNotFound || results[0] != nil || results[4] != nil {
		t.Fatalf("results %v", results)
	}
	if len(connErrs) != 1 || Code(connErrs[0]) != wire.CodeInternal {
		t.Fatalf("connection errors %v", connErrs)
	}
	if c.mu.win.inflight != 1 || c.mu.win.tail != 2 {
		t.Fatalf("window inflight %d tail %d", c.mu.win.inflight, c.mu.win.tail)
	}
	// Delivering beyond credit is a protocol violation.
	s := &Consumer{c: c}
	s.idv.Store(1)
	s.mu.credit = 1
	c.mu.consumers[1] = s
	b, st := wire.AppendDeliverStart(nil, wire.Current, 1, 2)
	for tag := uint64(1); tag <= 2; tag++ {
		b = wire.AppendDeliverMessageHead(b, tag, 0, 0, nil, []byte("q"), nil, 1)
		b = append(b, 'x')
	}
	wire.EndFrame(b, st, 0)
	h, body, _, _ := wire.Next(b, c.frameMax)
	if err := c.handleFrame(h, body); err == nil {
		t.Fatal("2 deliveries on 1 credit accepted")
	}
	// A CLOSE from the server ends the session with its code.
	b = wire.AppendClose(nil, wire.Current, wire.CodeShutdown, "going down")
	h, body, _, _ = wire.Next(b, c.frameMax)
	answer := make(chan []byte, 1)
	go func() {
		buf := make([]byte, 64)
		n, _ := peer.Read(buf)
		answer <- buf[:n]
	}()
	err := c.handleFrame(h, body)
	if !errors.Is(err, ErrClosed) || Code(err) != wire.CodeShutdown {
		t.Fatalf("CLOSE: %v", err)
	}
	// It was answered with a CLOSE of our own.
	got := <-answer
	h, body, _, err = wire.Next(got, c.frameMax)
	var cl wire.Close
	if err != nil || h.Type != wire.TypeClose || wire.DecodeClose(body, &cl) != nil || cl.Code != wire.CodeOK {
		t.Fatalf("answer to CLOSE: % x (%v)", got, err)
	}
}

// TestCancelledEndsConsumer: a CANCELLED (1.3) ends a plain Conn's
// consumer with ErrConsumerEnded and the broker's code, drops what an
// AckExplicit one buffered, refuses its settles, and leaves the Conn
// alone; one for an unknown consumer is ignored; in a 1.2 session, or
// malformed, it is a protocol error.
func TestCancelledEndsConsumer(t *testing.T) {
	c, _ := newFrameConn(t)
	s := &Consumer{c: c, queue: "q"}
	s.idv.Store(1)
	s.mu.subscribed, s.mu.credit = true, 10
	c.mu.consumers[1] = s
	if err := s.push([]Delivery{{Tag: 1, Payload: []byte("held"), consumer: s}}); err != nil {
		t.Fatal(err)
	}
	frame := func(b []byte) (wire.Header, []byte) {
		h, body, _, err := wire.Next(b, c.frameMax)
		if err != nil {
			t.Fatal(err)
		}
		return h, body
	}
	if err := c.handleFrame(frame(wire.AppendCancelled(nil, wire.Current, 9, wire.CodeUnavailable, "x"))); err != nil {
		t.Fatalf("CANCELLED of an unknown consumer: %v", err)
	}
	if s.Err() != nil || s.Buffered() != 1 {
		t.Fatalf("another consumer's CANCELLED touched this one: %v, %d buffered", s.Err(), s.Buffered())
	}
	if err := c.handleFrame(frame(wire.AppendCancelled(nil, wire.Current, 1, wire.CodeUnavailable, "master lost"))); err != nil {
		t.Fatal(err)
	}
	err := s.Err()
	var se *Error
	if !errors.Is(err, ErrConsumerEnded) || !errors.As(err, &se) || se.Code != wire.CodeUnavailable || se.Text != "master lost" {
		t.Fatalf("Err after CANCELLED: %v", err)
	}
	if _, err := s.Next(t.Context()); !errors.Is(err, ErrConsumerEnded) {
		t.Fatalf("Next after CANCELLED: %v (the held delivery must be dropped)", err)
	}
	if err := s.Accept(t.Context(), 1); !errors.Is(err, ErrConsumerEnded) {
		t.Fatalf("Accept after CANCELLED: %v", err)
	}
	if err := s.Cancel(t.Context()); err != nil {
		t.Fatalf("Cancel of an ended consumer: %v", err)
	}
	if _, ok := c.mu.consumers[1]; ok {
		t.Fatal("the ended consumer is still registered")
	}

	b, st := wire.StartFrame(nil, wire.Current, wire.TypeCancelled, 0)
	b = append(b, 0, 0, 0, 1, 0)
	wire.EndFrame(b, st, 0)
	if err := c.handleFrame(frame(b)); err == nil {
		t.Fatal("malformed CANCELLED accepted")
	}
	c.version = wire.VersionProducer
	if err := c.handleFrame(frame(wire.AppendCancelled(nil, wire.VersionProducer, 1, wire.CodeUnavailable, "x"))); err == nil {
		t.Fatal("CANCELLED in a 1.2 session accepted")
	}
}
