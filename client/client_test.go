package client

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/berthmq/berth/internal/testutil"
	"github.com/berthmq/berth/server"
	"github.com/berthmq/berth/wire"
)

func mustDeclare(t *testing.T, c *Conn, name string, opts QueueOptions) {
	t.Helper()
	if err := c.DeclareQueue(testCtx(t), name, opts); err != nil {
		t.Fatalf("declare %s: %v", name, err)
	}
}

func next(t *testing.T, s *Consumer) *Delivery {
	t.Helper()
	d, err := s.Next(testCtx(t))
	if err != nil {
		t.Fatalf("Next: %v", err)
	}
	return d
}

func TestRoundTripFIFO(t *testing.T) {
	s := startServer(t)
	c := dialTest(t, s.ClientAddr(), Config{Name: "rt"})
	ctx := testCtx(t)
	mustDeclare(t, c, "rt", QueueOptions{})
	const n = 200
	for i := 0; i < n; i++ {
		opts := PublishOptions{Props: []byte(fmt.Sprintf("p%d", i))}
		if err := c.Publish(ctx, "", "rt", []byte(fmt.Sprintf("m%d", i)), opts); err != nil {
			t.Fatalf("publish %d: %v", i, err)
		}
	}
	sub, err := c.Subscribe(ctx, "rt", SubscribeOptions{Credit: 16, AutoCredit: true})
	if err != nil {
		t.Fatal(err)
	}
	var lastTag uint64
	for i := 0; i < n; i++ {
		d := next(t, sub)
		if string(d.Payload) != fmt.Sprintf("m%d", i) || string(d.Props) != fmt.Sprintf("p%d", i) {
			t.Fatalf("message %d: payload %q props %q (FIFO broken?)", i, d.Payload, d.Props)
		}
		if d.Exchange != "" || d.RoutingKey != "rt" || d.Redelivered || d.DeliveryCount != 0 {
			t.Fatalf("message %d: %+v", i, d)
		}
		if d.Tag <= lastTag {
			t.Fatalf("tag %d after %d", d.Tag, lastTag)
		}
		lastTag = d.Tag
		if err := d.Accept(ctx); err != nil {
			t.Fatalf("accept %d: %v", i, err)
		}
	}
	// Accepted means gone: a fresh subscriber finds nothing.
	if err := sub.Cancel(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := sub.Next(ctx); !errors.Is(err, ErrConsumerClosed) {
		t.Fatalf("Next after cancel: %v", err)
	}
	sub2, err := c.Subscribe(ctx, "rt", SubscribeOptions{Credit: 1})
	if err != nil {
		t.Fatal(err)
	}
	short, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
	defer cancel()
	if d, err := sub2.Next(short); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("accepted message came back: %v %v", d, err)
	}
}

func TestPublishAsyncAndFlush(t *testing.T) {
	s := startServer(t)
	c := dialTest(t, s.ClientAddr())
	ctx := testCtx(t)
	mustDeclare(t, c, "async", QueueOptions{})
	const n = 20000
	var ok, failed atomic.Int64
	done := func(err error) {
		if err != nil {
			failed.Add(1)
		} else {
			ok.Add(1)
		}
	}
	payload := make([]byte, 128)
	for i := 0; i < n; i++ {
		// The payload is copied at call time: scribbling on it afterwards
		// must not change what was sent.
		payload[0] = byte(i)
		if err := c.PublishAsync(ctx, "", "async", payload, PublishOptions{}, done); err != nil {
			t.Fatalf("PublishAsync %d: %v", i, err)
		}
		payload[0] = 0xFF
	}
	// Plus some to a queue that does not exist: each fails on its own.
	for i := 0; i < 10; i++ {
		if err := c.PublishAsync(ctx, "", "no-such-queue", payload, PublishOptions{}, done); err != nil {
			t.Fatal(err)
		}
	}
	if err := c.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	if ok.Load() != n || failed.Load() != 10 {
		t.Fatalf("completions: ok %d failed %d", ok.Load(), failed.Load())
	}
	sub, err := c.Subscribe(ctx, "async", SubscribeOptions{Credit: 1000, AckMode: AckNone, AutoCredit: true})
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < n; i++ {
		d := next(t, sub)
		if d.Payload[0] != byte(i) || len(d.Payload) != 128 {
			t.Fatalf("message %d: first byte %d len %d", i, d.Payload[0], len(d.Payload))
		}
	}
}

