package server_test

import (
	"context"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/berthmq/berth/client"
	"github.com/berthmq/berth/journal"
	"github.com/berthmq/berth/server"
	"github.com/berthmq/berth/wire"
)

// queueOnShard finds a queue name that hashes to the given shard.
func queueOnShard(s *server.Server, prefix string, shard int) string {
	for i := 0; ; i++ {
		name := fmt.Sprintf("%s-%d", prefix, i)
		if s.Broker().ShardFor(name) == shard {
			return name
		}
	}
}

// TestDiskErrorFailsOnlyAffectedCommands fails every fsync of shard 0's
// journal. Persistent publishes and accepts on that shard get a store
// ERROR and are never completed; shard 1 and transient traffic carry on.
func TestDiskErrorFailsOnlyAffectedCommands(t *testing.T) {
	ffs := journal.NewFaultFS(nil)
	var failing atomic.Bool
	ffs.SetRule(func(op journal.Op, name string, n int) error {
		if failing.Load() && op == journal.OpSync && strings.Contains(name, "shard-000") {
			return journal.ErrInjected
		}
		return nil
	})
	s := startServer(t, func(c *server.Config) { c.JournalFS = ffs })
	c := dial(t, s)
	ctx := ctxT(t)
	bad := queueOnShard(s, "bad", 0)
	good := queueOnShard(s, "good", 1)
	for _, q := range []string{bad, good} {
		if err := c.DeclareQueue(ctx, q, client.QueueOptions{Durable: true}); err != nil {
			t.Fatal(err)
		}
	}
	// One message lands on the bad shard before the disk fails.
	if err := c.Publish(ctx, "", bad, []byte("early"), client.PublishOptions{Persistent: true}); err != nil {
		t.Fatal(err)
	}
	con, err := c.Subscribe(ctx, bad, client.SubscribeOptions{Credit: 1})
	if err != nil {
		t.Fatal(err)
	}
	early := next(t, con, 5*time.Second)

	failing.Store(true)
	var storeErrs int
	for i := 0; i < 20; i++ {
		err := c.Publish(ctx, "", bad, []byte("x"), client.PublishOptions{Persistent: true})
		if client.Code(err) != wire.CodeStore {
			t.Fatalf("persistent publish on the failed shard: got %v, want a store error", err)
		}
		storeErrs++
	}
	if err := early.Accept(ctx); client.Code(err) != wire.CodeStore {
		t.Fatalf("accept on the failed shard: got %v, want a store error", err)
	}
	// The other shard, and transient messages everywhere, keep working.
	for i := 0; i < 20; i++ {
		if err := c.Publish(ctx, "", good, []byte("y"), client.PublishOptions{Persistent: true}); err != nil {
			t.Fatalf("publish on the healthy shard: %v", err)
		}
	}
	tq := queueOnShard(s, "transient", 0)
	if err := c.DeclareQueue(ctx, tq, client.QueueOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := c.Publish(ctx, "", tq, []byte("z"), client.PublishOptions{Persistent: true}); err != nil {
		t.Fatalf("transient queue on the failed shard: %v", err)
	}
	gcon, err := c.Subscribe(ctx, good, client.SubscribeOptions{Credit: 100, AckMode: client.AckNone})
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 20; i++ {
		next(t, gcon, 5*time.Second)
	}
	if storeErrs != 20 {
		t.Fatalf("store errors %d", storeErrs)
	}
	_ = context.Background
}
