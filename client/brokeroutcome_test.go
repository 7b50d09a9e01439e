package client

import (
	"bufio"
	"context"
	"errors"
	"io"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/berthmq/berth/wire"
)

// scriptedServer is a broker played by the test on loopback: it answers
// HELLO with a WELCOME of the newest offered version up to max, then hands
// every other frame of the session, but HEARTBEAT and CLOSE, to serve,
// which answers with send. The session's version goes to versions.
func scriptedServer(t *testing.T, max wire.Version, versions chan<- wire.Version, serve func(v wire.Version, h wire.Header, body []byte, send func([]byte))) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			nc, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer nc.Close()
				r := bufio.NewReader(nc)
				var wmu sync.Mutex
				send := func(b []byte) { wmu.Lock(); _, _ = nc.Write(b); wmu.Unlock() }
				var v wire.Version
				for {
					hb := make([]byte, wire.HeaderSize)
					if _, err := io.ReadFull(r, hb); err != nil {
						return
					}
					h, err := wire.ReadHeader(hb, wire.FrameSizeMax)
					if err != nil {
						return
					}
					body := make([]byte, h.Length)
					if _, err := io.ReadFull(r, body); err != nil {
						return
					}
					switch h.Type {
					case wire.TypeHello:
						var hello wire.Hello
						if wire.DecodeHello(body, &hello) != nil {
							return
						}
						for _, o := range hello.Versions {
							if o <= max && o > v {
								v = o
							}
						}
						if versions != nil {
							versions <- v
						}
						w := wire.Welcome{Version: v, FrameSizeMax: wire.FrameSizeDefault, HeartbeatMs: 60000, CreditMax: 100, WindowMax: 100,
							ServerName: []byte("scripted"), Addrs: [][]byte{[]byte(ln.Addr().String())}}
						send(wire.AppendWelcome(nil, &w))
					case wire.TypeHeartbeat:
					case wire.TypeClose:
						send(wire.AppendClose(nil, v, wire.CodeOK, "bye"))
						return
					default:
						serve(v, h, body, send)
					}
				}
			}()
		}
	}()
	return ln.Addr().String()
}

// publishAnswers answers each published message by its payload: the
// payload names the error code to answer with ("ok" completes it).
func publishAnswers(v wire.Version, h wire.Header, body []byte, send func([]byte)) {
	if h.Type != wire.TypePublish {
		return
	}
	var p wire.Publish
	if wire.DecodePublishSession(body, h.Flags, v, &p) != nil {
		return
	}
	var m wire.PublishMessage
	for id := p.FirstID; p.Next(&m); id++ {
		switch string(m.Payload) {
		case "ok":
			send(wire.AppendComplete(nil, v, []wire.Range{{First: id, Last: id}}))
		case "outcome-unknown":
			send(wire.AppendError(nil, v, id, wire.CodeOutcomeUnknown, "the queue's group changed master while the command was in flight; its outcome is unknown"))
		case "unavailable":
			send(wire.AppendError(nil, v, id, wire.CodeUnavailable, "group 1 has no master now; retry"))
		case "store":
			send(wire.AppendError(nil, v, id, wire.CodeStore, "journal write failed"))
		case "internal":
			send(wire.AppendError(nil, v, id, wire.CodeInternal, "bug"))
		case "not-found":
			send(wire.AppendError(nil, v, id, wire.CodeNotFound, "no queue q"))
		case "code-99":
			send(wire.AppendError(nil, v, id, 99, "a code of a later version"))
		}
	}
}

// TestBrokerOutcomeUnknown: the client offers protocol 1.4, and an ERROR
// whose code leaves the command's outcome unknown (outcome-unknown,
// store, internal, a code it does not know) is an *Error carrying the
// broker's code and text that matches ErrOutcomeUnknown (errors.Is), not
// ErrClosed; a refusal (unavailable, not-found) does not match it. The
// connection goes on.
func TestBrokerOutcomeUnknown(t *testing.T) {
	versions := make(chan wire.Version, 1)
	addr := scriptedServer(t, wire.VersionOutcome, versions, publishAnswers)
	c := dialTest(t, addr)
	if v := <-versions; v != wire.VersionOutcome || c.Version() != wire.VersionOutcome {
		t.Fatalf("negotiated %v (client %v), want %v", v, c.Version(), wire.VersionOutcome)
	}
	ctx := testCtx(t)
	for _, tc := range []struct {
		payload string
		code    wire.ErrorCode
		unknown bool
	}{
		{"outcome-unknown", wire.CodeOutcomeUnknown, true},
		{"store", wire.CodeStore, true},
		{"internal", wire.CodeInternal, true},
		{"code-99", 99, true},
		{"unavailable", wire.CodeUnavailable, false},
		{"not-found", wire.CodeNotFound, false},
	} {
		err := c.Publish(ctx, "", "q", []byte(tc.payload), PublishOptions{})
		var se *Error
		if !errors.As(err, &se) || se.Code != tc.code || se.CommandID == 0 || se.Text == "" {
			t.Fatalf("%s: %v, want an *Error with code %v and the broker's text", tc.payload, err, tc.code)
		}
		if errors.Is(err, ErrOutcomeUnknown) != tc.unknown {
			t.Errorf("%s: errors.Is(err, ErrOutcomeUnknown) = %v, want %v", tc.payload, !tc.unknown, tc.unknown)
		}
		if errors.Is(err, ErrClosed) {
			t.Errorf("%s: %v wraps ErrClosed", tc.payload, err)
		}
	}
	err := c.Publish(ctx, "", "q", []byte("outcome-unknown"), PublishOptions{})
	var se *Error
	if !errors.As(err, &se) || se.Text != "the queue's group changed master while the command was in flight; its outcome is unknown" {
		t.Fatalf("text: %v", err)
	}
	if err := c.Publish(ctx, "", "q", []byte("ok"), PublishOptions{}); err != nil || c.Err() != nil {
		t.Fatalf("publish after them: %v (connection: %v)", err, c.Err())
	}
	// A connection-level *Error is not about a command.
	if errors.Is(&Error{Code: wire.CodeInternal}, ErrOutcomeUnknown) {
		t.Error("an *Error with command id 0 matches ErrOutcomeUnknown")
	}
}

