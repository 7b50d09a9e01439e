package server_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/berthmq/berth/client"
	"github.com/berthmq/berth/server"
)

func TestDurableQueueSurvivesRestart(t *testing.T) {
	dir := t.TempDir()
	withDir := func(c *server.Config) { c.DataDir = dir }
	s := startServer(t, withDir)
	ctx := ctxT(t)
	c := dial(t, s)
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(c.DeclareExchange(ctx, "dx", client.Direct, client.ExchangeOptions{Durable: true}))
	must(c.DeclareQueue(ctx, "dq", client.QueueOptions{Durable: true, MaxDeliveries: 10}))
	must(c.DeclareQueue(ctx, "tq", client.QueueOptions{}))
	must(c.Bind(ctx, "dx", "dq", "k"))
	for i := 0; i < 100; i++ {
		must(c.Publish(ctx, "dx", "k", []byte(fmt.Sprint(i)), client.PublishOptions{Persistent: true}))
	}
	must(c.Publish(ctx, "", "dq", []byte("transient"), client.PublishOptions{}))
	must(c.Publish(ctx, "", "tq", []byte("gone"), client.PublishOptions{Persistent: true}))
	con, err := c.Subscribe(ctx, "dq", client.SubscribeOptions{Credit: 20})
	must(err)
	var accept []uint64
	for i := 0; i < 20; i++ {
		d := next(t, con, 5*time.Second)
		switch {
		case i < 10:
			accept = append(accept, d.Tag) // 0..9 accepted
		case i < 15:
			must(d.Release(ctx)) // 10..14 released: delivery count 1
		}
		// 15..19 stay acquired until the session closes: requeued, count 1
	}
	must(con.Accept(ctx, accept...))
	_ = c.Close()
	checkFor(t, 5*time.Second, func() error {
		for _, q := range s.Broker().Queues() {
			if q.Name == "dq" && q.Unacked != 0 {
				return fmt.Errorf("%d still acquired after the session closed", q.Unacked)
			}
		}
		return nil
	})
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}

	s2 := startServer(t, withDir)
	c2 := dial(t, s2)
	// Wiring survived: the binding routes.
	must(c2.Publish(ctx, "dx", "k", []byte("after"), client.PublishOptions{Persistent: true}))
	if err := c2.DeclareQueue(ctx, "tq", client.QueueOptions{Passive: true}); client.Code(err) == 0 {
		t.Fatal("a non-durable queue survived a restart")
	}
	con2, err := c2.Subscribe(ctx, "dq", client.SubscribeOptions{Credit: 200, AckMode: client.AckNone})
	must(err)
	var got []string
	for i := 0; i < 91; i++ {
		d := next(t, con2, 5*time.Second)
		got = append(got, string(d.Payload))
		n := 0
		fmt.Sscan(string(d.Payload), &n)
		wantCount := uint32(0)
		if d.Payload[0] != 'a' && n >= 10 && n < 20 { // released, or requeued when the session closed
			wantCount = 1
		}
		if d.DeliveryCount != wantCount {
			t.Fatalf("message %s: delivery count %d, want %d", d.Payload, d.DeliveryCount, wantCount)
		}
	}
	for i := 10; i < 100; i++ {
		if got[i-10] != fmt.Sprint(i) {
			t.Fatalf("after restart position %d = %q, want %d (order or loss)", i-10, got[i-10], i)
		}
	}
	if got[90] != "after" {
		t.Fatalf("last = %q", got[90])
	}
	expectNone(t, con2, 100*time.Millisecond) // the transient message is gone
}
