package server_test

import (
	"context"
	"encoding/binary"
	"fmt"
	"testing"
	"time"

	"github.com/berthmq/berth/client"
	"github.com/berthmq/berth/server"
)

// TestFanoutOrderWithFullRings: one producer publishes numbered messages
// through a fanout exchange bound to queues on every shard, with shard
// rings so small that they are full most of the time. Every queue must
// hold every message, in publish order. A fan-out that reached some of its
// targets used to finish on a goroutine, which a later message's push
// could overtake.
func TestFanoutOrderWithFullRings(t *testing.T) {
	s := startServer(t, func(c *server.Config) { c.Shards, c.RingSize = 4, 4 })
	c := dial(t, s)
	// 160,000 deliveries: under the race detector on a loaded machine
	// they outlast ctxT's 20 s. Under -short (make test's race pass, at
	// the lowest priority) a quarter of them, which took 57 s in full.
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	const nq = 8
	n := 20000
	if testing.Short() {
		n = 5000
	}
	if err := c.DeclareExchange(ctx, "fan", client.Fanout, client.ExchangeOptions{}); err != nil {
		t.Fatal(err)
	}
	shardsUsed := map[int]bool{}
	for i := 0; i < nq; i++ {
		q := fmt.Sprint("fq", i)
		if err := c.DeclareQueue(ctx, q, client.QueueOptions{}); err != nil {
			t.Fatal(err)
		}
		if err := c.Bind(ctx, "fan", q, ""); err != nil {
			t.Fatal(err)
		}
	}
	for _, q := range s.Broker().Queues() {
		shardsUsed[q.Shard] = true
	}
	if len(shardsUsed) < 2 {
		t.Fatalf("the queues landed on %d shard(s): the test needs several", len(shardsUsed))
	}
	var buf [8]byte
	for i := 0; i < n; i++ {
		binary.BigEndian.PutUint64(buf[:], uint64(i))
		if err := c.PublishAsync(ctx, "fan", "", buf[:], client.PublishOptions{}, nil); err != nil {
			t.Fatal(err)
		}
	}
	if err := c.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < nq; i++ {
		q := fmt.Sprint("fq", i)
		con, err := c.Subscribe(ctx, q, client.SubscribeOptions{Credit: 1000, AutoCredit: true, AckMode: client.AckNone})
		if err != nil {
			t.Fatal(err)
		}
		for want := uint64(0); want < uint64(n); want++ {
			d := next(t, con, 10*time.Second)
			if got := binary.BigEndian.Uint64(d.Payload); got != want {
				t.Fatalf("queue %s: message %d where %d was due", q, got, want)
			}
		}
		if err := con.Cancel(ctx); err != nil {
			t.Fatal(err)
		}
	}
}