// TestBrokerOutcomeUnknownOlderServer: a 1.3 server, which has no
// outcome-unknown code, is served in 1.3.
func TestBrokerOutcomeUnknownOlderServer(t *testing.T) {
	versions := make(chan wire.Version, 1)
	addr := scriptedServer(t, wire.VersionCancelled, versions, publishAnswers)
	c := dialTest(t, addr)
	if v := <-versions; v != wire.VersionCancelled || c.Version() != wire.VersionCancelled {
		t.Fatalf("negotiated %v (client %v)", v, c.Version())
	}
	if err := c.Publish(testCtx(t), "", "q", []byte("ok"), PublishOptions{}); err != nil {
		t.Fatal(err)
	}
}

// TestConsumeGoesOnPastOutcomeUnknownSettle: on a reconnecting Conn, an
// accept answered outcome-unknown because the consumer's master was lost
// (protocol 6.8: the broker answers the consumer's open commands, then
// sends CANCELLED) does not end Consume: the Conn subscribes the consumer
// again and the message, redelivered, is accepted. OnSettled reports the
// first accept's error, which matches ErrOutcomeUnknown.
func TestConsumeGoesOnPastOutcomeUnknownSettle(t *testing.T) {
	var mu sync.Mutex
	subscribes := 0
	var consumer uint32
	accepts := 0
	addr := scriptedServer(t, wire.VersionOutcome, nil, func(v wire.Version, h wire.Header, body []byte, send func([]byte)) {
		mu.Lock()
		defer mu.Unlock()
		switch h.Type {
		case wire.TypeSubscribe:
			var s wire.Subscribe
			if wire.DecodeSubscribe(body, &s) != nil {
				return
			}
			subscribes++
			consumer = s.ConsumerID
			out := wire.AppendComplete(nil, v, []wire.Range{{First: s.CommandID, Last: s.CommandID}})
			var flags uint8
			if subscribes > 1 {
				flags = wire.MsgRedelivered
			}
			db, ds := wire.AppendDeliverStart(out, v, s.ConsumerID, 1)
			db = wire.AppendDeliverMessageHead(db, 1, uint32(subscribes-1), flags, nil, []byte("q"), nil, 2)
			db = append(db, "m1"...)
			wire.EndFrame(db, ds, 0)
			send(db)
		case wire.TypeAccept:
			var st wire.Settle
			if wire.DecodeSettle(body, &st) != nil {
				return
			}
			accepts++
			if accepts == 1 {
				// The master was lost with the accept in flight.
				out := wire.AppendError(nil, v, st.CommandID, wire.CodeOutcomeUnknown, "the consumer's master was lost before it answered; the outcome is unknown")
				send(wire.AppendCancelled(out, v, consumer, wire.CodeUnavailable, "the master of the consumer's queue changed; subscribe again"))
				return
			}
			send(wire.AppendComplete(nil, v, []wire.Range{{First: st.CommandID, Last: st.CommandID}}))
		}
	})
	c := dialTest(t, addr, Config{Reconnect: &ReconnectPolicy{DelayMin: 5 * time.Millisecond, DelayMax: 20 * time.Millisecond, MaxTime: 10 * time.Second}})
	ctx := testCtx(t)
	con, err := c.Subscribe(ctx, "q", SubscribeOptions{Credit: 10})
	if err != nil {
		t.Fatal(err)
	}
	cctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var settled []error
	handled := 0
	done := make(chan error, 1)
	go func() {
		done <- con.Consume(cctx, func(d *Delivery) error {
			mu.Lock()
			handled++
			mu.Unlock()
			return nil
		}, OnSettled(func(d *Delivery, _ Settle, err error) {
			mu.Lock()
			settled = append(settled, err)
			if len(settled) == 2 {
				cancel()
			}
			mu.Unlock()
		}))
	}()
	var cerr error
	select {
	case cerr = <-done:
	case <-time.After(20 * time.Second):
		t.Fatal("Consume did not return")
	}
	mu.Lock()
	defer mu.Unlock()
	if !errors.Is(cerr, context.Canceled) {
		t.Fatalf("Consume: %v; want it to go on past the outcome-unknown accept until cancelled (handled %d, settles %v)", cerr, handled, settled)
	}
	if len(settled) != 2 || !errors.Is(settled[0], ErrOutcomeUnknown) || Code(settled[0]) != wire.CodeOutcomeUnknown || settled[1] != nil {
		t.Fatalf("settles %v; want outcome-unknown, then nil", settled)
	}
	if handled != 2 || subscribes != 2 {
		t.Fatalf("handled %d, subscribed %d; want the message twice, subscribed again", handled, subscribes)
	}
}
