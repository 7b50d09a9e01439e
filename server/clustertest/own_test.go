package clustertest

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"regexp"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/berthmq/berth/client"
	"github.com/berthmq/berth/internal/testutil"
)

// TestOwnershipFairness: with -consume-at-replicas, one consumer of a
// replicated queue on each of three brokers (every one a replica of the
// queue's group). Each is served by its own broker, not proxied to the
// master: every broker's /v1/queues shows one consumer. The brokers take
// the queue's ownership in turns (time slices of 50 ms), so every
// consumer gets messages; each gets them in publish order; and every
// message is delivered once, unflagged (no broker failed).
func TestOwnershipFairness(t *testing.T) {
	testutil.Long(t, "ownership shared fairly between brokers")
	const groups, total = 3, 900
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	c := startReplicatedWith(t, ctx, groups, 3, 0, "-consume-at-replicas", "-own-slice", "50ms")
	const queue = "shared"
	g, _, _, conn := c.declare(queue, groups)
	c.declareEverywhere(queue)
	// Every broker runs its replica of the group before its consumer
	// subscribes (until then it would proxy it, or refuse it).
	testutil.WaitFor(t, 20*time.Second, func() error {
		for _, n := range c.nodes {
			if role, _, err := c.role(n, g); err != nil || role == "" {
				return fmt.Errorf("%s: role %q in group %d (%v)", n.name, role, g, err)
			}
		}
		return nil
	})

	var mu sync.Mutex
	got := map[string]int{}
	per := map[string]int{}
	errs := make(chan error, len(c.nodes))
	var wg sync.WaitGroup
	subscribed := make(chan struct{}, len(c.nodes))
	for _, n := range c.nodes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			cc, err := client.Dial(ctx, n.client)
			if err != nil {
				errs <- err
				return
			}
			defer cc.Close()
			con, err := cc.Subscribe(ctx, queue, client.SubscribeOptions{Credit: 20, AutoCredit: true})
			if err != nil {
				errs <- fmt.Errorf("%s: subscribe: %w", n.name, err)
				return
			}
			subscribed <- struct{}{}
			last := -1
			for {
				mu.Lock()
				done := len(got) >= total
				mu.Unlock()
				if done {
					return
				}
				dctx, dcancel := context.WithTimeout(ctx, 500*time.Millisecond)
				d, err := con.Next(dctx)
				dcancel()
				if err != nil {
					if ctx.Err() != nil {
						errs <- fmt.Errorf("%s: %w", n.name, err)
						return
					}
					continue
				}
				body := string(d.Payload)
				i, _ := strconv.Atoi(body[1:])
				if i <= last {
					errs <- fmt.Errorf("%s: %s after m%d: out of order", n.name, body, last)
					return
				}
				last = i
				if d.Redelivered || d.DeliveryCount != 0 {
					errs <- fmt.Errorf("%s: %s redelivered (count %d) with no failure", n.name, body, d.DeliveryCount)
					return
				}
				if err := d.Accept(ctx); err != nil {
					errs <- fmt.Errorf("%s: accept %s: %w", n.name, body, err)
					return
				}
				mu.Lock()
				got[body]++
				per[n.name]++
				mu.Unlock()
			}
		}()
	}
	for range c.nodes {
		select {
		case <-subscribed:
		case err := <-errs:
			t.Fatal(err)
		}
	}
	// Every broker serves its own consumer.
	testutil.WaitFor(t, 10*time.Second, func() error {
		for _, n := range c.nodes {
			var qs []struct {
				Name      string
				Consumers int
			}
			if err := c.getJSON(n, "/v1/queues", &qs); err != nil {
				return err
			}
			for _, q := range qs {
				if q.Name == queue && q.Consumers != 1 {
					return fmt.Errorf("%s: %d consumers of %s, want its own one", n.name, q.Consumers, queue)
				}
			}
		}
		return nil
	})
	c.publishAll(conn, queue, names(0, total))
	wg.Wait()
	close(errs)
	for err := range errs {
		for _, n := range c.nodes {
			var qs []map[string]any
			_ = c.getJSON(n, "/v1/queues", &qs)
			t.Logf("%s: %v", n.name, qs)
		}
		t.Fatalf("%v (per broker: %v, %d consumed)", err, per, len(got))
	}
	for name, n := range got {
		if n != 1 {
			t.Fatalf("%s delivered %d times", name, n)
		}
	}
	if len(got) != total {
		t.Fatalf("%d of %d messages consumed", len(got), total)
	}
	for _, n := range c.nodes {
		if per[n.name] == 0 {
			t.Fatalf("the consumer on %s got nothing (per broker: %v)", n.name, per)
		}
	}
	var qs []struct {
		Name      string
		Owner     uint32
		Handovers uint64
	}
	if err := c.getJSON(c.nodes[0], "/v1/queues", &qs); err != nil {
		t.Fatal(err)
	}
	for _, q := range qs {
		if q.Name == queue {
			if q.Handovers == 0 || q.Owner == 0 {
				t.Fatalf("queue %s: owner %d after %d handovers", queue, q.Owner, q.Handovers)
			}
			t.Logf("per broker: %v; %d handovers, owner now %d", per, q.Handovers, q.Owner)
		}
	}
	// The console's rows and the metrics show it too.
	var stats struct {
		Queues []struct {
			Name  string
			Owner uint32
		}
	}
	if err := c.getJSON(c.nodes[1], "/v1/queues/stats", &stats); err != nil {
		t.Fatal(err)
	}
	for _, q := range stats.Queues {
		if q.Name == queue && q.Owner == 0 {
			t.Fatalf("/v1/queues/stats at %s shows no owner of %s", c.nodes[1].name, queue)
		}
	}
	resp, err := http.Get("http://" + c.admins[c.nodes[1]] + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if !regexp.MustCompile(`(?m)^berth_shard_own_events_total\{[^}]*\} [1-9]`).Match(body) {
		t.Fatalf("%s's metrics count no own event:\n%s", c.nodes[1].name, regexp.MustCompile(`(?m)^berth_shard_own.*$`).FindAll(body, -1))
	}
}

