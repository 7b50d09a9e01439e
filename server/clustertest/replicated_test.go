package clustertest

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/berthmq/berth/client"
	"github.com/berthmq/berth/controlplane/ctlapi"
	"github.com/berthmq/berth/controlplane/ctlclient"
	"github.com/berthmq/berth/internal/testutil"
	"github.com/berthmq/berth/server"
)

// TestReplicatedQueueSurvivesMasterKill: three real brokers with
// replication groups. A durable queue's messages, published through its
// group's master, are replicated; the consumer accepts the first 200 of
// 500; kill -9 of the master; the new master delivers exactly the 300 not
// accepted, in order: no completed publish lost, no completed accept back.
func TestReplicatedQueueSurvivesMasterKill(t *testing.T) {
	const groups, total, accepted = 3, 500, 200
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
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
	const queue = "replicated"
	g := server.GroupOf(queue, groups)
	groupOf := func() ctlapi.Group {
		gr, err := cl.GetReplicaInfo(ctx, ctlapi.ReadConsistent, g)
		if err != nil {
			t.Fatal(err)
		}
		return gr
	}
	testutil.WaitFor(t, 30*time.Second, func() error {
		if gr := groupOf(); gr.Master == 0 || len(gr.SyncStateSet) != 3 {
			return fmt.Errorf("group %d: master %d, set %v", g, gr.Master, gr.SyncStateSet)
		}
		return nil
	})
	nodeOf := func(id uint32) *node {
		bs, err := cl.GetBrokers(ctx, ctlapi.ReadConsistent)
		if err != nil {
			t.Fatal(err)
		}
		for _, b := range bs {
			for _, n := range nodes {
				if b.ID == id && len(b.Addrs) > 0 && b.Addrs[0] == n.client {
					return n
				}
			}
		}
		t.Fatalf("no process for broker %d", id)
		return nil
	}
	master := groupOf().Master
	mnode := nodeOf(master)

	// The master's own node has taken the mastership (the controller
	// decides first; the broker follows within a WaitChange).
	testutil.WaitFor(t, 20*time.Second, func() error {
		resp, err := http.Get("http://" + admins[mnode] + "/v1/groups")
		if err != nil {
			return err
		}
		var view struct {
			Groups []struct {
				Group uint32
				Role  string
			}
		}
		err = json.NewDecoder(resp.Body).Decode(&view)
		resp.Body.Close()
		if err != nil {
			return err
		}
		for _, v := range view.Groups {
			if v.Group == g && v.Role == "master" {
				return nil
			}
		}
		return fmt.Errorf("%s does not master group %d yet: %+v", mnode.name, g, view.Groups)
	})
	// A follower refuses to take publishes for the group (no forwarding
	// yet).
	c := dial(t, ctx, mnode.client)
	if err := c.DeclareQueue(ctx, queue, client.QueueOptions{Durable: true}); err != nil {
		t.Fatal(err)
	}
	for _, n := range nodes {
		if n == mnode {
			continue
		}
		fc := dial(t, ctx, n.client)
		err := fc.Publish(ctx, "", queue, []byte("x"), client.PublishOptions{Persistent: true})
		if client.Code(err) == 0 {
			t.Fatalf("%s, a follower, took a publish to the replicated queue: %v", n.name, err)
		}
		fc.Close()
	}
	for i := range total {
		if err := c.Publish(ctx, "", queue, fmt.Appendf(nil, "m%04d", i), client.PublishOptions{Persistent: true}); err != nil {
			t.Fatalf("publish %d: %v", i, err)
		}
	}
	// Every member holds the 500 (the followers adopted the queue from
	// the controller when its first event reached them).
	testutil.WaitFor(t, 20*time.Second, func() error {
		for _, n := range nodes {
			resp, err := http.Get("http://" + admins[n] + "/v1/queues")
			if err != nil {
				return err
			}
			var qs []struct {
				Name  string
				Ready int
			}
			err = json.NewDecoder(resp.Body).Decode(&qs)
			resp.Body.Close()
			if err != nil {
				return err
			}
			i := slices.IndexFunc(qs, func(q struct {
				Name  string
				Ready int
			}) bool {
				return q.Name == queue
			})
			if i < 0 || qs[i].Ready != total {
				return fmt.Errorf("%s holds %+v", n.name, qs)
			}
		}
		return nil
	})
	con, err := c.Subscribe(ctx, queue, client.SubscribeOptions{Credit: 50, AutoCredit: true})
	if err != nil {
		t.Fatal(err)
	}
	for i := range accepted {
		d, err := con.Next(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if want := fmt.Sprintf("m%04d", i); string(d.Payload) != want {
			t.Fatalf("delivery %d: %q, want %q", i, d.Payload, want)
		}
		if err := d.Accept(ctx); err != nil {
			t.Fatalf("accept %d: %v", i, err)
		}
	}

	killed := time.Now()
	mnode.signal(syscall.SIGKILL)
	var newMaster uint32
	testutil.WaitFor(t, 30*time.Second, func() error {
		gr := groupOf()
		if gr.Master == 0 || gr.Master == master {
			return fmt.Errorf("group %d: master %d", g, gr.Master)
		}
		newMaster = gr.Master
		return nil
	})
	t.Logf("kill -9 of the master: group %d had master %d after %v", g, newMaster, time.Since(killed).Round(time.Millisecond))
	nc := dial(t, ctx, nodeOf(newMaster).client)
	var got []string
	testutil.WaitFor(t, 30*time.Second, func() error {
		ncon, err := nc.Subscribe(ctx, queue, client.SubscribeOptions{Credit: 1000})
		if err != nil {
			var views []string
			for _, n := range nodes {
				if n == mnode {
					continue
				}
				if resp, herr := http.Get("http://" + admins[n] + "/v1/groups"); herr == nil {
					b, _ := io.ReadAll(resp.Body)
					resp.Body.Close()
					views = append(views, n.name+": "+strings.Join(strings.Fields(string(b)), " "))
				}
			}
			return fmt.Errorf("%w (group %d: %v)", err, g, views) // the new master may still be taking over
		}
		for len(got) < total-accepted {
			nctx, ncancel := context.WithTimeout(ctx, 10*time.Second)
			d, err := ncon.Next(nctx)
			ncancel()
			if err != nil {
				t.Fatalf("after %d deliveries from the new master: %v", len(got), err)
			}
			got = append(got, string(d.Payload))
		}
		return nil
	})
	var want []string
	for i := accepted; i < total; i++ {
		want = append(want, fmt.Sprintf("m%04d", i))
	}
	if !slices.Equal(got, want) {
		t.Fatalf("the new master delivered %d messages, %v ... ; want m%04d..m%04d in order", len(got), got[:min(5, len(got))], accepted, total-1)
	}
}
