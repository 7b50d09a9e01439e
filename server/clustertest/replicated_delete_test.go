package clustertest

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/berthmq/berth/client"
	"github.com/berthmq/berth/internal/testutil"
	"github.com/berthmq/berth/replication"
)

// groupBase is where group g's log starts on n (its compacted base).
func (c *rcluster) groupBase(n *node, g uint32) (uint64, error) {
	var view struct {
		Groups []struct {
			Group uint32
			Base  uint64
		}
	}
	if err := c.getJSON(n, "/v1/groups", &view); err != nil {
		return 0, err
	}
	for _, v := range view.Groups {
		if v.Group == g {
			return v.Base, nil
		}
	}
	return 0, fmt.Errorf("%s runs no group %d", n.name, g)
}

// waitBase waits until every member has compacted group g's log up to
// index at least.
func (c *rcluster) waitBase(g uint32, index uint64, what string) {
	c.t.Helper()
	// A group compacts every 50 ticks of 20 ms at the latest.
	testutil.WaitFor(c.t, 20*time.Second, func() error {
		for _, n := range c.nodes {
			base, err := c.groupBase(n, g)
			if err != nil {
				return err
			}
			if base < index {
				return fmt.Errorf("%s keeps group %d's log from %d; %s is at %d", n.name, g, base, what, index)
			}
		}
		return nil
	})
}

// TestReplicatedDeleteReleasesLog: deleting a replicated queue releases
// its group's log as a purge does: every member, the master included,
// compacts its log past the deleted messages' enqueues. First a queue
// with a backlog: before, the master's removals of its messages
// committed after the queue had left its routing, found no queue and
// were skipped, so the master kept its log from the first deleted
// message on, and a replica catching up from it replayed every event of
// a queue that no longer exists. Then a queue deleted while publishes
// to it are in flight, whose enqueues commit after the master dropped
// it (so its removals do not cover them): the master forgets them as it
// applies them, the followers when they drop their copy.
func TestReplicatedDeleteReleasesLog(t *testing.T) {
	const groups, total = 3, 300
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	c := startReplicated(t, ctx, groups)
	const queue = "deleted-backlog"
	g, _, mnode, conn := c.declare(queue, groups)
	c.publishAll(conn, queue, names(0, total))
	c.waitReady(queue, total)
	last := c.lastIndex(mnode, g)
	if err := conn.DeleteQueue(ctx, queue, client.QueueDeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	c.waitBase(g, last, "the deleted backlog's last enqueue")

	busy := ""
	for i := 0; busy == ""; i++ {
		if n := fmt.Sprintf("deleted-busy-%d", i); replication.GroupOf(n, groups) == g {
			busy = n
		}
	}
	if err := conn.DeclareQueue(ctx, busy, client.QueueOptions{Durable: true}); err != nil {
		t.Fatal(err)
	}
	pub := dial(t, ctx, mnode.client)
	var completed, failed atomic.Int64
	published := make(chan error, 1)
	go func() {
		// Pipelined, until the deletion refuses them.
		for range 50000 {
			if failed.Load() > 0 {
				break
			}
			if err := pub.PublishAsync(ctx, "", busy, []byte("in flight"), client.PublishOptions{Persistent: true}, func(err error) {
				if err != nil {
					failed.Add(1)
				} else {
					completed.Add(1)
				}
			}); err != nil {
				published <- err
				return
			}
		}
		published <- pub.Flush(ctx)
	}()
	testutil.WaitFor(t, 20*time.Second, func() error {
		if n := completed.Load(); n < 500 {
			return fmt.Errorf("%d publishes completed", n)
		}
		return nil
	})
	if err := conn.DeleteQueue(ctx, busy, client.QueueDeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := <-published; err != nil {
		t.Fatal(err)
	}
	if failed.Load() == 0 {
		t.Fatal("no publish refused after the deletion")
	}
	t.Logf("%d publishes completed before the deletion", completed.Load())
	c.waitBase(g, c.lastIndex(mnode, g), "the log's end")
}
