package clustertest

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"syscall"
	"testing"
	"time"

	"github.com/berthmq/berth/controlplane/ctlapi"
	"github.com/berthmq/berth/controlplane/ctlclient"
	"github.com/berthmq/berth/internal/testutil"
)

// TestGroupsFollowController runs three real brokers with replication
// groups (-peer) and a 3-member controller: the groups get their first
// masters spread over the brokers with all three in sync; after kill -9 of
// a master broker, its groups get new masters and those masters bring the
// surviving follower back into the SyncStateSet through the controller
// (so they can commit again); restarted, the killed broker catches up and
// is back in every set.
func TestGroupsFollowController(t *testing.T) {
	const groups = 6
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	admins := map[*node]string{}
	nodes := startGroupEach(t, func(_ int, n *node) []string {
		admins[n] = testutil.FreeAddr(t)
		return []string{"-peer", testutil.FreeAddr(t), "-controller-heartbeat-ms", "200", "-admin", admins[n]}
	}, "broker", "broker", "broker")
	var ctlAddrs []string
	for _, n := range nodes {
		ctlAddrs = append(ctlAddrs, n.ctl)
	}
	cl := ctlclient.NewClient(ctlAddrs)
	defer cl.Close()
	testutil.WaitFor(t, 20*time.Second, func() error {
		bs, err := cl.GetBrokers(ctx, ctlapi.ReadConsistent)
		if err != nil {
			return err
		}
		if len(bs) != 3 {
			return fmt.Errorf("%d brokers registered", len(bs))
		}
		return nil
	})
	info, err := cl.GetClusterInfo(ctx, ctlapi.ReadConsistent)
	if err != nil {
		t.Fatal(err)
	}
	cfg := info.Config
	cfg.Groups = groups
	if err := cl.SetClusterConfig(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	read := func() []ctlapi.Group {
		gs, _, err := cl.GetGroups(ctx, ctlapi.ReadConsistent, 0, groups)
		if err != nil {
			t.Fatal(err)
		}
		return gs
	}
	// First elections: every group has a master and all three in sync.
	testutil.WaitFor(t, 30*time.Second, func() error {
		for _, g := range read() {
			if g.Master == 0 || len(g.SyncStateSet) != 3 {
				return fmt.Errorf("group %d: master %d, set %v", g.ID, g.Master, g.SyncStateSet)
			}
		}
		return nil
	})
	masters := map[uint32]int{}
	for _, g := range read() {
		masters[g.Master]++
	}
	if len(masters) != 3 {
		t.Fatalf("masters %v: not spread over the three brokers", masters)
	}

	// kill -9 the master of group 0.
	victim := read()[0].Master
	bs, err := cl.GetBrokers(ctx, ctlapi.ReadConsistent)
	if err != nil {
		t.Fatal(err)
	}
	var vnode *node
	for _, b := range bs {
		for _, n := range nodes {
			if b.ID == victim && len(b.Addrs) > 0 && b.Addrs[0] == n.client {
				vnode = n
			}
		}
	}
	if vnode == nil {
		t.Fatalf("no process for broker %d", victim)
	}
	lost := []uint32{}
	for _, g := range read() {
		if g.Master == victim {
			lost = append(lost, g.ID)
		}
	}
	killed := time.Now()
	vnode.signal(syscall.SIGKILL)
	var elected, inSync time.Duration
	testutil.WaitFor(t, 30*time.Second, func() error {
		gs := read()
		for _, id := range lost {
			g := gs[id]
			if g.Master == 0 || g.Master == victim {
				return fmt.Errorf("group %d still has master %d", id, g.Master)
			}
		}
		if elected == 0 {
			elected = time.Since(killed)
		}
		for _, id := range lost {
			g := gs[id]
			if len(g.SyncStateSet) < 2 || slices.Contains(g.SyncStateSet, victim) {
				return fmt.Errorf("group %d: set %v", id, g.SyncStateSet)
			}
		}
		return nil
	})
	inSync = time.Since(killed)
	t.Logf("kill -9 of broker %d: its %d groups had new masters after %v, and two members in sync after %v", victim, len(lost), elected.Round(time.Millisecond), inSync.Round(time.Millisecond))

	// Every broker's own view (/v1/groups) agrees with the controller:
	// the same epoch everywhere, master on the master only, followers
	// caught up to the master's commit.
	checkViews := func(live []*node) error {
		gs := read()
		for _, n := range live {
			var view struct {
				Broker uint32 `json:"broker_id"`
				Groups []struct {
					Group           uint32
					Role            string
					Epoch, Master   uint32
					Commit, Applied uint64
				} `json:"groups"`
			}
			resp, err := http.Get("http://" + admins[n] + "/v1/groups")
			if err != nil {
				return err
			}
			err = json.NewDecoder(resp.Body).Decode(&view)
			resp.Body.Close()
			if err != nil {
				return err
			}
			if len(view.Groups) != groups {
				return fmt.Errorf("%s runs %d groups", n.name, len(view.Groups))
			}
			for _, v := range view.Groups {
				g := gs[v.Group]
				wantRole := "follower"
				if g.Master == view.Broker {
					wantRole = "master"
				}
				if v.Epoch != g.Epoch || v.Master != g.Master || v.Role != wantRole {
					return fmt.Errorf("%s (broker %d) sees group %d as %s of epoch %d under %d; the controller: epoch %d, master %d",
						n.name, view.Broker, v.Group, v.Role, v.Epoch, v.Master, g.Epoch, g.Master)
				}
			}
		}
		return nil
	}
	var live []*node
	for _, n := range nodes {
		if n != vnode {
			live = append(live, n)
		}
	}
	testutil.WaitFor(t, 20*time.Second, func() error { return checkViews(live) })

	// Restarted, the killed broker is back in every set.
	vnode.proc = nil
	vnode.start(t)
	vnode.waitUp(t, 20*time.Second)
	testutil.WaitFor(t, 30*time.Second, func() error {
		for _, g := range read() {
			if len(g.SyncStateSet) != 3 {
				return fmt.Errorf("group %d: set %v after the restart", g.ID, g.SyncStateSet)
			}
		}
		return nil
	})
	testutil.WaitFor(t, 20*time.Second, func() error { return checkViews(nodes) })
}
