package clustertest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/berthmq/berth/client"
	"github.com/berthmq/berth/controlplane/ctlapi"
	"github.com/berthmq/berth/controlplane/ctlclient"
	"github.com/berthmq/berth/internal/testutil"
	"github.com/berthmq/berth/replication"
	"github.com/berthmq/berth/wire"
)

// rcluster is three berthd processes with replication groups and a
// 3-member controller, initialised with some groups.
type rcluster struct {
	t      testing.TB
	ctx    context.Context
	nodes  []*node
	admins map[*node]string
	cl     *ctlclient.Client
}

func startReplicated(t testing.TB, ctx context.Context, groups uint32) *rcluster {
	t.Helper()
	return startReplicatedN(t, ctx, groups, 3, 0)
}

// startProxying is startReplicated with -consume-at-replicas=false: a
// consumer at a follower is proxied to the group's master, as one at a
// broker outside the group's replica set always is. The tests of the
// proxy's behaviour run on it.
func startProxying(t testing.TB, ctx context.Context, groups uint32) *rcluster {
	t.Helper()
	return startReplicatedWith(t, ctx, groups, 3, 0, "-consume-at-replicas=false")
}

// startReplicatedN is startReplicated with brokers brokers (each embedding
// a controller member) and replicas brokers per group (0: the default).
func startReplicatedN(t testing.TB, ctx context.Context, groups uint32, brokers int, replicas uint32) *rcluster {
	t.Helper()
	return startReplicatedWith(t, ctx, groups, brokers, replicas)
}

// startBrokers starts brokers berthd brokers with replication groups'
// peer ports (each embedding a controller member) and waits until all are
// registered; the cluster has no groups until "cluster init".
func startBrokers(t testing.TB, ctx context.Context, brokers int, extra ...string) *rcluster {
	t.Helper()
	c := &rcluster{t: t, ctx: ctx, admins: map[*node]string{}}
	roles := make([]string, brokers)
	for i := range roles {
		roles[i] = "broker"
	}
	c.nodes = startGroupEach(t, func(_ int, n *node) []string {
		c.admins[n] = testutil.FreeAddr(t)
		// No rebalancing unless a test asks for it: these tests follow
		// masters through the failures they cause, and a handover of
		// their own would move one more (rebalance_test.go covers it).
		return append([]string{"-peer", testutil.FreeAddr(t), "-controller-heartbeat-ms", "200", "-admin", c.admins[n], "-group-rebalance", "0"}, extra...)
	}, roles...)
	var ctlAddrs []string
	for _, n := range c.nodes {
		ctlAddrs = append(ctlAddrs, n.ctl)
	}
	c.cl = ctlclient.NewClient(ctlAddrs)
	t.Cleanup(c.cl.Close)
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
	return c
}

// startReplicatedWith is startReplicatedN with more berthd flags for every
// broker (a later flag overrides an earlier one).
func startReplicatedWith(t testing.TB, ctx context.Context, groups uint32, brokers int, replicas uint32, extra ...string) *rcluster {
	t.Helper()
	c := startBrokers(t, ctx, brokers, extra...)
	info, err := c.cl.GetClusterInfo(ctx, ctlapi.ReadConsistent)
	if err != nil {
		t.Fatal(err)
	}
	cfg := info.Config
	cfg.Groups, cfg.Replicas = groups, replicas
	if err := c.cl.SetClusterConfig(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	return c
}

// group is the controller's record of group g. A read that fails (the
// controller may be electing a leader: its members run in the brokers the
// tests kill and freeze) returns a record with no master, so the waits
// below go on.
func (c *rcluster) group(g uint32) ctlapi.Group {
	ctx, cancel := context.WithTimeout(c.ctx, 2*time.Second)
	defer cancel()
	gr, err := c.cl.GetReplicaInfo(ctx, ctlapi.ReadConsistent, g)
	if err != nil {
		return ctlapi.Group{ID: g}
	}
	return gr
}

// nodeOf is the process of broker id.
func (c *rcluster) nodeOf(id uint32) *node {
	c.t.Helper()
	bs, err := c.cl.GetBrokers(c.ctx, ctlapi.ReadConsistent)
	if err != nil {
		c.t.Fatal(err)
	}
	for _, b := range bs {
		for _, n := range c.nodes {
			if b.ID == id && len(b.Addrs) > 0 && b.Addrs[0] == n.client {
				return n
			}
		}
	}
	c.t.Fatalf("no process for broker %d", id)
	return nil
}

func (c *rcluster) getJSON(n *node, path string, v any) error {
	resp, err := http.Get("http://" + c.admins[n] + path)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(resp.Body)
		return fmt.Errorf("%s %s: %s %s", n.name, path, resp.Status, b)
	}
	return json.NewDecoder(resp.Body).Decode(v)
}

