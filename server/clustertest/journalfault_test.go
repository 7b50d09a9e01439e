package clustertest

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/berthmq/berth/client"
	"github.com/berthmq/berth/controlplane/ctlapi"
	"github.com/berthmq/berth/internal/testutil"
	"github.com/berthmq/berth/server"
	"github.com/berthmq/berth/wire"
)

// readyz is n's /readyz status code and body.
func (c *rcluster) readyz(n *node) (int, string, error) {
	cl := http.Client{Timeout: 2 * time.Second}
	resp, err := cl.Get("http://" + c.admins[n] + "/readyz")
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 1<<16))
	return resp.StatusCode, string(b), err
}

// TestGroupJournalFailure (issue 25, item 2): the group journal of one
// broker fails with ENOSPC, through the fault layer berthd puts over the
// real file system in tests (server.GroupJournalFaultEnv). On a follower:
// the group goes on without it, its /readyz names the failure, and an
// election after the master's kill passes over it; restarted with the
// fault gone, it rejoins the SyncStateSet. On the master: it steps down
// and another broker takes over, the publishes meanwhile fail with
// unavailable (never internal), and no completed publish is lost.
func TestGroupJournalFailure(t *testing.T) {
	testutil.Long(t, "a group journal failing on a member")
	const faultFile = "groups-fault"
	t.Setenv(server.GroupJournalFaultEnv, faultFile)
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	c := startReplicatedWith(t, ctx, 1, 3, 3)
	const queue = "jfault"
	g, master, mnode, conn := c.declare(queue, 1)
	conn.Close()
	c.declareEverywhere(queue)
	ids := c.brokerIDs()
	faulty := func(n *node, on bool) {
		p := filepath.Join(dataDir(n), faultFile)
		var err error
		if on {
			err = os.WriteFile(p, nil, 0o644)
		} else {
			err = os.Remove(p)
		}
		if err != nil {
			t.Fatal(err)
		}
	}

	// A producer at a broker of the test's choice, publishing until
	// stopped; completed publishes must all be in the queue at the end,
	// and every failure must be a retryable one.
	var mu sync.Mutex
	completed := map[int]bool{}
	var failures []string
	next := 0
	produce := func(at *node, stop <-chan struct{}) <-chan struct{} {
		done := make(chan struct{})
		go func() {
			defer close(done)
			pc := dial(t, ctx, at.client)
			defer pc.Close()
			for {
				select {
				case <-stop:
					return
				default:
				}
				mu.Lock()
				i := next
				next++
				mu.Unlock()
				err := pc.Publish(ctx, "", queue, []byte(fmt.Sprintf("p%06d", i)), client.PublishOptions{Persistent: true})
				mu.Lock()
				var se *client.Error
				switch {
				case err == nil:
					completed[i] = true
				case errors.As(err, &se) && se.Code == wire.CodeUnavailable, errors.Is(err, client.ErrOutcomeUnknown):
					time.Sleep(20 * time.Millisecond)
				default:
					failures = append(failures, err.Error())
				}
				mu.Unlock()
				time.Sleep(2 * time.Millisecond)
			}
		}()
		return done
	}

	// 1. A follower's group journal fails.
	var f, third *node
	for _, n := range c.nodes {
		switch {
		case n == mnode:
		case f == nil:
			f = n
		default:
			third = n
		}
	}
	stop := make(chan struct{})
	done := produce(mnode, stop)
	faulty(f, true)
	testutil.WaitFor(t, 20*time.Second, func() error {
		code, body, err := c.readyz(f)
		if err != nil {
			return err
		}
		if code != http.StatusServiceUnavailable || !strings.Contains(body, "group journal failed") {
			return fmt.Errorf("%s /readyz %d %q", f.name, code, body)
		}
		return nil
	})
	testutil.WaitFor(t, 20*time.Second, func() error {
		gr := c.group(g)
		if gr.Master != master || slices.Contains(gr.SyncStateSet, ids[f]) {
			return fmt.Errorf("group %d: master %d, set %v: want master %d and %s (broker %d) out of the set", g, gr.Master, gr.SyncStateSet, master, f.name, ids[f])
		}
		return nil
	})
	mu.Lock()
	before := len(completed)
	mu.Unlock()
	testutil.WaitFor(t, 20*time.Second, func() error {
		mu.Lock()
		defer mu.Unlock()
		if len(completed) < before+100 {
			return fmt.Errorf("%d publishes completed since the follower failed", len(completed)-before)
		}
		return nil
	})
	close(stop)
	<-done
	t.Logf("%s (broker %d) failed as a follower; the group went on (%d publishes completed)", f.name, ids[f], len(completed))

	// The master dies: the election passes over the failed follower.
	mnode.kill()
	newMaster := c.waitNewMaster(g, master)
	if newMaster == ids[f] {
		t.Fatalf("broker %d, whose group journal failed, was elected master", newMaster)
	}
	if newMaster != ids[third] {
		t.Fatalf("new master %d, want %d", newMaster, ids[third])
	}
	mnode.start(t)
	mnode.waitUp(t, 30*time.Second)

	// Restarted once the fault is gone, the follower rejoins.
	faulty(f, false)
	f.stop(t, syscall.SIGTERM)
	f.start(t)
	f.waitUp(t, 30*time.Second)
	master, mnode = c.waitServing(g)
	testutil.WaitFor(t, 20*time.Second, func() error {
		code, body, err := c.readyz(f)
		if err != nil || code != http.StatusOK {
			return fmt.Errorf("%s /readyz %d %q %v", f.name, code, body, err)
		}
		return nil
	})

	// 2. The master's group journal fails, with a producer at it.
	stop = make(chan struct{})
	done = produce(mnode, stop)
	time.Sleep(300 * time.Millisecond)
	faulty(mnode, true)
	next2 := c.waitNewMaster(g, master)
	testutil.WaitFor(t, 20*time.Second, func() error {
		code, body, err := c.readyz(mnode)
		if err != nil {
			return err
		}
		if code != http.StatusServiceUnavailable || !strings.Contains(body, "group journal failed") {
			return fmt.Errorf("%s /readyz %d %q", mnode.name, code, body)
		}
		return nil
	})
	mu.Lock()
	before = len(completed)
	mu.Unlock()
	// Publishes at the failed broker go on: it forwards them to the new
	// master.
	testutil.WaitFor(t, 20*time.Second, func() error {
		mu.Lock()
		defer mu.Unlock()
		if len(completed) < before+100 {
			return fmt.Errorf("%d publishes completed since the master failed", len(completed)-before)
		}
		return nil
	})
	close(stop)
	<-done
	t.Logf("%s (broker %d) failed as master; broker %d took over", mnode.name, master, next2)

	mu.Lock()
	defer mu.Unlock()
	for i, e := range failures {
		if i < 10 {
			t.Errorf("a publish failed with an error that is not retryable: %s", e)
		}
	}
	// No completed publish is lost.
	nn := c.nodeOf(next2) // the failed broker stays out of the set
	rc := dial(t, ctx, nn.client)
	defer rc.Close()
	con, err := rc.Subscribe(ctx, queue, client.SubscribeOptions{Credit: 1000, AutoCredit: true, AckMode: client.AckNone})
	if err != nil {
		t.Fatal(err)
	}
	got := map[int]int{}
	for {
		nctx, ncancel := context.WithTimeout(ctx, 3*time.Second)
		d, err := con.Next(nctx)
		ncancel()
		if err != nil {
			break
		}
		i, _ := strconv.Atoi(strings.TrimPrefix(string(d.Payload), "p"))
		got[i]++
	}
	lost := 0
	for i := range completed {
		if got[i] == 0 {
			lost++
		}
	}
	t.Logf("%d publishes completed, %d messages drained, %d completed ones lost", len(completed), len(got), lost)
	if lost > 0 {
		t.Errorf("%d completed publishes lost", lost)
	}
}

