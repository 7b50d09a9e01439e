package clustertest

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/berthmq/berth/client"
	"github.com/berthmq/berth/controlplane/ctlapi"
	"github.com/berthmq/berth/internal/testutil"
	"github.com/berthmq/berth/wire"
)

// brokerIDs maps each process of c to its broker id.
func (c *rcluster) brokerIDs() map[*node]uint32 {
	c.t.Helper()
	bs, err := c.cl.GetBrokers(c.ctx, ctlapi.ReadConsistent)
	if err != nil {
		c.t.Fatal(err)
	}
	out := map[*node]uint32{}
	for _, b := range bs {
		for _, n := range c.nodes {
			if len(b.Addrs) > 0 && b.Addrs[0] == n.client {
				out[n] = b.ID
			}
		}
	}
	if len(out) != len(c.nodes) {
		c.t.Fatalf("%d of %d processes matched to brokers", len(out), len(c.nodes))
	}
	return out
}

// declareEverywhere declares the durable queue on every broker, as a
// client of each would before using it: a broker learns a queue declared
// elsewhere only when it declares it too, restarts, or holds its group.
func (c *rcluster) declareEverywhere(queue string) {
	c.t.Helper()
	for _, n := range c.nodes {
		conn := dial(c.t, c.ctx, n.client)
		if err := conn.DeclareQueue(c.ctx, queue, client.QueueOptions{Durable: true}); err != nil {
			c.t.Fatalf("declare %q at %s: %v", queue, n.name, err)
		}
		conn.Close()
	}
}

// spreadOf is the largest count minus the smallest over ids.
func spreadOf(counts map[uint32]int, ids map[*node]uint32) int {
	lo, hi := -1, 0
	for _, id := range ids {
		n := counts[id]
		if lo < 0 || n < lo {
			lo = n
		}
		hi = max(hi, n)
	}
	return hi - lo
}

