package clustertest

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/berthmq/berth/client"
	"github.com/berthmq/berth/controlplane/ctlapi"
	"github.com/berthmq/berth/controlplane/ctlclient"
	"github.com/berthmq/berth/internal/testutil"
)

// TestBrokersBeyondControllerMembers: a 3-member controller group on
// controller-only nodes serves four brokers that run no member of it
// (-controller-addrs), more than a group's five members could if each
// broker had to embed one. They register, the groups are placed over
// all four (a replica count of 4 is accepted), a queue declared through
// one broker is served through another, and when the master of its group
// is killed another broker takes over with every message.
func TestBrokersBeyondControllerMembers(t *testing.T) {
	const brokers, groups, replicas, total, accepted = 4, 4, 3, 300, 100
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	ctls := startGroup(t, "controller", "controller", "controller")
	var ctlAddrs []string
	for _, n := range ctls {
		ctlAddrs = append(ctlAddrs, n.ctl)
	}
	c := &rcluster{t: t, ctx: ctx, admins: map[*node]string{}}
	c.cl = ctlclient.NewClient(ctlAddrs)
	t.Cleanup(c.cl.Close)
	dir := t.TempDir()
	for i := range brokers {
		n := &node{name: fmt.Sprintf("broker-%d", i+1), client: testutil.FreeAddr(t)}
		c.admins[n] = testutil.FreeAddr(t)
		n.logPath = filepath.Join(dir, n.name+".log")
		n.args = []string{"-data", filepath.Join(dir, n.name), "-controller-addrs", strings.Join(ctlAddrs, ","),
			"-listen", n.client, "-admin", c.admins[n], "-peer", testutil.FreeAddr(t),
			"-controller-heartbeat-ms", "200", "-group-rebalance", "0", "-shards", "1", "-loops", "1", "-log-level", "info"}
		c.nodes = append(c.nodes, n)
	}
	t.Cleanup(func() {
		for _, n := range c.nodes {
			n.kill()
			if t.Failed() {
				t.Logf("%s log:\n%s", n.name, n.logTail())
				keepLog(t, n)
			}
		}
	})
	for _, n := range c.nodes {
		n.start(t)
	}
	for _, n := range c.nodes {
		n.waitUp(t, 30*time.Second)
	}
	testutil.WaitFor(t, 20*time.Second, func() error {
		bs, err := c.cl.GetBrokers(ctx, ctlapi.ReadConsistent)
		if err != nil {
			return err
		}
		if len(bs) != brokers {
			return fmt.Errorf("%d brokers registered", len(bs))
		}
		return nil
	})
	// None of them runs a controller member: the controller has the three
	// it started with.
	for _, n := range c.nodes {
		var st struct {
			Controller map[string]any `json:"controller"`
		}
		if err := c.getJSON(n, "/v1/status", &st); err != nil {
			t.Fatal(err)
		}
		if st.Controller != nil {
			t.Fatalf("%s reports a controller member of its own: %v", n.name, st.Controller)
		}
	}
	members, err := c.cl.Members(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(members) != 3 {
		t.Fatalf("the controller has members %v, want the 3 controller-only nodes", members)
	}
	info, err := c.cl.GetClusterInfo(ctx, ctlapi.ReadConsistent)
	if err != nil {
		t.Fatal(err)
	}
	cfg := info.Config
	cfg.Groups, cfg.Replicas = groups, replicas
	if err := c.cl.SetClusterConfig(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	holds := map[uint32]int{}
	for g := range uint32(groups) {
		c.waitServing(g)
		for _, b := range c.group(g).Replicas {
			holds[b]++
		}
	}
	if len(holds) != brokers {
		t.Fatalf("the groups' replicas are on brokers %v, want all %d", holds, brokers)
	}

	const queue = "beyond-members"
	g, master, mnode, conn := c.declare(queue, groups)
	c.publishAll(conn, queue, names(0, total))
	// Every replica of the group holds them; the fourth broker holds no
	// replica of it, and serves its consumer through the master.
	replicaOf := map[*node]bool{}
	for _, b := range c.group(g).Replicas {
		replicaOf[c.nodeOf(b)] = true
	}
	var other *node
	for _, n := range c.nodes {
		if !replicaOf[n] {
			other = n
		}
	}
	testutil.WaitFor(t, 20*time.Second, func() error {
		for n := range replicaOf {
			if got, _, err := c.depth(n, queue); err != nil || got != total {
				return fmt.Errorf("%s holds %d ready, want %d (%v)", n.name, got, total, err)
			}
		}
		return nil
	})
	if other == nil {
		t.Fatalf("group %d is on every broker: %v", g, c.group(g).Replicas)
	}
	oc := dial(t, ctx, other.client)
	con, err := oc.Subscribe(ctx, queue, client.SubscribeOptions{Credit: 50, AutoCredit: true})
	if err != nil {
		t.Fatal(err)
	}
	for i, want := range names(0, accepted) {
		d, err := con.Next(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if string(d.Payload) != want {
			t.Fatalf("delivery %d through %s: %q, want %q", i, other.name, d.Payload, want)
		}
		if err := d.Accept(ctx); err != nil {
			t.Fatalf("accept %d: %v", i, err)
		}
	}
	if err := con.Cancel(ctx); err != nil {
		t.Fatal(err)
	}

	killed := time.Now()
	mnode.signal(syscall.SIGKILL)
	newMaster := c.waitNewMaster(g, master)
	t.Logf("kill -9 of the master: group %d had master %d after %v", g, newMaster, time.Since(killed).Round(time.Millisecond))
	c.consumeAll(c.nodeOf(newMaster), queue, names(accepted, total))
}

// TestControllerAddrsRefused: -controller-addrs is refused with a clear
// error beside an embedded member, on a controller-only node, and
// without a data directory; a broker whose controller group does not
// answer fails to start within -controller-wait, saying so.
func TestControllerAddrsRefused(t *testing.T) {
	dir := t.TempDir()
	addr := testutil.FreeAddr(t)
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"-controller-addrs", addr, "-controller-peers", "1=" + testutil.FreeAddr(t), "-controller-id", "1"}, "not both"},
		{[]string{"-controller-addrs", addr, "-controller", testutil.FreeAddr(t)}, "exclude the in-process controller"},
		{[]string{"-controller-addrs", addr, "-role", "controller", "-controller-peers", "1=" + testutil.FreeAddr(t), "-controller-id", "1"}, "controller-only node"},
		{[]string{"-controller-addrs", addr + "," + addr}, "given twice"},
		{[]string{"-controller-addrs", addr, "-controller-wait", "1s"}, "did not answer"},
	} {
		logPath := filepath.Join(dir, fmt.Sprintf("refused-%d.log", len(tc.want)))
		args := append([]string{"-data", t.TempDir(), "-listen", testutil.FreeAddr(t), "-admin", ""}, tc.args...)
		p := testutil.StartBerthd(t, logPath, args...)
		err := p.Wait(t, 30*time.Second)
		raw, _ := os.ReadFile(logPath)
		if err == nil || !strings.Contains(string(raw), tc.want) {
			t.Fatalf("berthd %v: exit %v, want a failure saying %q; log:\n%s", tc.args, err, tc.want, raw)
		}
	}
}
