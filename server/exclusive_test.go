package server_test

import (
	"errors"
	"testing"

	"github.com/berthmq/berth/client"
	"github.com/berthmq/berth/wire"
)

// Another session gets not-allowed for every queue command on an
// exclusive queue (as RabbitMQ answers resource-locked), and may still
// publish to it; the owner may do everything.
func TestExclusiveQueueRefusesOtherSessions(t *testing.T) {
	s := startServer(t)
	owner, other := dial(t, s), dial(t, s)
	ctx := ctxT(t)
	if err := owner.DeclareQueue(ctx, "ex", client.QueueOptions{Exclusive: true}); err != nil {
		t.Fatal(err)
	}
	if err := owner.DeclareExchange(ctx, "x", client.Direct, client.ExchangeOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := owner.Bind(ctx, "x", "ex", "owned"); err != nil {
		t.Fatal(err)
	}
	notAllowed := func(what string, err error) {
		t.Helper()
		var e *client.Error
		if !errors.As(err, &e) || e.Code != wire.CodeNotAllowed {
			t.Errorf("%s by another session: %v, want not-allowed", what, err)
		}
	}
	notAllowed("PURGE", other.Purge(ctx, "ex"))
	notAllowed("BIND", other.Bind(ctx, "x", "ex", "k"))
	notAllowed("UNBIND", other.Unbind(ctx, "x", "ex", "owned"))
	notAllowed("DELETE", other.DeleteQueue(ctx, "ex", client.QueueDeleteOptions{}))
	notAllowed("DECLARE_QUEUE", other.DeclareQueue(ctx, "ex", client.QueueOptions{Exclusive: true}))
	_, err := other.Subscribe(ctx, "ex", client.SubscribeOptions{Credit: 1})
	notAllowed("SUBSCRIBE", err)
	if err := other.Publish(ctx, "", "ex", []byte("reply"), client.PublishOptions{}); err != nil {
		t.Fatalf("PUBLISH to another session's exclusive queue: %v", err)
	}
	// The refusals changed nothing: the message is there, the binding too.
	con, err := owner.Subscribe(ctx, "ex", client.SubscribeOptions{Credit: 10})
	if err != nil {
		t.Fatal(err)
	}
	if d := next(t, con, 5e9); string(d.Payload) != "reply" {
		t.Fatalf("owner got %q", d.Payload)
	}
	if err := other.Publish(ctx, "x", "owned", []byte("routed"), client.PublishOptions{}); err != nil {
		t.Fatal(err)
	}
	if d := next(t, con, 5e9); string(d.Payload) != "routed" {
		t.Fatalf("owner got %q through the binding", d.Payload)
	}
	if err := con.Cancel(ctx); err != nil {
		t.Fatal(err)
	}
	for what, err := range map[string]error{
		"PURGE":  owner.Purge(ctx, "ex"),
		"BIND":   owner.Bind(ctx, "x", "ex", "k"),
		"UNBIND": owner.Unbind(ctx, "x", "ex", "k"),
	} {
		if err != nil {
			t.Errorf("%s by the owner: %v", what, err)
		}
	}
	if err := owner.DeleteQueue(ctx, "ex", client.QueueDeleteOptions{}); err != nil {
		t.Fatalf("DELETE by the owner: %v", err)
	}
}
