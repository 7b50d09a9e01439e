package clustertest

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/berthmq/berth/client"
	"github.com/berthmq/berth/controlplane/ctlapi"
	"github.com/berthmq/berth/internal/testutil"
)

// TestReconnectingProducerAcrossMasterKill: three real brokers; a
// reconnecting producer (producer ids on) publishes to a replicated queue
// through its group's master, which is killed with -9 a third of the way
// in. The producer's Conn dials another broker on its own and resends what
// had no answer. Refused publishes were not carried out; a resend refused
// by the broker it landed on is ambiguous (the copy sent before the kill
// may have committed). Both are published again through the new master
// (the producer follows the master itself: brokers do not forward to the
// master yet). A consumer on a reconnecting Conn of its own accepts
// meanwhile (Consume). Then every completed publish must have been
// accepted by it or be held by the new master (unless its accept's answer
// was lost), no message whose accept completed comes back, none is there
// twice unless its retry was ambiguous, and first tries are in order.
func TestReconnectingProducerAcrossMasterKill(t *testing.T) {
	testutil.Long(t, "a reconnecting producer across a killed master")
	const groups, total, killAt = 3, 3000, 1000
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	c := startReplicated(t, ctx, groups)
	const queue = "failover-client"
	g, master, mnode, conn := c.declare(queue, groups)
	conn.Close()
	var seeds []string
	seeds = append(seeds, mnode.client)
	for _, n := range c.nodes {
		if n != mnode {
			seeds = append(seeds, n.client)
		}
	}
	var evMu sync.Mutex
	var events []client.Event
	policy := &client.ReconnectPolicy{DelayMin: 20 * time.Millisecond, DelayMax: 200 * time.Millisecond, MaxTime: 30 * time.Second,
		OnEvent: func(e client.Event) { evMu.Lock(); events = append(events, e); evMu.Unlock() }}
	prod, err := client.DialConfig(ctx, client.Config{Reconnect: policy}, seeds...)
	if err != nil {
		t.Fatal(err)
	}
	defer prod.Close()
	if prod.ProducerID() == 0 {
		t.Fatal("no producer id negotiated")
	}

	// A consumer on the master, on a reconnecting Conn of its own, accepts
	// as the producer publishes. After the kill its Conn dials another
	// broker; one that is not the new master refuses its subscription,
	// which ends the consumer (brokers do not forward yet).
	consConn, err := client.DialConfig(ctx, client.Config{Reconnect: &client.ReconnectPolicy{MaxTime: 20 * time.Second}}, seeds...)
	if err != nil {
		t.Fatal(err)
	}
	defer consConn.Close()
	live, err := consConn.Subscribe(ctx, queue, client.SubscribeOptions{Credit: 100, AutoCredit: true})
	if err != nil {
		t.Fatal(err)
	}
	var (
		accMu         sync.Mutex
		accepted      = map[int]bool{} // accept completed: must not come back
		acceptUnknown = map[int]bool{} // accept sent, answer lost: may be gone
	)
	cctx, stopConsumer := context.WithCancel(ctx)
	consumerDone := make(chan struct{})
	go func() {
		defer close(consumerDone)
		// Consume settles in batches; OnSettled says what became of each.
		_ = live.Consume(cctx, func(*client.Delivery) error { return nil }, client.OnSettled(func(d *client.Delivery, _ client.Settle, err error) {
			var i int
			fmt.Sscanf(string(d.Payload), "m%d", &i)
			accMu.Lock()
			defer accMu.Unlock()
			switch {
			case err == nil:
				accepted[i] = true
			case errors.Is(err, client.ErrOutcomeUnknown):
				acceptUnknown[i] = true
			}
		}))
	}()

	var (
		mu         sync.Mutex
		completed  = map[int]bool{} // publish completed
		firstTry   []int            // completed on the first Conn, in completion order per queue
		retry      []int            // refused or ambiguous: published again
		ambiguous  = map[int]bool{}
		killedAt   time.Time
		firstAfter time.Duration // kill to the first completion after it
	)
	var wg sync.WaitGroup
	killed := make(chan struct{})
	// probe measures failover as a client that follows the master sees
	// it: from the kill to the first publish completed by the new master.
	probeDone := make(chan time.Duration, 1)
	probe := func() {
		for ctx.Err() == nil {
			time.Sleep(10 * time.Millisecond)
			gr := c.group(g)
			if gr.Master == 0 || gr.Master == master {
				continue
			}
			var addr string
			for _, n := range c.nodes {
				if n != mnode && c.nodeOfOK(gr.Master, n) {
					addr = n.client
				}
			}
			pctx, pcancel := context.WithTimeout(ctx, time.Second)
			pc, err := client.Dial(pctx, addr)
			if err == nil {
				err = pc.Publish(pctx, "", queue, []byte("probe"), client.PublishOptions{Persistent: true})
				pc.Close()
			}
			pcancel()
			if err == nil {
				probeDone <- time.Since(killedAt)
				return
			}
		}
	}
	for i := 0; i < total; i++ {
		if i == killAt {
			// Kill mid-stream: once a good part has completed, with the
			// window full of publishes in flight.
			testutil.WaitUntil(t, 20*time.Second, "publishes before the kill", func() bool {
				mu.Lock()
				defer mu.Unlock()
				return len(completed) >= killAt/2
			})
			killedAt = time.Now()
			mnode.signal(syscall.SIGKILL)
			close(killed)
			go probe()
		}
		i := i
		wg.Add(1)
		err := prod.PublishAsync(ctx, "", queue, []byte(fmt.Sprintf("m%05d", i)), client.PublishOptions{Persistent: true}, func(err error) {
			defer wg.Done()
			mu.Lock()
			defer mu.Unlock()
			switch {
			case err == nil:
				completed[i] = true
				firstTry = append(firstTry, i)
				select {
				case <-killed:
					if firstAfter == 0 && i >= killAt {
						firstAfter = time.Since(killedAt)
					}
				default:
				}
			case errors.Is(err, client.ErrOutcomeUnknown):
				ambiguous[i] = true
				retry = append(retry, i)
			default:
				retry = append(retry, i) // refused: not carried out
			}
		})
		if err != nil {
			t.Fatalf("publish %d: %v", i, err)
		}
	}
	wg.Wait()
	newMaster := c.waitNewMaster(g, master)
	nnode := c.nodeOf(newMaster)
	testutil.WaitFor(t, 20*time.Second, func() error {
		role, _, err := c.role(nnode, g)
		if err != nil || role != "master" {
			return fmt.Errorf("%s serves group %d as %q (%v)", nnode.name, g, role, err)
		}
		return nil
	})
	var failover time.Duration
	select {
	case failover = <-probeDone:
	case <-ctx.Done():
		t.Fatal("no publish completed by the new master")
	}
	t.Logf("group %d: master %d killed, new master %d; failover (kill to the first publish the new master completed) %v; the reconnecting producer's first completion after the kill %v; %d completed, %d to publish again (%d ambiguous)",
		g, master, newMaster, failover.Round(time.Millisecond), firstAfter.Round(time.Millisecond), len(completed), len(retry), len(ambiguous))
	evMu.Lock()
	for _, e := range events {
		t.Logf("producer event: %v %s after %v, %d resent, err %v", e.Kind, e.Addr, e.Down.Round(time.Millisecond), e.Resent, e.Err)
	}
	evMu.Unlock()

	// Publish again what was refused or ambiguous, through the new master.
	again, err := client.DialConfig(ctx, client.Config{Reconnect: &client.ReconnectPolicy{MaxTime: 20 * time.Second}}, nnode.client)
	if err != nil {
		t.Fatal(err)
	}
	defer again.Close()
	testutil.WaitFor(t, 20*time.Second, func() error {
		return again.DeclareQueue(ctx, queue, client.QueueOptions{Durable: true})
	})
	for _, i := range retry {
		testutil.WaitFor(t, 20*time.Second, func() error {
			return again.Publish(ctx, "", queue, []byte(fmt.Sprintf("m%05d", i)), client.PublishOptions{Persistent: true})
		})
		completed[i] = true
	}

	stopConsumer()
	<-consumerDone
	consConn.Close()
	accMu.Lock()
	defer accMu.Unlock()

	// Read the queue on the new master.
	r := dial(t, ctx, nnode.client)
	defer r.Close()
	cons, err := r.Subscribe(ctx, queue, client.SubscribeOptions{Credit: 1000, AutoCredit: true, AckMode: client.AckNone})
	if err != nil {
		t.Fatal(err)
	}
	seen := map[int]int{}
	var order []int
	for got := 0; ; got++ {
		wait := 2 * time.Second
		if got >= len(completed)-len(accepted) {
			wait = 500 * time.Millisecond
		}
		dctx, dcancel := context.WithTimeout(ctx, wait)
		d, err := cons.Next(dctx)
		dcancel()
		if err != nil {
			if got >= len(completed)-len(accepted)-len(acceptUnknown) {
				break
			}
			t.Fatalf("after %d of about %d messages: %v", got, len(completed)-len(accepted), err)
		}
		if string(d.Payload) == "probe" {
			got--
			continue
		}
		var i int
		fmt.Sscanf(string(d.Payload), "m%d", &i)
		seen[i]++
		if seen[i] == 1 {
			order = append(order, i)
		}
	}
	dups, ambiguousDups := 0, 0
	for i, k := range seen {
		if k > 1 {
			if ambiguous[i] {
				ambiguousDups++
			} else {
				dups++
			}
		}
	}
	for i := range completed {
		if seen[i] == 0 && !accepted[i] && !acceptUnknown[i] {
			t.Errorf("completed publish %d lost", i)
		}
		if seen[i] > 0 && accepted[i] && !ambiguous[i] {
			t.Errorf("message %d came back after its accept completed", i)
		}
	}
	if dups > 0 {
		t.Errorf("%d messages enqueued twice without an ambiguous retry", dups)
	}
	// First-try completions were enqueued in publish order.
	pos := map[int]int{}
	for k, i := range order {
		pos[i] = k
	}
	last := -1
	for _, i := range sortedInts(firstTry) {
		if ambiguous[i] {
			continue
		}
		if pos[i] < last {
			t.Fatalf("message %d delivered before an earlier publish: per-queue order lost", i)
		}
		last = pos[i]
	}
	t.Logf("%d messages accepted by the live consumer (%d more with the answer lost), %d read after, %d completed publishes, %d ambiguous retries, %d of them enqueued twice",
		len(accepted), len(acceptUnknown), len(seen), len(completed), len(ambiguous), ambiguousDups)
}

// nodeOfOK reports whether n is the process of broker id.
func (c *rcluster) nodeOfOK(id uint32, n *node) bool {
	ctx, cancel := context.WithTimeout(c.ctx, time.Second)
	defer cancel()
	bs, err := c.cl.GetBrokers(ctx, ctlapi.ReadConsistent)
	if err != nil {
		return false
	}
	for _, b := range bs {
		if b.ID == id && len(b.Addrs) > 0 && b.Addrs[0] == n.client {
			return true
		}
	}
	return false
}

func sortedInts(xs []int) []int {
	out := append([]int(nil), xs...)
	for i := 1; i < len(out); i++ {
		for j := i; j > 0 && out[j] < out[j-1]; j-- {
			out[j], out[j-1] = out[j-1], out[j]
		}
	}
	return out
}
