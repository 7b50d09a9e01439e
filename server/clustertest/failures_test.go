package clustertest

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/berthmq/berth/client"
	"github.com/berthmq/berth/internal/testutil"
)

// dataDir is the -data directory of n.
func (n *node) dataDir() string {
	for i, a := range n.args {
		if a == "-data" && i+1 < len(n.args) {
			return n.args[i+1]
		}
	}
	return ""
}

// cutGroupJournalTail drops the last bytes of the newest segment of n's
// group journal, as a disk that lost its unsynced tail would.
func cutGroupJournalTail(t *testing.T, n *node, bytes int64) {
	t.Helper()
	dir := filepath.Join(n.dataDir(), "groups")
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var segs []string
	for _, e := range ents {
		if strings.HasSuffix(e.Name(), ".seg") {
			segs = append(segs, e.Name())
		}
	}
	if len(segs) == 0 {
		t.Fatalf("%s: no group journal segment in %s", n.name, dir)
	}
	sort.Strings(segs)
	p := filepath.Join(dir, segs[len(segs)-1])
	st, err := os.Stat(p)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(p, max(st.Size()-bytes, st.Size()/2)); err != nil {
		t.Fatal(err)
	}
}

// TestReplicatedQueueThroughFailures publishes to a replicated queue on
// three berthd while, in turn: a follower is killed (kill -9) and later
// restarted; the master is killed and restarted, and the new master is
// killed as soon as it is elected (two failovers in quick succession); a
// follower is killed and restarted with the tail of its group journal
// cut off. Every publish the client saw complete is delivered exactly
// once, in publish order; one that failed (its outcome unknown) is
// delivered at most once; every member ends with the same messages.
func TestReplicatedQueueThroughFailures(t *testing.T) {
	testutil.Long(t, "a replicated queue through kills and restarts")
	const groups = 3
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Second)
	defer cancel()
	c := startReplicated(t, ctx, groups)
	const queue = "failures"
	g, master, mnode, conn := c.declare(queue, groups)

	var done, ambiguous []string
	seq := 0
	var lastDone time.Time
	var longestGap time.Duration
	// publish sends n messages, one at a time, to the group's master,
	// following it through failovers.
	publish := func(n int) {
		t.Helper()
		phase := time.Now()
		for k := 0; k < n; {
			if time.Since(phase) > 40*time.Second {
				var views []string
				for _, nd := range c.nodes {
					var v any
					if err := c.getJSON(nd, "/v1/groups", &v); err == nil {
						views = append(views, fmt.Sprintf("%s: %v", nd.name, v))
					} else {
						views = append(views, fmt.Sprintf("%s: %v", nd.name, err))
					}
				}
				t.Fatalf("no publish completed for 40 s; controller: %+v\n%s", c.group(g), strings.Join(views, "\n"))
			}
			seq++
			m := fmt.Sprintf("m%05d", seq)
			pctx, pcancel := context.WithTimeout(ctx, 5*time.Second)
			err := conn.Publish(pctx, "", queue, []byte(m), client.PublishOptions{Persistent: true})
			pcancel()
			if err == nil {
				now := time.Now()
				if !lastDone.IsZero() && now.Sub(lastDone) > longestGap {
					longestGap = now.Sub(lastDone)
				}
				lastDone = now
				done = append(done, m)
				k++
				phase = now
				continue
			}
			ambiguous = append(ambiguous, m)
			if ctx.Err() != nil {
				t.Fatalf("publish %s: %v", m, err)
			}
			// The master may have changed: publish to the controller's
			// (dialling may fail while it is down or starting).
			time.Sleep(20 * time.Millisecond)
			if gr := c.group(g); gr.Master != 0 && (gr.Master != master || conn.Err() != nil || errors.Is(err, client.ErrOutcomeUnknown)) {
				n := c.nodeOf(gr.Master)
				dctx, dcancel := context.WithTimeout(ctx, 2*time.Second)
				cn, derr := client.Dial(dctx, n.client)
				dcancel()
				if derr == nil {
					conn.Close()
					conn, master, mnode = cn, gr.Master, n
				}
			}
		}
	}
	follower := func() *node {
		for _, n := range c.nodes {
			if n != mnode {
				return n
			}
		}
		return nil
	}
	inSync := func() {
		t.Helper()
		testutil.WaitFor(t, 30*time.Second, func() error {
			gr := c.group(g)
			if len(gr.SyncStateSet) != 3 {
				return fmt.Errorf("group %d: set %v", g, gr.SyncStateSet)
			}
			return nil
		})
	}

	// 1. A follower killed mid-stream, then restarted.
	publish(100)
	f := follower()
	f.signal(syscall.SIGKILL)
	lastDone, longestGap = time.Now(), 0
	publish(100)
	t.Logf("kill -9 of a follower: the longest gap between completed publishes was %v", longestGap.Round(time.Millisecond))
	f.stop(t, syscall.SIGKILL)
	f.start(t)
	f.waitUp(t, 20*time.Second)
	inSync()
	publish(50)

	// 2. Two failovers in quick succession.
	old := mnode
	old.signal(syscall.SIGKILL)
	second := c.waitNewMaster(g, master)
	old.stop(t, syscall.SIGKILL)
	old.start(t)
	sn := c.nodeOf(second)
	sn.signal(syscall.SIGKILL)
	// Restarted at once, as a supervisor would: if the second master
	// was the only member in sync when it died, the group waits for it
	// (no unclean election).
	sn.stop(t, syscall.SIGKILL)
	sn.start(t)
	publish(100)
	old.waitUp(t, 20*time.Second)
	sn.waitUp(t, 20*time.Second)
	inSync()
	publish(50)

	// 3. A follower whose journal lost its tail rejoins.
	f = follower()
	f.signal(syscall.SIGKILL)
	f.stop(t, syscall.SIGKILL)
	cutGroupJournalTail(t, f, 4096)
	publish(50)
	f.start(t)
	f.waitUp(t, 20*time.Second)
	inSync()
	publish(50)

	// Every member holds the same messages; then they are consumed from
	// the master.
	testutil.WaitFor(t, 30*time.Second, func() error {
		var views []string
		var first int
		for i, n := range c.nodes {
			ready, unacked, err := c.depth(n, queue)
			if err != nil {
				return err
			}
			views = append(views, fmt.Sprintf("%s %d/%d", n.name, ready, unacked))
			if i == 0 {
				first = ready
			} else if ready != first {
				return fmt.Errorf("members differ: %s", strings.Join(views, ", "))
			}
			if ready < len(done) {
				return fmt.Errorf("%s holds %d, %d publishes completed", n.name, ready, len(done))
			}
		}
		return nil
	})
	ready, _, err := c.depth(mnode, queue)
	if err != nil {
		t.Fatal(err)
	}
	got := takeAll(t, ctx, mnode, queue, ready)
	checkDeliveries(t, got, done, nil, ambiguous)
	if len(got) > len(done)+len(ambiguous) {
		t.Fatalf("%d deliveries for %d publishes", len(got), len(done)+len(ambiguous))
	}
	t.Logf("%d publishes completed, %d of unknown outcome (%d of those delivered)", len(done), len(ambiguous), len(got)-len(done))
}

