package client

import (
	"context"
	"encoding/binary"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/berthmq/berth/server"
	"github.com/berthmq/berth/wire"
)

func TestBackoffBounds(t *testing.T) {
	p, err := (&ReconnectPolicy{DelayMin: 10 * time.Millisecond, DelayMax: 300 * time.Millisecond}).withDefaults()
	if err != nil {
		t.Fatal(err)
	}
	for n := 1; n <= 20; n++ {
		want := min(10*time.Millisecond<<min(n-1, 30), 300*time.Millisecond)
		for _, u := range []float64{0, 0.25, 0.5, 0.999999} {
			d := backoff(&p, n, u)
			if d < want/2 || d > want {
				t.Fatalf("round %d u=%v: wait %v outside [%v, %v]", n, u, d, want/2, want)
			}
		}
		if lo, hi := backoff(&p, n, 0), backoff(&p, n, 0.999999); hi-lo < want/2-want/100 {
			t.Fatalf("round %d: jitter spans %v..%v, want about half of %v", n, lo, hi, want)
		}
	}
	// Without bounds a policy still gives up in the end.
	q, _ := (&ReconnectPolicy{}).withDefaults()
	if q.MaxTime != reconnectTimeDefault || q.DelayMin != reconnectDelayMinDefault || q.DelayMax != reconnectDelayMaxDefault {
		t.Fatalf("defaults: %+v", q)
	}
	if _, err := (&ReconnectPolicy{DelayMin: time.Second, DelayMax: time.Millisecond}).withDefaults(); !errors.Is(err, ErrInvalid) {
		t.Fatalf("DelayMax below DelayMin: %v", err)
	}
}

// reconnectRun publishes n messages through a proxy that, a third of the
// way in, holds back the server's answers and then cuts the connection:
// the broker has enqueued messages whose completions the client never
// saw, and the client resends them on its new connection. It returns how
// often each message was delivered first-hand (not Redelivered), after
// checking that every publish completed, every message was delivered, and
// first-hand deliveries keep publish order.
func reconnectRun(t *testing.T, noProducerID bool) (counts []int, s *server.Server, events []Event) {
	s = startServer(t)
	p := startProxy(t, s.ClientAddr())
	var evMu sync.Mutex
	cfg := Config{Window: 1024, Reconnect: &ReconnectPolicy{
		DelayMin: 5 * time.Millisecond, DelayMax: 50 * time.Millisecond, MaxTime: 20 * time.Second,
		NoProducerID: noProducerID,
		OnEvent: func(e Event) {
			evMu.Lock()
			events = append(events, e)
			evMu.Unlock()
		},
	}}
	c := dialTest(t, p.addr(), cfg)
	if (c.ProducerID() != 0) == noProducerID {
		t.Fatalf("producer id %x with NoProducerID %v", c.ProducerID(), noProducerID)
	}
	ctx := testCtx(t)
	if err := c.DeclareQueue(ctx, "rq", QueueOptions{Durable: true}); err != nil {
		t.Fatal(err)
	}
	cons, err := c.Subscribe(ctx, "rq", SubscribeOptions{Credit: 256, AutoCredit: true})
	if err != nil {
		t.Fatal(err)
	}
	const n = 3000
	heldBatch := min(c.Window()/2, 100)
	counts = make([]int, n)
	var (
		consumed  sync.WaitGroup
		lastFirst = -1
		orderErr  error
		stale     atomic.Int32
		early     *Delivery
		seenAt    []bool
		seenN     atomic.Int32
	)
	consumed.Add(1)
	go func() {
		defer consumed.Done()
		seen := 0
		for seen < n {
			if len(seenAt) == 0 {
				seenAt = make([]bool, n)
			}
			d, err := cons.Next(ctx)
			if err != nil {
				orderErr = err
				return
			}
			i := int(binary.BigEndian.Uint32(d.Payload))
			if !seenAt[i] {
				seenAt[i] = true
				seen++
				seenN.Add(1)
			}
			if !d.Redelivered {
				counts[i]++
				if i <= lastFirst && orderErr == nil && !noProducerID {
					orderErr = errors.New("first-hand deliveries out of publish order")
				}
				lastFirst = max(lastFirst, i)
			}
			if early == nil {
				early = d // kept unsettled across the break: its settle goes stale
				continue
			}
			if err := d.Accept(ctx); err != nil {
				if errors.Is(err, ErrStaleDelivery) {
					stale.Add(1)
					continue
				}
				orderErr = err
				return
			}
		}
	}()
	var completed sync.WaitGroup
	var pubErr atomic.Pointer[error]
	payload := make([]byte, 4)
	for i := 0; i < n; i++ {
		if i == n/3 {
			// Hold the answers, let the broker take a batch it will not
			// be heard completing, then cut.
			if err := c.Flush(ctx); err != nil {
				t.Fatal(err)
			}
			p.pause()
			before := enqueued(s, "rq")
			for j := 0; j < heldBatch; j++ {
				binary.BigEndian.PutUint32(payload, uint32(i))
				completed.Add(1)
				if err := c.PublishAsync(ctx, "", "rq", payload, PublishOptions{Persistent: true}, func(err error) {
					if err != nil {
						pubErr.Store(&err)
					}
					completed.Done()
				}); err != nil {
					t.Fatal(err)
				}
				i++
			}
			waitFor(t, "the broker to enqueue the held batch", func() bool { return enqueued(s, "rq") >= before+uint64(heldBatch) })
			p.kill()
			p.unpause()
		}
		binary.BigEndian.PutUint32(payload, uint32(i))
		completed.Add(1)
		if err := c.PublishAsync(ctx, "", "rq", payload, PublishOptions{Persistent: true}, func(err error) {
			if err != nil {
				pubErr.Store(&err)
			}
			completed.Done()
		}); err != nil {
			t.Fatal(err)
		}
	}
	completed.Wait()
	if e := pubErr.Load(); e != nil {
		t.Fatalf("a publish failed: %v", *e)
	}
	waitFor(t, "every message consumed", func() bool { return seenN.Load() == n })
	cctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	_ = cons.Cancel(cctx)
	consumed.Wait()
	if orderErr != nil && !errors.Is(orderErr, ErrConsumerClosed) {
		t.Fatal(orderErr)
	}
	if err := early.Accept(ctx); !errors.Is(err, ErrStaleDelivery) {
		t.Fatalf("accept of a delivery from the broken connection: %v, want ErrStaleDelivery", err)
	}
	evMu.Lock()
	defer evMu.Unlock()
	return counts, s, events
}

