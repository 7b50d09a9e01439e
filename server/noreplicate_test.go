package server_test

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/berthmq/berth/client"
	"github.com/berthmq/berth/controlplane/ctlapi"
	"github.com/berthmq/berth/controlplane/ctlclient"
	"github.com/berthmq/berth/internal/testutil"
	"github.com/berthmq/berth/server"
	"github.com/berthmq/berth/wire"
)

// TestNoReplicateRefusedWhereIgnored: the declare flag no-replicate was
// accepted and ignored, the queue landing in a replication group (issue
// 25 item 7). It is now refused, with code invalid and the reason, for a
// durable queue that would be replicated, and accepted where it holds:
// a durable queue declared before the cluster has groups (it stays on
// its broker), a transient one, and a redeclare of a queue kept local.
func TestNoReplicateRefusedWhereIgnored(t *testing.T) {
	s := startServer(t, func(c *server.Config) {
		c.ControllerAddr, c.PeerAddr = testutil.FreeAddr(t), "127.0.0.1:0"
	})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	c := dial(t, s)
	nr := client.QueueOptions{Durable: true, NoReplicate: true}
	if err := c.DeclareQueue(ctx, "kept-local", nr); err != nil {
		t.Fatalf("no-replicate before the cluster has groups: %v", err)
	}
	cl := ctlclient.NewClient([]string{s.ControllerAddr()})
	defer cl.Close()
	testutil.WaitFor(t, 10*time.Second, func() error {
		return cl.SetClusterConfig(ctx, ctlapi.ClusterConfig{Groups: 4})
	})

	err := c.DeclareQueue(ctx, "orders", nr)
	if client.Code(err) != wire.CodeInvalid || !strings.Contains(err.Error(), "no-replicate is not supported") ||
		!strings.Contains(err.Error(), "group ") {
		t.Fatalf("durable no-replicate queue in a cluster with groups: %v, want invalid naming its group", err)
	}
	w, err := cl.GetWiring(ctx, ctlapi.ReadConsistent)
	if err != nil {
		t.Fatal(err)
	}
	if slices.ContainsFunc(w.Queues, func(q ctlapi.DeclareQueue) bool { return q.Name == "orders" }) {
		t.Fatal("the refused declare reached the controller's wiring")
	}
	if err := c.DeclareQueue(ctx, "orders", client.QueueOptions{Durable: true}); err != nil {
		t.Fatalf("the same queue without the flag: %v", err)
	}
	for name, opts := range map[string]client.QueueOptions{
		"kept-local": nr,                                                // on this broker since before the groups
		"transient":  {NoReplicate: true},                               // never replicated
		"orders":     {Durable: true, NoReplicate: true, Passive: true}, // a passive declare only checks
	} {
		if err := c.DeclareQueue(ctx, name, opts); err != nil {
			t.Errorf("declare %q %+v: %v", name, opts, err)
		}
	}
}