// TestForwardPlacement: 3 and 5 real brokers, 3 replicas per group. The
// controller spreads replicas and masters evenly (each broker's counts
// within one of the others'), each broker runs exactly the groups placed
// on it, a publish through every broker (followers and brokers outside the
// group forward to the master) reaches the queue, and a consumer on a
// broker that is not the master (outside the replica set with 5 brokers),
// which proxies it to the master, gets every message exactly once, in
// order per producer, and its accepts reach the master.
func TestForwardPlacement(t *testing.T) {
	testutil.Long(t, "placement and forwarding over 3 and 5 brokers")
	for _, tc := range []struct {
		brokers int
		groups  uint32
	}{{3, 6}, {5, 10}} {
		t.Run(fmt.Sprintf("brokers=%d", tc.brokers), func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
			defer cancel()
			c := startReplicatedN(t, ctx, tc.groups, tc.brokers, 3)
			ids := c.brokerIDs()
			for g := range tc.groups {
				c.waitServing(g)
			}
			gs, _, err := c.cl.GetGroups(ctx, ctlapi.ReadConsistent, 0, tc.groups)
			if err != nil {
				t.Fatal(err)
			}
			held, mastered := map[uint32]int{}, map[uint32]int{}
			for _, g := range gs {
				if len(g.Replicas) != 3 || !slices.Contains(g.Replicas, g.Master) {
					t.Fatalf("group %d: replicas %v, master %d", g.ID, g.Replicas, g.Master)
				}
				for _, id := range g.Replicas {
					held[id]++
				}
				mastered[g.Master]++
			}
			if s := spreadOf(held, ids); s > 1 {
				t.Errorf("groups held per broker %v: spread %d", held, s)
			}
			if s := spreadOf(mastered, ids); s > 1 {
				t.Errorf("groups mastered per broker %v: spread %d", mastered, s)
			}
			t.Logf("held %v, mastered %v", held, mastered)
			// Each broker runs the groups placed on it, and no other.
			for n, id := range ids {
				var view struct{ Groups []struct{ Group uint32 } }
				if err := c.getJSON(n, "/v1/groups", &view); err != nil {
					t.Fatal(err)
				}
				var runs, want []uint32
				for _, v := range view.Groups {
					runs = append(runs, v.Group)
				}
				for _, g := range gs {
					if slices.Contains(g.Replicas, id) {
						want = append(want, g.ID)
					}
				}
				if !slices.Equal(runs, want) {
					t.Fatalf("broker %d runs groups %v, placed in %v", id, runs, want)
				}
			}

			const queue, perProducer = "forwarded", 200
			g, master, mnode, _ := c.declare(queue, tc.groups)
			t.Logf("queue %q in group %d, replicas %v, master %d", queue, g, gs[g].Replicas, master)
			c.declareEverywhere(queue)
			var wg sync.WaitGroup
			errs := make(chan error, tc.brokers*perProducer)
			for i, n := range c.nodes {
				conn := dial(t, ctx, n.client)
				// A broker forwards once it has read the group's master
				// from the controller; until then it answers
				// resource-limit, and a client retries.
				testutil.WaitFor(t, 30*time.Second, func() error {
					pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
					defer cancel()
					return conn.Publish(pctx, "", queue, []byte(fmt.Sprintf("warm%d", i)), client.PublishOptions{Persistent: true})
				})
				wg.Add(perProducer)
				for k := range perProducer {
					msg := fmt.Sprintf("p%d-%04d", i, k)
					err := conn.PublishAsync(ctx, "", queue, []byte(msg), client.PublishOptions{Persistent: true}, func(err error) {
						if err != nil {
							errs <- fmt.Errorf("%s through %s: %w", msg, n.name, err)
						}
						wg.Done()
					})
					if err != nil {
						t.Fatalf("%s through %s: %v", msg, n.name, err)
					}
				}
			}
			wg.Wait()
			close(errs)
			for err := range errs {
				t.Fatal(err)
			}
			// Consume through a broker that does not master the group,
			// outside its replica set when there is one: the broker
			// proxies the consumer to the master.
			var via *node
			for _, n := range c.nodes {
				if n == mnode {
					continue
				}
				if via == nil || !slices.Contains(gs[g].Replicas, ids[n]) {
					via = n
				}
			}
			t.Logf("consuming through broker %d", ids[via])
			got := consumeUntil(t, ctx, via, queue, tc.brokers*(perProducer+1), "")
			// Every accept reached the master: the queue is empty there.
			testutil.WaitFor(t, 10*time.Second, func() error {
				ready, unacked, err := c.depth(mnode, queue)
				if err != nil || ready != 0 || unacked != 0 {
					return fmt.Errorf("master holds %d ready, %d unacked (%v)", ready, unacked, err)
				}
				return nil
			})
			next := make([]int, tc.brokers)
			for _, m := range got {
				if strings.HasPrefix(m, "warm") {
					continue
				}
				p, k := parseMsg(t, m)
				if k != next[p] {
					t.Fatalf("producer %d: got message %d, want %d (exactly once, in order)", p, k, next[p])
				}
				next[p]++
			}
		})
	}
}

func parseMsg(t *testing.T, m string) (producer, seq int) {
	t.Helper()
	a, b, ok := strings.Cut(strings.TrimPrefix(m, "p"), "-")
	p, err1 := strconv.Atoi(a)
	k, err2 := strconv.Atoi(b)
	if !ok || err1 != nil || err2 != nil {
		t.Fatalf("unexpected message %q", m)
	}
	return p, k
}

// consumeUntil subscribes at n and takes messages, accepting each, until
// it has want of them or sees the message stop; it fails on a wait of 10 s.
func consumeUntil(t *testing.T, ctx context.Context, n *node, queue string, want int, stop string) []string {
	t.Helper()
	conn := dial(t, ctx, n.client)
	var con *client.Consumer
	testutil.WaitFor(t, 30*time.Second, func() error {
		sctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		var err error
		con, err = conn.Subscribe(sctx, queue, client.SubscribeOptions{Credit: 500, AutoCredit: true})
		return err
	})
	var got []string
	for len(got) < want {
		nctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		d, err := con.Next(nctx)
		cancel()
		if err != nil {
			t.Fatalf("after %d deliveries from %s: %v", len(got), n.name, err)
		}
		if err := d.Accept(ctx); err != nil {
			t.Fatal(err)
		}
		if string(d.Payload) == stop {
			break
		}
		got = append(got, string(d.Payload))
	}
	return got
}

