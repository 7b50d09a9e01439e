package server_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/berthmq/berth/client"
	"github.com/berthmq/berth/internal/testutil"
	"github.com/berthmq/berth/server"
	"github.com/berthmq/berth/wire"
)

// startServer runs a broker on a random loopback port for one test.
func startServer(t testing.TB, mutate ...func(*server.Config)) *server.Server {
	t.Helper()
	cfg := server.DefaultConfig()
	cfg.ClientAddr = "127.0.0.1:0"
	cfg.AdminAddr = ""
	cfg.DataDir = t.TempDir()
	cfg.Shards = 2
	cfg.Loops = 2
	cfg.Logger = testLogger(t)
	applyMatrixCell(t, &cfg) // shards and fsync of TestSemanticsMatrix's cell, if t runs in one
	for _, m := range mutate {
		m(&cfg)
	}
	s, err := server.Start(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s
}

func dial(t testing.TB, s *server.Server) *client.Conn {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c, err := client.Dial(ctx, s.ClientAddr())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

func ctxT(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// checkFor polls f until it returns nil or the time runs out.
func checkFor(t testing.TB, total time.Duration, f func() error) {
	t.Helper()
	testutil.WaitFor(t, total, f)
}

func next(t testing.TB, c *client.Consumer, wait time.Duration) *client.Delivery {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	d, err := c.Next(ctx)
	if err != nil {
		t.Fatalf("next on %s: %v", c.Queue(), err)
	}
	return d
}

func expectNone(t testing.TB, c *client.Consumer, wait time.Duration) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	if d, err := c.Next(ctx); err == nil {
		t.Fatalf("unexpected delivery %q on %s", d.Payload, c.Queue())
	}
}

func TestFIFOAndAccept(t *testing.T) {
	s := startServer(t)
	c := dial(t, s)
	ctx := ctxT(t)
	if err := c.DeclareQueue(ctx, "q", client.QueueOptions{}); err != nil {
		t.Fatal(err)
	}
	const n = 2000
	for i := 0; i < n; i++ {
		if err := c.PublishAsync(ctx, "", "q", []byte(fmt.Sprint(i)), client.PublishOptions{}, nil); err != nil {
			t.Fatal(err)
		}
	}
	if err := c.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	con, err := c.Subscribe(ctx, "q", client.SubscribeOptions{Credit: 100, AutoCredit: true})
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < n; i++ {
		d := next(t, con, 5*time.Second)
		if string(d.Payload) != fmt.Sprint(i) {
			t.Fatalf("message %d: got %q (FIFO broken)", i, d.Payload)
		}
		if err := d.Accept(ctx); err != nil {
			t.Fatal(err)
		}
	}
	expectNone(t, con, 100*time.Millisecond)
}

func TestCreditIsRespected(t *testing.T) {
	s := startServer(t)
	c := dial(t, s)
	ctx := ctxT(t)
	if err := c.DeclareQueue(ctx, "credit", client.QueueOptions{}); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 50; i++ {
		if err := c.Publish(ctx, "", "credit", []byte("m"), client.PublishOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	con, err := c.Subscribe(ctx, "credit", client.SubscribeOptions{Credit: 3})
	if err != nil {
		t.Fatal(err)
	}
	checkFor(t, 5*time.Second, func() error {
		if con.Buffered() != 3 {
			return fmt.Errorf("buffered %d, want 3", con.Buffered())
		}
		return nil
	})
	// Nothing beyond the credit arrives, however long we wait.
	time.Sleep(100 * time.Millisecond)
	if b := con.Buffered(); b != 3 {
		t.Fatalf("buffered %d deliveries with credit 3", b)
	}
	if _, err := con.Credit(2); err != nil {
		t.Fatal(err)
	}
	checkFor(t, 5*time.Second, func() error {
		if con.Buffered() != 5 {
			return fmt.Errorf("buffered %d, want 5", con.Buffered())
		}
		return nil
	})
	time.Sleep(50 * time.Millisecond)
	if b := con.Buffered(); b != 5 {
		t.Fatalf("buffered %d deliveries with credit 5", b)
	}
}

func TestReleaseGoesBackToItsPosition(t *testing.T) {
	s := startServer(t)
	c := dial(t, s)
	ctx := ctxT(t)
	if err := c.DeclareQueue(ctx, "rel", client.QueueOptions{}); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 5; i++ {
		if err := c.Publish(ctx, "", "rel", []byte(fmt.Sprint(i)), client.PublishOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	con, err := c.Subscribe(ctx, "rel", client.SubscribeOptions{Credit: 2})
	if err != nil {
		t.Fatal(err)
	}
	d0, d1 := next(t, con, 5*time.Second), next(t, con, 5*time.Second)
	if string(d0.Payload) != "0" || string(d1.Payload) != "1" {
		t.Fatalf("got %q %q", d0.Payload, d1.Payload)
	}
	// Release 1 then 0: both go back in front of 2, in their old order.
	if err := d1.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if err := d0.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := con.Credit(5); err != nil {
		t.Fatal(err)
	}
	want := []string{"0", "1", "2", "3", "4"}
	for i, w := range want {
		d := next(t, con, 5*time.Second)
		if string(d.Payload) != w {
			t.Fatalf("after release, message %d = %q, want %q", i, d.Payload, w)
		}
		if i < 2 && (!d.Redelivered || d.DeliveryCount != 1) {
			t.Fatalf("released message not marked redelivered: %+v", d)
		}
	}
}

func TestRejectDeadLettersAndMaxDeliveries(t *testing.T) {
	s := startServer(t)
	c := dial(t, s)
	ctx := ctxT(t)
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(c.DeclareExchange(ctx, "dlx", client.Fanout, client.ExchangeOptions{}))
	must(c.DeclareQueue(ctx, "dead", client.QueueOptions{}))
	must(c.Bind(ctx, "dlx", "dead", ""))
	must(c.DeclareQueue(ctx, "work", client.QueueOptions{DeadLetterExchange: "dlx", MaxDeliveries: 2}))
	must(c.Publish(ctx, "", "work", []byte("rejected"), client.PublishOptions{}))
	must(c.Publish(ctx, "", "work", []byte("poison"), client.PublishOptions{}))
	con, err := c.Subscribe(ctx, "work", client.SubscribeOptions{Credit: 1})
	must(err)
	d := next(t, con, 5*time.Second)
	if string(d.Payload) != "rejected" {
		t.Fatalf("got %q", d.Payload)
	}
	must(d.Reject(ctx))
	must2 := func(d *client.Delivery) {
		must(d.Release(ctx))
	}
	_, _ = con.Credit(1)
	d = next(t, con, 5*time.Second)
	if string(d.Payload) != "poison" {
		t.Fatalf("got %q", d.Payload)
	}
	must2(d) // delivery 1
	_, _ = con.Credit(1)
	d = next(t, con, 5*time.Second)
	must2(d) // delivery 2: reaches max-deliveries, dead-lettered
	_, _ = con.Credit(1)
	expectNone(t, con, 100*time.Millisecond)

	dead, err := c.Subscribe(ctx, "dead", client.SubscribeOptions{Credit: 10})
	must(err)
	got := []string{string(next(t, dead, 5*time.Second).Payload), string(next(t, dead, 5*time.Second).Payload)}
	if got[0] != "rejected" || got[1] != "poison" {
		t.Fatalf("dead letters %v", got)
	}
}

func TestRoutingAllExchangeKinds(t *testing.T) {
	s := startServer(t)
	c := dial(t, s)
	ctx := ctxT(t)
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	for _, q := range []string{"d1", "d2", "f1", "f2", "t1", "t2", "t3"} {
		must(c.DeclareQueue(ctx, q, client.QueueOptions{}))
	}
	must(c.DeclareExchange(ctx, "direct", client.Direct, client.ExchangeOptions{}))
	must(c.DeclareExchange(ctx, "fan", client.Fanout, client.ExchangeOptions{}))
	must(c.DeclareExchange(ctx, "topic", client.Topic, client.ExchangeOptions{}))
	must(c.Bind(ctx, "direct", "d1", "a"))
	must(c.Bind(ctx, "direct", "d2", "b"))
	must(c.Bind(ctx, "fan", "f1", "ignored"))
	must(c.Bind(ctx, "fan", "f2", ""))
	must(c.Bind(ctx, "topic", "t1", "stock.*.nyse"))
	must(c.Bind(ctx, "topic", "t2", "stock.#"))
	must(c.Bind(ctx, "topic", "t3", "#.eu"))
	must(c.Bind(ctx, "topic", "t3", "*.*.eu")) // double match delivers once

	pub := func(ex, key, body string) { must(c.Publish(ctx, ex, key, []byte(body), client.PublishOptions{})) }
	pub("direct", "a", "da")
	pub("direct", "b", "db")
	pub("direct", "zzz", "unroutable")
	pub("fan", "whatever", "fan")
	pub("topic", "stock.ibm.nyse", "ibm")
	pub("topic", "stock", "bare")
	pub("topic", "stock.sap.xetra.eu", "sap")
	pub("topic", "bond.eu", "bond")
	pub("", "d1", "default")

	want := map[string][]string{
		"d1": {"da", "default"}, "d2": {"db"}, "f1": {"fan"}, "f2": {"fan"},
		"t1": {"ibm"}, "t2": {"ibm", "bare", "sap"}, "t3": {"sap", "bond"},
	}
	for q, msgs := range want {
		con, err := c.Subscribe(ctx, q, client.SubscribeOptions{Credit: 100, AckMode: client.AckNone})
		must(err)
		for _, w := range msgs {
			if d := next(t, con, 5*time.Second); string(d.Payload) != w {
				t.Fatalf("queue %s: got %q want %q", q, d.Payload, w)
			}
		}
		expectNone(t, con, 50*time.Millisecond)
	}
	// Publishing to a missing exchange or queue is an error for that message.
	if err := c.Publish(ctx, "nope", "k", nil, client.PublishOptions{}); client.Code(err) != wire.CodeNotFound {
		t.Fatalf("missing exchange: %v", err)
	}
	if err := c.Publish(ctx, "", "nope", nil, client.PublishOptions{}); client.Code(err) != wire.CodeNotFound {
		t.Fatalf("missing queue: %v", err)
	}
}

func TestTTL(t *testing.T) {
	s := startServer(t)
	c := dial(t, s)
	ctx := ctxT(t)
	if err := c.DeclareQueue(ctx, "ttlq", client.QueueOptions{MessageTTL: 50 * time.Millisecond}); err != nil {
		t.Fatal(err)
	}
	if err := c.DeclareQueue(ctx, "msgttl", client.QueueOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := c.Publish(ctx, "", "ttlq", []byte("old"), client.PublishOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := c.Publish(ctx, "", "msgttl", []byte("short"), client.PublishOptions{TTL: 30 * time.Millisecond}); err != nil {
		t.Fatal(err)
	}
	if err := c.Publish(ctx, "", "msgttl", []byte("long"), client.PublishOptions{TTL: time.Hour}); err != nil {
		t.Fatal(err)
	}
	time.Sleep(250 * time.Millisecond)
	if err := c.Publish(ctx, "", "ttlq", []byte("fresh"), client.PublishOptions{}); err != nil {
		t.Fatal(err)
	}
	con, err := c.Subscribe(ctx, "ttlq", client.SubscribeOptions{Credit: 10, AckMode: client.AckNone})
	if err != nil {
		t.Fatal(err)
	}
	if d := next(t, con, 5*time.Second); string(d.Payload) != "fresh" {
		t.Fatalf("expired message delivered: %q", d.Payload)
	}
	con2, err := c.Subscribe(ctx, "msgttl", client.SubscribeOptions{Credit: 10, AckMode: client.AckNone})
	if err != nil {
		t.Fatal(err)
	}
	if d := next(t, con2, 5*time.Second); string(d.Payload) != "long" {
		t.Fatalf("per-message TTL: got %q", d.Payload)
	}
}

func TestMaxLength(t *testing.T) {
	s := startServer(t)
	c := dial(t, s)
	ctx := ctxT(t)
	if err := c.DeclareQueue(ctx, "rej", client.QueueOptions{MaxLength: 3}); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 3; i++ {
		if err := c.Publish(ctx, "", "rej", []byte(fmt.Sprint(i)), client.PublishOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	if err := c.Publish(ctx, "", "rej", []byte("x"), client.PublishOptions{}); client.Code(err) != wire.CodeResourceLimit {
		t.Fatalf("publish to a full reject-publish queue: %v", err)
	}
	// drop-head sends the oldest to the dead-letter exchange.
	if err := c.DeclareExchange(ctx, "dl", client.Fanout, client.ExchangeOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := c.DeclareQueue(ctx, "dropped", client.QueueOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := c.Bind(ctx, "dl", "dropped", ""); err != nil {
		t.Fatal(err)
	}
	if err := c.DeclareQueue(ctx, "drop", client.QueueOptions{MaxLength: 2, Overflow: client.OverflowDropHead, DeadLetterExchange: "dl"}); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 5; i++ {
		if err := c.Publish(ctx, "", "drop", []byte(fmt.Sprint(i)), client.PublishOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	con, _ := c.Subscribe(ctx, "drop", client.SubscribeOptions{Credit: 10, AckMode: client.AckNone})
	for _, w := range []string{"3", "4"} {
		if d := next(t, con, 5*time.Second); string(d.Payload) != w {
			t.Fatalf("drop-head kept %q, want %q", d.Payload, w)
		}
	}
	expectNone(t, con, 50*time.Millisecond)
	dl, _ := c.Subscribe(ctx, "dropped", client.SubscribeOptions{Credit: 10, AckMode: client.AckNone})
	for _, w := range []string{"0", "1", "2"} {
		if d := next(t, dl, 5*time.Second); string(d.Payload) != w {
			t.Fatalf("dead-lettered %q, want %q", d.Payload, w)
		}
	}
}

// TestDisconnectRequeues is guarantee 6: what a session acquired and did not
// accept goes back to the queue when it disconnects, with its delivery count.
func TestDisconnectRequeues(t *testing.T) {
	s := startServer(t)
	ctx := ctxT(t)
	c1 := dial(t, s)
	if err := c1.DeclareQueue(ctx, "g6", client.QueueOptions{}); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 10; i++ {
		if err := c1.Publish(ctx, "", "g6", []byte(fmt.Sprint(i)), client.PublishOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	con, err := c1.Subscribe(ctx, "g6", client.SubscribeOptions{Credit: 10})
	if err != nil {
		t.Fatal(err)
	}
	var accepted []uint64
	for i := 0; i < 10; i++ {
		d := next(t, con, 5*time.Second)
		if i%2 == 0 {
			accepted = append(accepted, d.Tag)
		}
	}
	if err := con.Accept(ctx, accepted...); err != nil { // guarantee 3
		t.Fatal(err)
	}
	_ = c1.Close()

	c2 := dial(t, s)
	con2, err := c2.Subscribe(ctx, "g6", client.SubscribeOptions{Credit: 100})
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for i := 0; i < 5; i++ {
		d := next(t, con2, 5*time.Second)
		if !d.Redelivered || d.DeliveryCount != 1 {
			t.Fatalf("requeued message not marked redelivered: %+v", d)
		}
		got = append(got, string(d.Payload))
	}
	if fmt.Sprint(got) != "[1 3 5 7 9]" {
		t.Fatalf("requeued %v", got)
	}
	expectNone(t, con2, 100*time.Millisecond) // accepted ones are forgotten
}

func TestExclusiveAndAutoDelete(t *testing.T) {
	s := startServer(t)
	ctx := ctxT(t)
	c1, c2 := dial(t, s), dial(t, s)
	if err := c1.DeclareQueue(ctx, "mine", client.QueueOptions{Exclusive: true}); err != nil {
		t.Fatal(err)
	}
	if _, err := c2.Subscribe(ctx, "mine", client.SubscribeOptions{Credit: 1}); client.Code(err) != wire.CodeNotAllowed {
		t.Fatalf("subscribe to another's exclusive queue: %v", err)
	}
	if err := c1.DeclareQueue(ctx, "auto", client.QueueOptions{AutoDelete: true}); err != nil {
		t.Fatal(err)
	}
	con, err := c1.Subscribe(ctx, "auto", client.SubscribeOptions{Credit: 1})
	if err != nil {
		t.Fatal(err)
	}
	if err := con.Cancel(ctx); err != nil {
		t.Fatal(err)
	}
	checkFor(t, 5*time.Second, func() error {
		if err := c2.DeclareQueue(ctx, "auto", client.QueueOptions{Passive: true}); client.Code(err) != wire.CodeNotFound {
			return fmt.Errorf("auto-delete queue still there: %v", err)
		}
		return nil
	})
	_ = c1.Close()
	checkFor(t, 5*time.Second, func() error {
		if err := c2.DeclareQueue(ctx, "mine", client.QueueOptions{Passive: true}); client.Code(err) != wire.CodeNotFound {
			return fmt.Errorf("exclusive queue outlived its session: %v", err)
		}
		return nil
	})
}

func TestPurgeAndDelete(t *testing.T) {
	s := startServer(t)
	c := dial(t, s)
	ctx := ctxT(t)
	if err := c.DeclareQueue(ctx, "p", client.QueueOptions{}); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 10; i++ {
		_ = c.Publish(ctx, "", "p", []byte("x"), client.PublishOptions{})
	}
	if err := c.DeleteQueue(ctx, "p", client.QueueDeleteOptions{IfEmpty: true}); client.Code(err) != wire.CodePreconditionFailed {
		t.Fatalf("delete if-empty of a full queue: %v", err)
	}
	if err := c.Purge(ctx, "p"); err != nil {
		t.Fatal(err)
	}
	if err := c.DeleteQueue(ctx, "p", client.QueueDeleteOptions{IfEmpty: true}); err != nil {
		t.Fatal(err)
	}
	if err := c.Publish(ctx, "", "p", []byte("x"), client.PublishOptions{}); client.Code(err) != wire.CodeNotFound {
		t.Fatalf("publish to deleted queue: %v", err)
	}
	if err := c.DeclareQueue(ctx, "p", client.QueueOptions{MaxLength: 1}); err != nil {
		t.Fatal(err)
	}
	if err := c.DeclareQueue(ctx, "p", client.QueueOptions{MaxLength: 2}); client.Code(err) != wire.CodePreconditionFailed {
		t.Fatalf("redeclare with other options: %v", err)
	}
}

// rawConn speaks the wire protocol by hand, for malformed input.
func rawConn(t *testing.T, s *server.Server) net.Conn {
	t.Helper()
	nc, err := net.DialTimeout("tcp", s.ClientAddr(), 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = nc.Close() })
	_ = nc.SetDeadline(time.Now().Add(10 * time.Second))
	return nc
}

func readFrames(t *testing.T, nc net.Conn) (types []wire.Type, errs []wire.Error) {
	t.Helper()
	data, _ := io.ReadAll(nc) // until the server closes
	for len(data) > 0 {
		h, body, n, err := wire.Next(data, wire.FrameSizeMax)
		if err != nil || n == 0 {
			t.Fatalf("bad frame from server: %v (n=%d)", err, n)
		}
		if h.Type == wire.TypeHeartbeat {
			data = data[n:]
			continue // may come at any time
		}
		types = append(types, h.Type)
		if h.Type == wire.TypeError {
			var e wire.Error
			if err := wire.DecodeError(body, &e); err != nil {
				t.Fatal(err)
			}
			e.Text = append([]byte(nil), e.Text...)
			errs = append(errs, e)
		}
		data = data[n:]
	}
	return
}

func TestMalformedFrameClosesOnlyThatConnection(t *testing.T) {
	s := startServer(t)
	ctx := ctxT(t)
	good := dial(t, s)
	if err := good.DeclareQueue(ctx, "ok", client.QueueOptions{}); err != nil {
		t.Fatal(err)
	}
	cases := map[string][]byte{
		"garbage":       []byte("GET / HTTP/1.1\r\n\r\n"),
		"no hello":      wire.AppendHeartbeat(nil, wire.Current),
		"oversize":      func() []byte { b := wire.AppendHeartbeat(nil, wire.Current); b[8] = 0x7f; return b }(),
		"bad publish":   append(wire.AppendHello(nil, []wire.Version{wire.Current}, "x", "none", nil, 0, 0), badPublish()...),
		"unknown type":  append(wire.AppendHello(nil, []wire.Version{wire.Current}, "x", "none", nil, 0, 0), unknownType()...),
		"wrong version": wire.AppendHello(nil, []wire.Version{wire.MakeVersion(9, 0)}, "x", "none", nil, 0, 0),
	}
	for name, input := range cases {
		t.Run(name, func(t *testing.T) {
			nc := rawConn(t, s)
			if _, err := nc.Write(input); err != nil {
				t.Fatal(err)
			}
			types, errs := readFrames(t, nc)
			if len(errs) == 0 || types[len(types)-1] != wire.TypeClose {
				t.Fatalf("got frames %v, want ERROR then CLOSE", types)
			}
			if errs[0].Code == wire.CodeOK {
				t.Fatalf("error without a code: %+v", errs[0])
			}
		})
	}
	// The good connection never noticed.
	if err := good.Publish(ctx, "", "ok", []byte("still here"), client.PublishOptions{}); err != nil {
		t.Fatal(err)
	}
}

func badPublish() []byte {
	b, s := wire.AppendPublishStart(nil, wire.Current, 1, "", 2) // says 2, carries 1
	b = wire.AppendPublishMessage(b, 0, 0, "ok", nil, []byte("x"))
	wire.EndFrame(b, s, 0)
	return b
}

func unknownType() []byte {
	b, s := wire.StartFrame(nil, wire.Current, wire.Type(0x7e), 0)
	wire.EndFrame(b, s, 0)
	return b
}

func TestHigherMinorVersionFrameIsSkipped(t *testing.T) {
	s := startServer(t)
	nc := rawConn(t, s)
	out := wire.AppendHello(nil, []wire.Version{wire.Current}, "x", "none", nil, 0, 0)
	// A frame from a future minor version, of a type we do not know.
	b, st := wire.StartFrame(nil, wire.MakeVersion(wire.VersionMajor, wire.VersionMinor+1), wire.Type(0x7e), 0)
	b = append(b, "future"...)
	wire.EndFrame(b, st, 0)
	out = append(out, b...)
	out = wire.AppendDeclareQueue(out, wire.Current, &wire.DeclareQueue{CommandID: 1, Name: []byte("v")})
	out = wire.AppendClose(out, wire.Current, wire.CodeOK, "bye")
	// Wait for the declare to complete before CLOSE races it.
	if _, err := nc.Write(out[:len(out)-len(wire.AppendClose(nil, wire.Current, wire.CodeOK, "bye"))]); err != nil {
		t.Fatal(err)
	}
	time.Sleep(100 * time.Millisecond)
	if _, err := nc.Write(wire.AppendClose(nil, wire.Current, wire.CodeOK, "bye")); err != nil {
		t.Fatal(err)
	}
	types, errs := readFrames(t, nc)
	if len(errs) != 0 {
		t.Fatalf("errors: %+v", errs)
	}
	want := []wire.Type{wire.TypeWelcome, wire.TypeComplete, wire.TypeClose}
	if fmt.Sprint(types) != fmt.Sprint(want) {
		t.Fatalf("frames %v, want %v", types, want)
	}
}

func TestHeartbeatTimeoutClosesDeadConnection(t *testing.T) {
	s := startServer(t)
	nc := rawConn(t, s)
	// Ask for 50 ms heartbeats, then go silent.
	if _, err := nc.Write(wire.AppendHello(nil, []wire.Version{wire.Current}, "x", "none", nil, 0, 50)); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	types, errs := readFrames(t, nc)
	if len(errs) != 0 || types[len(types)-1] != wire.TypeClose {
		t.Fatalf("frames %v errors %+v", types, errs)
	}
	if time.Since(start) > 8*time.Second {
		t.Fatal("dead connection kept open")
	}
}

func TestThousandConnections(t *testing.T) {
	if testing.Short() {
		t.Skip("short")
	}
	s := startServer(t)
	ctx := ctxT(t)
	const n = 1000
	conns := make([]*client.Conn, n)
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			c, err := client.Dial(ctx, s.ClientAddr())
			if err != nil {
				errs <- err
				return
			}
			conns[i] = c
		}(i)
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	defer func() {
		for _, c := range conns {
			_ = c.Close()
		}
	}()
	if err := conns[0].DeclareQueue(ctx, "many", client.QueueOptions{}); err != nil {
		t.Fatal(err)
	}
	// Every connection is live: each publishes one message.
	for i, c := range conns {
		if err := c.PublishAsync(ctx, "", "many", []byte(fmt.Sprint(i)), client.PublishOptions{}, nil); err != nil {
			t.Fatal(err)
		}
	}
	for _, c := range conns {
		if err := c.Flush(ctx); err != nil {
			t.Fatal(err)
		}
	}
	con, err := conns[n-1].Subscribe(ctx, "many", client.SubscribeOptions{Credit: n, AckMode: client.AckNone})
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	for i := 0; i < n; i++ {
		seen[string(next(t, con, 10*time.Second).Payload)] = true
	}
	if len(seen) != n {
		t.Fatalf("got %d distinct messages from %d connections", len(seen), n)
	}
}

func TestConcurrentProducersConsumers(t *testing.T) {
	s := startServer(t)
	ctx := ctxT(t)
	setup := dial(t, s)
	const queues, producers, perProducer = 4, 4, 2000
	for q := 0; q < queues; q++ {
		if err := setup.DeclareQueue(ctx, fmt.Sprint("cq", q), client.QueueOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	var wg sync.WaitGroup
	for p := 0; p < producers; p++ {
		wg.Add(1)
		go func(p int) {
			defer wg.Done()
			c := dial(t, s)
			for i := 0; i < perProducer; i++ {
				q := fmt.Sprint("cq", i%queues)
				if err := c.PublishAsync(ctx, "", q, []byte(fmt.Sprintf("%d-%06d", p, i)), client.PublishOptions{}, nil); err != nil {
					t.Error(err)
					return
				}
			}
			if err := c.Flush(ctx); err != nil {
				t.Error(err)
			}
		}(p)
	}
	wg.Wait()
	// Two consumers per queue on separate connections; every message once,
	// and each producer's messages in order within a queue per consumer.
	var mu sync.Mutex
	got := map[string]int{}
	var cwg sync.WaitGroup
	for q := 0; q < queues; q++ {
		for k := 0; k < 2; k++ {
			cwg.Add(1)
			go func(q int) {
				defer cwg.Done()
				c := dial(t, s)
				con, err := c.Subscribe(ctx, fmt.Sprint("cq", q), client.SubscribeOptions{Credit: 64, AutoCredit: true})
				if err != nil {
					t.Error(err)
					return
				}
				last := map[byte]string{}
				for {
					cctx, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
					d, err := con.Next(cctx)
					cancel()
					if err != nil {
						return
					}
					p := d.Payload[0]
					if s := string(d.Payload); s <= last[p] {
						t.Errorf("out of order: %s after %s", s, last[p])
					}
					last[p] = string(d.Payload)
					mu.Lock()
					got[string(d.Payload)]++
					mu.Unlock()
					if err := d.Accept(ctx); err != nil {
						t.Error(err)
						return
					}
				}
			}(q)
		}
	}
	cwg.Wait()
	if len(got) != producers*perProducer {
		t.Fatalf("got %d distinct messages, want %d", len(got), producers*perProducer)
	}
	var dups []string
	for k, v := range got {
		if v != 1 {
			dups = append(dups, k)
		}
	}
	sort.Strings(dups)
	if len(dups) > 0 {
		t.Fatalf("delivered more than once: %v", dups[:min(10, len(dups))])
	}
}

var _ = errors.New

func testLogger(t testing.TB) *slog.Logger {
	level := slog.LevelError
	if os.Getenv("BERTH_TEST_DEBUG") != "" {
		level = slog.LevelDebug
	}
	return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))
}

// TestLargeDeliveryBatchesFromTwoShards has one connection take thousands
// of messages at once from queues on both shards: each shard's batches must
// reach the socket whole, never interleaved with the other's.
func TestLargeDeliveryBatchesFromTwoShards(t *testing.T) {
	s := startServer(t)
	c := dial(t, s)
	ctx := ctxT(t)
	const n = 5000
	q0, q1 := queueOnShard(s, "big", 0), queueOnShard(s, "big", 1)
	for _, q := range []string{q0, q1} {
		if err := c.DeclareQueue(ctx, q, client.QueueOptions{}); err != nil {
			t.Fatal(err)
		}
		for i := 0; i < n; i++ {
			if err := c.PublishAsync(ctx, "", q, []byte(q), client.PublishOptions{}, nil); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := c.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	sub := dial(t, s)
	var cons []*client.Consumer
	for _, q := range []string{q0, q1} {
		con, err := sub.Subscribe(ctx, q, client.SubscribeOptions{Credit: n, AckMode: client.AckNone})
		if err != nil {
			t.Fatal(err)
		}
		cons = append(cons, con)
	}
	for i, con := range cons {
		for k := 0; k < n; k++ {
			d := next(t, con, 10*time.Second)
			if string(d.Payload) != []string{q0, q1}[i] {
				t.Fatalf("payload %q on %s", d.Payload, con.Queue())
			}
		}
	}
}

func TestWindowIsEnforced(t *testing.T) {
	s := startServer(t, func(c *server.Config) { c.WindowMax = 10 })
	setup := dial(t, s)
	if err := setup.DeclareQueue(ctxT(t), "w", client.QueueOptions{}); err != nil {
		t.Fatal(err)
	}
	nc := rawConn(t, s)
	out := wire.AppendHello(nil, []wire.Version{wire.Current}, "x", "none", nil, 0, 0)
	b, st := wire.AppendPublishStart(nil, wire.Current, 1, "", 30)
	for i := 0; i < 30; i++ {
		b = wire.AppendPublishMessage(b, 0, 0, "w", nil, []byte("m"))
	}
	wire.EndFrame(b, st, 0)
	out = append(out, b...)
	if _, err := nc.Write(out); err != nil {
		t.Fatal(err)
	}
	time.Sleep(200 * time.Millisecond)
	if _, err := nc.Write(wire.AppendClose(nil, wire.Current, wire.CodeOK, "bye")); err != nil {
		t.Fatal(err)
	}
	_, errs := readFrames(t, nc)
	if len(errs) != 20 {
		t.Fatalf("%d errors for 30 publishes over a window of 10, want 20", len(errs))
	}
	for _, e := range errs {
		if e.Code != wire.CodeResourceLimit || e.CommandID <= 10 {
			t.Fatalf("unexpected error %+v", e)
		}
	}
}

func TestShutdownSendsClose(t *testing.T) {
	s := startServer(t)
	nc := rawConn(t, s)
	if _, err := nc.Write(wire.AppendHello(nil, []wire.Version{wire.Current}, "x", "none", nil, 0, 0)); err != nil {
		t.Fatal(err)
	}
	time.Sleep(50 * time.Millisecond)
	go s.Close()
	types, _ := readFrames(t, nc)
	if len(types) == 0 || types[len(types)-1] != wire.TypeClose {
		t.Fatalf("frames %v, want CLOSE last", types)
	}
}

// TestStartFailsWhenShardsCannotStart: a shard setup that fails (here the
// paging directory, whose parent is a file) fails Start with its error;
// the broker does not come up without its shards.
func TestStartFailsWhenShardsCannotStart(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "paging"), []byte("not a directory"), 0o644); err != nil {
		t.Fatal(err)
	}
	cfg := server.DefaultConfig()
	cfg.ClientAddr, cfg.AdminAddr, cfg.DataDir, cfg.ControllerAddr = "127.0.0.1:0", "", dir, ""
	cfg.Shards, cfg.Loops, cfg.MemoryLimit, cfg.Logger = 1, 1, 64<<20, testLogger(t)
	s, err := server.Start(cfg)
	if err == nil {
		s.Close()
		t.Fatal("started without its shards")
	}
	if !strings.Contains(err.Error(), "paging") {
		t.Fatalf("error %v does not name the paging directory", err)
	}
}

// TestFailedStartStopsWhatItStarted: a start that fails late (the TLS
// listener's certificate is missing, after the admin HTTP, the controller
// and the client listener came up) stops them all by Close's path: their
// ports are free again, and a start on the same data directory succeeds.
func TestFailedStartStopsWhatItStarted(t *testing.T) {
	dir := t.TempDir()
	cfg := server.DefaultConfig()
	cfg.ClientAddr, cfg.AdminAddr, cfg.ControllerAddr = testutil.FreeAddr(t), testutil.FreeAddr(t), testutil.FreeAddr(t)
	cfg.DataDir, cfg.Shards, cfg.Loops, cfg.Logger = dir, 1, 1, testLogger(t)
	bad := cfg
	bad.TLSAddr, bad.TLSCert, bad.TLSKey = "127.0.0.1:0", filepath.Join(dir, "missing.pem"), filepath.Join(dir, "missing-key.pem")
	if s, err := server.Start(bad); err == nil {
		s.Close()
		t.Fatal("started without its TLS certificate")
	}
	for _, addr := range []string{cfg.ClientAddr, cfg.AdminAddr, cfg.ControllerAddr} {
		ln, err := net.Listen("tcp", addr)
		if err != nil {
			t.Fatalf("after the failed start %s is still taken: %v", addr, err)
		}
		ln.Close()
	}
	s, err := server.Start(cfg)
	if err != nil {
		t.Fatalf("start after the failed one: %v", err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
}
