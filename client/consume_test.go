package client

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
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

// settleReport is one OnSettled call.
type settleReport struct {
	how Settle
	err error
}

// TestConsumeOnSettled: OnSettled reports each handled message once, with
// how it was settled and whether the server confirmed it.
func TestConsumeOnSettled(t *testing.T) {
	s := startServer(t)
	c := dialTest(t, s.ClientAddr())
	ctx := testCtx(t)
	mustDeclare(t, c, "dead2", QueueOptions{})
	mustDeclare(t, c, "work2", QueueOptions{DeadLetterKey: "dead2"})
	const n = 300
	for i := 0; i < n; i++ {
		if err := c.Publish(ctx, "", "work2", []byte(strconv.Itoa(i)), PublishOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	sub, err := c.Subscribe(ctx, "work2", SubscribeOptions{Credit: 100, AutoCredit: true})
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	reports := map[uint64][]settleReport{}
	handled := map[uint64]Settle{}
	cctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var accepted int
	err = sub.Consume(cctx, func(d *Delivery) error {
		i, _ := strconv.Atoi(string(d.Payload))
		switch {
		case i%10 == 3:
			handled[d.Tag] = SettleReject
			return ErrReject
		case i%10 == 7 && d.DeliveryCount == 0:
			handled[d.Tag] = SettleRelease
			return errors.New("later")
		}
		handled[d.Tag] = SettleAccept
		if accepted++; accepted == n-n/10 {
			cancel()
		}
		return nil
	}, OnSettled(func(d *Delivery, how Settle, err error) {
		mu.Lock()
		reports[d.Tag] = append(reports[d.Tag], settleReport{how, err})
		mu.Unlock()
	}))
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("Consume: %v", err)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(reports) != len(handled) {
		t.Fatalf("%d messages reported, %d handled", len(reports), len(handled))
	}
	for tag, how := range handled {
		r := reports[tag]
		if len(r) != 1 || r[0].how != how || r[0].err != nil {
			t.Fatalf("tag %d handled as %v, reported %v", tag, how, r)
		}
	}
}

// TestConsumeOnSettledConnectionEnds: settles the server confirmed are
// reported nil; a settle whose answer is lost with the connection is
// reported ErrOutcomeUnknown (never an *Error), although here the server
// did carry it out: the client cannot know.
func TestConsumeOnSettledConnectionEnds(t *testing.T) {
	s := startServer(t)
	p := startProxy(t, s.ClientAddr())
	c := dialTest(t, p.addr())
	ctx := testCtx(t)
	mustDeclare(t, c, "lost", QueueOptions{})
	const half = 10
	for i := 0; i < 2*half; i++ {
		if err := c.Publish(ctx, "", "lost", []byte{byte(i)}, PublishOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	sub, err := c.Subscribe(ctx, "lost", SubscribeOptions{Credit: half})
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var reports []settleReport
	var payloads []byte
	confirmed := make(chan struct{})
	errc := make(chan error, 1)
	handled := 0
	go func() {
		errc <- sub.Consume(ctx, func(d *Delivery) error {
			if handled++; handled == 2*half {
				// The answer to the settle of the second half will be
				// held back.
				p.pause()
			}
			return nil
		}, OnSettled(func(d *Delivery, how Settle, err error) {
			mu.Lock()
			reports = append(reports, settleReport{how, err})
			payloads = append(payloads, d.Payload[0])
			if len(reports) == half {
				close(confirmed)
			}
			mu.Unlock()
		}))
	}()
	select {
	case <-confirmed:
	case <-ctx.Done():
		t.Fatal("the first half was never reported")
	}
	if _, err := sub.Credit(half); err != nil {
		t.Fatal(err)
	}
	// The server has applied the second ACCEPT: nothing ready, nothing
	// acquired. Only its answer is missing.
	waitFor(t, "the server to apply every accept", func() bool {
		for _, q := range s.Broker().Queues() {
			if q.Name == "lost" {
				return q.Ready == 0 && q.Unacked == 0
			}
		}
		return false
	})
	p.kill()
	err = <-errc
	if !errors.Is(err, ErrOutcomeUnknown) {
		t.Fatalf("Consume: %v, want the lost settle's ErrOutcomeUnknown", err)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(reports) != 2*half {
		t.Fatalf("%d reports for %d messages", len(reports), 2*half)
	}
	for i, r := range reports {
		if r.how != SettleAccept {
			t.Fatalf("report %d: %v", i, r.how)
		}
		if payloads[i] < half {
			if r.err != nil {
				t.Fatalf("message %d, confirmed before the cut: %v", payloads[i], r.err)
			}
			continue
		}
		// The second half may have come in more than one DELIVER, and a
		// settle sent before the last handler call was answered; the one
		// sent after it (with the last message) was not.
		if r.err == nil && payloads[i] < 2*half-1 {
			continue
		}
		if !errors.Is(r.err, ErrOutcomeUnknown) {
			t.Fatalf("message %d, answer lost: %v, want ErrOutcomeUnknown", payloads[i], r.err)
		}
		checkNotRefusal(t, "lost settle", r.err)
	}
}
