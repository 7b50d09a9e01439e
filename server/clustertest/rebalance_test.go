package clustertest

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/berthmq/berth/client"
	"github.com/berthmq/berth/internal/testutil"
	"github.com/berthmq/berth/wire"
)

// TestRebalanceAfterRestart: three real brokers rebalancing every
// second. A queue's group is mastered by its preferred broker P (the
// placement's first replica); a client on another broker X publishes
// through X and accepts the first 50 messages. kill -9 of P moves the
// group to another broker; P restarts, catches up, and after a second in
// sync gets the group handed back while X keeps publishing. Then every
// completed publish is delivered once, in order, none of the accepted
// ones comes back, and no publish refused as not taken (by its code:
// unavailable during the handover, among others) is delivered at all.
func TestRebalanceAfterRestart(t *testing.T) {
	testutil.Long(t, "masters rebalanced after a restart")
	const groups = 3
	ctx, cancel := context.WithTimeout(context.Background(), 150*time.Second)
	defer cancel()
	c := startReplicatedWith(t, ctx, groups, 3, 0, "-group-rebalance", "1s")
	const queue = "rebalance"
	g, master, pnode, _ := c.declare(queue, groups)
	if pref := c.group(g).Replicas[0]; pref != master {
		// The first election is decided from the heartbeats it finds;
		// should it have picked another broker, the rebalance moves the
		// group to its preferred one within seconds.
		testutil.WaitFor(t, 30*time.Second, func() error {
			if gr := c.group(g); gr.Master != pref {
				return fmt.Errorf("group %d: master %d, preferred %d", g, gr.Master, pref)
			}
			return nil
		})
		master, pnode = c.waitServing(g)
	}
	x := c.follower(pnode)
	conn := dial(t, ctx, x.client)
	if err := conn.DeclareQueue(ctx, queue, client.QueueOptions{Durable: true}); err != nil { // as X's clients would
		t.Fatal(err)
	}

	var (
		mu                       sync.Mutex
		done, ambiguous, refused []string
		seq                      int
		lastDone                 time.Time
		gaps                     []time.Duration // between completed publishes, in order
	)
	publishOne := func() {
		mu.Lock()
		seq++
		m := fmt.Sprintf("m%05d", seq)
		mu.Unlock()
		pctx, pcancel := context.WithTimeout(ctx, 5*time.Second)
		err := conn.Publish(pctx, "", queue, []byte(m), client.PublishOptions{Persistent: true})
		pcancel()
		mu.Lock()
		defer mu.Unlock()
		var se *client.Error
		switch {
		case err == nil:
			now := time.Now()
			if !lastDone.IsZero() {
				gaps = append(gaps, now.Sub(lastDone))
			}
			lastDone = now
			done = append(done, m)
		case errors.As(err, &se) && !errors.Is(err, client.ErrOutcomeUnknown) && se.Code.Outcome() == wire.OutcomeNotCarriedOut:
			// By its code, not its text (protocol 1.4): every such
			// refusal, not only the handover's, must never be delivered.
			refused = append(refused, m)
		default:
			ambiguous = append(ambiguous, m)
		}
		if err != nil {
			if len(refused)+len(ambiguous) <= 3 {
				t.Logf("publish %s: %v", m, err)
			}
			if ctx.Err() != nil {
				t.Errorf("publish %s: %v", m, err)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	completed := func() int { mu.Lock(); defer mu.Unlock(); return len(done) }
	publishN := func(n int) {
		t.Helper()
		for want := completed() + n; completed() < want; {
			if ctx.Err() != nil {
				t.Fatalf("%d of %d publishes completed before the deadline", completed(), want)
			}
			publishOne()
		}
	}

	publishN(100)
	mu.Lock()
	accepted := slices.Clone(done[:50])
	mu.Unlock()
	consumeRedialing(t, ctx, x, queue, accepted, true)

	// kill -9 of P: another broker takes the group.
	pnode.signal(syscall.SIGKILL)
	interim := c.nodeOf(c.waitNewMaster(g, master))
	publishN(100)
	pnode.stop(t, syscall.SIGKILL)
	pnode.start(t)
	pnode.waitUp(t, 20*time.Second)

	// X publishes all along while P catches up and gets the group back,
	// and a consumer on X takes and accepts messages all along too: its
	// settles keep committing through the handover's pause.
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(2)
	go func() {
		defer wg.Done()
		for {
			select {
			case <-stop:
				return
			default:
			}
			publishOne()
		}
	}()
	stopConsumer := make(chan struct{})
	live := liveConsumer{}
	go func() {
		defer wg.Done()
		live.run(ctx, x.client, queue, stopConsumer)
	}()
	mu.Lock()
	before := len(gaps)
	mu.Unlock()
	start := time.Now()
	testutil.WaitFor(t, 60*time.Second, func() error {
		gr := c.group(g)
		if gr.Master != master {
			return fmt.Errorf("group %d: master %d, set %v; preferred %d", g, gr.Master, gr.SyncStateSet, master)
		}
		role, _, err := c.role(pnode, g)
		if err != nil {
			return err
		}
		if role != "master" {
			return fmt.Errorf("%s does not serve group %d yet (%q)", pnode.name, g, role)
		}
		return nil
	})
	t.Logf("the preferred master had group %d back %v after its restart", g, time.Since(start).Round(time.Millisecond))
	// The metrics say so: the interim master made a handover (at least
	// this one), and P serves the group.
	for _, want := range []struct {
		n      *node
		series string
		least  float64
	}{{interim, "berth_group_handovers_total", 1}, {pnode, fmt.Sprintf("berth_group_master{group=%q}", fmt.Sprint(g)), 1},
		{pnode, "berth_group_journal_fsyncs_total", 1}, {pnode, "berth_group_journal_fsync_seconds_count", 1}} {
		testutil.WaitFor(t, 10*time.Second, func() error {
			resp, err := http.Get("http://" + c.admins[want.n] + "/metrics")
			if err != nil {
				return err
			}
			defer resp.Body.Close()
			body, err := io.ReadAll(resp.Body)
			if err != nil {
				return err
			}
			for _, line := range strings.Split(string(body), "\n") {
				if v, ok := strings.CutPrefix(line, want.series+" "); ok {
					if f, err := strconv.ParseFloat(v, 64); err == nil && f >= want.least {
						return nil
					}
					return fmt.Errorf("%s's /metrics: %s", want.n.name, line)
				}
			}
			return fmt.Errorf("%s's /metrics lacks %s", want.n.name, want.series)
		})
	}
	// One publisher at a time: publishes in flight together may land in
	// either order.
	close(stop)
	close(stopConsumer)
	wg.Wait()
	publishN(100)
	mu.Lock()
	var longest time.Duration
	for _, d := range gaps[before:] {
		longest = max(longest, d)
	}
	t.Logf("while the group was handed back: %d publishes completed, %d refused as not taken, %d of unknown outcome; longest gap between completions %v",
		len(gaps)-before, len(refused), len(ambiguous), longest.Round(time.Millisecond))
	mu.Unlock()

	// The live consumer's accepts: at least one must have committed while
	// the group was handed back.
	live.mu.Lock()
	liveOK, liveFailed := slices.Clone(live.accepted), slices.Clone(live.failed)
	again := slices.Clone(live.again)
	live.mu.Unlock()
	t.Logf("the consumer on %s accepted %d messages meanwhile (%d accepts failed, %d subscriptions)",
		x.name, len(liveOK), len(liveFailed), live.subscribes)
	if len(again) > 0 {
		t.Fatalf("delivered again to the consumer on %s after their accepts were answered OK: %v", x.name, again[:min(5, len(again))])
	}
	if len(liveOK) == 0 {
		t.Fatal("the consumer accepted nothing while the group was handed back")
	}
	// Every member holds the rest; consume it from X.
	taken := map[string]bool{}
	for _, m := range append(slices.Clone(liveOK), liveFailed...) {
		taken[m] = true
	}
	var once []string
	for _, m := range done[len(accepted):] {
		if !taken[m] {
			once = append(once, m)
		}
	}
	want := len(once)
	testutil.WaitFor(t, 30*time.Second, func() error {
		for _, n := range c.nodes {
			ready, _, err := c.depth(n, queue)
			if err != nil {
				return err
			}
			if ready < want {
				return fmt.Errorf("%s holds %d ready, %d completed publishes not accepted", n.name, ready, want)
			}
		}
		return nil
	})
	ready, _, err := c.depth(pnode, queue)
	if err != nil {
		t.Fatal(err)
	}
	got := takeAll(t, ctx, x, queue, ready)
	// Never: the accepted ones (before, and by the live consumer), and
	// those refused as not taken. Maybe: those whose accept failed.
	never := append(append(slices.Clone(accepted), refused...), liveOK...)
	checkDeliveries(t, got, once, never, append(slices.Clone(ambiguous), liveFailed...))
	for _, m := range refused {
		if slices.Contains(liveOK, m) || slices.Contains(liveFailed, m) {
			t.Fatalf("%s, refused as not taken, was delivered to the live consumer", m)
		}
	}
}

// liveConsumer takes and accepts messages of a queue through one broker
// until told to stop, subscribing again whenever its consumer or
// connection ends (a master moving ends the consumers it served).
type liveConsumer struct {
	mu       sync.Mutex
	accepted []string // accepted, the accept answered OK
	failed   []string // delivered, the accept failed: may come back
	again    []string // delivered again after an accept answered OK
	// subscribes counts the subscriptions.
	subscribes int
}

func (l *liveConsumer) run(ctx context.Context, addr, queue string, stop <-chan struct{}) {
	okSet := map[string]bool{}
	for {
		select {
		case <-stop:
			return
		case <-ctx.Done():
			return
		default:
		}
		conn, err := client.Dial(ctx, addr)
		if err != nil {
			time.Sleep(50 * time.Millisecond)
			continue
		}
		sctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		con, err := conn.Subscribe(sctx, queue, client.SubscribeOptions{Credit: 50, AutoCredit: true})
		cancel()
		if err != nil {
			conn.Close()
			time.Sleep(50 * time.Millisecond)
			continue
		}
		l.mu.Lock()
		l.subscribes++
		l.mu.Unlock()
		for err == nil {
			select {
			case <-stop:
				conn.Close()
				return
			default:
			}
			nctx, ncancel := context.WithTimeout(ctx, 200*time.Millisecond)
			var d *client.Delivery
			d, err = con.Next(nctx)
			ncancel()
			if errors.Is(err, context.DeadlineExceeded) && ctx.Err() == nil {
				err = nil // nothing ready yet
				continue
			}
			if err != nil {
				break
			}
			m := string(d.Payload)
			actx, acancel := context.WithTimeout(ctx, 5*time.Second)
			aerr := d.Accept(actx)
			acancel()
			l.mu.Lock()
			switch {
			case okSet[m]:
				l.again = append(l.again, m)
			case aerr == nil:
				okSet[m] = true
				l.accepted = append(l.accepted, m)
			default:
				l.failed = append(l.failed, m)
			}
			l.mu.Unlock()
		}
		conn.Close()
		time.Sleep(20 * time.Millisecond)
	}
}