// TestForwardMasterKilled: publishes pipelined through a follower, which
// forwards them, while the group's master is killed (kill -9). Every
// publish completes or fails; every one that completed is delivered by
// the new master exactly once; one that failed with outcome-unknown (in
// flight at the kill) is delivered at most once, one refused as not taken
// (unavailable, resource-limit) never; order per producer holds; and the
// follower forwards to the new master once it serves.
func TestForwardMasterKilled(t *testing.T) {
	const groups, total, killAt = 3, 3000, 300
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	c := startReplicated(t, ctx, groups)
	const queue = "forward-kill"
	g, master, mnode, _ := c.declare(queue, groups)
	c.declareEverywhere(queue)
	fnode := c.follower(mnode)
	conn := dial(t, ctx, fnode.client)
	// The follower forwards once it has read the group's master from the
	// controller; until then it answers resource-limit, and a client
	// retries.
	const warm = "warm"
	testutil.WaitFor(t, 30*time.Second, func() error {
		pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		return conn.Publish(pctx, "", queue, []byte(warm), client.PublishOptions{Persistent: true})
	})
	var mu sync.Mutex
	outcome := make([]error, total)
	completed := 0
	killed := make(chan struct{})
	var wg sync.WaitGroup
	for k := range total {
		wg.Add(1)
		msg := fmt.Sprintf("p0-%04d", k)
		err := conn.PublishAsync(ctx, "", queue, []byte(msg), client.PublishOptions{Persistent: true}, func(err error) {
			mu.Lock()
			outcome[k] = err
			if err == nil {
				completed++
				if completed == killAt {
					close(killed)
				}
			}
			mu.Unlock()
			wg.Done()
		})
		if err != nil {
			wg.Done()
			mu.Lock()
			outcome[k] = err
			mu.Unlock()
		}
		if k == killAt*2 {
			select {
			case <-killed:
			case <-time.After(60 * time.Second):
				mu.Lock()
				n := completed
				var first error
				for _, err := range outcome {
					if err != nil {
						first = err
						break
					}
				}
				mu.Unlock()
				t.Fatalf("only %d of %d publishes completed in 60 s; first error: %v", n, k, first)
			}
			mnode.signal(syscall.SIGKILL)
		}
	}
	waited := make(chan struct{})
	go func() { wg.Wait(); close(waited) }()
	select {
	case <-waited:
	case <-time.After(60 * time.Second):
		mu.Lock()
		outstanding := 0
		for _, err := range outcome {
			if err == nil {
				outstanding++
			}
		}
		mu.Unlock()
		t.Fatalf("publishes without an outcome 60 s after the kill (completed or waiting: %d)", outstanding)
	}
	ok, failed, unknown := 0, 0, 0
	for k, err := range outcome {
		if err == nil {
			ok++
			continue
		}
		failed++
		switch code := client.Code(err); code {
		case wire.CodeOutcomeUnknown:
			// In flight when the master died.
			unknown++
			if !errors.Is(err, client.ErrOutcomeUnknown) {
				t.Errorf("publish %d failed with %v, which does not match ErrOutcomeUnknown", k, err)
			}
		case wire.CodeUnavailable, wire.CodeResourceLimit:
			// Not taken: checked below never to be delivered.
			if errors.Is(err, client.ErrOutcomeUnknown) {
				t.Errorf("publish %d failed with %v, which matches ErrOutcomeUnknown", k, err)
			}
		default:
			t.Errorf("publish %d failed with %v; want outcome-unknown, or unavailable or resource-limit (not taken)", k, err)
		}
	}
	t.Logf("kill -9 of the master with forwards in flight: %d completed, %d failed (%d of unknown outcome)", ok, failed, unknown)
	if ok < killAt {
		t.Fatalf("only %d publishes completed", ok)
	}
	newMaster := c.waitNewMaster(g, master)
	const stop = "stop"
	testutil.WaitFor(t, 30*time.Second, func() error {
		pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		return conn.Publish(pctx, "", queue, []byte(stop), client.PublishOptions{Persistent: true})
	})
	got := consumeUntil(t, ctx, c.nodeOf(newMaster), queue, total+2, stop)
	if len(got) == 0 || got[0] != warm {
		t.Fatalf("the first message delivered is not the one published first: %v", got[:min(1, len(got))])
	}
	got = got[1:]
	seen := make([]int, total)
	last := -1
	for _, m := range got {
		_, k := parseMsg(t, m)
		if k <= last {
			t.Fatalf("message %d after %d: order per producer broken", k, last)
		}
		last = k
		seen[k]++
	}
	lost, dup, refusedDelivered := 0, 0, 0
	for k := range total {
		if outcome[k] == nil && seen[k] != 1 {
			lost++
		}
		if seen[k] > 1 {
			dup++
		}
		if outcome[k] != nil && !errors.Is(outcome[k], client.ErrOutcomeUnknown) && seen[k] > 0 {
			refusedDelivered++
			if refusedDelivered <= 3 {
				t.Errorf("publish %d, refused as not taken (%v), was delivered", k, outcome[k])
			}
		}
	}
	if lost > 0 || dup > 0 || refusedDelivered > 0 {
		t.Fatalf("%d completed publishes not delivered exactly once, %d delivered twice, %d refused as not taken delivered", lost, dup, refusedDelivered)
	}
}

