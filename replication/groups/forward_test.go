package groups

import (
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/berthmq/berth/internal/testutil"
	"github.com/berthmq/berth/wire"
)

// refusal is the error a forward gets from a master's refusal in these
// tests.
type refusal struct {
	code wire.ErrorCode
	text string
}

func (r *refusal) Error() string { return fmt.Sprintf("%v: %s", r.code, r.text) }

func mapRefusal(code wire.ErrorCode, text string) error { return &refusal{code, text} }

// masterStub is a real transport that answers forwards by the event's
// first byte: 'E' commits, 'F' is refused as full, 'H' is held (never
// answered).
func masterStub(t testing.TB) (*Transport, *atomic.Int64) {
	t.Helper()
	tr, err := Listen("127.0.0.1:0", 1, func(*wire.GroupMessage) {}, quiet())
	if err != nil {
		t.Fatal(err)
	}
	var held atomic.Int64
	tr.SetForwardHandler(func(from, g uint32, event []byte, reply ForwardReply) {
		switch event[0] {
		case 'E':
			reply.Send(wire.CodeOK, "")
		case 'F':
			reply.Send(wire.CodeResourceLimit, fmt.Sprintf("group %d from %d: full", g, from))
		case 'H':
			held.Add(1)
		}
	})
	return tr, &held
}

// TestForwarderOutcomes: forwards pipelined to a master over loopback get
// the master's answers (commit, refusal with its code and text); forwards
// held when the master's transport closes fail as lost, none is left
// waiting; a master that cannot be dialled fails them as lost too.
func TestForwarderOutcomes(t *testing.T) {
	tr, held := masterStub(t)
	f := NewForwarder(2, nil, mapRefusal, quiet())
	defer f.Close()

	const n = 2000
	var wg sync.WaitGroup
	var ok, full atomic.Int64
	var bad atomic.Value
	wg.Add(n)
	for i := range n {
		ev := []byte{'E'}
		if i%10 == 0 {
			ev[0] = 'F'
		}
		err := f.Forward(1, tr.Addr(), 3, ev, func(err error) {
			var r *refusal
			switch {
			case err == nil:
				ok.Add(1)
			case errors.As(err, &r) && r.code == wire.CodeResourceLimit && r.text == "group 3 from 2: full":
				full.Add(1)
			default:
				bad.Store(err)
			}
			wg.Done()
		})
		if err != nil {
			t.Fatalf("forward %d: %v", i, err)
		}
	}
	wg.Wait()
	if err := bad.Load(); err != nil {
		t.Fatalf("unexpected outcome: %v", err)
	}
	if ok.Load() != n-n/10 || full.Load() != n/10 {
		t.Fatalf("%d committed, %d refused; want %d and %d", ok.Load(), full.Load(), n-n/10, n/10)
	}

	// Held forwards, then the master goes away.
	const h = 50
	lost := make(chan error, h)
	for range h {
		if err := f.Forward(1, tr.Addr(), 3, []byte{'H'}, func(err error) { lost <- err }); err != nil {
			t.Fatal(err)
		}
	}
	testutil.WaitFor(t, 10*time.Second, func() error {
		if held.Load() != h {
			return fmt.Errorf("master holds %d of %d", held.Load(), h)
		}
		return nil
	})
	tr.Close()
	for range h {
		select {
		case err := <-lost:
			var fl *ForwardLostError
			if !errors.As(err, &fl) || fl.Master != 1 || fl.NotSent {
				t.Fatalf("held forward ended with %v (not sent: %v), want lost after it was sent", err, fl != nil && fl.NotSent)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("a held forward was left waiting after its master closed")
		}
	}

	// Nobody listens there any more: the forward fails as lost (at once
	// or through done), it does not hang, and it says it was never sent.
	done := make(chan error, 1)
	err := f.Forward(1, tr.Addr(), 3, []byte{'E'}, func(err error) { done <- err })
	if err == nil {
		err = <-done
	}
	var fl *ForwardLostError
	if !errors.As(err, &fl) || !fl.NotSent {
		t.Fatalf("forward to a closed master: %v, want lost and not sent", err)
	}
}

// TestForwarderWindow: past forwardWindowMax forwards waiting on one
// master, Forward refuses with ErrForwardBusy instead of queueing more.
func TestForwarderWindow(t *testing.T) {
	tr, held := masterStub(t)
	defer tr.Close()
	f := NewForwarder(2, nil, mapRefusal, quiet())
	defer f.Close()
	for i := range forwardWindowMax {
		if err := f.Forward(1, tr.Addr(), 0, []byte{'H'}, func(error) {}); err != nil {
			t.Fatalf("forward %d of the window: %v", i, err)
		}
	}
	if err := f.Forward(1, tr.Addr(), 0, []byte{'H'}, func(error) {}); !errors.Is(err, ErrForwardBusy) {
		t.Fatalf("forward past the window: %v, want ErrForwardBusy", err)
	}
	testutil.WaitFor(t, 10*time.Second, func() error {
		if held.Load() != forwardWindowMax {
			return fmt.Errorf("master holds %d", held.Load())
		}
		return nil
	})
}

// BenchmarkForward measures forwards of 128-byte events to a master
// stub over loopback that commits each at once, with up to 4096 waiting:
// the forwarding side's cost per forward, and its allocations (the frame
// goes into a reused buffer; done is one func for all).
//
//	go test ./replication/groups -run '^$' -bench Forward -benchmem
func BenchmarkForward(b *testing.B) {
	tr, _ := masterStub(b)
	defer tr.Close()
	f := NewForwarder(2, nil, mapRefusal, quiet())
	defer f.Close()
	ev := make([]byte, 128)
	ev[0] = 'E'
	addr := tr.Addr()
	const window = 4096
	slots := make(chan struct{}, window)
	var failed atomic.Int64
	done := func(err error) {
		if err != nil {
			failed.Add(1)
		}
		<-slots
	}
	b.SetBytes(int64(len(ev)))
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		slots <- struct{}{}
		for f.Forward(1, addr, 0, ev, done) != nil {
			time.Sleep(time.Microsecond)
		}
	}
	for range window {
		slots <- struct{}{}
	}
	b.StopTimer()
	if failed.Load() > 0 {
		b.Fatalf("%d forwards failed", failed.Load())
	}
}

