package crashtest

import (
	"context"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"github.com/berthmq/berth/client"
	"github.com/berthmq/berth/internal/testutil"
)

// TestDelayedAndPrioritySurviveKill9: a persistent delayed message on a
// durable queue, completed before berthd is killed with SIGKILL, is
// delivered after the restart, and not before its deliver-at time; the
// persistent messages of a priority queue come back in priority order.
func TestDelayedAndPrioritySurviveKill9(t *testing.T) {
	dataDir, logPath := t.TempDir(), filepath.Join(t.TempDir(), "berthd.log")
	logOnFailure(t, logPath)
	addr := testutil.FreeAddr(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	b := startBroker(t, dataDir, logPath, addr)
	c, err := client.Dial(ctx, b.addr)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.DeclareQueue(ctx, "later", client.QueueOptions{Durable: true}); err != nil {
		t.Fatal(err)
	}
	if err := c.DeclareQueue(ctx, "prio", client.QueueOptions{Durable: true, MaxPriority: 3}); err != nil {
		t.Fatal(err)
	}
	at := time.Now().Add(1500 * time.Millisecond)
	if err := c.Publish(ctx, "", "later", []byte("delayed"), client.PublishOptions{Persistent: true, DeliverAt: at}); err != nil {
		t.Fatal(err)
	}
	for i, p := range []uint8{0, 2, 1, 3, 2} {
		if err := c.Publish(ctx, "", "prio", []byte(fmt.Sprintf("m%d", i)), client.PublishOptions{Persistent: true, Priority: p}); err != nil {
			t.Fatal(err)
		}
	}
	c.Close()
	b.kill()

	b = startBroker(t, dataDir, logPath, addr)
	defer b.kill()
	c, err = client.Dial(ctx, b.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	prio, err := c.Subscribe(ctx, "prio", client.SubscribeOptions{Credit: 10, AckMode: client.AckNone})
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"m3", "m1", "m4", "m2", "m0"} {
		d, err := prio.Next(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if string(d.Payload) != want {
			t.Fatalf("priority queue after kill -9: got %s, want %s", d.Payload, want)
		}
	}
	later, err := c.Subscribe(ctx, "later", client.SubscribeOptions{Credit: 10, AckMode: client.AckNone})
	if err != nil {
		t.Fatal(err)
	}
	d, err := later.Next(ctx)
	if err != nil {
		t.Fatalf("the delayed message did not come after the restart: %v", err)
	}
	if now := time.Now(); string(d.Payload) != "delayed" || now.Before(at) {
		t.Fatalf("got %q %v before its deliver-at time", d.Payload, at.Sub(now))
	}
	t.Logf("delayed message delivered %v after its time (restart included)", time.Since(at))
}
