package clustertest

import (
	"context"
	"fmt"
	"slices"
	"syscall"
	"testing"
	"time"

	"github.com/berthmq/berth/client"
	"github.com/berthmq/berth/internal/testutil"
	"github.com/berthmq/berth/replication"
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
	g := replication.GroupOf(queue, groups)
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
	// The others come in priority order; the delayed one (priority 5)
	// comes no earlier than its time, which may pass during the failover
	// on a busy machine, putting it first.
	// The new master may still proxy a first subscribe to the master it
	// knew and then end the consumer: each try dials afresh (nothing is
	// accepted, so a failed try leaves every message in the queue).
	var got []string
	testutil.WaitFor(t, 30*time.Second, func() error {
		got = got[:0]
		nc, err := client.Dial(ctx, c.nodeOf(newMaster).client)
		if err != nil {
			return err
		}
		defer nc.Close()
		con, err := nc.Subscribe(ctx, queue, client.SubscribeOptions{Credit: 10})
		if err != nil {
			return err
		}
		for len(got) < 6 {
			nctx, ncancel := context.WithTimeout(ctx, 10*time.Second)
			d, err := con.Next(nctx)
			ncancel()
			if err != nil {
				return fmt.Errorf("after %d deliveries %v: %w", len(got), got, err)
			}
			if string(d.Payload) == "delayed" && time.Now().Before(at) {
				t.Fatal("the delayed message was delivered before its time by the new master")
			}
			got = append(got, string(d.Payload))
		}
		return nil
	})
	var others []string
	for _, m := range got {
		if m != "delayed" {
			others = append(others, m)
		}
	}
	if want := []string{"m3", "m1", "m4", "m2", "m0"}; !slices.Equal(others, want) || len(got) != 6 {
		t.Fatalf("delivered %v; want %v in this order and the delayed one", got, want)
	}
}