// TestForwardResultCodeForVersion: a master's outcome-unknown answer
// reaches a forwarding broker of 1.4 or later as it is, and one whose
// hello said 1.3 as unavailable (it does not know the code), with the
// same text.
func TestForwardResultCodeForVersion(t *testing.T) {
	tr, err := Listen("127.0.0.1:0", 1, func(*wire.GroupMessage) {}, quiet())
	if err != nil {
		t.Fatal(err)
	}
	defer tr.Close()
	const text = "the queue's group changed master while the command was in flight; its outcome is unknown"
	tr.SetForwardHandler(func(_, _ uint32, _ []byte, reply ForwardReply) { reply.Send(wire.CodeOutcomeUnknown, text) })

	// A forwarder of this build.
	f := NewForwarder(2, nil, mapRefusal, quiet())
	defer f.Close()
	done := make(chan error, 1)
	if err := f.Forward(1, tr.Addr(), 0, []byte{'E'}, func(err error) { done <- err }); err != nil {
		t.Fatal(err)
	}
	var r *refusal
	if err := <-done; !errors.As(err, &r) || r.code != wire.CodeOutcomeUnknown || r.text != text {
		t.Fatalf("1.4 forwarder: %v, want outcome-unknown", err)
	}

	// A 1.3 forwarder, on a raw connection.
	for _, v := range []wire.Version{wire.VersionCancelled, wire.Current} {
		conn, err := net.Dial("tcp", tr.Addr())
		if err != nil {
			t.Fatal(err)
		}
		out := wire.AppendForwardHello(nil, 3, v)
		out = wire.AppendForward(out, 7, 0, []byte{'E'})
		if _, err := conn.Write(out); err != nil {
			t.Fatal(err)
		}
		_ = conn.SetReadDeadline(time.Now().Add(10 * time.Second))
		hdr := make([]byte, wire.HeaderSize)
		if _, err := io.ReadFull(conn, hdr); err != nil {
			t.Fatal(err)
		}
		h, err := wire.ReadHeader(hdr, wire.FrameSizeMax)
		if err != nil || h.Type != wire.TypeForwardResult {
			t.Fatalf("%+v %v", h, err)
		}
		body := make([]byte, h.Length)
		if _, err := io.ReadFull(conn, body); err != nil {
			t.Fatal(err)
		}
		conn.Close()
		id, code, got, err := wire.DecodeForwardResult(body)
		want := wire.CodeOutcomeUnknown.For(v)
		if err != nil || id != 7 || code != want || string(got) != text {
			t.Fatalf("forwarder of %v: id %d, code %v %q, %v; want %v", v, id, code, got, err, want)
		}
	}
}

// TestForwardEncodedWritesInPlace: an event encoded straight into the
// forwarding buffer reaches the master whole, as Forward's copy does; an
// encoder that writes other than the size it gave is refused and leaves
// no part of its frame behind (the forward after it still commits).
func TestForwardEncodedWritesInPlace(t *testing.T) {
	tr, _ := masterStub(t)
	defer tr.Close()
	f := NewForwarder(2, nil, mapRefusal, quiet())
	defer f.Close()
	done := make(chan error, 3)
	if err := f.ForwardEncoded(1, tr.Addr(), 3, 3, func(dst []byte) []byte { return append(dst, 'E', 'x', 'y') },
		func(err error) { done <- err }); err != nil {
		t.Fatal(err)
	}
	// Refused by the master if any of it went out ('F').
	if err := f.ForwardEncoded(1, tr.Addr(), 3, 2, func(dst []byte) []byte { return append(dst, 'F', 'x', 'y') },
		func(err error) { done <- err }); err == nil {
		t.Fatal("an event of 3 bytes said to be 2 was taken")
	}
	if err := f.Forward(1, tr.Addr(), 3, []byte("E"), func(err error) { done <- err }); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		select {
		case err := <-done:
			if err != nil {
				t.Fatalf("forward: %v", err)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("a forward was not answered: the stream is out of step")
		}
	}
}
