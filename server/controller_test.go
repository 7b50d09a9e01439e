package server_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/berthmq/berth/client"
	"github.com/berthmq/berth/controlplane/ctlapi"
	"github.com/berthmq/berth/controlplane/ctlclient"
	"github.com/berthmq/berth/server"
)

// TestWiringGoesThroughController runs the broker with its in-process
// controller: durable wiring is committed there (read back through the
// controller's own client), and a restart restores it from there.
func TestWiringGoesThroughController(t *testing.T) {
	dir := t.TempDir()
	withCtl := func(c *server.Config) { c.DataDir = dir; c.ControllerAddr = "127.0.0.1:0" }
	s := startServer(t, withCtl)
	if s.ControllerAddr() == "" {
		t.Fatal("no controller started")
	}
	ctx := ctxT(t)
	c := dial(t, s)
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(c.DeclareExchange(ctx, "cx", client.Topic, client.ExchangeOptions{Durable: true}))
	opts := client.QueueOptions{Durable: true, MaxLength: 1000, MaxLengthBytes: 1 << 20, DeadLetterExchange: "cx", DeadLetterKey: "dead", MaxDeliveries: 5, MessageTTL: time.Minute}
	must(c.DeclareQueue(ctx, "cq", opts))
	must(c.DeclareQueue(ctx, "transient", client.QueueOptions{}))
	must(c.Bind(ctx, "cx", "cq", "a.#"))

	// The controller holds the durable wiring, and only that.
	cc := ctlclient.NewClient([]string{s.ControllerAddr()})
	w, err := cc.GetWiring(ctx, ctlapi.ReadConsistent)
	if err != nil {
		t.Fatal(err)
	}
	if got := fmt.Sprint(len(w.Exchanges), len(w.Queues), len(w.Bindings)); got != "1 1 1" {
		t.Fatalf("controller wiring %+v", w)
	}
	if w.Queues[0].Name != "cq" || w.Queues[0].Options.MaxLengthBytes != 1<<20 || w.Queues[0].Options.DeadLetterKey != "dead" {
		t.Fatalf("controller queue %+v", w.Queues[0])
	}
	must(c.Publish(ctx, "cx", "a.b", []byte("kept"), client.PublishOptions{Persistent: true}))
	_ = c.Close()
	must(s.Close())

	s2 := startServer(t, withCtl)
	c2 := dial(t, s2)
	// Same options: the redeclare matches what the controller restored.
	must(c2.DeclareQueue(ctx, "cq", opts))
	if err := c2.DeclareQueue(ctx, "transient", client.QueueOptions{Passive: true}); client.Code(err) == 0 {
		t.Fatal("a transient queue came back")
	}
	must(c2.Publish(ctx, "cx", "a.c", []byte("routed"), client.PublishOptions{Persistent: true}))
	con, err := c2.Subscribe(ctx, "cq", client.SubscribeOptions{Credit: 10, AckMode: client.AckNone})
	must(err)
	for _, want := range []string{"kept", "routed"} {
		if d := next(t, con, 5*time.Second); string(d.Payload) != want {
			t.Fatalf("got %q want %q", d.Payload, want)
		}
	}
	// Deleting goes through the controller too.
	must(c2.DeleteQueue(ctx, "cq", client.QueueDeleteOptions{}))
	cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	w, err = ctlclient.NewClient([]string{s2.ControllerAddr()}).GetWiring(cctx, ctlapi.ReadConsistent)
	if err != nil {
		t.Fatal(err)
	}
	if len(w.Queues) != 0 || len(w.Bindings) != 0 {
		t.Fatalf("after delete the controller still has %+v", w)
	}
}
