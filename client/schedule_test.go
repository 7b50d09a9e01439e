package client

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/berthmq/berth/wire"
)

// TestPriorityQueue: through a real broker, a queue declared with
// MaxPriority delivers higher priorities first, FIFO within one, a
// priority above the maximum counting as the maximum; redeclaring with
// another maximum is refused, and a maximum above 10 never leaves the
// client.
func TestPriorityQueue(t *testing.T) {
	s := startServer(t)
	c := dialTest(t, s.ClientAddr())
	ctx := testCtx(t)
	mustDeclare(t, c, "pq", QueueOptions{Durable: true, MaxPriority: 5})
	for i, p := range []uint8{1, 5, 3, 9, 0, 3} {
		opts := PublishOptions{Persistent: i%2 == 0}.WithPriority(p)
		if err := c.Publish(ctx, "", "pq", []byte(fmt.Sprintf("m%d", i)), opts); err != nil {
			t.Fatal(err)
		}
	}
	sub, err := c.Subscribe(ctx, "pq", SubscribeOptions{Credit: 100, AckMode: AckNone})
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"m1", "m3", "m2", "m5", "m0", "m4"} {
		if d := next(t, sub); string(d.Payload) != want {
			t.Fatalf("got %s, want %s", d.Payload, want)
		}
	}
	var e *Error
	if err := c.DeclareQueue(ctx, "pq", QueueOptions{Durable: true, MaxPriority: 4}); !errors.As(err, &e) || e.Code != wire.CodePreconditionFailed {
		t.Fatalf("redeclare with another max priority: %v", err)
	}
	if err := c.DeclareQueue(ctx, "pq2", QueueOptions{MaxPriority: 11}); !errors.Is(err, ErrInvalid) {
		t.Fatalf("max priority 11: %v", err)
	}
}

// TestDeliverAt: a message published with a delay, or a deliver-at time,
// reaches its consumer no earlier than asked, behind a message published
// after it without one; the queue counts it as delayed meanwhile.
func TestDeliverAt(t *testing.T) {
	s := startServer(t)
	c := dialTest(t, s.ClientAddr())
	ctx := testCtx(t)
	mustDeclare(t, c, "later", QueueOptions{})
	start := time.Now()
	at := start.Add(250 * time.Millisecond)
	if err := c.Publish(ctx, "", "later", []byte("delay"), PublishOptions{}.WithDelay(200*time.Millisecond)); err != nil {
		t.Fatal(err)
	}
	if err := c.Publish(ctx, "", "later", []byte("at"), PublishOptions{}.WithDeliverAt(at)); err != nil {
		t.Fatal(err)
	}
	if err := c.Publish(ctx, "", "later", []byte("now"), PublishOptions{DeliverAt: start.Add(-time.Hour)}); err != nil {
		t.Fatal(err)
	}
	// A time past what the broker's int64 nanoseconds hold is refused for
	// that message alone.
	var e *Error
	if err := c.Publish(ctx, "", "later", []byte("never"), PublishOptions{DeliverAt: time.Date(3000, 1, 1, 0, 0, 0, 0, time.UTC)}); !errors.As(err, &e) || e.Code != wire.CodeInvalid {
		t.Fatalf("deliver-at in the year 3000: %v", err)
	}
	delayed := -1
	for _, qi := range s.Broker().Queues() {
		if qi.Name == "later" {
			delayed = qi.Delayed
		}
	}
	if delayed != 2 {
		t.Fatalf("delayed count %d, want 2", delayed)
	}
	sub, err := c.Subscribe(ctx, "later", SubscribeOptions{Credit: 10, AckMode: AckNone})
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []struct {
		payload   string
		notBefore time.Time
	}{{"now", start}, {"delay", start.Add(200 * time.Millisecond)}, {"at", at}} {
		d := next(t, sub)
		if got := time.Now(); string(d.Payload) != want.payload || got.Before(want.notBefore) {
			t.Fatalf("got %q at +%v, want %q not before +%v", d.Payload, got.Sub(start), want.payload, want.notBefore.Sub(start))
		}
	}
}
