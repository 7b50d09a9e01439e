package clustertest

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/berthmq/berth/client"
	"github.com/berthmq/berth/internal/testutil"
	"github.com/berthmq/berth/wire"
)

// TestWiringMadeElsewhere: exchanges, queues and bindings declared,
// unbound and deleted through one broker reach the others while they
// run. A publish through another broker to a queue declared at the first
// is taken (it was refused with not-found until that broker restarted);
// a publish through a third broker's copy of an exchange and binding made
// at the first reaches the queue, and stops reaching it after the unbind;
// deletes at the first leave the others without the queue and exchange.
func TestWiringMadeElsewhere(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	c := startReplicated(t, ctx, 3)
	a := dial(t, ctx, c.nodes[0].client)
	b := dial(t, ctx, c.nodes[1].client)
	third := dial(t, ctx, c.nodes[2].client)

	const queue, exch = "made-at-1", "ex-made-at-1"
	if err := a.DeclareQueue(ctx, queue, client.QueueOptions{Durable: true}); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	var known time.Duration // until broker 2 stopped answering not-found
	var want []string
	testutil.WaitFor(t, 10*time.Second, func() error {
		m := fmt.Sprintf("direct-%d", len(want))
		err := b.Publish(ctx, "", queue, []byte(m), client.PublishOptions{Persistent: true})
		if known == 0 && client.Code(err) != wire.CodeNotFound {
			known = time.Since(start)
		}
		if err != nil {
			// Not found until broker 2 has the queue; then perhaps
			// unavailable while the new cluster's groups start.
			return fmt.Errorf("publish through broker 2: %w", err)
		}
		want = append(want, m)
		return nil
	})
	t.Logf("a queue declared at broker 1 was known at broker 2 after %v and took publishes there after %v",
		known.Round(time.Millisecond), time.Since(start).Round(time.Millisecond))
	consumeRedialing(t, ctx, c.nodes[2], queue, want, true)
	// Broker 2's passes show in its metrics.
	if v := scrapeMetric(t, c.admins[c.nodes[1]], "berth_wiring_sync_passes_total"); v < 1 {
		t.Fatalf("broker 2 counts %v wiring sync passes", v)
	}
	if v := scrapeMetric(t, c.admins[c.nodes[1]], "berth_wiring_sync_seconds_count"); v < 1 {
		t.Fatalf("broker 2 timed %v wiring sync passes", v)
	}

	if err := a.DeclareExchange(ctx, exch, client.Direct, client.ExchangeOptions{Durable: true}); err != nil {
		t.Fatal(err)
	}
	if err := a.Bind(ctx, exch, queue, "k"); err != nil {
		t.Fatal(err)
	}
	sub, err := a.Subscribe(ctx, queue, client.SubscribeOptions{Credit: 100})
	if err != nil {
		t.Fatal(err)
	}
	// routed publishes one message through broker 3's exchange and
	// reports whether the consumer at broker 1 got it within wait.
	n := 0
	routed := func(wait time.Duration) (bool, error) {
		n++
		m := fmt.Sprintf("routed-%d", n)
		if err := third.Publish(ctx, exch, "k", []byte(m), client.PublishOptions{Persistent: true}); err != nil {
			return false, err // not-found while broker 3 lacks the exchange
		}
		wctx, wcancel := context.WithTimeout(ctx, wait)
		defer wcancel()
		for {
			d, err := sub.Next(wctx)
			if errors.Is(err, context.DeadlineExceeded) {
				return false, nil
			}
			if err != nil {
				return false, err
			}
			if err := d.Accept(ctx); err != nil {
				return false, err
			}
			if !strings.HasPrefix(string(d.Payload), "routed-") {
				return false, fmt.Errorf("unexpected message %q", d.Payload)
			}
			if string(d.Payload) == m {
				return true, nil
			}
		}
	}
	testutil.WaitFor(t, 10*time.Second, func() error {
		ok, err := routed(300 * time.Millisecond)
		if err != nil || !ok {
			return fmt.Errorf("broker 3 does not route %s/k to %s yet (%v)", exch, queue, err)
		}
		return nil
	})

	if err := a.Unbind(ctx, exch, queue, "k"); err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, 10*time.Second, func() error {
		ok, err := routed(500 * time.Millisecond)
		if err != nil {
			return err
		}
		if ok {
			return fmt.Errorf("broker 3 still routes %s/k after the unbind", exch)
		}
		return nil
	})
	if err := sub.Cancel(ctx); err != nil {
		t.Fatal(err)
	}

	if err := a.DeleteQueue(ctx, queue, client.QueueDeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := a.DeleteExchange(ctx, exch, client.ExchangeDeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	for i, conn := range []*client.Conn{b, third} {
		testutil.WaitFor(t, 10*time.Second, func() error {
			if err := conn.DeclareQueue(ctx, queue, client.QueueOptions{Durable: true, Passive: true}); err == nil {
				return fmt.Errorf("broker %d still has queue %s", i+2, queue)
			}
			if err := conn.DeclareExchange(ctx, exch, client.Direct, client.ExchangeOptions{Durable: true, Passive: true}); err == nil {
				return fmt.Errorf("broker %d still has exchange %s", i+2, exch)
			}
			return nil
		})
	}
}

// scrapeMetric reads the value of series (name and labels, as /metrics
// writes it) from the broker whose admin address is admin; -1 if absent.
func scrapeMetric(t *testing.T, admin, series string) float64 {
	t.Helper()
	resp, err := http.Get("http://" + admin + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(body), "\n") {
		if v, ok := strings.CutPrefix(line, series+" "); ok {
			f, err := strconv.ParseFloat(v, 64)
			if err != nil {
				t.Fatalf("%s: %q", series, line)
			}
			return f
		}
	}
	return -1
}

// TestWiringMadeElsewhereFiveBrokers: with 5 brokers and groups of 3, a
// queue's group leaves out two brokers, which get none of its events and
// so never adopted it: a queue declared at broker 1 is taken by a publish
// through every other broker, the messages are all delivered, and once
// it is deleted at broker 1 no broker has it.
func TestWiringMadeElsewhereFiveBrokers(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	c := startReplicatedN(t, ctx, 5, 5, 3)
	a := dial(t, ctx, c.nodes[0].client)
	const queue = "made-at-1-of-5"
	if err := a.DeclareQueue(ctx, queue, client.QueueOptions{Durable: true}); err != nil {
		t.Fatal(err)
	}
	var want []string
	for i, n := range c.nodes[1:] {
		conn := dial(t, ctx, n.client)
		testutil.WaitFor(t, 15*time.Second, func() error {
			m := fmt.Sprintf("through-%d-%d", i+2, len(want))
			if err := conn.Publish(ctx, "", queue, []byte(m), client.PublishOptions{Persistent: true}); err != nil {
				return fmt.Errorf("publish through %s: %w", n.name, err)
			}
			want = append(want, m)
			return nil
		})
		conn.Close()
	}
	consumeRedialing(t, ctx, c.nodes[4], queue, want, true)
	// Deleted at broker 1: gone everywhere, from the group's members
	// through its log and from the two others through the sync.
	if err := a.DeleteQueue(ctx, queue, client.QueueDeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	for _, n := range c.nodes[1:] {
		conn := dial(t, ctx, n.client)
		testutil.WaitFor(t, 15*time.Second, func() error {
			if err := conn.DeclareQueue(ctx, queue, client.QueueOptions{Durable: true, Passive: true}); err == nil {
				return fmt.Errorf("%s still has %s", n.name, queue)
			}
			return nil
		})
		conn.Close()
	}
}
