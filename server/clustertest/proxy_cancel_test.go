package clustertest

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/berthmq/berth/client"
	"github.com/berthmq/berth/internal/testutil"
	"github.com/berthmq/berth/replication"
	"github.com/berthmq/berth/wire"
)

// TestProxiedConsumerCancelledOnMasterKill: two clients on a broker that
// is not the master of a group consume two queues of that group through
// it (proxied), each having accepted some messages and holding more
// unaccepted; the plain client also publishes to a queue of another group
// all along. kill -9 of the group's master ends the proxied consumers
// with a CANCELLED (protocol 1.3), not their connections:
//   - the plain client's connection stays open and its publishes go on
//     completing; its consumer ends with ErrConsumerEnded (unavailable),
//     a settle of what it held fails, and subscribed again on the same
//     connection it gets every message it had not accepted, in order;
//   - the reconnecting client never disconnects, and its consumer, the
//     same handle, subscribes again by itself and gets every message it
//     had not accepted.
//
// No accepted message comes back to either.
func TestProxiedConsumerCancelledOnMasterKill(t *testing.T) {
	const groups, total, accepted, held = 3, 120, 40, 10
	ctx, cancel := context.WithTimeout(context.Background(), 150*time.Second)
	defer cancel()
	c := startProxying(t, ctx, groups)
	const plainQ = "cancel-plain"
	g, master, mnode, mconn := c.declare(plainQ, groups)
	reconQ := ""
	for i := 0; reconQ == ""; i++ {
		if q := fmt.Sprintf("cancel-reconnect-%d", i); replication.GroupOf(q, groups) == g {
			reconQ = q
		}
	}
	if err := mconn.DeclareQueue(ctx, reconQ, client.QueueOptions{Durable: true}); err != nil {
		t.Fatal(err)
	}
	c.declareEverywhere(plainQ)
	c.declareEverywhere(reconQ)
	c.publishAll(mconn, plainQ, names(0, total))
	c.publishAll(mconn, reconQ, names(0, total))
	mconn.Close()
	fnode := c.follower(mnode)

	// The publish queue's group is mastered by a broker that lives on.
	pubQ := ""
	for i := 0; pubQ == ""; i++ {
		q := fmt.Sprintf("cancel-pub-%d", i)
		if h := replication.GroupOf(q, groups); h != g && c.group(h).Master != master && c.group(h).Master != 0 {
			pubQ = q
		}
		if i > 1000 {
			t.Fatal("no group mastered by a broker other than the victim")
		}
	}
	c.waitServing(replication.GroupOf(pubQ, groups))
	c.declareEverywhere(pubQ)

	conn := dial(t, ctx, fnode.client)
	var evMu sync.Mutex
	var evs []client.Event
	policy := &client.ReconnectPolicy{DelayMin: 10 * time.Millisecond, DelayMax: 200 * time.Millisecond, MaxTime: 60 * time.Second,
		OnEvent: func(e client.Event) { evMu.Lock(); evs = append(evs, e); evMu.Unlock() }}
	rconn, err := client.DialConfig(ctx, client.Config{Reconnect: policy}, fnode.client)
	if err != nil {
		t.Fatal(err)
	}
	defer rconn.Close()

	// The plain consumer: accepted, then held.
	pcon, err := subscribeWhenServing(t, ctx, conn, plainQ, client.SubscribeOptions{Credit: accepted + held})
	if err != nil {
		t.Fatal(err)
	}
	var heldDs []*client.Delivery
	for i, want := range names(0, accepted+held) {
		d, err := pcon.Next(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if string(d.Payload) != want {
			t.Fatalf("plain delivery %d: %q, want %q", i, d.Payload, want)
		}
		if i < accepted {
			if err := d.Accept(ctx); err != nil {
				t.Fatal(err)
			}
		} else {
			heldDs = append(heldDs, d)
		}
	}
	// The reconnecting consumer, AutoCredit: what it holds is owed again
	// when it subscribes again.
	rcon, err := rconn.Subscribe(ctx, reconQ, client.SubscribeOptions{Credit: 2 * held, AutoCredit: true})
	if err != nil {
		t.Fatal(err)
	}
	raccepted := map[string]bool{}
	for i := range accepted + held {
		d, err := rcon.Next(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if i < accepted {
			if err := d.Accept(ctx); err != nil {
				t.Fatal(err)
			}
			raccepted[string(d.Payload)] = true
		}
	}

	// Publishes on the plain connection, all along.
	stopPub := make(chan struct{})
	pubDone := make(chan struct{})
	var pubMu sync.Mutex
	published, afterKill := 0, 0
	var pubErr error
	killed := make(chan struct{})
	go func() {
		defer close(pubDone)
		for k := 0; ; k++ {
			select {
			case <-stopPub:
				return
			default:
			}
			pctx, pcancel := context.WithTimeout(ctx, 30*time.Second)
			err := conn.Publish(pctx, "", pubQ, []byte(fmt.Sprintf("p%d", k)), client.PublishOptions{Persistent: true})
			pcancel()
			pubMu.Lock()
			if err != nil && client.Code(err) != wire.CodeUnavailable {
				pubErr = fmt.Errorf("publish %d: %w", k, err)
				pubMu.Unlock()
				return
			}
			if err == nil {
				published++
				select {
				case <-killed:
					afterKill++
				default:
				}
			} else {
				k-- // refused unavailable (too few in sync): not proposed, sent again
				time.Sleep(20 * time.Millisecond)
			}
			pubMu.Unlock()
		}
	}()

	testutil.WaitFor(t, 30*time.Second, func() error {
		pubMu.Lock()
		defer pubMu.Unlock()
		if pubErr != nil || published >= 5 {
			return nil
		}
		return fmt.Errorf("%d publishes completed before the kill", published)
	})
	mnode.signal(syscall.SIGKILL)
	close(killed)

	// The plain consumer ends, its connection does not.
	nctx, ncancel := context.WithTimeout(ctx, 30*time.Second)
	_, err = pcon.Next(nctx)
	timedOut := nctx.Err() != nil
	ncancel()
	if err == nil || timedOut || !errors.Is(err, client.ErrConsumerEnded) || client.Code(err) != wire.CodeUnavailable {
		t.Fatalf("the plain proxied consumer after kill -9 of its master: %v; want ErrConsumerEnded, unavailable", err)
	}
	if !errors.Is(pcon.Err(), client.ErrConsumerEnded) {
		t.Fatalf("Consumer.Err: %v", pcon.Err())
	}
	t.Logf("plain consumer after kill -9 of its master: %v", err)
	if err := heldDs[0].Accept(ctx); err == nil {
		t.Fatal("accept of a delivery of the ended consumer succeeded")
	}
	if err := conn.Err(); err != nil {
		t.Fatalf("the plain connection ended: %v", err)
	}
	newMaster := c.waitNewMaster(g, master)

	// Subscribed again on the same connection: every message not
	// accepted, in order.
	consumeOnConn(t, ctx, conn, plainQ, names(accepted, total))

	// The reconnecting consumer goes on by itself.
	got := map[string]bool{}
	for len(got) < total-accepted {
		nctx, ncancel := context.WithTimeout(ctx, 30*time.Second)
		d, err := rcon.Next(nctx)
		ncancel()
		if err != nil {
			t.Fatalf("reconnecting consumer after the kill, with %d of %d messages taken: %v", len(got), total-accepted, err)
		}
		m := string(d.Payload)
		if raccepted[m] {
			t.Fatalf("%s came back to the reconnecting consumer after its accept completed", m)
		}
		got[m] = true
		if err := d.Accept(ctx); err != nil && !errors.Is(err, client.ErrStaleDelivery) {
			t.Fatalf("accept %s: %v", m, err)
		}
	}
	for _, m := range names(accepted, total) {
		if !got[m] {
			t.Fatalf("%s was never delivered to the reconnecting consumer", m)
		}
	}
	evMu.Lock()
	if len(evs) != 0 {
		t.Errorf("the reconnecting Conn's connection broke: %+v", evs)
	}
	evMu.Unlock()

	// The publishes went on.
	testutil.WaitFor(t, 30*time.Second, func() error {
		pubMu.Lock()
		defer pubMu.Unlock()
		if pubErr != nil || afterKill >= 20 {
			return nil
		}
		return fmt.Errorf("%d publishes completed after the kill", afterKill)
	})
	close(stopPub)
	<-pubDone
	if pubErr != nil {
		t.Fatal(pubErr)
	}
	if err := conn.Err(); err != nil {
		t.Fatalf("the plain connection ended: %v", err)
	}
	t.Logf("group %d: master %d killed, new master %d; the plain connection published %d messages (%d after the kill)", g, master, newMaster, published, afterKill)
}

// consumeOnConn subscribes to queue on conn until it has taken want in
// order, accepting each: a broker that has just learned the new master
// answers unavailable, and one that proxied the subscribe to a master
// that then lost the group ends the consumer (CANCELLED); the next try
// goes on after what was accepted.
func consumeOnConn(t *testing.T, ctx context.Context, conn *client.Conn, queue string, want []string) {
	t.Helper()
	var got []string
	testutil.WaitFor(t, 30*time.Second, func() error {
		sctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		con, err := conn.Subscribe(sctx, queue, client.SubscribeOptions{Credit: 1000})
		cancel()
		if err != nil {
			return err
		}
		defer con.Cancel(ctx)
		for len(got) < len(want) {
			nctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			d, err := con.Next(nctx)
			cancel()
			if err != nil {
				return fmt.Errorf("after %d deliveries: %w", len(got), err)
			}
			if err := d.Accept(ctx); err != nil {
				return fmt.Errorf("accept after %d deliveries: %w", len(got), err)
			}
			got = append(got, string(d.Payload))
		}
		return nil
	})
	if !slices.Equal(got, want) {
		t.Fatalf("delivered %d messages %v...; want %d: %v...", len(got), got[:min(5, len(got))], len(want), want[:min(5, len(want))])
	}
	if err := conn.Err(); err != nil {
		t.Fatalf("the connection ended: %v", err)
	}
}

// TestProxiedConsumerQueueDeleted: a consumer proxied through a follower
// whose queue is deleted at its master ends with a CANCELLED (not-found)
// that the master sends through the proxy; the follower forgets it (a
// settle fails not-found) and the client's connection goes on. A
// consumer at the master of a queue deleted through a follower ends with
// a CANCELLED (not-found) too, and a purge through a follower empties the
// master's queue.
func TestProxiedConsumerQueueDeleted(t *testing.T) {
	const groups = 3
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	c := startReplicated(t, ctx, groups)
	const queue, other = "deleted-proxied", "deleted-proxied-other"
	_, _, mnode, mconn := c.declare(queue, groups)
	if err := mconn.DeclareQueue(ctx, other, client.QueueOptions{}); err != nil {
		t.Fatal(err)
	}
	c.declareEverywhere(queue)
	c.publishAll(mconn, queue, names(0, 3))
	fnode := c.follower(mnode)
	conn := dial(t, ctx, fnode.client)
	con, err := subscribeWhenServing(t, ctx, conn, queue, client.SubscribeOptions{Credit: 1})
	if err != nil {
		t.Fatal(err)
	}
	d, err := con.Next(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := mconn.DeleteQueue(ctx, queue, client.QueueDeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	nctx, ncancel := context.WithTimeout(ctx, 20*time.Second)
	_, err = con.Next(nctx)
	ncancel()
	if !errors.Is(err, client.ErrConsumerEnded) || client.Code(err) != wire.CodeNotFound {
		t.Fatalf("proxied consumer of a queue deleted at its master: %v; want ErrConsumerEnded, not-found", err)
	}
	if err := d.Accept(ctx); err == nil {
		t.Fatal("accept of a delivery of the deleted queue succeeded")
	}
	// The connection goes on: a transient queue on the follower.
	if err := conn.DeclareQueue(ctx, other, client.QueueOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := conn.Publish(ctx, "", other, []byte("after"), client.PublishOptions{}); err != nil {
		t.Fatal(err)
	}
	if conn.Err() != nil {
		t.Fatalf("the connection ended: %v", conn.Err())
	}

	// A consumer at the master of a queue deleted through another broker
	// (which forwards the delete to the master) ends alike.
	const direct = "deleted-via-follower"
	_, _, dnode, dconn := c.declare(direct, groups)
	c.declareEverywhere(direct)
	c.publishAll(dconn, direct, names(0, 2))
	dcon, err := subscribeWhenServing(t, ctx, dconn, direct, client.SubscribeOptions{Credit: 1})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := dcon.Next(ctx); err != nil {
		t.Fatal(err)
	}
	via := dial(t, ctx, c.follower(dnode).client)
	if err := via.DeleteQueue(ctx, direct, client.QueueDeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	nctx, ncancel = context.WithTimeout(ctx, 20*time.Second)
	_, err = dcon.Next(nctx)
	ncancel()
	if !errors.Is(err, client.ErrConsumerEnded) || client.Code(err) != wire.CodeNotFound {
		t.Fatalf("consumer at the master of a queue deleted through a follower: %v; want ErrConsumerEnded, not-found", err)
	}
	if dconn.Err() != nil {
		t.Fatalf("the master's client connection ended: %v", dconn.Err())
	}

	// A purge through a follower empties every copy, the master's too.
	const purged = "purged-via-follower"
	_, _, pnode, pconn := c.declare(purged, groups)
	c.declareEverywhere(purged)
	c.publishAll(pconn, purged, names(0, 3))
	pvia := dial(t, ctx, c.follower(pnode).client)
	if err := pvia.Purge(ctx, purged); err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, 10*time.Second, func() error {
		for _, n := range c.nodes {
			if ready, _, err := c.depth(n, purged); err != nil || ready != 0 {
				return fmt.Errorf("%s holds %d of the purged queue (%v)", n.name, ready, err)
			}
		}
		return nil
	})
	c.publishAll(pconn, purged, []string{"after-purge"})
	pcon, err := subscribeWhenServing(t, ctx, pconn, purged, client.SubscribeOptions{Credit: 1})
	if err != nil {
		t.Fatal(err)
	}
	pd, err := pcon.Next(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if string(pd.Payload) != "after-purge" {
		t.Fatalf("first message at the master after a purge through a follower: %q, want after-purge", pd.Payload)
	}
}

// TestDirectConsumerCancelledOnStepDown: a consumer at its queue's master
// (not proxied) has accepted some messages and holds more; the master is
// frozen (SIGSTOP) until another broker masters the group, then thawed:
// it steps down and ends the consumer with a CANCELLED (unavailable),
// keeping the client's connection; subscribed again there (now proxied
// to the new master), the client gets every message it had not accepted,
// in order.
func TestDirectConsumerCancelledOnStepDown(t *testing.T) {
	const groups, total, accepted, held = 3, 60, 10, 10
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	c := startReplicated(t, ctx, groups)
	const queue = "stepdown-direct"
	g, master, mnode, conn := c.declare(queue, groups)
	c.declareEverywhere(queue)
	c.publishAll(conn, queue, names(0, total))
	con, err := conn.Subscribe(ctx, queue, client.SubscribeOptions{Credit: accepted + held})
	if err != nil {
		t.Fatal(err)
	}
	heldD := takeAccepting(t, ctx, con, accepted+held, accepted)[0]
	c.stepDown(g, master, mnode)
	nctx, ncancel := context.WithTimeout(ctx, 30*time.Second)
	_, err = con.Next(nctx)
	timedOut := nctx.Err() != nil
	ncancel()
	if err == nil || timedOut || !errors.Is(err, client.ErrConsumerEnded) || client.Code(err) != wire.CodeUnavailable {
		t.Fatalf("the consumer at a master that stepped down: %v; want ErrConsumerEnded, unavailable", err)
	}
	t.Logf("consumer at a master that stepped down: %v", err)
	if err := heldD.Accept(ctx); err == nil {
		t.Fatal("accept of a delivery of the ended consumer succeeded")
	}
	if err := conn.Err(); err != nil {
		t.Fatalf("the connection ended: %v", err)
	}
	consumeOnConn(t, ctx, conn, queue, names(accepted, total))
}

// TestDirectConsumerOldClientClosedOnStepDown: a protocol 1.2 client, which
// has no CANCELLED, consuming at a master that is frozen and then thawed
// after a new master took its group, has its connection closed with
// shutdown (it used to receive nothing more, silently); a new connection
// gets every unaccepted message, in order.
func TestDirectConsumerOldClientClosedOnStepDown(t *testing.T) {
	const groups, total, accepted, held = 3, 40, 10, 10
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	c := startReplicated(t, ctx, groups)
	const queue = "stepdown-old-client"
	g, master, mnode, conn := c.declare(queue, groups)
	c.declareEverywhere(queue)
	c.publishAll(conn, queue, names(0, total))
	old, err := client.DialConfig(ctx, client.Config{MaxVersion: wire.VersionProducer}, mnode.client)
	if err != nil {
		t.Fatal(err)
	}
	defer old.Close()
	con, err := old.Subscribe(ctx, queue, client.SubscribeOptions{Credit: accepted + held})
	if err != nil {
		t.Fatal(err)
	}
	takeAccepting(t, ctx, con, accepted+held, accepted)
	c.stepDown(g, master, mnode)
	nctx, ncancel := context.WithTimeout(ctx, 30*time.Second)
	_, err = con.Next(nctx)
	timedOut := nctx.Err() != nil
	ncancel()
	if err == nil || timedOut || !errors.Is(err, client.ErrClosed) || client.Code(old.Err()) != wire.CodeShutdown {
		t.Fatalf("a 1.2 consumer at a master that stepped down: %v (timed out: %v, connection: %v); want its connection closed with shutdown", err, timedOut, old.Err())
	}
	t.Logf("1.2 consumer at a master that stepped down: %v", err)
	consumeOnConn(t, ctx, dial(t, ctx, mnode.client), queue, names(accepted, total))
}

// takeAccepting receives n deliveries on con, accepts the first accepted
// of them, and returns the rest, held.
func takeAccepting(t *testing.T, ctx context.Context, con *client.Consumer, n, accepted int) []*client.Delivery {
	t.Helper()
	var held []*client.Delivery
	for i := range n {
		d, err := con.Next(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if i >= accepted {
			held = append(held, d)
		} else if err := d.Accept(ctx); err != nil {
			t.Fatal(err)
		}
	}
	return held
}

// stepDown freezes mnode, the master of group g, until the controller
// names another master, then thaws it: it finds it has to step down.
func (c *rcluster) stepDown(g, master uint32, mnode *node) {
	mnode.signal(syscall.SIGSTOP)
	defer mnode.signal(syscall.SIGCONT) // also if the wait fails
	c.waitNewMaster(g, master)
}