func TestPublishErrors(t *testing.T) {
	s := startServer(t)
	c := dialTest(t, s.ClientAddr())
	ctx := testCtx(t)
	if err := c.Publish(ctx, "", "missing", []byte("x"), PublishOptions{}); Code(err) != wire.CodeNotFound {
		t.Fatalf("default exchange, missing queue: %v", err)
	}
	if err := c.Publish(ctx, "missing-ex", "k", []byte("x"), PublishOptions{}); Code(err) != wire.CodeNotFound {
		t.Fatalf("missing exchange: %v", err)
	}
	// Routed nowhere: dropped, but completed.
	if err := c.DeclareExchange(ctx, "lonely", Direct, ExchangeOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := c.Publish(ctx, "lonely", "k", []byte("x"), PublishOptions{}); err != nil {
		t.Fatalf("unrouted publish: %v", err)
	}
	mustDeclare(t, c, "small", QueueOptions{MaxLength: 2, Overflow: OverflowRejectPublish})
	for i := 0; i < 2; i++ {
		if err := c.Publish(ctx, "", "small", []byte("x"), PublishOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	err := c.Publish(ctx, "", "small", []byte("x"), PublishOptions{})
	var se *Error
	if !errors.As(err, &se) || se.Code != wire.CodeResourceLimit || se.CommandID == 0 {
		t.Fatalf("publish to full queue: %v", err)
	}
	// Client-side checks never reach the wire.
	if err := c.Publish(ctx, "", "small", make([]byte, c.MaxFrameSize()), PublishOptions{}); !errors.Is(err, ErrTooLarge) {
		t.Fatalf("oversize publish: %v", err)
	}
	if err := c.Publish(ctx, string(make([]byte, 300)), "k", nil, PublishOptions{}); !errors.Is(err, ErrInvalid) {
		t.Fatalf("long exchange name: %v", err)
	}
	// The session is still healthy after all that.
	if err := c.Publish(ctx, "lonely", "k", nil, PublishOptions{}); err != nil {
		t.Fatal(err)
	}
}

func TestManagementErrors(t *testing.T) {
	s := startServer(t)
	c := dialTest(t, s.ClientAddr())
	ctx := testCtx(t)
	check := func(what string, err error, want wire.ErrorCode) {
		t.Helper()
		var se *Error
		if !errors.As(err, &se) || se.Code != want {
			t.Fatalf("%s: got %v, want *Error %v", what, err, want)
		}
	}
	check("passive declare of missing queue", c.DeclareQueue(ctx, "nope", QueueOptions{Passive: true}), wire.CodeNotFound)
	mustDeclare(t, c, "q1", QueueOptions{MaxLength: 10})
	if err := c.DeclareQueue(ctx, "q1", QueueOptions{MaxLength: 10}); err != nil {
		t.Fatalf("identical redeclare: %v", err)
	}
	if err := c.DeclareQueue(ctx, "q1", QueueOptions{Passive: true}); err != nil {
		t.Fatalf("passive declare of existing queue: %v", err)
	}
	check("redeclare with other options", c.DeclareQueue(ctx, "q1", QueueOptions{MaxLength: 11}), wire.CodePreconditionFailed)
	check("passive declare of missing exchange", c.DeclareExchange(ctx, "nope", Topic, ExchangeOptions{Passive: true}), wire.CodeNotFound)
	if err := c.DeclareExchange(ctx, "ex", Topic, ExchangeOptions{}); err != nil {
		t.Fatal(err)
	}
	check("redeclare exchange as another kind", c.DeclareExchange(ctx, "ex", Fanout, ExchangeOptions{}), wire.CodePreconditionFailed)
	check("bind from missing exchange", c.Bind(ctx, "nope", "q1", "k"), wire.CodeNotFound)
	check("bind to missing queue", c.Bind(ctx, "ex", "nope", "k"), wire.CodeNotFound)
	if err := c.Bind(ctx, "ex", "q1", "a.*"); err != nil {
		t.Fatal(err)
	}
	check("unbind from missing exchange", c.Unbind(ctx, "nope", "q1", "a.*"), wire.CodeNotFound)
	if err := c.Unbind(ctx, "ex", "q1", "a.*"); err != nil {
		t.Fatal(err)
	}
	check("unbind of a binding that is gone", c.Unbind(ctx, "ex", "q1", "a.*"), wire.CodeNotFound)
	check("delete missing queue", c.DeleteQueue(ctx, "nope", QueueDeleteOptions{}), wire.CodeNotFound)
	check("delete missing exchange", c.DeleteExchange(ctx, "nope", ExchangeDeleteOptions{}), wire.CodeNotFound)
	check("purge missing queue", c.Purge(ctx, "nope"), wire.CodeNotFound)
	_, err := c.Subscribe(ctx, "nope", SubscribeOptions{Credit: 1})
	check("subscribe to missing queue", err, wire.CodeNotFound)

	if err := c.Publish(ctx, "", "q1", []byte("x"), PublishOptions{}); err != nil {
		t.Fatal(err)
	}
	check("delete non-empty queue if-empty", c.DeleteQueue(ctx, "q1", QueueDeleteOptions{IfEmpty: true}), wire.CodePreconditionFailed)
	if err := c.Purge(ctx, "q1"); err != nil {
		t.Fatal(err)
	}
	if err := c.DeleteQueue(ctx, "q1", QueueDeleteOptions{IfEmpty: true}); err != nil {
		t.Fatalf("delete emptied queue: %v", err)
	}
	check("declare passive after delete", c.DeclareQueue(ctx, "q1", QueueOptions{Passive: true}), wire.CodeNotFound)
	if err := c.DeleteExchange(ctx, "ex", ExchangeDeleteOptions{}); err != nil {
		t.Fatal(err)
	}

	// Exclusive queue of another session.
	mustDeclare(t, c, "mine", QueueOptions{Exclusive: true})
	other := dialTest(t, s.ClientAddr())
	_, err = other.Subscribe(ctx, "mine", SubscribeOptions{Credit: 1})
	check("subscribe to another session's exclusive queue", err, wire.CodeNotAllowed)
}

func TestRoutingThroughExchanges(t *testing.T) {
	s := startServer(t)
	c := dialTest(t, s.ClientAddr())
	ctx := testCtx(t)
	for _, q := range []string{"d", "f1", "f2", "t"} {
		mustDeclare(t, c, q, QueueOptions{})
	}
	for _, e := range []struct {
		name string
		kind ExchangeKind
	}{{"direct", Direct}, {"fan", Fanout}, {"top", Topic}} {
		if err := c.DeclareExchange(ctx, e.name, e.kind, ExchangeOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	for _, b := range [][3]string{{"direct", "d", "k"}, {"fan", "f1", ""}, {"fan", "f2", ""}, {"top", "t", "a.*.c"}} {
		if err := c.Bind(ctx, b[0], b[1], b[2]); err != nil {
			t.Fatal(err)
		}
	}
	pub := func(ex, key, body string) {
		if err := c.Publish(ctx, ex, key, []byte(body), PublishOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	pub("direct", "other", "lost")
	pub("direct", "k", "direct")
	pub("fan", "whatever", "fan")
	pub("top", "a.b.d", "lost")
	pub("top", "a.b.c", "topic")
	want := map[string][]string{"d": {"direct"}, "f1": {"fan"}, "f2": {"fan"}, "t": {"topic"}}
	for q, bodies := range want {
		sub, err := c.Subscribe(ctx, q, SubscribeOptions{Credit: 10, AckMode: AckNone})
		if err != nil {
			t.Fatal(err)
		}
		for _, body := range bodies {
			d := next(t, sub)
			if string(d.Payload) != body {
				t.Fatalf("queue %s got %q, want %q", q, d.Payload, body)
			}
		}
		short, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
		if d, err := sub.Next(short); err == nil {
			t.Fatalf("queue %s got extra %q", q, d.Payload)
		}
		cancel()
	}
}

// TestCreditNeverExceeded counts messages delivered and not yet settled per
// consumer; with AutoCredit it may never pass the credit, and without it
// exactly the granted credit arrives.
func TestCreditNeverExceeded(t *testing.T) {
	s := startServer(t)
	c := dialTest(t, s.ClientAddr())
	ctx := testCtx(t)
	mustDeclare(t, c, "cr", QueueOptions{})
	const n = 3000
	for i := 0; i < n; i++ {
		if err := c.PublishAsync(ctx, "", "cr", []byte{byte(i)}, PublishOptions{}, nil); err != nil {
			t.Fatal(err)
		}
	}
	if err := c.Flush(ctx); err != nil {
		t.Fatal(err)
	}

	// Manual credit: exactly what was granted arrives, no more.
	manual, err := c.Subscribe(ctx, "cr", SubscribeOptions{Credit: 5})
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, "5 buffered deliveries", func() bool { return manual.Buffered() >= 5 })
	time.Sleep(100 * time.Millisecond) // room for a wrong extra delivery to show up
	if b := manual.Buffered(); b != 5 {
		t.Fatalf("credit 5 but %d delivered", b)
	}
	if got, err := manual.Credit(3); err != nil || got != 3 {
		t.Fatalf("Credit(3) = %d, %v", got, err)
	}
	waitFor(t, "8 buffered deliveries", func() bool { return manual.Buffered() >= 8 })
	time.Sleep(100 * time.Millisecond)
	if b := manual.Buffered(); b != 8 {
		t.Fatalf("credit 8 but %d delivered", b)
	}
	var tags []uint64
	for i := 0; i < 8; i++ {
		tags = append(tags, next(t, manual).Tag)
	}
	if err := manual.Accept(ctx, tags...); err != nil {
		t.Fatal(err)
	}
	if err := manual.Cancel(ctx); err != nil {
		t.Fatal(err)
	}

	// AutoCredit, two consumers on one queue, settling in random-sized
	// batches: in flight never above credit.
	const credit = 7
	var wg sync.WaitGroup
	var got atomic.Int64
	errs := make(chan error, 2)
	for w := 0; w < 2; w++ {
		sub, err := c.Subscribe(ctx, "cr", SubscribeOptions{Credit: credit, AutoCredit: true})
		if err != nil {
			t.Fatal(err)
		}
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			var held []uint64
			for got.Load() < n-8 && ctx.Err() == nil {
				short, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
				d, err := sub.Next(short)
				cancel()
				if err != nil {
					if errors.Is(err, context.DeadlineExceeded) {
						continue
					}
					errs <- err
					return
				}
				got.Add(1)
				held = append(held, d.Tag)
				if inflight := len(held) + sub.Buffered(); inflight > credit {
					errs <- fmt.Errorf("consumer %d: %d in flight with credit %d", w, inflight, credit)
					return
				}
				if len(held) >= 1+int(d.Tag%credit) {
					if err := sub.Accept(ctx, held...); err != nil {
						errs <- err
						return
					}
					held = held[:0]
				}
			}
			if len(held) > 0 {
				if err := sub.Accept(ctx, held...); err != nil {
					errs <- err
				}
			}
		}(w)
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	if got.Load() != n-8 {
		t.Fatalf("consumed %d of %d", got.Load(), n-8)
	}
	if err := c.Err(); err != nil {
		t.Fatalf("connection failed (over-delivery ends it): %v", err)
	}
}

func TestSettleReleaseRejectBatch(t *testing.T) {
	s := startServer(t)
	c := dialTest(t, s.ClientAddr())
	ctx := testCtx(t)
	if err := c.DeclareExchange(ctx, "dlx", Fanout, ExchangeOptions{}); err != nil {
		t.Fatal(err)
	}
	mustDeclare(t, c, "dead", QueueOptions{})
	if err := c.Bind(ctx, "dlx", "dead", ""); err != nil {
		t.Fatal(err)
	}
	mustDeclare(t, c, "work", QueueOptions{DeadLetterExchange: "dlx"})
	for i := 0; i < 10; i++ {
		if err := c.Publish(ctx, "", "work", []byte{byte(i)}, PublishOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	sub, err := c.Subscribe(ctx, "work", SubscribeOptions{Credit: 1})
	if err != nil {
		t.Fatal(err)
	}
	// Single release: the same message comes back first, marked.
	d := next(t, sub)
	if d.Payload[0] != 0 {
		t.Fatalf("first message %d", d.Payload[0])
	}
	if err := d.Release(ctx); err != nil {
		t.Fatal(err)
	}
	sub.Credit(1)
	d2 := next(t, sub)
	if d2.Payload[0] != 0 || !d2.Redelivered || d2.DeliveryCount != 1 || d2.Tag == d.Tag {
		t.Fatalf("after release: payload %d redelivered %v count %d tag %d (was %d)", d2.Payload[0], d2.Redelivered, d2.DeliveryCount, d2.Tag, d.Tag)
	}
	// Single reject: dead-lettered.
	if err := d2.Reject(ctx); err != nil {
		t.Fatal(err)
	}
	// Batch: take 9, reject 3 of them out of order, release 2, accept 4.
	sub.Credit(9)
	var ds []*Delivery
	for i := 0; i < 9; i++ {
		ds = append(ds, next(t, sub))
	}
	if err := sub.Reject(ctx, ds[8].Tag, ds[1].Tag, ds[2].Tag); err != nil {
		t.Fatal(err)
	}
	if err := sub.Release(ctx, ds[4].Tag, ds[3].Tag); err != nil {
		t.Fatal(err)
	}
	if err := sub.Accept(ctx, ds[0].Tag, ds[5].Tag, ds[6].Tag, ds[7].Tag, ds[7].Tag); err != nil {
		t.Fatal(err)
	}
	// Settling again is ignored by the server.
	if err := sub.Accept(ctx, ds[0].Tag, 1<<40); err != nil {
		t.Fatalf("re-accept: %v", err)
	}
	if err := sub.Accept(ctx); !errors.Is(err, ErrNoTags) {
		t.Fatalf("empty accept: %v", err)
	}
	// Released ones (payloads 4 and 5) come back in their old order.
	sub.Credit(10)
	for _, want := range []byte{4, 5} {
		d := next(t, sub)
		if d.Payload[0] != want || !d.Redelivered {
			t.Fatalf("released: got %d redelivered %v, want %d", d.Payload[0], d.Redelivered, want)
		}
		if err := d.Accept(ctx); err != nil {
			t.Fatal(err)
		}
	}
	// Dead letters: 0 (single reject), then 2, 3 and 9 in reject order
	// within a batch; compare as a set after the first.
	dead, err := c.Subscribe(ctx, "dead", SubscribeOptions{Credit: 10, AckMode: AckNone})
	if err != nil {
		t.Fatal(err)
	}
	seen := map[byte]bool{}
	for i := 0; i < 4; i++ {
		seen[next(t, dead).Payload[0]] = true
	}
	for _, want := range []byte{0, 2, 3, 9} {
		if !seen[want] {
			t.Fatalf("dead letters %v lack %d", seen, want)
		}
	}
	// Async accept with a callback.
	if err := c.Publish(ctx, "", "work", []byte{42}, PublishOptions{}); err != nil {
		t.Fatal(err)
	}
	d = next(t, sub)
	res := make(chan error, 1)
	if err := sub.AcceptAsync(ctx, []uint64{d.Tag}, func(err error) { res <- err }); err != nil {
		t.Fatal(err)
	}
	if err := <-res; err != nil {
		t.Fatal(err)
	}
}

// TestSettleSplitAcrossFrames sends more ranges than fit in one frame of
// the smallest size, so one Accept becomes several commands.
func TestSettleSplitAcrossFrames(t *testing.T) {
	s := startServer(t)
	c := dialTest(t, s.ClientAddr(), Config{MaxFrameSize: wire.FrameSizeMin})
	if c.MaxFrameSize() != wire.FrameSizeMin {
		t.Fatalf("frame size %d", c.MaxFrameSize())
	}
	ctx := testCtx(t)
	mustDeclare(t, c, "split", QueueOptions{})
	per := rangesPerFrame(c.MaxFrameSize())
	n := 2*per + 10
	for i := 0; i < 2*n; i++ {
		if err := c.PublishAsync(ctx, "", "split", []byte{1}, PublishOptions{}, nil); err != nil {
			t.Fatal(err)
		}
	}
	sub, err := c.Subscribe(ctx, "split", SubscribeOptions{Credit: uint32(2 * n)})
	if err != nil {
		t.Fatal(err)
	}
	var odd, even []uint64
	for i := 0; i < 2*n; i++ {
		d := next(t, sub)
		if i%2 == 0 {
			even = append(even, d.Tag)
		} else {
			odd = append(odd, d.Tag)
		}
	}
	// Every other tag: n one-tag ranges, more than two frames' worth.
	if err := sub.Accept(ctx, even...); err != nil {
		t.Fatal(err)
	}
	if err := sub.Release(ctx, odd...); err != nil {
		t.Fatal(err)
	}
	sub.Credit(uint32(n))
	for i := 0; i < n; i++ {
		if d := next(t, sub); !d.Redelivered {
			t.Fatalf("message %d not a redelivery: accept of the even tags leaked", i)
		}
	}
}

func TestRequeueOnDisconnect(t *testing.T) {
	s := startServer(t)
	ctx := testCtx(t)
	c1 := dialTest(t, s.ClientAddr())
	mustDeclare(t, c1, "rq", QueueOptions{})
	for i := 0; i < 5; i++ {
		if err := c1.Publish(ctx, "", "rq", []byte{byte(i)}, PublishOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	sub, err := c1.Subscribe(ctx, "rq", SubscribeOptions{Credit: 5})
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 5; i++ {
		d := next(t, sub)
		if i < 2 {
			if err := d.Accept(ctx); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := c1.Close(); err != nil {
		t.Fatal(err)
	}
	if err := c1.Publish(ctx, "", "rq", nil, PublishOptions{}); !errors.Is(err, ErrClosed) {
		t.Fatalf("publish after Close: %v", err)
	}
	c2 := dialTest(t, s.ClientAddr())
	sub2, err := c2.Subscribe(ctx, "rq", SubscribeOptions{Credit: 10})
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []byte{2, 3, 4} {
		d := next(t, sub2)
		if d.Payload[0] != want || !d.Redelivered {
			t.Fatalf("requeued: got %d redelivered %v, want %d", d.Payload[0], d.Redelivered, want)
		}
	}
}

func TestDialFallsThrough(t *testing.T) {
	s := startServer(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := ln.Addr().String()
	ln.Close()
	ctx := testCtx(t)
	c, err := Dial(ctx, dead, s.ClientAddr())
	if err != nil {
		t.Fatalf("dial: %v", err)
	}
	defer c.Close()
	if c.Addr() != s.ClientAddr() {
		t.Fatalf("connected to %s", c.Addr())
	}
	if c.Window() <= 0 || c.CreditMax() == 0 || c.ServerName() == "" {
		t.Fatalf("WELCOME not taken: window %d credit %d name %q", c.Window(), c.CreditMax(), c.ServerName())
	}
	if _, err := Dial(ctx, dead); err == nil {
		t.Fatal("dial of a dead address worked")
	}
	if _, err := Dial(ctx); !errors.Is(err, ErrNoAddress) {
		t.Fatalf("dial of nothing: %v", err)
	}
	if _, err := DialConfig(ctx, Config{MaxFrameSize: 10}, s.ClientAddr()); !errors.Is(err, ErrInvalid) {
		t.Fatalf("bad frame size: %v", err)
	}
}

func TestConcurrentPublishers(t *testing.T) {
	s := startServer(t)
	c := dialTest(t, s.ClientAddr(), Config{Window: 64})
	ctx := testCtx(t)
	mustDeclare(t, c, "conc", QueueOptions{})
	const producers, each = 8, 400
	var wg sync.WaitGroup
	errs := make(chan error, producers)
	for p := 0; p < producers; p++ {
		wg.Add(1)
		go func(p int) {
			defer wg.Done()
			for i := 0; i < each; i++ {
				body := []byte(fmt.Sprintf("%d/%d", p, i))
				var err error
				if i%2 == 0 {
					err = c.Publish(ctx, "", "conc", body, PublishOptions{})
				} else {
					err = c.PublishAsync(ctx, "", "conc", body, PublishOptions{}, func(err error) {
						if err != nil {
							errs <- err
						}
					})
				}
				if err != nil {
					errs <- err
					return
				}
			}
		}(p)
	}
	wg.Wait()
	if err := c.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	sub, err := c.Subscribe(ctx, "conc", SubscribeOptions{Credit: 500, AckMode: AckNone, AutoCredit: true})
	if err != nil {
		t.Fatal(err)
	}
	nextSeq := make([]int, producers)
	for i := 0; i < producers*each; i++ {
		d := next(t, sub)
		var p, seq int
		if _, err := fmt.Sscanf(string(d.Payload), "%d/%d", &p, &seq); err != nil {
			t.Fatalf("payload %q: %v", d.Payload, err)
		}
		if seq != nextSeq[p] {
			t.Fatalf("producer %d: got seq %d, want %d (lost, duplicated or reordered)", p, seq, nextSeq[p])
		}
		nextSeq[p]++
	}
}

// TestWindowBound holds back the server's answers with a proxy: the client
// must stop at its window, block the publisher, give up with the context,
// and resume when completions flow again.
func TestWindowBound(t *testing.T) {
	s := startServer(t)
	p := startProxy(t, s.ClientAddr())
	const window = 16
	c := dialTest(t, p.addr(), Config{Window: window})
	if c.Window() != window {
		t.Fatalf("window %d", c.Window())
	}
	ctx := testCtx(t)
	mustDeclare(t, c, "win", QueueOptions{})
	p.pause()
	var completed atomic.Int64
	// Publishes fill their share of the window; the rest is kept for
	// other commands.
	pubs := window - windowReserve(window)
	for i := 0; i < pubs; i++ {
		if err := c.PublishAsync(ctx, "", "win", []byte{1}, PublishOptions{}, func(error) { completed.Add(1) }); err != nil {
			t.Fatal(err)
		}
	}
	short, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
	err := c.PublishAsync(short, "", "win", []byte{1}, PublishOptions{}, nil)
	cancel()
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("publish past the publishes' share of the window: %v", err)
	}
	declared := make(chan error, window)
	for i := pubs; i < window; i++ {
		go func() { declared <- c.DeclareQueue(ctx, fmt.Sprint("reserve-", i), QueueOptions{}) }()
	}
	testutil.WaitFor(t, 10*time.Second, func() error {
		c.mu.Lock()
		defer c.mu.Unlock()
		if c.mu.win.inflight != window {
			return fmt.Errorf("%d commands out; want the whole window, %d", c.mu.win.inflight, window)
		}
		return nil
	})
	short, cancel = context.WithTimeout(ctx, 50*time.Millisecond)
	if err := c.DeclareQueue(short, "other", QueueOptions{}); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("declare past a full window: %v", err)
	}
	cancel()
	if n := completed.Load(); n != 0 {
		t.Fatalf("%d completions leaked through the paused proxy", n)
	}
	blocked := make(chan error, 1)
	go func() { blocked <- c.Publish(ctx, "", "win", []byte{2}, PublishOptions{}) }()
	select {
	case err := <-blocked:
		t.Fatalf("publish did not block on a full window: %v", err)
	case <-time.After(50 * time.Millisecond):
	}
	p.unpause()
	if err := <-blocked; err != nil {
		t.Fatal(err)
	}
	if err := c.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	if n := completed.Load(); n != int64(pubs) {
		t.Fatalf("completed %d of %d", n, pubs)
	}
	for i := pubs; i < window; i++ {
		if err := <-declared; err != nil {
			t.Fatalf("declare in the window's reserve: %v", err)
		}
	}
}

func TestHeartbeatTimeout(t *testing.T) {
	// Generous against scheduler stalls on a loaded machine: the server
	// gives up after 3 silent intervals.
	const hb = 150 * time.Millisecond
	// The server's heartbeat timer ticks at its configured interval, so
	// the session interval asked for must not be shorter than it.
	s := startServer(t, func(cfg *server.Config) { cfg.Heartbeat = hb })
	p := startProxy(t, s.ClientAddr())
	c := dialTest(t, p.addr(), Config{Heartbeat: hb})
	if c.Heartbeat() != hb {
		t.Fatalf("heartbeat %v", c.Heartbeat())
	}
	// An idle but healthy session survives many intervals: both sides
	// heartbeat on their own.
	time.Sleep(5 * hb)
	if err := c.Err(); err != nil {
		t.Fatalf("idle session died: %v", err)
	}
	p.pause()
	select {
	case <-c.Done():
	case <-time.After(testTimeout):
		t.Fatal("dead server not noticed")
	}
	if err := c.Err(); !errors.Is(err, ErrHeartbeatTimeout) || !errors.Is(err, ErrClosed) {
		t.Fatalf("err %v", err)
	}
	if err := c.Publish(testCtx(t), "", "x", nil, PublishOptions{}); !errors.Is(err, ErrClosed) {
		t.Fatalf("publish on dead conn: %v", err)
	}
}

func TestContextCancellation(t *testing.T) {
	s := startServer(t)
	c := dialTest(t, s.ClientAddr())
	ctx := testCtx(t)
	mustDeclare(t, c, "ctx", QueueOptions{})
	dead, cancel := context.WithCancel(ctx)
	cancel()
	if err := c.Publish(dead, "", "ctx", []byte("x"), PublishOptions{}); !errors.Is(err, context.Canceled) {
		t.Fatalf("publish with cancelled ctx: %v", err)
	}
	if err := c.DeclareQueue(dead, "ctx2", QueueOptions{}); !errors.Is(err, context.Canceled) {
		t.Fatalf("declare with cancelled ctx: %v", err)
	}
	sub, err := c.Subscribe(ctx, "ctx", SubscribeOptions{Credit: 1})
	if err != nil {
		t.Fatal(err)
	}
	short, cancel2 := context.WithTimeout(ctx, 50*time.Millisecond)
	defer cancel2()
	if _, err := sub.Next(short); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Next on empty queue: %v (the cancelled publish was sent?)", err)
	}
	// The connection is fine afterwards.
	if err := c.Publish(ctx, "", "ctx", []byte("y"), PublishOptions{}); err != nil {
		t.Fatal(err)
	}
	if d := next(t, sub); string(d.Payload) != "y" {
		t.Fatalf("got %q", d.Payload)
	}
}

func TestServerCloseEndsSession(t *testing.T) {
	s := startServer(t)
	c := dialTest(t, s.ClientAddr())
	ctx := testCtx(t)
	mustDeclare(t, c, "sc", QueueOptions{})
	sub, err := c.Subscribe(ctx, "sc", SubscribeOptions{Credit: 1})
	if err != nil {
		t.Fatal(err)
	}
	go s.Close()
	if _, err := sub.Next(ctx); !errors.Is(err, ErrClosed) {
		t.Fatalf("Next after server close: %v", err)
	}
	if err := c.DeclareQueue(ctx, "x", QueueOptions{}); !errors.Is(err, ErrClosed) {
		t.Fatalf("declare after server close: %v", err)
	}
}

// TestCloseFinishesInFlight checks that Close lets queued publishes
// complete before it ends the session, and that every callback fires once.
func TestCloseFinishesInFlight(t *testing.T) {
	s := startServer(t)
	c := dialTest(t, s.ClientAddr())
	ctx := testCtx(t)
	mustDeclare(t, c, "cl", QueueOptions{})
	const n = 5000
	var ok, failed atomic.Int64
	for i := 0; i < n; i++ {
		if err := c.PublishAsync(ctx, "", "cl", []byte{1}, PublishOptions{}, func(err error) {
			if err != nil {
				failed.Add(1)
			} else {
				ok.Add(1)
			}
		}); err != nil {
			t.Fatal(err)
		}
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	if ok.Load() != n || failed.Load() != 0 {
		t.Fatalf("after Close: %d ok, %d failed of %d", ok.Load(), failed.Load(), n)
	}
	if err := c.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	if err := c.Err(); !errors.Is(err, ErrClosed) {
		t.Fatalf("Err after Close: %v", err)
	}
	// The messages are really there.
	c2 := dialTest(t, s.ClientAddr())
	sub, err := c2.Subscribe(ctx, "cl", SubscribeOptions{Credit: 1000, AckMode: AckNone, AutoCredit: true})
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < n; i++ {
		next(t, sub)
	}
}

// TestPersistentSurvivesRestart: a completed persistent publish to a
// durable queue is on disk, so a restarted broker still has it; an
// accepted one is gone for good.
func TestPersistentSurvivesRestart(t *testing.T) {
	dir := t.TempDir()
	useDir := func(cfg *server.Config) { cfg.DataDir = dir }
	s := startServer(t, useDir)
	c := dialTest(t, s.ClientAddr())
	ctx := testCtx(t)
	mustDeclare(t, c, "keep", QueueOptions{Durable: true})
	const n = 100
	for i := 0; i < n; i++ {
		if err := c.PublishAsync(ctx, "", "keep", []byte{byte(i)}, PublishOptions{Persistent: true}, func(err error) {
			if err != nil {
				t.Errorf("persistent publish: %v", err)
			}
		}); err != nil {
			t.Fatal(err)
		}
	}
	if err := c.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	sub, err := c.Subscribe(ctx, "keep", SubscribeOptions{Credit: 10})
	if err != nil {
		t.Fatal(err)
	}
	var tags []uint64
	for i := 0; i < 10; i++ {
		tags = append(tags, next(t, sub).Tag)
	}
	if err := sub.Accept(ctx, tags...); err != nil {
		t.Fatal(err)
	}
	c.Close()
	s.Close()

	s2 := startServer(t, useDir)
	c2 := dialTest(t, s2.ClientAddr())
	sub2, err := c2.Subscribe(ctx, "keep", SubscribeOptions{Credit: n, AckMode: AckNone})
	if err != nil {
		t.Fatalf("durable queue after restart: %v", err)
	}
	for i := 10; i < n; i++ {
		if d := next(t, sub2); d.Payload[0] != byte(i) {
			t.Fatalf("after restart got %d, want %d", d.Payload[0], i)
		}
	}
	short, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
	defer cancel()
	if d, err := sub2.Next(short); err == nil {
		t.Fatalf("extra message %d after restart (an accepted one came back?)", d.Payload[0])
	}
}

func TestMessageTTL(t *testing.T) {
	s := startServer(t)
	c := dialTest(t, s.ClientAddr())
	ctx := testCtx(t)
	mustDeclare(t, c, "ttl", QueueOptions{})
	if err := c.Publish(ctx, "", "ttl", []byte("short"), PublishOptions{TTL: 30 * time.Millisecond}); err != nil {
		t.Fatal(err)
	}
	if err := c.Publish(ctx, "", "ttl", []byte("long"), PublishOptions{TTL: time.Hour}); err != nil {
		t.Fatal(err)
	}
	time.Sleep(150 * time.Millisecond)
	sub, err := c.Subscribe(ctx, "ttl", SubscribeOptions{Credit: 10, AckMode: AckNone})
	if err != nil {
		t.Fatal(err)
	}
	if d := next(t, sub); string(d.Payload) != "long" {
		t.Fatalf("got %q; the expired message was delivered", d.Payload)
	}
}

// TestFlushWaitsForCallbacks: Flush returns only after the callbacks of the
// commands before it have run, even slow ones. The reader fires callbacks
// outside its lock after retiring their ids; Flush used to return in that
// gap (an example test saw 9,950 of 10,000 callbacks under -race).
func TestFlushWaitsForCallbacks(t *testing.T) {
	s := startServer(t)
	c := dialTest(t, s.ClientAddr())
	ctx := testCtx(t)
	mustDeclare(t, c, "slowcb", QueueOptions{})
	const n = 200
	var ran atomic.Int64
	done := func(err error) {
		time.Sleep(200 * time.Microsecond)
		ran.Add(1)
	}
	for round := 0; round < 5; round++ {
		for i := 0; i < n; i++ {
			if err := c.PublishAsync(ctx, "", "slowcb", []byte("x"), PublishOptions{}, done); err != nil {
				t.Fatal(err)
			}
		}
		if err := c.Flush(ctx); err != nil {
			t.Fatal(err)
		}
		if got := ran.Load(); got != int64((round+1)*n) {
			t.Fatalf("round %d: Flush returned with %d of %d callbacks run", round, got, (round+1)*n)
		}
	}
}
