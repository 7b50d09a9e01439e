package clustertest

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/berthmq/berth/client"
)

// TestReconnectingConsumerAcrossMasterKill: a consumer on a reconnecting
// Conn reads a replicated queue at its group's master, accepting each
// message, and the master is killed with -9 partway. The Conn dials
// another broker at once, before the controller has elected the new
// master, so its SUBSCRIBE sent again is refused as unavailable; the
// consumer must subscribe again until it is served, and go on without its
// application doing anything: it gets every message it had not accepted,
// and none whose accept completed.
func TestReconnectingConsumerAcrossMasterKill(t *testing.T) {
	const groups, total, before = 3, 300, 100
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	c := startReplicated(t, ctx, groups)
	const queue = "reconnecting-consumer"
	g, master, mnode, conn := c.declare(queue, groups)
	c.declareEverywhere(queue)
	c.publishAll(conn, queue, names(0, total))
	conn.Close()
	seeds := []string{mnode.client}
	for _, n := range c.nodes {
		if n != mnode {
			seeds = append(seeds, n.client)
		}
	}
	var evMu sync.Mutex
	var evs []string
	events := func() []string { evMu.Lock(); defer evMu.Unlock(); return slices.Clone(evs) }
	policy := &client.ReconnectPolicy{DelayMin: 10 * time.Millisecond, DelayMax: 200 * time.Millisecond, MaxTime: 30 * time.Second,
		OnEvent: func(e client.Event) {
			evMu.Lock()
			evs = append(evs, fmt.Sprintf("%v %s %v", e.Kind, e.Addr, e.Err))
			evMu.Unlock()
		}}
	cc, err := client.DialConfig(ctx, client.Config{Reconnect: policy}, seeds...)
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	con, err := cc.Subscribe(ctx, queue, client.SubscribeOptions{Credit: 10, AutoCredit: true})
	if err != nil {
		t.Fatal(err)
	}
	accepted := map[string]bool{}
	for len(accepted) < before {
		d, err := con.Next(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if err := d.Accept(ctx); err != nil {
			t.Fatal(err)
		}
		accepted[string(d.Payload)] = true
	}
	mnode.signal(syscall.SIGKILL)
	newMaster := c.waitNewMaster(g, master)
	got := map[string]bool{}
	for len(got) < total-before {
		nctx, ncancel := context.WithTimeout(ctx, 30*time.Second)
		d, err := con.Next(nctx)
		ncancel()
		if err != nil {
			t.Fatalf("after the kill, with %d of %d messages taken: the consumer ended: %v (events %v)", len(got), total-before, err, events())
		}
		m := string(d.Payload)
		if accepted[m] {
			t.Fatalf("%s came back after its accept completed", m)
		}
		got[m] = true
		if err := d.Accept(ctx); err != nil && !errors.Is(err, client.ErrStaleDelivery) {
			t.Fatalf("accept %s: %v", m, err)
		}
	}
	for _, m := range names(before, total) {
		if !got[m] && !accepted[m] {
			t.Fatalf("%s was never delivered", m)
		}
	}
	t.Logf("group %d: master %d killed, new master %d; connection events %v", g, master, newMaster, events())
}