// TestGroupJournalUnopenable: a broker whose group journal cannot even be
// opened (the fault file is there before the cluster gets its groups)
// serves none of them and says so: /readyz names the failure, it stops
// heartbeating, so the controller never makes it the group's master, and
// a publish through it is forwarded to the master the others elected.
// Before, the manager logged the error and the broker went on reporting
// ready and heartbeating.
func TestGroupJournalUnopenable(t *testing.T) {
	const faultFile = "groups-fault"
	t.Setenv(server.GroupJournalFaultEnv, faultFile)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c := startBrokers(t, ctx, 3)
	bad := c.nodes[0]
	if err := os.WriteFile(filepath.Join(dataDir(bad), faultFile), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	ids := c.brokerIDs()
	info, err := c.cl.GetClusterInfo(ctx, ctlapi.ReadConsistent)
	if err != nil {
		t.Fatal(err)
	}
	cfg := info.Config
	cfg.Groups, cfg.Replicas = 1, 3
	if err := c.cl.SetClusterConfig(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, 20*time.Second, func() error {
		code, body, err := c.readyz(bad)
		if err != nil {
			return err
		}
		if code != http.StatusServiceUnavailable || !strings.Contains(body, "group journal failed") {
			return fmt.Errorf("%s /readyz %d %q", bad.name, code, body)
		}
		return nil
	})
	var master uint32
	testutil.WaitFor(t, 30*time.Second, func() error {
		gr := c.group(0)
		if gr.Master == 0 || gr.Master == ids[bad] {
			return fmt.Errorf("group 0's master is %d; %s is %d", gr.Master, bad.name, ids[bad])
		}
		master = gr.Master
		return nil
	})
	const queue = "junopen"
	conn := dial(t, ctx, c.nodeOf(master).client)
	if err := conn.DeclareQueue(ctx, queue, client.QueueOptions{Durable: true}); err != nil {
		t.Fatal(err)
	}
	conn.Close()
	pc := dial(t, ctx, bad.client)
	defer pc.Close()
	testutil.WaitFor(t, 20*time.Second, func() error {
		return pc.Publish(ctx, "", queue, []byte("x"), client.PublishOptions{Persistent: true})
	})
	if gr := c.group(0); gr.Master == ids[bad] {
		t.Fatalf("%s, whose group journal never opened, became the master", bad.name)
	}
}
