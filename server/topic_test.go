package server_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/berthmq/berth/client"
	"github.com/berthmq/berth/server"
	"github.com/berthmq/berth/wire"
)

// TestHostileTopicBindingDoesNotStallTheLoop binds the pattern that froze an
// event loop under the backtracking matcher (twelve "#" words, then "z")
// and publishes a 30-word key that does not match it. With one event loop,
// a second connection shares the loop; it must keep working while the
// first publishes. Under the old matcher the publish never completed and
// the connection died of missed heartbeats after about 16 s; the limits
// here are generous because the machine is shared, not because matching is
// slow (BenchmarkTopicMatchWorstCase measures that).
func TestHostileTopicBindingDoesNotStallTheLoop(t *testing.T) {
	s := startServer(t, func(c *server.Config) { c.Loops = 1 })
	c := dial(t, s)
	other := dial(t, s)
	ctx := ctxT(t)
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(c.DeclareExchange(ctx, "t", client.Topic, client.ExchangeOptions{}))
	must(c.DeclareQueue(ctx, "q", client.QueueOptions{}))
	must(other.DeclareQueue(ctx, "side", client.QueueOptions{}))
	must(c.Bind(ctx, "t", "q", strings.Repeat("#.", 12)+"z"))

	// The other connection publishes round trips while the hostile
	// publishes go through the same loop.
	sideDone := make(chan error, 1)
	go func() {
		for i := 0; i < 200; i++ {
			pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			err := other.Publish(pctx, "", "side", []byte("x"), client.PublishOptions{})
			cancel()
			if err != nil {
				sideDone <- err
				return
			}
		}
		sideDone <- nil
	}()

	miss := strings.TrimSuffix(strings.Repeat("a.", 30), ".")
	hit := strings.Repeat("a.", 29) + "z"
	for i := 0; i < 20; i++ {
		pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		start := time.Now()
		must(c.Publish(pctx, "t", miss, []byte("miss"), client.PublishOptions{}))
		must(c.Publish(pctx, "t", hit, []byte("hit"), client.PublishOptions{}))
		cancel()
		if i == 0 {
			t.Logf("first hostile publish pair completed in %v", time.Since(start))
		}
	}
	must(<-sideDone)

	con, err := c.Subscribe(ctx, "q", client.SubscribeOptions{Credit: 100, AckMode: client.AckNone})
	must(err)
	for i := 0; i < 20; i++ {
		if d := next(t, con, 5*time.Second); string(d.Payload) != "hit" {
			t.Fatalf("delivery %d: %q, want only the matching key's messages", i, d.Payload)
		}
	}
	expectNone(t, con, 50*time.Millisecond)

	// A pattern longer than any key may be is refused with a clear error.
	err = c.Bind(ctx, "t", "q", strings.Repeat("#.", 32)+"z")
	if client.Code(err) != wire.CodeInvalid || !strings.Contains(err.Error(), "at most 32") {
		t.Fatalf("33-word pattern: %v, want an invalid-argument error naming the cap", err)
	}
}