// TestProxiedConsumerMasterKilled: a consumer proxied through a follower
// accepts 100 of 300 messages and holds 50 more unaccepted; kill -9 of the
// master ends the consumer (CANCELLED), not its connection; subscribed
// again through the same broker, it
// gets the 200 not accepted, in order, none of the accepted ones again. A
// second consumer through that broker whose client closes hands back what
// it held.
func TestProxiedConsumerMasterKilled(t *testing.T) {
	const groups, total, accepted, held = 3, 300, 100, 50
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	c := startProxying(t, ctx, groups)
	const queue = "proxied"
	g, master, mnode, mconn := c.declare(queue, groups)
	c.declareEverywhere(queue)
	c.publishAll(mconn, queue, names(0, total))
	fnode := c.follower(mnode)
	// A consumer that takes 10 and closes without accepting them.
	closer := dial(t, ctx, fnode.client)
	con, err := subscribeWhenServing(t, ctx, closer, queue, client.SubscribeOptions{Credit: 10})
	if err != nil {
		t.Fatal(err)
	}
	for range 10 {
		if _, err := con.Next(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if err := closer.Close(); err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, 10*time.Second, func() error {
		if ready, unacked, err := c.depth(mnode, queue); err != nil || ready != total || unacked != 0 {
			return fmt.Errorf("master holds %d ready, %d unacked (%v) after the proxied client closed", ready, unacked, err)
		}
		return nil
	})

	conn := dial(t, ctx, fnode.client)
	con, err = conn.Subscribe(ctx, queue, client.SubscribeOptions{Credit: accepted + held})
	if err != nil {
		t.Fatal(err)
	}
	for i, want := range names(0, accepted+held) {
		d, err := con.Next(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if string(d.Payload) != want {
			t.Fatalf("delivery %d: %q, want %q", i, d.Payload, want)
		}
		if i < accepted {
			if err := d.Accept(ctx); err != nil {
				t.Fatalf("accept %d: %v", i, err)
			}
		}
	}
	mnode.signal(syscall.SIGKILL)
	nctx, ncancel := context.WithTimeout(ctx, 20*time.Second)
	_, err = con.Next(nctx)
	ncancel()
	if err == nil {
		t.Fatal("the proxied consumer got a delivery after its master was killed")
	}
	if !errors.Is(err, client.ErrConsumerEnded) || conn.Err() != nil {
		t.Fatalf("the proxied consumer after kill -9 of its master: %v, connection %v; want it ended, the connection open", err, conn.Err())
	}
	t.Logf("proxied consumer after kill -9 of its master: %v", err)
	c.waitNewMaster(g, master)
	consumeRedialing(t, ctx, fnode, queue, names(accepted, total), true)
}

// TestProxiedConsumerMasterFrozen: the master of a queue consumed through
// a follower is frozen (SIGSTOP) past the controller's broker timeout; the
// follower sees the new master and ends the proxied consumer with a
// CANCELLED (the frozen master would deliver no more), keeping its
// connection; thawed, the old
// master steps down, and the consumer subscribed again through the same
// broker gets every message it had not accepted, in order.
func TestProxiedConsumerMasterFrozen(t *testing.T) {
	testutil.Long(t, "a proxied consumer across a frozen master")
	const groups, total, accepted = 3, 100, 10
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	c := startProxying(t, ctx, groups)
	const queue = "proxied-frozen"
	g, master, mnode, mconn := c.declare(queue, groups)
	c.declareEverywhere(queue)
	c.publishAll(mconn, queue, names(0, total))
	fnode := c.follower(mnode)
	conn := dial(t, ctx, fnode.client)
	con, err := subscribeWhenServing(t, ctx, conn, queue, client.SubscribeOptions{Credit: 2 * accepted})
	if err != nil {
		t.Fatal(err)
	}
	for i := range 2 * accepted {
		d, err := con.Next(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if i < accepted {
			if err := d.Accept(ctx); err != nil {
				t.Fatal(err)
			}
		}
	}
	mnode.signal(syscall.SIGSTOP)
	thawed := false
	defer func() {
		if !thawed {
			mnode.signal(syscall.SIGCONT)
		}
	}()
	c.waitNewMaster(g, master)
	nctx, ncancel := context.WithTimeout(ctx, 20*time.Second)
	_, err = con.Next(nctx)
	timedOut := nctx.Err() != nil
	ncancel()
	if err == nil || timedOut || !errors.Is(err, client.ErrConsumerEnded) || conn.Err() != nil {
		t.Fatalf("the proxied consumer of a frozen master: %v, connection %v; want the consumer ended, the connection open", err, conn.Err())
	}
	t.Logf("proxied consumer after its master froze: %v", err)
	mnode.signal(syscall.SIGCONT)
	thawed = true
	consumeRedialing(t, ctx, fnode, queue, names(accepted, total), true)
}

// subscribeWhenServing subscribes on conn, a broker that proxies to the
// queue's master, trying again while that broker answers unavailable: it
// learns the group's master from the controller a moment after the
// master serves.
func subscribeWhenServing(t *testing.T, ctx context.Context, conn *client.Conn, queue string, opts client.SubscribeOptions) (*client.Consumer, error) {
	t.Helper()
	var con *client.Consumer
	var err error
	testutil.WaitFor(t, 20*time.Second, func() error {
		con, err = conn.Subscribe(ctx, queue, opts)
		if client.Code(err) == wire.CodeUnavailable {
			return err
		}
		return nil
	})
	return con, err
}

// consumeRedialing subscribes at n, on a new connection each try, until
// it takes want from queue in order. A broker that has just become master
// may still proxy a subscribe to the master it knew, and a broker
// proxying to a master that is lost ends the consumer: the client
// subscribes again. With accept, each message is accepted as it comes and
// a later try goes on after those; without, nothing is accepted, a failed
// try leaves every message in the queue, and the next starts afresh.
func consumeRedialing(t testing.TB, ctx context.Context, n *node, queue string, want []string, accept bool) {
	t.Helper()
	var got []string
	testutil.WaitFor(t, 30*time.Second, func() error {
		if !accept {
			got = got[:0]
		}
		conn, err := client.Dial(ctx, n.client)
		if err != nil {
			return err
		}
		defer conn.Close()
		sctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		con, err := conn.Subscribe(sctx, queue, client.SubscribeOptions{Credit: 1000})
		cancel()
		if err != nil {
			return err
		}
		for len(got) < len(want) {
			nctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			d, err := con.Next(nctx)
			cancel()
			if err != nil {
				return fmt.Errorf("after %d deliveries from %s: %w", len(got), n.name, err)
			}
			if accept {
				if err := d.Accept(ctx); err != nil {
					return fmt.Errorf("accept after %d deliveries: %w", len(got), err)
				}
			}
			got = append(got, string(d.Payload))
		}
		return nil
	})
	if !slices.Equal(got, want) {
		t.Fatalf("%s delivered %d messages %v...; want %d: %v...", n.name, len(got), got[:min(5, len(got))], len(want), want[:min(5, len(want))])
	}
}
