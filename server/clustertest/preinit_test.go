package clustertest

import (
	"context"
	"fmt"
	"syscall"
	"testing"
	"time"

	"github.com/berthmq/berth/client"
	"github.com/berthmq/berth/controlplane/ctlapi"
	"github.com/berthmq/berth/internal/testutil"
)

// TestQueueBeforeInitSurvivesRestart: a durable queue declared before
// "cluster init" stays on the broker that declared it (OPERATIONS.md),
// and its persistent messages are there after that broker restarts with
// the groups running.
func TestQueueBeforeInitSurvivesRestart(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	c := startBrokers(t, ctx, 3)
	cl := c.cl
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
	info, err := cl.GetClusterInfo(ctx, ctlapi.ReadConsistent)
	if err != nil {
		t.Fatal(err)
	}
	cfg := info.Config
	cfg.Groups = 3
	if err := cl.SetClusterConfig(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, 30*time.Second, func() error {
		gs, _, err := cl.GetGroups(ctx, ctlapi.ReadConsistent, 0, 3)
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
	n.stop(t, syscall.SIGTERM)
	n.start(t)
	n.waitUp(t, 20*time.Second)
	consumeRedialing(t, ctx, n, queue, want, true)
}