func enqueued(s *server.Server, queue string) uint64 {
	for _, q := range s.Broker().Queues() {
		if q.Name == queue {
			return q.Enqueued
		}
	}
	return 0
}

func TestReconnectResendsWithoutDuplicates(t *testing.T) {
	counts, s, events := reconnectRun(t, false)
	for i, k := range counts {
		// 0: its first delivery went to the broken connection.
		if k > 1 {
			t.Fatalf("message %d delivered first-hand %d times: enqueued twice", i, k)
		}
	}
	if d := s.Broker().Stats().Duplicates; d == 0 {
		t.Fatal("no resend was recognised as a duplicate: the test did not exercise dedup")
	}
	if len(events) < 2 || events[0].Kind != EventDisconnected || events[1].Kind != EventReconnected {
		t.Fatalf("events %v, want disconnected then reconnected", events)
	}
}

// Without producer ids the same run enqueues the resent batch twice: the
// run above shows dedup at work, not a batch that never reached the broker.
func TestReconnectWithoutProducerIDDuplicates(t *testing.T) {
	counts, _, _ := reconnectRun(t, true)
	dups := 0
	for _, k := range counts {
		if k > 1 {
			dups++
		}
	}
	if dups == 0 {
		t.Fatal("no duplicate without producer ids: the held batch was not resent")
	}
	t.Logf("%d messages enqueued twice without producer ids", dups)
}

