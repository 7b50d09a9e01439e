package clustertest

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/berthmq/berth/client"
	"github.com/berthmq/berth/internal/testutil"
	"github.com/berthmq/berth/replication"
)

// TestReplicatedExpiryDeadLettersOnce: messages whose TTL runs out in a
// replicated queue with a dead-letter exchange reach the dead-letter
// queue once each, as rejected ones do. Every member holds a copy of the
// expiring messages; only the group's master dead-letters them (and
// proposes their removal), the followers drop theirs when that removal
// commits.
func TestReplicatedExpiryDeadLettersOnce(t *testing.T) {
	const groups, total = 3, 20
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	c := startReplicated(t, ctx, groups)
	const source, dlx, target = "ttl-source", "ttl-dlx", "ttl-dead"
	g := replication.GroupOf(source, groups)
	_, mnode := c.waitServing(g)
	c.waitServing(replication.GroupOf(target, groups))
	conn := dial(t, ctx, mnode.client)
	if err := conn.DeclareExchange(ctx, dlx, client.Fanout, client.ExchangeOptions{Durable: true}); err != nil {
		t.Fatal(err)
	}
	if err := conn.DeclareQueue(ctx, target, client.QueueOptions{Durable: true}); err != nil {
		t.Fatal(err)
	}
	if err := conn.Bind(ctx, dlx, target, ""); err != nil {
		t.Fatal(err)
	}
	if err := conn.DeclareQueue(ctx, source, client.QueueOptions{Durable: true, DeadLetterExchange: dlx, MessageTTL: 100 * time.Millisecond}); err != nil {
		t.Fatal(err)
	}
	// The target on every member first: the brokers adopt it from the
	// controller when its first event reaches them, and the followers'
	// expiry must find the exchange's binding to show the defect.
	if err := conn.Publish(ctx, "", target, []byte("first"), client.PublishOptions{Persistent: true}); err != nil {
		t.Fatal(err)
	}
	c.waitReady(target, 1)
	c.publishAll(conn, source, names(0, total))
	// Every message expired everywhere...
	testutil.WaitFor(t, 20*time.Second, func() error {
		for _, n := range c.nodes {
			ready, unacked, err := c.depth(n, source)
			if err != nil {
				return err
			}
			if ready != 0 || unacked != 0 {
				return fmt.Errorf("%s holds %d ready, %d unacked of the expiring queue", n.name, ready, unacked)
			}
		}
		return nil
	})
	// ...and was dead-lettered once: every member holds each dead letter
	// once, and goes on doing so past several expiry ticks (100 ms).
	for range 5 {
		c.waitReady(target, 1+total)
		time.Sleep(100 * time.Millisecond)
	}
	c.consumeAll(mnode, target, append([]string{"first"}, names(0, total)...))
}