// takeAll subscribes to queue at n and takes count deliveries, accepting
// each (AutoCredit gives the credit back as they settle); it returns
// their payloads in delivery order.
func takeAll(t *testing.T, ctx context.Context, n *node, queue string, count int) []string {
	t.Helper()
	cc := dial(t, ctx, n.client)
	con, err := cc.Subscribe(ctx, queue, client.SubscribeOptions{Credit: 500, AutoCredit: true})
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for range count {
		nctx, ncancel := context.WithTimeout(ctx, 10*time.Second)
		d, err := con.Next(nctx)
		ncancel()
		if err != nil {
			t.Fatalf("after %d of %d deliveries: %v", len(got), count, err)
		}
		if err := d.Accept(ctx); err != nil {
			t.Fatalf("accept after %d deliveries: %v", len(got), err)
		}
		got = append(got, string(d.Payload))
	}
	return got
}

// checkDeliveries checks deliveries got, payloads named in publish
// order: each of once came exactly once, none of never came, none of
// maybe (publishes of unknown outcome) came twice, and they came in
// publish order.
func checkDeliveries(t *testing.T, got, once, never, maybe []string) {
	t.Helper()
	seen := map[string]int{}
	for _, m := range got {
		seen[m]++
	}
	for _, m := range once {
		if seen[m] != 1 {
			t.Fatalf("completed publish %s delivered %d times", m, seen[m])
		}
	}
	for _, m := range never {
		if seen[m] != 0 {
			t.Fatalf("%s delivered %d times, want never", m, seen[m])
		}
	}
	for _, m := range maybe {
		if seen[m] > 1 {
			t.Fatalf("publish %s of unknown outcome delivered %d times", m, seen[m])
		}
	}
	for i := 1; i < len(got); i++ {
		if got[i] < got[i-1] {
			t.Fatalf("deliveries out of publish order at %d of %d: ... %v ...", i, len(got), got[max(0, i-5):min(len(got), i+5)])
		}
	}
}
