package client

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync/atomic"
	"testing"
	"time"
)

// TestConsumeSettlesByHandlerResult: nil accepts, ErrReject dead-letters,
// another error releases for redelivery; Consume returns ctx's error when
// cancelled, after its settles were answered.
func TestConsumeSettlesByHandlerResult(t *testing.T) {
	s := startServer(t)
	c := dialTest(t, s.ClientAddr())
	ctx := testCtx(t)
	mustDeclare(t, c, "dead", QueueOptions{})
	mustDeclare(t, c, "work", QueueOptions{DeadLetterKey: "dead"})
	const n = 100
	for i := 0; i < n; i++ {
		if err := c.Publish(ctx, "", "work", []byte(strconv.Itoa(i)), PublishOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	sub, err := c.Subscribe(ctx, "work", SubscribeOptions{Credit: 16, AutoCredit: true})
	if err != nil {
		t.Fatal(err)
	}
	cctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var accepted, rejected, released atomic.Int64
	err = sub.Consume(cctx, func(d *Delivery) error {
		i, _ := strconv.Atoi(string(d.Payload))
		switch {
		case i%10 == 3:
			rejected.Add(1)
			return fmt.Errorf("poison %d: %w", i, ErrReject)
		case i%10 == 7 && d.DeliveryCount == 0:
			released.Add(1)
			return errors.New("try again later")
		}
		if accepted.Add(1) == n-n/10 {
			cancel()
		}
		return nil
	})
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("Consume returned %v, want context.Canceled", err)
	}
	if rejected.Load() != n/10 || released.Load() != n/10 || accepted.Load() != n-n/10 {
		t.Fatalf("handled: accepted %d rejected %d released %d", accepted.Load(), rejected.Load(), released.Load())
	}
	// Consume waited for its settles: the queues already show them.
	depth := map[string][2]int{}
	for _, q := range s.Broker().Queues() {
		depth[q.Name] = [2]int{q.Ready, q.Unacked}
	}
	if depth["work"] != [2]int{0, 0} || depth["dead"][0] != n/10 {
		t.Fatalf("after Consume: work ready/unacked %v, dead %v; want 0/0 and %d", depth["work"], depth["dead"], n/10)
	}
}

// TestConsumeAckNoneAndCancel: with AckNone nothing is settled, and a
// cancelled consumer ends Consume with ErrConsumerClosed.
func TestConsumeAckNoneAndCancel(t *testing.T) {
	s := startServer(t)
	c := dialTest(t, s.ClientAddr())
	ctx := testCtx(t)
	mustDeclare(t, c, "fire", QueueOptions{})
	for i := 0; i < 10; i++ {
		if err := c.Publish(ctx, "", "fire", []byte("x"), PublishOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	sub, err := c.Subscribe(ctx, "fire", SubscribeOptions{Credit: 100, AckMode: AckNone})
	if err != nil {
		t.Fatal(err)
	}
	var got atomic.Int64
	errc := make(chan error, 1)
	go func() {
		errc <- sub.Consume(ctx, func(d *Delivery) error { got.Add(1); return errors.New("ignored with AckNone") })
	}()
	deadline := time.Now().Add(5 * time.Second)
	for got.Load() < 10 && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	if err := sub.Cancel(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-errc:
		if !errors.Is(err, ErrConsumerClosed) {
			t.Fatalf("Consume returned %v, want ErrConsumerClosed", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Consume did not return after Cancel")
	}
	if got.Load() != 10 {
		t.Fatalf("handled %d of 10", got.Load())
	}
}
