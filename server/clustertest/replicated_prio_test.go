package clustertest

import (
	"context"
	"fmt"
	"syscall"
	"testing"
	"time"

	"github.com/berthmq/berth/client"
	"github.com/berthmq/berth/internal/testutil"
	"github.com/berthmq/berth/server"
)

// TestReplicatedPriorityAndDelay: the group log carries a message's
// priority and deliver-at time. A replicated priority queue gets
// messages of mixed priorities and one delayed message through its
// master; every member holds them (the delayed one counted as delayed);
// the master is killed with SIGKILL, and the new master, whose copy was
// built from the log alone, delivers them in priority order and the
// delayed one no earlier than its time.
func TestReplicatedPriorityAndDelay(t *testing.T) {
	const groups = 3
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	c := startReplicated(t, ctx, groups)
	const queue = "replicated-prio"
	g := server.GroupOf(queue, groups)
	master, mnode := c.waitServing(g)
	conn := dial(t, ctx, mnode.client)
	if err := conn.DeclareQueue(ctx, queue, client.QueueOptions{Durable: true, MaxPriority: 5}); err != nil {
		t.Fatal(err)
	}
	at := time.Now().Add(3 * time.Second)
	if err := conn.Publish(ctx, "", queue, []byte("delayed"), client.PublishOptions{Persistent: true, Priority: 5, DeliverAt: at}); err != nil {
		t.Fatal(err)
	}
	for i, p := range []uint8{0, 3, 1, 5, 3} {
		if err := conn.Publish(ctx, "", queue, []byte(fmt.Sprintf("m%d", i)), client.PublishOptions{Persistent: true, Priority: p}); err != nil {
			t.Fatal(err)
		}
	}
	testutil.WaitFor(t, 20*time.Second, func() error {
		for _, n := range c.nodes {
			var qs []struct {
				Name           string
				Ready, Delayed int
			}
			if err := c.getJSON(n, "/v1/queues", &qs); err != nil {
				return err
			}
			held := false
			for _, q := range qs {
				held = held || q.Name == queue && q.Ready == 5 && q.Delayed == 1
			}
			if !held {
				return fmt.Errorf("%s does not hold 5 ready and 1 delayed: %+v", n.name, qs)
			}
		}
		return nil
	})
	conn.Close()
	mnode.signal(syscall.SIGKILL)
	newMaster := c.waitNewMaster(g, master)
	c.consumeAll(c.nodeOf(newMaster), queue, []string{"m3", "m1", "m4", "m2", "m0", "delayed"})
	if time.Now().Before(at) {
		t.Fatal("the delayed message was delivered before its time by the new master")
	}
}