// A Conn whose every address stays dead gives up after its rounds: the
// publishes it held fail (sent ones with ErrOutcomeUnknown), Err wraps
// ErrGaveUp, Done closes and OnEvent hears gave-up. A Conn that is closed
// while it dials stops at once.
func TestReconnectGivesUp(t *testing.T) {
	s := startServer(t)
	p := startProxy(t, s.ClientAddr())
	events := make(chan Event, 16)
	cfg := Config{Reconnect: &ReconnectPolicy{DelayMin: time.Millisecond, DelayMax: 5 * time.Millisecond, MaxAttempts: 3,
		OnEvent: func(e Event) { events <- e }}}
	c, err := DialConfig(testCtx(t), cfg, p.addr())
	if err != nil {
		t.Fatal(err)
	}
	c.mu.Lock()
	c.mu.addrs = nil // only the proxy: the server's own address would still answer
	c.mu.Unlock()
	ctx := testCtx(t)
	if err := c.DeclareQueue(ctx, "gq", QueueOptions{}); err != nil {
		t.Fatal(err)
	}
	p.pause()
	res := make(chan error, 1)
	if err := c.PublishAsync(ctx, "", "gq", []byte("x"), PublishOptions{}, func(err error) { res <- err }); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the publish to be sent", func() bool {
		c.mu.Lock()
		defer c.mu.Unlock()
		return c.mu.sentBelow > c.mu.win.tail
	})
	p.ln.Close() // every dial fails from now on
	p.kill()     // and the answer stays held
	select {
	case <-c.Done():
	case <-ctx.Done():
		t.Fatal("the Conn did not give up")
	}
	if err := <-res; !errors.Is(err, ErrOutcomeUnknown) || !errors.Is(err, ErrGaveUp) {
		t.Fatalf("held publish: %v, want ErrOutcomeUnknown and ErrGaveUp", err)
	}
	if !errors.Is(c.Err(), ErrGaveUp) || !errors.Is(c.Err(), ErrClosed) {
		t.Fatalf("Err %v", c.Err())
	}
	var kinds []EventKind
	for len(events) > 0 {
		e := <-events
		kinds = append(kinds, e.Kind)
		if e.Kind == EventGaveUp && e.Rounds != 3 {
			t.Fatalf("gave up after %d rounds, want 3", e.Rounds)
		}
	}
	if len(kinds) != 2 || kinds[0] != EventDisconnected || kinds[1] != EventGaveUp {
		t.Fatalf("events %v", kinds)
	}

	// Close while dialling: unbounded rounds, a long wait between them.
	p2 := startProxy(t, s.ClientAddr())
	c2, err := DialConfig(testCtx(t), Config{Reconnect: &ReconnectPolicy{DelayMin: time.Hour, MaxTime: 2 * time.Hour}}, p2.addr())
	if err != nil {
		t.Fatal(err)
	}
	c2.mu.Lock()
	c2.mu.addrs = nil
	c2.mu.Unlock()
	p2.close()
	waitFor(t, "the break", func() bool {
		c2.mu.Lock()
		defer c2.mu.Unlock()
		return c2.mu.link == nil
	})
	closed := make(chan struct{})
	go func() { c2.Close(); close(closed) }()
	select {
	case <-closed:
	case <-time.After(10 * time.Second):
		t.Fatal("Close waited for the reconnect's hour")
	}
}

// TestReconnectingConnNoticesFrozenBroker: a reconnecting Conn that asks
// for no interval gets ReconnectHeartbeatDefault rather than the server's
// 5 s, so a broker that stops answering without closing the connection
// (the proxy holds everything it sends) is given up on and dialled again
// after 3 s, where the server's interval would take 15 s.
func TestReconnectingConnNoticesFrozenBroker(t *testing.T) {
	s := startServer(t) // heartbeat 5 s, the default
	if plain := dialTest(t, s.ClientAddr()); plain.Heartbeat() != 5*time.Second {
		t.Fatalf("a Conn without Reconnect: heartbeat %v, want the server's 5s", plain.Heartbeat())
	}
	if asked := dialTest(t, s.ClientAddr(), Config{Heartbeat: 300 * time.Millisecond, Reconnect: &ReconnectPolicy{}}); asked.Heartbeat() != 300*time.Millisecond {
		t.Fatalf("a reconnecting Conn that asked for 300ms: heartbeat %v", asked.Heartbeat())
	}
	p := startProxy(t, s.ClientAddr())
	events := make(chan Event, 16)
	c := dialTest(t, p.addr(), Config{Reconnect: &ReconnectPolicy{DelayMin: time.Millisecond, DelayMax: 5 * time.Millisecond,
		OnEvent: func(e Event) { events <- e }}})
	if c.Heartbeat() != ReconnectHeartbeatDefault {
		t.Fatalf("a reconnecting Conn: heartbeat %v, want %v", c.Heartbeat(), ReconnectHeartbeatDefault)
	}
	p.pause()
	start := time.Now()
	// Bounded well below the 15 s the server's interval would take, and
	// well above the 3 s this one takes.
	deadline := time.After(10 * time.Second)
	for {
		select {
		case e := <-events:
			if e.Kind != EventDisconnected {
				continue
			}
			if !errors.Is(e.Err, ErrHeartbeatTimeout) {
				t.Fatalf("disconnected by %v, want ErrHeartbeatTimeout", e.Err)
			}
			t.Logf("frozen broker noticed after %v", time.Since(start).Round(time.Millisecond))
			return
		case <-deadline:
			t.Fatal("the frozen broker was not noticed within 10 s")
		}
	}
}