// TestOwnerKilledRequeuesWhatItHeld: with -consume-at-replicas, a
// consumer on a broker that is not the group's master takes the queue's
// ownership, accepts some messages and holds more unaccepted; every
// member shows those as acquired. After kill -9 of that broker, the
// master takes the queue back once the broker stays silent (twice the
// group's lag) and a consumer at the master gets every message not
// accepted, each once: those the dead owner held flagged redelivered
// with a count of one, the rest unflagged (an owner that is not the
// master sends nothing before its acquires event commits, so it leaves
// no window to over-flag).
func TestOwnerKilledRequeuesWhatItHeld(t *testing.T) { ownerLost(t, false) }

// TestOwnerFrozenIsFenced is TestOwnerKilledRequeuesWhatItHeld with
// SIGSTOP for the owner instead of kill -9: once the master took the
// queue back and its consumer got everything, SIGCONT; the woken owner
// cannot complete an accept of what it held under its old ownership
// (the accept fails, or its consumer was ended), and no message comes
// again.
func TestOwnerFrozenIsFenced(t *testing.T) {
	testutil.Long(t, "a frozen owner fenced")
	ownerLost(t, true)
}

func ownerLost(t *testing.T, freeze bool) {
	const groups, total, accepted, held = 3, 300, 20, 40
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	c := startReplicatedWith(t, ctx, groups, 3, 0, "-consume-at-replicas", "-own-slice", "50ms")
	const queue = "owned"
	g, master, mnode, conn := c.declare(queue, groups)
	c.declareEverywhere(queue)
	var owner *node
	for _, n := range c.nodes {
		if n != mnode {
			owner = n
			break
		}
	}
	testutil.WaitFor(t, 20*time.Second, func() error {
		if role, _, err := c.role(owner, g); err != nil || role == "" {
			return fmt.Errorf("%s: role %q in group %d (%v)", owner.name, role, g, err)
		}
		return nil
	})
	oc := dial(t, ctx, owner.client)
	con, err := oc.Subscribe(ctx, queue, client.SubscribeOptions{Credit: accepted + held})
	if err != nil {
		t.Fatal(err)
	}
	c.publishAll(conn, queue, names(0, total))
	acceptedBy := map[string]bool{}
	heldBy := map[string]bool{}
	var heldDeliveries []*client.Delivery
	for i := range accepted + held {
		d, err := con.Next(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if d.Redelivered {
			t.Fatalf("%s redelivered before any failure", d.Payload)
		}
		if i < accepted {
			if err := d.Accept(ctx); err != nil {
				t.Fatal(err)
			}
			acceptedBy[string(d.Payload)] = true
		} else {
			heldBy[string(d.Payload)] = true
			heldDeliveries = append(heldDeliveries, d)
		}
	}
	testutil.WaitFor(t, 20*time.Second, func() error {
		for _, n := range c.nodes {
			ready, unacked, err := c.depth(n, queue)
			if err != nil {
				return err
			}
			if ready != total-accepted-held || unacked != held {
				return fmt.Errorf("%s: %d ready, %d acquired; want %d and %d", n.name, ready, unacked, total-accepted-held, held)
			}
		}
		return nil
	})
	var qs []struct {
		Name  string
		Owner uint32
	}
	if err := c.getJSON(mnode, "/v1/queues", &qs); err != nil {
		t.Fatal(err)
	}
	for _, q := range qs {
		if q.Name == queue && (q.Owner == 0 || q.Owner == master) {
			t.Fatalf("queue %s is owned by %d, the master, not by the consumer's broker", queue, q.Owner)
		}
	}

	if freeze {
		owner.signal(syscall.SIGSTOP)
	} else {
		owner.signal(syscall.SIGKILL)
	}
	mc, err := conn.Subscribe(ctx, queue, client.SubscribeOptions{Credit: 100, AutoCredit: true})
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]bool{}
	flagged := 0
	for len(got) < total-accepted {
		d, err := mc.Next(ctx)
		if err != nil {
			t.Fatalf("after %d of %d: %v", len(got), total-accepted, err)
		}
		p := string(d.Payload)
		switch {
		case acceptedBy[p]:
			t.Fatalf("%s, accepted at the dead owner, delivered again", p)
		case got[p]:
			t.Fatalf("%s delivered twice", p)
		case heldBy[p] && (!d.Redelivered || d.DeliveryCount != 1):
			t.Fatalf("%s, held by the dead owner: redelivered %v, count %d; want flagged, count 1", p, d.Redelivered, d.DeliveryCount)
		case !heldBy[p] && (d.Redelivered || d.DeliveryCount != 0):
			t.Fatalf("%s, handed to nobody: redelivered %v, count %d; want neither", p, d.Redelivered, d.DeliveryCount)
		}
		if heldBy[p] {
			flagged++
		}
		got[p] = true
		if err := d.Accept(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if flagged != held {
		t.Fatalf("%d flagged, want %d", flagged, held)
	}
	if !freeze {
		return
	}
	owner.signal(syscall.SIGCONT)
	// The woken owner's consumer accepts one message it held: that must
	// not complete, since the master's consumer accepted it already.
	var victim *client.Delivery
	for _, d := range heldDeliveries {
		victim = d
		break
	}
	actx, acancel := context.WithTimeout(ctx, 20*time.Second)
	defer acancel()
	if err := victim.Accept(actx); err == nil {
		t.Fatalf("the woken owner completed an accept of %s, which the master's consumer accepted", victim.Payload)
	} else {
		t.Logf("the woken owner's accept of %s: %v", victim.Payload, err)
	}
	// Nothing comes again at the master.
	dctx, dcancel := context.WithTimeout(ctx, 2*time.Second)
	defer dcancel()
	if d, err := mc.Next(dctx); err == nil {
		t.Fatalf("%s delivered again after the owner woke", d.Payload)
	}
}
