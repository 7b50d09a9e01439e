package clustertest

import (
	"context"
	"fmt"
	"slices"
	"syscall"
	"testing"
	"time"

	"github.com/berthmq/berth/client"
	"github.com/berthmq/berth/controlplane/ctlapi"
	"github.com/berthmq/berth/controlplane/ctlclient"
	"github.com/berthmq/berth/internal/testutil"
)

// Failover of a group whose master is also the controller's leader: the
// broker that dies takes the controller leader with it, so the new leader
// never sees that broker's connection close. These tests run the brokers
// with a broker timeout of a minute so that only the mechanisms meant to
// find the dead master early can pass them within their bounds; the time
// taken is logged, and measured by perf/cmd/failover-bench --leader-master.

// ctlLeader is the broker process whose controller member leads, and its
// broker id.
func (c *rcluster) ctlLeader() (*node, uint32, error) {
	ctx, cancel := context.WithTimeout(c.ctx, 2*time.Second)
	defer cancel()
	members, leader, err := c.cl.MemberList(ctx)
	if err != nil {
		return nil, 0, err
	}
	for _, n := range c.nodes {
		if n.ctl == members[leader] {
			id, err := c.brokerIDOf(n)
			return n, id, err
		}
	}
	return nil, 0, fmt.Errorf("controller leader %d (%s) is no broker of the cluster", leader, members[leader])
}

// brokerIDOf is the broker id of process n.
func (c *rcluster) brokerIDOf(n *node) (uint32, error) {
	ctx, cancel := context.WithTimeout(c.ctx, 2*time.Second)
	defer cancel()
	bs, err := c.cl.GetBrokers(ctx, ctlapi.ReadConsistent)
	if err != nil {
		return 0, err
	}
	for _, b := range bs {
		if len(b.Addrs) > 0 && b.Addrs[0] == n.client {
			return b.ID, nil
		}
	}
	return 0, fmt.Errorf("%s is not registered", n.name)
}

// masterOnLeader moves group g's master onto the broker that leads the
// controller, by elections preferring it, and waits until that broker
// serves the group with every replica in sync. It returns the broker's
// process and id, and the group's epoch.
func (c *rcluster) masterOnLeader(g uint32) (*node, uint32, uint32) {
	c.t.Helper()
	var ln *node
	var lid, epoch uint32
	testutil.WaitFor(c.t, 60*time.Second, func() error {
		var err error
		if ln, lid, err = c.ctlLeader(); err != nil {
			return err
		}
		gr := c.group(g)
		if gr.Master != lid {
			ctx, cancel := context.WithTimeout(c.ctx, 5*time.Second)
			defer cancel()
			_, err := c.cl.ElectMaster(ctx, []uint32{g}, lid)
			return fmt.Errorf("group %d: master %d, not the controller leader %d (elected: %v)", g, gr.Master, lid, err)
		}
		if len(gr.SyncStateSet) != len(gr.Replicas) {
			return fmt.Errorf("group %d: set %v of %v", g, gr.SyncStateSet, gr.Replicas)
		}
		role, _, err := c.role(ln, g)
		if err != nil {
			return err
		}
		if role != "master" {
			return fmt.Errorf("%s does not serve group %d yet (%q)", ln.name, g, role)
		}
		epoch = gr.Epoch
		// Still the controller's leader?
		if again, _, err := c.ctlLeader(); err != nil || again != ln {
			return fmt.Errorf("the controller leader moved (%v)", err)
		}
		return nil
	})
	return ln, lid, epoch
}

