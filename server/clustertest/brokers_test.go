package clustertest

import (
	"context"
	"fmt"
	"slices"
	"syscall"
	"testing"
	"time"

	"github.com/berthmq/berth/controlplane/ctlapi"
	"github.com/berthmq/berth/controlplane/ctlclient"
	"github.com/berthmq/berth/internal/testutil"
)

// TestBrokersRegisterAndHeartbeat runs three brokers embedding a 3-member
// controller: each gets its own broker id and registers its client
// address. In active-passive mode the controller elects one of them
// primary; after that broker's process is killed, its heartbeats stop and
// the controller moves the role to another broker.
func TestBrokersRegisterAndHeartbeat(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 40*time.Second)
	defer cancel()
	nodes := startGroup(t, "broker", "broker", "broker")
	var ctlAddrs []string
	for _, n := range nodes {
		ctlAddrs = append(ctlAddrs, n.ctl)
	}
	cl := ctlclient.NewClient(ctlAddrs)
	defer cl.Close()

	// Every broker registers once its listener is up; Start makes the
	// first attempt, so they are all there by now or very soon.
	byAddr := map[string]uint32{}
	testutil.WaitFor(t, 10*time.Second, func() error {
		bs, err := cl.GetBrokers(ctx, ctlapi.ReadConsistent)
		if err != nil {
			return err
		}
		clear(byAddr)
		var ids []uint32
		for _, b := range bs {
			if len(b.Addrs) != 1 {
				return fmt.Errorf("broker %d has addresses %v", b.ID, b.Addrs)
			}
			byAddr[b.Addrs[0]] = b.ID
			ids = append(ids, b.ID)
		}
		slices.Sort(ids)
		if len(slices.Compact(ids)) != 3 || len(bs) != 3 {
			return fmt.Errorf("brokers %+v, want three with distinct ids", bs)
		}
		for _, n := range nodes {
			if _, ok := byAddr[n.client]; !ok {
				return fmt.Errorf("%s (%s) is not registered: %+v", n.name, n.client, bs)
			}
		}
		return nil
	})

	info, err := cl.GetClusterInfo(ctx, ctlapi.ReadConsistent)
	if err != nil {
		t.Fatal(err)
	}
	cfg := info.Config
	if cfg.Groups == 0 {
		cfg.Groups = 1 // unset; the state machine needs a group count
	}
	cfg.Mode = ctlapi.ModeActivePassive
	if err := cl.SetClusterConfig(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	var primary uint32
	testutil.WaitFor(t, 10*time.Second, func() error {
		p, _, _, err := cl.GetPrimary(ctx, ctlapi.ReadConsistent)
		if err != nil {
			return err
		}
		if p == 0 {
			return fmt.Errorf("no primary elected")
		}
		primary = p
		return nil
	})
	var victim *node
	var rest []string
	for _, n := range nodes {
		if byAddr[n.client] == primary {
			victim = n
		} else {
			rest = append(rest, n.ctl)
		}
	}
	if victim == nil {
		t.Fatalf("primary %d is none of the brokers %v", primary, byAddr)
	}
	t.Logf("primary is broker %d (%s); killing it", primary, victim.name)
	victim.stop(t, syscall.SIGKILL)

	cr := ctlclient.NewClient(rest)
	defer cr.Close()
	start := time.Now()
	testutil.WaitFor(t, 10*time.Second, func() error {
		p, _, addrs, err := cr.GetPrimary(ctx, ctlapi.ReadConsistent)
		if err != nil {
			return err
		}
		if p == 0 || p == primary {
			return fmt.Errorf("primary is %d after killing broker %d", p, primary)
		}
		if len(addrs) != 1 || byAddr[addrs[0]] != p {
			return fmt.Errorf("new primary %d has addresses %v", p, addrs)
		}
		return nil
	})
	t.Logf("a new primary after %v", time.Since(start).Round(time.Millisecond))
}

// TestWelcomeListsEveryBroker: a client of one broker learns every
// registered broker's client address from WELCOME (client.ServerAddrs),
// this broker's first, so it can dial another when this one is gone.
func TestWelcomeListsEveryBroker(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 40*time.Second)
	defer cancel()
	nodes := startGroupArgs(t, []string{"-controller-heartbeat-ms", "200"}, "broker", "broker", "broker")
	var want []string
	for _, n := range nodes {
		want = append(want, n.client)
	}
	testutil.WaitFor(t, 20*time.Second, func() error {
		c := dial(t, ctx, nodes[0].client)
		defer c.Close()
		got := c.ServerAddrs()
		if len(got) == 0 || got[0] != nodes[0].client {
			return fmt.Errorf("WELCOME lists %v; want %s first", got, nodes[0].client)
		}
		sorted := slices.Clone(got)
		slices.Sort(sorted)
		w := slices.Clone(want)
		slices.Sort(w)
		if !slices.Equal(sorted, w) {
			return fmt.Errorf("WELCOME lists %v, want the three brokers %v", got, want)
		}
		return nil
	})
}
