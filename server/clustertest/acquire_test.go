package clustertest

import (
	"context"
	"fmt"
	"syscall"
	"testing"
	"time"

	"github.com/berthmq/berth/client"
	"github.com/berthmq/berth/internal/testutil"
)

// TestFailoverRedeliversOnlyWhatWasHandedOut: a consumer at the master of
// a replicated queue accepts some messages and holds more unaccepted;
// every member shows those as acquired (the group log carries the
// master's acquires), and, the master idle, an acquire window of 0. After kill -9 of the master, the new master
// delivers every message not accepted, in order: the held ones flagged
// redelivered with a delivery count of one, the rest (nobody was handed
// them) unflagged with a count of zero. Before acquisitions were in the
// group log, every message the new master inherited came flagged.
func TestFailoverRedeliversOnlyWhatWasHandedOut(t *testing.T) {
	const groups, total, accepted, held = 3, 300, 50, 40
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	c := startReplicated(t, ctx, groups)
	const queue = "handed-out"
	g, master, mnode, conn := c.declare(queue, groups)
	c.publishAll(conn, queue, names(0, total))
	con, err := conn.Subscribe(ctx, queue, client.SubscribeOptions{Credit: accepted + held})
	if err != nil {
		t.Fatal(err)
	}
	for i := range accepted + held {
		d, err := con.Next(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if i < accepted {
			if err := d.Accept(ctx); err != nil {
				t.Fatal(err)
			}
		}
	}
	// The master idles: two ticks with nothing sent shrink its window to
	// 0, so that its followers treat none of what they hold ready as
	// maybe delivered.
	testutil.WaitFor(t, 20*time.Second, func() error {
		for _, n := range c.nodes {
			ready, unacked, err := c.depth(n, queue)
			if err != nil {
				return err
			}
			if ready != total-accepted-held || unacked != held {
				return fmt.Errorf("%s: %d ready, %d acquired; want %d and %d", n.name, ready, unacked, total-accepted-held, held)
			}
			var qs []struct {
				Name          string
				AcquireWindow uint32 `json:"acquire_window"`
			}
			if err := c.getJSON(n, "/v1/queues", &qs); err != nil {
				return err
			}
			for _, q := range qs {
				if q.Name == queue && q.AcquireWindow != 0 {
					return fmt.Errorf("%s: acquire window %d", n.name, q.AcquireWindow)
				}
			}
		}
		return nil
	})

	mnode.signal(syscall.SIGKILL)
	nnode := c.nodeOf(c.waitNewMaster(g, master))
	var ncon *client.Consumer
	testutil.WaitFor(t, 30*time.Second, func() error {
		nconn, err := client.Dial(ctx, nnode.client)
		if err != nil {
			return err
		}
		ncon, err = nconn.Subscribe(ctx, queue, client.SubscribeOptions{Credit: total})
		if err != nil {
			nconn.Close()
			return err
		}
		t.Cleanup(func() { nconn.Close() })
		return nil
	})
	flagged := 0
	for i, want := range names(accepted, total) {
		d, err := ncon.Next(ctx)
		if err != nil {
			t.Fatalf("delivery %d of %d from the new master: %v", i, total-accepted, err)
		}
		if string(d.Payload) != want {
			t.Fatalf("delivery %d from the new master is %q, want %q", i, d.Payload, want)
		}
		handedOut := i < held
		if d.Redelivered != handedOut || d.DeliveryCount != uint32(btoi(handedOut)) {
			t.Fatalf("%s from the new master: redelivered %v, delivery count %d; the old master handed it out: %v", want, d.Redelivered, d.DeliveryCount, handedOut)
		}
		if d.Redelivered {
			flagged++
		}
	}
	t.Logf("after the master's kill -9: %d of %d messages flagged redelivered (the %d it had handed out)", flagged, total-accepted, held)
}

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}
