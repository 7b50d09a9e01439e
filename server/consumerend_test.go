package server_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/berthmq/berth/client"
	"github.com/berthmq/berth/wire"
)

// TestQueueDeletedCancelsConsumers: a queue deleted by another client
// ends its consumers with a CANCELLED (not-found) and keeps their
// sessions: a plain Conn's consumer ends with ErrConsumerEnded, a
// delivery it held can no longer be accepted, and its connection still
// publishes and consumes; a reconnecting Conn's consumer tries to
// subscribe again and ends with the not-found that gets; a consumer of
// another queue on the same connection is untouched.
func TestQueueDeletedCancelsConsumers(t *testing.T) {
	s := startServer(t)
	ctx := ctxT(t)
	admin := dial(t, s)
	for _, q := range []string{"doomed", "kept"} {
		if err := admin.DeclareQueue(ctx, q, client.QueueOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	for range 2 {
		if err := admin.Publish(ctx, "", "doomed", []byte("m"), client.PublishOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	plain := dial(t, s)
	doomed, err := plain.Subscribe(ctx, "doomed", client.SubscribeOptions{Credit: 1})
	if err != nil {
		t.Fatal(err)
	}
	kept, err := plain.Subscribe(ctx, "kept", client.SubscribeOptions{Credit: 10})
	if err != nil {
		t.Fatal(err)
	}
	held := next(t, doomed, 5*time.Second)
	recon, err := client.DialConfig(ctx, client.Config{Reconnect: &client.ReconnectPolicy{MaxTime: 5 * time.Second}}, s.ClientAddr())
	if err != nil {
		t.Fatal(err)
	}
	defer recon.Close()
	rdoomed, err := recon.Subscribe(ctx, "doomed", client.SubscribeOptions{Credit: 1})
	if err != nil {
		t.Fatal(err)
	}
	next(t, rdoomed, 5*time.Second)

	if err := admin.DeleteQueue(ctx, "doomed", client.QueueDeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	nctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	_, err = doomed.Next(nctx)
	cancel()
	if !errors.Is(err, client.ErrConsumerEnded) || client.Code(err) != wire.CodeNotFound {
		t.Fatalf("consumer of the deleted queue: %v; want ErrConsumerEnded, not-found", err)
	}
	if err := held.Accept(ctx); err == nil {
		t.Fatal("accept of a delivery of the deleted queue's consumer succeeded")
	}
	// Its queue deleted, the not-found is final: no retrying for
	// ResubscribeNotFound (5 s), which is for brokers that have not
	// learned a queue yet.
	nctx, cancel = context.WithTimeout(ctx, 3*time.Second)
	_, err = rdoomed.Next(nctx)
	cancel()
	if err == nil || client.Code(err) != wire.CodeNotFound || errors.Is(err, client.ErrConsumerEnded) {
		t.Fatalf("reconnecting consumer of the deleted queue: %v; want the not-found of its new SUBSCRIBE within 3 s", err)
	}
	// The sessions go on.
	if err := plain.Publish(ctx, "", "kept", []byte("after"), client.PublishOptions{}); err != nil {
		t.Fatal(err)
	}
	if d := next(t, kept, 5*time.Second); string(d.Payload) != "after" {
		t.Fatalf("kept got %q", d.Payload)
	}
	if plain.Err() != nil || recon.Err() != nil {
		t.Fatalf("connections ended: %v, %v", plain.Err(), recon.Err())
	}
}
