package clustertest

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/berthmq/berth/client"
	"github.com/berthmq/berth/controlplane/ctlapi"
	"github.com/berthmq/berth/internal/testutil"
	"github.com/berthmq/berth/wire"
)

// TestQueueBeforeInitSurvivesRestart: a durable queue declared before
// "cluster init" stays on the broker that declared it (OPERATIONS.md),
// and its persistent messages are there after that broker restarts with
// the groups running.
func TestQueueBeforeInitSurvivesRestart(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	c := startBrokers(t, ctx, 3)
	n := c.nodes[0]
	conn := dial(t, ctx, n.client)
	const queue = "before-init"
	if err := conn.DeclareQueue(ctx, queue, client.QueueOptions{Durable: true}); err != nil {
		t.Fatal(err)
	}
	var want []string
	for i := range 10 {
		m := fmt.Sprintf("m%02d", i)
		if err := conn.Publish(ctx, "", queue, []byte(m), client.PublishOptions{Persistent: true}); err != nil {
			t.Fatal(err)
		}
		want = append(want, m)
	}
	conn.Close()
	initGroups(t, ctx, c, 3)
	n.stop(t, syscall.SIGTERM)
	n.start(t)
	n.waitUp(t, 20*time.Second)
	consumeRedialing(t, ctx, n, queue, want, true)
}

// TestQueueBeforeInitStaysOnItsBroker: a queue declared at one broker
// before "cluster init" stays there alone. The other brokers answer
// not-found for it, before the init, after it, and after a restart (which
// used to make the restarted broker a copy of its own); a declare of it
// at another broker is refused; once it is deleted, another broker may
// declare the name afresh.
func TestQueueBeforeInitStaysOnItsBroker(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	c := startBrokers(t, ctx, 3)
	a := dial(t, ctx, c.nodes[0].client)
	const queue = "stays-on-1"
	if err := a.DeclareQueue(ctx, queue, client.QueueOptions{Durable: true}); err != nil {
		t.Fatal(err)
	}
	want := []string{"m0", "m1", "m2"}
	for _, m := range want {
		if err := a.Publish(ctx, "", queue, []byte(m), client.PublishOptions{Persistent: true}); err != nil {
			t.Fatal(err)
		}
	}
	b := dial(t, ctx, c.nodes[1].client)
	notFound := func(when string) {
		t.Helper()
		err := b.Publish(ctx, "", queue, []byte("through-2"), client.PublishOptions{Persistent: true})
		if client.Code(err) != wire.CodeNotFound {
			t.Fatalf("%s: a publish through broker 2: %v, want not-found", when, err)
		}
	}
	// Broker 2 sees the declare in the controller and writes the name
	// down as broker 1's.
	testutil.WaitFor(t, 10*time.Second, func() error {
		data, err := os.ReadFile(filepath.Join(dataDir(c.nodes[1]), "foreign-queues"))
		if err != nil || !strings.Contains(string(data), queue) {
			return fmt.Errorf("broker 2 has not written %s down as another broker's (%v)", queue, err)
		}
		return nil
	})
	notFound("before the init")
	initGroups(t, ctx, c, 3)
	notFound("after the init")
	b.Close()
	c.nodes[1].stop(t, syscall.SIGTERM)
	c.nodes[1].start(t)
	c.nodes[1].waitUp(t, 20*time.Second)
	b = dial(t, ctx, c.nodes[1].client)
	notFound("after broker 2 restarted")
	err := b.DeclareQueue(ctx, queue, client.QueueOptions{Durable: true})
	if client.Code(err) != wire.CodePreconditionFailed || !strings.Contains(err.Error(), "another broker") {
		t.Fatalf("declare at broker 2: %v, want precondition-failed naming another broker", err)
	}
	consumeRedialing(t, ctx, c.nodes[0], queue, want, true)

	if err := a.DeleteQueue(ctx, queue, client.QueueDeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, 10*time.Second, func() error {
		return b.DeclareQueue(ctx, queue, client.QueueOptions{Durable: true})
	})
}

// dataDir is the -data argument n was started with.
func dataDir(n *node) string {
	if i := slices.Index(n.args, "-data"); i >= 0 && i+1 < len(n.args) {
		return n.args[i+1]
	}
	return ""
}

// initGroups does what "berthctl cluster init --groups n" does and waits
// until every group has a master.
func initGroups(t *testing.T, ctx context.Context, c *rcluster, n uint32) {
	t.Helper()
	info, err := c.cl.GetClusterInfo(ctx, ctlapi.ReadConsistent)
	if err != nil {
		t.Fatal(err)
	}
	cfg := info.Config
	cfg.Groups = n
	if err := c.cl.SetClusterConfig(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, 30*time.Second, func() error {
		gs, _, err := c.cl.GetGroups(ctx, ctlapi.ReadConsistent, 0, n)
		if err != nil {
			return err
		}
		for _, g := range gs {
			if g.Master == 0 {
				return fmt.Errorf("group %d has no master", g.ID)
			}
		}
		return nil
	})
}