// role is n's own view of its role in group g ("" if it runs no node yet).
func (c *rcluster) role(n *node, g uint32) (string, uint32, error) {
	var view struct {
		Groups []struct {
			Group uint32
			Role  string
			Epoch uint32
		}
	}
	if err := c.getJSON(n, "/v1/groups", &view); err != nil {
		return "", 0, err
	}
	for _, v := range view.Groups {
		if v.Group == g {
			return v.Role, v.Epoch, nil
		}
	}
	return "", 0, nil
}

// waitServing waits until the controller has a master for group g with
// all its replicas in sync and that broker's node serves as master; it
// returns the master's process.
func (c *rcluster) waitServing(g uint32) (uint32, *node) {
	c.t.Helper()
	var id uint32
	testutil.WaitFor(c.t, 30*time.Second, func() error {
		gr := c.group(g)
		if gr.Master == 0 || len(gr.Replicas) == 0 || len(gr.SyncStateSet) != len(gr.Replicas) {
			return fmt.Errorf("group %d: master %d, set %v", g, gr.Master, gr.SyncStateSet)
		}
		id = gr.Master
		return nil
	})
	n := c.nodeOf(id)
	testutil.WaitFor(c.t, 20*time.Second, func() error {
		role, _, err := c.role(n, g)
		if err != nil {
			return err
		}
		if role != "master" {
			return fmt.Errorf("%s does not serve group %d yet (%q)", n.name, g, role)
		}
		return nil
	})
	return id, n
}

// depth is n's ready and unacked counts of queue (-1, -1 if it lacks it).
func (c *rcluster) depth(n *node, queue string) (ready, unacked int, err error) {
	var qs []struct {
		Name           string
		Ready, Unacked int
	}
	if err := c.getJSON(n, "/v1/queues", &qs); err != nil {
		return 0, 0, err
	}
	for _, q := range qs {
		if q.Name == queue {
			return q.Ready, q.Unacked, nil
		}
	}
	return -1, -1, nil
}

// consumeAll takes want from queue at n, in order, without accepting: a
// try that fails leaves every message in the queue.
func (c *rcluster) consumeAll(n *node, queue string, want []string) {
	c.t.Helper()
	consumeRedialing(c.t, c.ctx, n, queue, want, false)
}

// declare declares the durable queue through its group's master, once
// that master serves, and returns the group, the master and a connection
// to it.
func (c *rcluster) declare(queue string, groups uint32) (uint32, uint32, *node, *client.Conn) {
	c.t.Helper()
	g := replication.GroupOf(queue, groups)
	master, mnode := c.waitServing(g)
	conn := dial(c.t, c.ctx, mnode.client)
	if err := conn.DeclareQueue(c.ctx, queue, client.QueueOptions{Durable: true}); err != nil {
		c.t.Fatal(err)
	}
	return g, master, mnode, conn
}

// waitNewMaster waits until the controller gives group g a master other
// than old, and returns it.
func (c *rcluster) waitNewMaster(g, old uint32) uint32 {
	c.t.Helper()
	var id uint32
	testutil.WaitFor(c.t, 30*time.Second, func() error {
		gr := c.group(g)
		if gr.Master == 0 || gr.Master == old {
			return fmt.Errorf("group %d: master %d", g, gr.Master)
		}
		id = gr.Master
		return nil
	})
	return id
}