// newMasterWithin waits up to within for the controller to give group g a
// master other than old, and returns it with the group's epoch.
func (c *rcluster) newMasterWithin(g, old uint32, within time.Duration, why string) (uint32, uint32) {
	c.t.Helper()
	deadline := time.Now().Add(within)
	for {
		// Short reads: one sent during the controller's election may be
		// redirected to the old leader, frozen or dead, and hang until
		// its timeout; the logged time is then late by at most that.
		ctx, cancel := context.WithTimeout(c.ctx, 250*time.Millisecond)
		gr, err := c.cl.GetReplicaInfo(ctx, ctlapi.ReadConsistent, g)
		cancel()
		if err != nil {
			gr = ctlapi.Group{ID: g}
		}
		if gr.Master != 0 && gr.Master != old {
			return gr.Master, gr.Epoch
		}
		if time.Now().After(deadline) {
			c.t.Fatalf("group %d has no new master %v after its master %d stopped (controller: master %d epoch %d set %v): %s",
				g, within, old, gr.Master, gr.Epoch, gr.SyncStateSet, why)
		}
		select {
		case <-c.ctx.Done():
			c.t.Fatal(c.ctx.Err())
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// publishAt publishes msgs at n once n takes publishes (it may have just
// become master), persistent, each completed before the next.
func (c *rcluster) publishAt(n *node, queue string, msgs []string) {
	c.t.Helper()
	conn := dial(c.t, c.ctx, n.client)
	testutil.WaitFor(c.t, 30*time.Second, func() error {
		return conn.Publish(c.ctx, "", queue, []byte(msgs[0]), client.PublishOptions{Persistent: true})
	})
	c.publishAll(conn, queue, msgs[1:])
}

// TestFailoverKillMasterLeadingController: kill -9 of the broker that is
// both group g's master and the controller's leader. The brokers' timeout
// is a minute and a new controller leader's grace a third of it: the
// group gets a new master within 15 s only because a follower whose
// connection from the master dropped asks the controller for the election
// (and heartbeats first, so that it is a candidate at the new leader). The
// new master holds every completed publish, in order, and takes new ones.
func TestFailoverKillMasterLeadingController(t *testing.T) {
	testutil.Long(t, "failover of a killed master that leads the controller")
	const groups, before, after = 3, 200, 50
	ctx, cancel := context.WithTimeout(context.Background(), 150*time.Second)
	defer cancel()
	c := startReplicatedWith(t, ctx, groups, 3, 0, "-controller-broker-timeout", "60s", "-controller-heartbeat-ms", "3000")
	const queue = "ctlfail-kill"
	g, _, _, conn := c.declare(queue, groups)
	c.publishAll(conn, queue, names(0, before/2))
	ln, lid, epoch := c.masterOnLeader(g)
	c.publishAt(ln, queue, names(before/2, before))
	c.waitReady(queue, before)
	if again, _, err := c.ctlLeader(); err != nil || again != ln {
		t.Skipf("the controller leader moved off %s before the kill (%v); the case is not set up", ln.name, err)
	}

	killed := time.Now()
	ln.signal(syscall.SIGKILL)
	nm, nepoch := c.newMasterWithin(g, lid, 15*time.Second,
		"without the followers' request the new controller leader waits out its 20 s grace")
	t.Logf("kill -9 of %s (broker %d, master of group %d at epoch %d and controller leader): broker %d master at epoch %d after %v",
		ln.name, lid, g, epoch, nm, nepoch, time.Since(killed).Round(time.Millisecond))
	if nepoch <= epoch {
		t.Fatalf("new master %d at epoch %d, not past the dead master's %d", nm, nepoch, epoch)
	}
	nnode := c.nodeOf(nm)
	c.publishAt(nnode, queue, names(before, before+after))
	c.consumeAll(nnode, queue, names(0, before+after))
	// The controller lives on in the two members left.
	if nl, _, err := c.ctlLeader(); err != nil || nl == ln {
		t.Fatalf("controller leader after the kill: %v %v", nl, err)
	}
}

// TestFailoverFreezeMasterLeadingController: SIGSTOP of the broker that is
// both group g's master and the controller's leader. No connection closes;
// with a broker timeout of a minute, the group moves within 20 s only
// because the new controller leader counts the silent broker dead after
// its grace (1 s here). Brokers heartbeat every 3 s, so the live ones are
// candidates at the new leader in time only because they heartbeat to it
// as soon as their embedded member sees it elected: the election goes
// straight to a new master, with no epoch left without one. Thawed, the
// old master is fenced: it steps down, and every member holds the same
// queue, which the new master delivers whole and in order.
func TestFailoverFreezeMasterLeadingController(t *testing.T) {
	testutil.Long(t, "failover of a frozen master that leads the controller")
	const groups, before, after = 3, 200, 50
	ctx, cancel := context.WithTimeout(context.Background(), 150*time.Second)
	defer cancel()
	c := startReplicatedWith(t, ctx, groups, 3, 0, "-controller-broker-timeout", "60s",
		"-controller-leader-grace", "1s", "-controller-heartbeat-ms", "3000")
	const queue = "ctlfail-freeze"
	g, _, _, conn := c.declare(queue, groups)
	c.publishAll(conn, queue, names(0, before/2))
	ln, lid, epoch := c.masterOnLeader(g)
	c.publishAt(ln, queue, names(before/2, before))
	c.waitReady(queue, before)
	if again, _, err := c.ctlLeader(); err != nil || again != ln {
		t.Skipf("the controller leader moved off %s before the freeze (%v); the case is not set up", ln.name, err)
	}

	// The test's own controller client asks only the live members from
	// now on: a request to the frozen one would hang until its timeout.
	var live []string
	for _, n := range c.nodes {
		if n != ln {
			live = append(live, n.ctl)
		}
	}
	all := c.cl
	c.cl = ctlclient.NewClient(live)
	defer func() { c.cl.Close(); c.cl = all }()
	frozen := time.Now()
	ln.signal(syscall.SIGSTOP)
	thawed := false
	defer func() {
		if !thawed {
			ln.signal(syscall.SIGCONT)
		}
	}()
	nm, nepoch := c.newMasterWithin(g, lid, 20*time.Second,
		"without the new controller leader's grace it waits out the 60 s broker timeout")
	t.Logf("SIGSTOP of %s (broker %d, master of group %d at epoch %d and controller leader): broker %d master at epoch %d after %v",
		ln.name, lid, g, epoch, nm, nepoch, time.Since(frozen).Round(time.Millisecond))
	if nepoch != epoch+1 {
		t.Fatalf("new master at epoch %d after %d: the new controller leader counted live brokers dead first (they did not heartbeat to it within its grace)", nepoch, epoch)
	}
	nnode := c.nodeOf(nm)
	c.publishAt(nnode, queue, names(before, before+after))
	ln.signal(syscall.SIGCONT)
	thawed = true

	testutil.WaitFor(t, 30*time.Second, func() error {
		role, e, err := c.role(ln, g)
		if err != nil {
			return err
		}
		if role == "master" || e < nepoch {
			return fmt.Errorf("%s: %s of group %d at epoch %d, want a follower at %d or later", ln.name, role, g, e, nepoch)
		}
		for _, n := range c.nodes {
			ready, unacked, err := c.depth(n, queue)
			if err != nil {
				return err
			}
			if ready != before+after || unacked != 0 {
				return fmt.Errorf("%s holds %d ready, %d unacked; want %d/0", n.name, ready, unacked, before+after)
			}
		}
		return nil
	})
	if got := c.group(g); !slices.Contains(got.Replicas, lid) {
		t.Fatalf("group %d replicas %v lost broker %d", g, got.Replicas, lid)
	}
	c.consumeAll(nnode, queue, names(0, before+after))
}