// TestResubscribeWaitsForQueue: after a reconnect to a broker that does
// not know a consumer's queue yet (a cluster broker that has not synced
// a declare made through another one), the SUBSCRIBE sent again is
// refused as not-found and tried again until the queue appears, and the
// consumer then gets what is published to it. A queue that never
// appears ends its consumer with not-found once ResubscribeNotFound has
// passed.
func TestResubscribeWaitsForQueue(t *testing.T) {
	for _, tc := range []struct {
		name   string
		window time.Duration
	}{{"default", 0}, {"off", -1}} {
		t.Run(tc.name, func(t *testing.T) {
			a, b := startServer(t), startServer(t)
			p := startProxy(t, a.ClientAddr())
			window := tc.window
			if window == 0 {
				window = 2 * time.Second // the test's own, shorter than the 5 s default
			}
			cfg := Config{Reconnect: &ReconnectPolicy{DelayMin: 5 * time.Millisecond, DelayMax: 20 * time.Millisecond, ResubscribeNotFound: window}}
			c, err := DialConfig(testCtx(t), cfg, p.addr())
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			c.mu.Lock()
			c.mu.addrs = nil // only the proxy
			c.mu.Unlock()
			ctx := testCtx(t)
			for _, q := range []string{"late", "never"} {
				if err := c.DeclareQueue(ctx, q, QueueOptions{}); err != nil {
					t.Fatal(err)
				}
			}
			late, err := c.Subscribe(ctx, "late", SubscribeOptions{Credit: 8, AckMode: AckNone})
			if err != nil {
				t.Fatal(err)
			}
			never, err := c.Subscribe(ctx, "never", SubscribeOptions{Credit: 8, AckMode: AckNone})
			if err != nil {
				t.Fatal(err)
			}
			p.retarget(b.ClientAddr())
			p.kill()

			if tc.window < 0 {
				// Off: the first not-found ends each consumer.
				if _, err := late.Next(ctx); Code(err) != wire.CodeNotFound {
					t.Fatalf("late consumer: %v, want not-found", err)
				}
				return
			}
			waitFor(t, "a not-found refusal of the SUBSCRIBE sent again", func() bool {
				late.mu.Lock()
				defer late.mu.Unlock()
				return late.mu.retries > 0
			})
			if err := late.Err(); err != nil {
				t.Fatalf("late consumer ended at the first refusal: %v", err)
			}
			d := dialTest(t, b.ClientAddr())
			if err := d.DeclareQueue(ctx, "late", QueueOptions{}); err != nil {
				t.Fatal(err)
			}
			if err := d.Publish(ctx, "", "late", []byte("after"), PublishOptions{}); err != nil {
				t.Fatal(err)
			}
			got, err := late.Next(ctx)
			if err != nil {
				t.Fatalf("late consumer: %v", err)
			}
			if string(got.Payload) != "after" {
				t.Fatalf("late consumer got %q", got.Payload)
			}
			start := time.Now()
			_, err = never.Next(ctx)
			if Code(err) != wire.CodeNotFound {
				t.Fatalf("consumer of a queue that never appears: %v, want not-found", err)
			}
			if waited := time.Since(start); waited > window+5*time.Second {
				t.Fatalf("gave up after %v, window %v", waited, window)
			}
		})
	}
}