// publishAll publishes msgs to queue, persistent, one at a time.
//
// A publish refused because the group has fewer replicas in sync than
// min-sync-replicas was not proposed, so it is sent again after a pause
// (a follower slowed down by -race on a loaded machine can fall out of
// the set for a moment); any other error fails the test.
func (c *rcluster) publishAll(conn *client.Conn, queue string, msgs []string) {
	c.t.Helper()
	for i, m := range msgs {
		deadline := time.Now().Add(20 * time.Second)
		for {
			err := conn.Publish(c.ctx, "", queue, []byte(m), client.PublishOptions{Persistent: true})
			if err == nil {
				break
			}
			var se *client.Error
			if !errors.As(err, &se) || se.Code != wire.CodeUnavailable || !strings.Contains(se.Text, "in sync") || time.Now().After(deadline) {
				c.t.Fatalf("publish %d to %s: %v", i, queue, err)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
}

// follower is a broker of the cluster other than n.
func (c *rcluster) follower(n *node) *node {
	for _, o := range c.nodes {
		if o != n {
			return o
		}
	}
	c.t.Fatal("a cluster of one broker")
	return nil
}

// waitReady waits until every member holds ready messages of queue.
func (c *rcluster) waitReady(queue string, ready int) {
	c.t.Helper()
	testutil.WaitFor(c.t, 20*time.Second, func() error {
		for _, n := range c.nodes {
			got, _, err := c.depth(n, queue)
			if err != nil {
				return err
			}
			if got != ready {
				return fmt.Errorf("%s holds %d ready, want %d", n.name, got, ready)
			}
		}
		return nil
	})
}

func names(from, to int) []string {
	var out []string
	for i := from; i < to; i++ {
		out = append(out, fmt.Sprintf("m%04d", i))
	}
	return out
}

// TestReplicatedQueueSurvivesMasterKill: three real brokers with
// replication groups. A durable queue's messages, published through its
// group's master, are replicated; the consumer accepts the first 200 of
// 500; kill -9 of the master; the new master delivers exactly the 300 not
// accepted, in order: no completed publish lost, no completed accept back.
func TestReplicatedQueueSurvivesMasterKill(t *testing.T) {
	const groups, total, accepted = 3, 500, 200
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	c := startReplicated(t, ctx, groups)
	const queue = "replicated"
	g, master, mnode, conn := c.declare(queue, groups)
	c.publishAll(conn, queue, names(0, total))
	// Every member holds the 500 (the followers adopted the queue from
	// the controller when its first event reached them).
	c.waitReady(queue, total)
	con, err := conn.Subscribe(ctx, queue, client.SubscribeOptions{Credit: 50, AutoCredit: true})
	if err != nil {
		t.Fatal(err)
	}
	for i, want := range names(0, accepted) {
		d, err := con.Next(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if string(d.Payload) != want {
			t.Fatalf("delivery %d: %q, want %q", i, d.Payload, want)
		}
		if err := d.Accept(ctx); err != nil {
			t.Fatalf("accept %d: %v", i, err)
		}
	}

	killed := time.Now()
	mnode.signal(syscall.SIGKILL)
	newMaster := c.waitNewMaster(g, master)
	t.Logf("kill -9 of the master: group %d had master %d after %v", g, newMaster, time.Since(killed).Round(time.Millisecond))
	nm := c.nodeOf(newMaster)
	c.consumeAll(nm, queue, names(accepted, total))

	// A purge is one event in the group log, not one per message, and the
	// surviving follower drops what it held.
	testutil.WaitFor(t, 20*time.Second, func() error {
		ready, unacked, err := c.depth(nm, queue)
		if err != nil || ready != total-accepted || unacked != 0 {
			return fmt.Errorf("new master: %d ready, %d unacked (%v)", ready, unacked, err)
		}
		return nil
	})
	before := c.lastIndex(nm, g)
	if before < total {
		t.Fatalf("group %d's log ends at %d after %d enqueues", g, before, total)
	}
	pc := dial(t, ctx, nm.client)
	if err := pc.Purge(ctx, queue); err != nil {
		t.Fatal(err)
	}
	if after := c.lastIndex(nm, g); after-before > 2 {
		t.Fatalf("purging %d messages took %d events in the group log", total-accepted, after-before)
	}
	testutil.WaitFor(t, 20*time.Second, func() error {
		for _, n := range c.nodes {
			if n == mnode {
				continue
			}
			if ready, _, err := c.depth(n, queue); err != nil || ready != 0 {
				return fmt.Errorf("%s holds %d ready after the purge (%v)", n.name, ready, err)
			}
		}
		return nil
	})

	// A deleted queue goes from the follower too.
	if err := pc.DeleteQueue(ctx, queue, client.QueueDeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, 20*time.Second, func() error {
		for _, n := range c.nodes {
			if n == mnode {
				continue
			}
			if ready, _, err := c.depth(n, queue); err != nil || ready != -1 {
				return fmt.Errorf("%s still has the deleted queue (%d ready, %v)", n.name, ready, err)
			}
		}
		return nil
	})
}

// lastIndex is the end of group g's log on n.
func (c *rcluster) lastIndex(n *node, g uint32) uint64 {
	c.t.Helper()
	var view struct {
		Groups []struct {
			Group     uint32
			LastIndex uint64 `json:"last_index"`
		}
	}
	if err := c.getJSON(n, "/v1/groups", &view); err != nil {
		c.t.Fatal(err)
	}
	for _, v := range view.Groups {
		if v.Group == g {
			return v.LastIndex
		}
	}
	c.t.Fatalf("%s runs no group %d", n.name, g)
	return 0
}

// TestFrozenMasterStepsDown: the group's master is frozen (SIGSTOP) past
// the controller's broker timeout while a consumer holds messages it has
// not accepted; another broker becomes master and takes publishes; thawed
// (SIGCONT), the old master learns the newer epoch, steps down, drops what
// it had applied ahead of the log (its consumer's acquires) and applies the
// committed log again, so its copy of the queue matches the others'. The
// new master then delivers every message not accepted, in order.
func TestFrozenMasterStepsDown(t *testing.T) {
	testutil.Long(t, "a frozen master steps down")
	const groups, total, accepted, held, more = 3, 300, 50, 50, 100
	ctx, cancel := context.WithTimeout(context.Background(), 150*time.Second)
	defer cancel()
	c := startReplicated(t, ctx, groups)
	const queue = "frozen"
	g, master, mnode, conn := c.declare(queue, groups)
	for _, m := range names(0, total) {
		if err := conn.Publish(ctx, "", queue, []byte(m), client.PublishOptions{Persistent: true}); err != nil {
			t.Fatal(err)
		}
	}
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
	if ready, unacked, err := c.depth(mnode, queue); err != nil || ready != total-accepted-held || unacked != held {
		t.Fatalf("master before the freeze: ready %d unacked %d (%v)", ready, unacked, err)
	}

	mnode.signal(syscall.SIGSTOP)
	newMaster := c.waitNewMaster(g, master)
	nnode := c.nodeOf(newMaster)
	nconn := dial(t, ctx, nnode.client)
	testutil.WaitFor(t, 30*time.Second, func() error {
		// The new master takes publishes once it serves.
		err := nconn.Publish(ctx, "", queue, []byte(names(total, total+1)[0]), client.PublishOptions{Persistent: true})
		if err != nil {
			var views []string
			for _, n := range c.nodes {
				if n == mnode {
					continue
				}
				var v any
				if gerr := c.getJSON(n, "/v1/groups", &v); gerr == nil {
					views = append(views, fmt.Sprintf("%s: %v", n.name, v))
				}
			}
			return fmt.Errorf("%w; controller %+v; %v", err, c.group(g), views)
		}
		return nil
	})
	for _, m := range names(total+1, total+more) {
		if err := nconn.Publish(ctx, "", queue, []byte(m), client.PublishOptions{Persistent: true}); err != nil {
			t.Fatal(err)
		}
	}
	mnode.signal(syscall.SIGCONT)

	// The old master steps down and its copy matches the committed log:
	// every message not accepted is ready, none is held.
	want := total - accepted + more
	testutil.WaitFor(t, 30*time.Second, func() error {
		role, epoch, err := c.role(mnode, g)
		if err != nil {
			return err
		}
		if role == "master" {
			return fmt.Errorf("%s still masters group %d (epoch %d)", mnode.name, g, epoch)
		}
		var views []string
		for _, n := range c.nodes {
			ready, unacked, err := c.depth(n, queue)
			if err != nil {
				return err
			}
			views = append(views, fmt.Sprintf("%s %d/%d", n.name, ready, unacked))
			if ready != want || unacked != 0 {
				return fmt.Errorf("ready/unacked: %s; want %d/0 everywhere", strings.Join(views, ", "), want)
			}
		}
		return nil
	})
	c.consumeAll(nnode, queue, names(accepted, total+more))
}

// TestReplicatedDeadLetters: messages rejected from a replicated queue
// reach its dead-letter queue on every member, and the source's removal
// is proposed only then: those the dead-letter queue refuses (it is full)
// stay in the group's log, and after kill -9 of the master the new one
// holds each message once, in the source or in the dead-letter queue.
func TestReplicatedDeadLetters(t *testing.T) {
	const groups, total, rejected, room = 3, 40, 15, 10
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	c := startReplicated(t, ctx, groups)
	const source = "dl-source"
	// A dead-letter queue in the same group, so the same broker masters
	// both (publishes are not forwarded between brokers yet).
	g := replication.GroupOf(source, groups)
	target := ""
	for i := 0; target == ""; i++ {
		if n := fmt.Sprintf("dl-target-%d", i); replication.GroupOf(n, groups) == g {
			target = n
		}
	}
	master, mnode := c.waitServing(g)
	conn := dial(t, ctx, mnode.client)
	if err := conn.DeclareQueue(ctx, target, client.QueueOptions{Durable: true, MaxLength: room, Overflow: client.OverflowRejectPublish}); err != nil {
		t.Fatal(err)
	}
	if err := conn.DeclareQueue(ctx, source, client.QueueOptions{Durable: true, DeadLetterKey: target}); err != nil {
		t.Fatal(err)
	}
	c.publishAll(conn, source, names(0, total))
	con, err := conn.Subscribe(ctx, source, client.SubscribeOptions{Credit: 5, AutoCredit: true})
	if err != nil {
		t.Fatal(err)
	}
	for i := range rejected {
		d, err := con.Next(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if err := d.Reject(ctx); err != nil {
			t.Fatalf("reject %d: %v", i, err)
		}
	}
	if err := con.Cancel(ctx); err != nil {
		t.Fatal(err)
	}
	conn.Close()
	// The followers hold in the source what the full dead-letter queue
	// refused, as acquired (the log has their acquires, not their
	// removals); the master dropped them from its view (it would only
	// get them back from the log).
	testutil.WaitFor(t, 20*time.Second, func() error {
		for _, n := range c.nodes {
			src, srcAcquired, err := c.depth(n, source)
			if err != nil {
				return err
			}
			dl, _, err := c.depth(n, target)
			if err != nil {
				return err
			}
			want, wantAcquired := total-rejected, rejected-room
			if n == mnode {
				wantAcquired = 0
			}
			if src != want || srcAcquired != wantAcquired || dl != room {
				return fmt.Errorf("%s: source %d ready and %d acquired (want %d and %d), dead letters %d (want %d)", n.name, src, srcAcquired, want, wantAcquired, dl, room)
			}
		}
		return nil
	})
	// Every member's /v1/queues names the queue's group and its master.
	for _, n := range c.nodes {
		var qs []struct {
			Name   string
			Group  *uint32
			Master uint32
		}
		if err := c.getJSON(n, "/v1/queues", &qs); err != nil {
			t.Fatal(err)
		}
		for _, q := range qs {
			if q.Name == source && (q.Group == nil || *q.Group != g || q.Master != master) {
				t.Fatalf("%s shows queue %s in group %v with master %d; want group %d, master %d", n.name, source, q.Group, q.Master, g, master)
			}
		}
	}
	mnode.signal(syscall.SIGKILL)
	nm := c.nodeOf(c.waitNewMaster(g, master))
	c.consumeAll(nm, target, names(0, room))
	c.consumeAll(nm, source, names(room, total))
}
