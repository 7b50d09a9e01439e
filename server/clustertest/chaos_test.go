package clustertest

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/berthmq/berth/client"
	"github.com/berthmq/berth/internal/testutil"
	"github.com/berthmq/berth/replication"
	"github.com/berthmq/berth/wire"
)

// chaosDefault is TestClusterChaos's run of faults in make test;
// BERTH_CHAOS (a duration, e.g. 5m) runs it longer, BERTH_CHAOS_SEED
// picks the fault schedule (the processes' timing is not replayable),
// BERTH_CHAOS_ARGS adds berthd flags (make chaos CHAOS_ARGS=...).
const chaosDefault = 6 * time.Second

// chaosQueue is one replicated queue's workload and what became of it.
type chaosQueue struct {
	name string
	mu   sync.Mutex
	// Publishes: completed must be delivered; failed (refused, or of
	// unknown outcome) may be, once.
	completed, failed map[int]bool
	// refused: failed publishes the broker said it did not take; they
	// must never be delivered.
	refused map[int]bool
	errs    map[string]int // failed publishes by error
	// The live consumer's accepts: accepted must not come back;
	// acceptUnknown may.
	accepted, acceptUnknown map[int]bool
	delivered               int
	seenLive                map[int]bool // delivered to the live consumer
	unflagged               int          // delivered again without the redelivered flag
	// acceptedBack counts deliveries of a message whose accept had
	// completed already (guarantee 3), seen live rather than in the
	// final drain.
	acceptedBack int
	published    int
	restarts     int // the consumer subscribed again after Consume ended
	// history is each recent message's deliveries and settles as the
	// clients saw them, printed for the messages a check fails on
	// (suspect, which are kept); older ones are dropped as the numbers
	// grow (pruned up to prunedTo), to bound the memory of a long run.
	history  map[int][]string
	suspect  map[int]bool
	prunedTo int
}

// note adds an event to message i's history; q.mu is held.
func (q *chaosQueue) note(start time.Time, i int, format string, args ...any) {
	const keep = 150_000 // about 15 s at 10,000 messages a second per queue; some 45 MB each
	if i-keep > q.prunedTo+keep {
		for k := range q.history {
			if k < i-keep && !q.suspect[k] {
				delete(q.history, k)
			}
		}
		q.prunedTo = i - keep
	}
	q.history[i] = append(q.history[i], fmt.Sprintf("%6dms ", time.Since(start).Milliseconds())+fmt.Sprintf(format, args...))
}

// TestClusterChaos: three real brokers (R3), one replicated queue per
// group, a reconnecting producer and reconnecting accepting consumers
// per queue (one per broker), each on
// any broker (the brokers forward and proxy), and
// a schedule of faults: kill -9 of a broker and its restart, or SIGSTOP
// past the controller's broker timeout and SIGCONT, one broker at a time,
// with group rebalancing on. After the faults the cluster must heal on
// its own: every group with a master and all its replicas in the
// SyncStateSet as the controller records it, and every broker's copy of
// each queue equal. Then each queue is drained and checked: no completed
// publish lost, no accepted message back (checked at every delivery
// too, not only in the final drain), nothing enqueued twice,
// publish order kept, nothing refused as not taken delivered, and
// nothing delivered again without the redelivered flag.
func TestClusterChaos(t *testing.T) {
	testutil.Long(t, "faults under load")
	run := chaosDefault
	if v := os.Getenv("BERTH_CHAOS"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil {
			t.Fatalf("BERTH_CHAOS=%q: %v", v, err)
		}
		run = d
	}
	seed := uint64(time.Now().UnixNano())
	if v := os.Getenv("BERTH_CHAOS_SEED"); v != "" {
		s, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			t.Fatalf("BERTH_CHAOS_SEED=%q: %v", v, err)
		}
		seed = s
	}
	// BERTH_CHAOS_DOUBLE=1 makes a quarter of the faults hit two brokers
	// at once.
	double := os.Getenv("BERTH_CHAOS_DOUBLE") != ""
	// Consumers per queue: one per broker (BERTH_CHAOS_CONSUMERS sets
	// it), so that whichever broker masters a queue's group has a local
	// consumer beside the proxied ones. That found, in session 13's long
	// runs, a master's consumers handed one another's deliveries after a
	// proxying broker died (a write batch released twice).
	consumers := 3
	if v := os.Getenv("BERTH_CHAOS_CONSUMERS"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > 16 {
			t.Fatalf("BERTH_CHAOS_CONSUMERS=%q: want 1 to 16", v)
		}
		consumers = n
	}
	t.Logf("faults for %v, seed %d (BERTH_CHAOS_SEED=%d), two brokers at once: %v, %d consumers per queue", run, seed, seed, double, consumers)
	rng := rand.New(rand.NewPCG(seed, 1))

	const groups = 3
	ctx, cancel := context.WithTimeout(context.Background(), run+4*time.Minute)
	defer cancel()
	args := []string{"-group-rebalance", "2s"}
	if v := os.Getenv("BERTH_CHAOS_ARGS"); v != "" {
		args = append(args, strings.Fields(v)...) // e.g. -consume-at-replicas
	}
	c := startReplicatedWith(t, ctx, groups, 3, 3, args...)
	var seeds []string
	for _, n := range c.nodes {
		seeds = append(seeds, n.client)
	}

	// One queue per group.
	var queues []*chaosQueue
	taken := map[uint32]bool{}
	for i := 0; len(queues) < groups; i++ {
		name := fmt.Sprintf("chaos-%d", i)
		if g := replication.GroupOf(name, groups); !taken[g] {
			taken[g] = true
			queues = append(queues, &chaosQueue{name: name, completed: map[int]bool{}, failed: map[int]bool{}, refused: map[int]bool{}, errs: map[string]int{},
				accepted: map[int]bool{}, acceptUnknown: map[int]bool{}, seenLive: map[int]bool{}, history: map[int][]string{}, suspect: map[int]bool{}})
		}
	}
	for _, q := range queues {
		g := replication.GroupOf(q.name, groups)
		_, mnode := c.waitServing(g)
		conn := dial(t, ctx, mnode.client)
		if err := conn.DeclareQueue(ctx, q.name, client.QueueOptions{Durable: true}); err != nil {
			t.Fatal(err)
		}
		conn.Close()
	}
	// Every broker knows every queue before the clients come: a broker
	// learns a queue declared elsewhere within a pass of its wiring sync.
	testutil.WaitFor(t, 20*time.Second, func() error {
		for _, q := range queues {
			for _, n := range c.nodes {
				if ready, _, err := c.depth(n, q.name); err != nil || ready < 0 {
					return fmt.Errorf("%s does not know %s yet (%v)", n.name, q.name, err)
				}
			}
		}
		return nil
	})

	policy := func() *client.ReconnectPolicy {
		return &client.ReconnectPolicy{DelayMin: 20 * time.Millisecond, DelayMax: 300 * time.Millisecond, MaxTime: run + time.Minute}
	}
	start := time.Now()
	t.Logf("clients start at %s (the times below count from it)", start.UTC().Format("15:04:05.000"))
	var suspects []struct {
		q *chaosQueue
		i int
	}
	wctx, stopWork := context.WithCancel(ctx)
	var wg sync.WaitGroup
	for qi, q := range queues {
		// The producer: up to 64 publishes in flight, numbered in order.
		wg.Add(1)
		go func() {
			defer wg.Done()
			order := append([]string(nil), seeds[qi%len(seeds):]...)
			order = append(order, seeds[:qi%len(seeds)]...)
			conn, err := client.DialConfig(ctx, client.Config{Reconnect: policy(), Heartbeat: 200 * time.Millisecond}, order...)
			if err != nil {
				t.Errorf("%s producer: %v", q.name, err)
				return
			}
			defer conn.Close()
			sem := make(chan struct{}, 64)
			var inflight sync.WaitGroup
			for i := 0; wctx.Err() == nil; i++ {
				select {
				case sem <- struct{}{}:
				case <-wctx.Done():
				}
				if wctx.Err() != nil {
					break
				}
				inflight.Add(1)
				err := conn.PublishAsync(ctx, "", q.name, []byte(fmt.Sprintf("%08d", i)), client.PublishOptions{Persistent: true}, func(err error) {
					defer inflight.Done()
					<-sem
					q.mu.Lock()
					defer q.mu.Unlock()
					if err == nil {
						q.completed[i] = true
					} else {
						q.failed[i] = true
						if refusedForSure(err) {
							q.refused[i] = true
						}
						if why := chaosErrorCheck(err); why != "" {
							t.Errorf("%s: publish %d: %v: %s", q.name, i, err, why)
						}
						k := err.Error()
						if len(k) > 90 {
							k = k[:90]
						}
						q.errs[k]++
					}
				})
				if err != nil {
					inflight.Done()
					<-sem
					q.mu.Lock()
					q.failed[i] = true
					q.mu.Unlock()
					if conn.Err() != nil {
						t.Errorf("%s producer's connection ended: %v", q.name, conn.Err())
						break
					}
				}
				q.mu.Lock()
				q.published = i + 1
				q.mu.Unlock()
			}
			inflight.Wait()
		}()
		// The consumers, each starting on the next broker, so that with
		// one per broker whichever broker is the group's master has one
		// of them local (not proxied): a master that delivers after it
		// was replaced reaches it, where a proxied consumer's session
		// ends with the master's link. Each accepts what it gets.
		for ci := range consumers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				order := append([]string(nil), seeds[(qi+1+ci)%len(seeds):]...)
				order = append(order, seeds[:(qi+1+ci)%len(seeds)]...)
				conn, err := client.DialConfig(ctx, client.Config{Reconnect: policy(), Heartbeat: 200 * time.Millisecond}, order...)
				if err != nil {
					t.Errorf("%s consumer: %v", q.name, err)
					return
				}
				defer conn.Close()
				// Consume ends when a settle is refused for good (an accept
				// refused because the group has too few replicas in sync):
				// the application then cancels the consumer, which gives
				// back what it held, and subscribes again.
				for wctx.Err() == nil {
					con, err := conn.Subscribe(ctx, q.name, client.SubscribeOptions{Credit: 200, AutoCredit: true})
					if err != nil {
						if wctx.Err() == nil {
							time.Sleep(100 * time.Millisecond)
						}
						continue
					}
					err = con.Consume(wctx, func(d *client.Delivery) error {
						i, _ := strconv.Atoi(string(d.Payload))
						q.mu.Lock()
						defer q.mu.Unlock()
						q.delivered++
						q.note(start, i, "deliver to c%d.%d via %s tag %d count %d redelivered %v", ci, con.ID(), conn.Addr(), d.Tag, d.DeliveryCount, d.Redelivered)
						bad := false
						if q.accepted[i] {
							q.acceptedBack++
							bad = true
							if q.acceptedBack <= 5 {
								t.Errorf("%s: message %d delivered again after its accept completed", q.name, i)
							}
						}
						if q.seenLive[i] && !d.Redelivered {
							q.unflagged++
							bad = true
							if q.unflagged <= 5 {
								t.Errorf("%s: message %d delivered again without the redelivered flag", q.name, i)
							}
						}
						if bad && len(suspects) < 5 && !q.suspect[i] {
							q.suspect[i] = true
							suspects = append(suspects, struct {
								q *chaosQueue
								i int
							}{q, i})
						}
						q.seenLive[i] = true
						return nil
					}, client.OnSettled(func(d *client.Delivery, _ client.Settle, err error) {
						i, _ := strconv.Atoi(string(d.Payload))
						q.mu.Lock()
						defer q.mu.Unlock()
						q.note(start, i, "settled by c%d.%d tag %d: %v", ci, con.ID(), d.Tag, err)
						if err == nil {
							q.accepted[i] = true
						} else {
							// Lost with the connection or the consumer's master,
							// or refused: it may have taken effect.
							q.acceptUnknown[i] = true
						}
					}))
					if wctx.Err() != nil {
						break
					}
					q.mu.Lock()
					q.restarts++
					q.mu.Unlock()
					t.Logf("%dms: %s consumer c%d.%d ended", time.Since(start).Milliseconds(), q.name, ci, con.ID())
					t.Logf("%s consumer ended (%v); subscribing again", q.name, err)
					cctx, ccancel := context.WithTimeout(ctx, 5*time.Second)
					_ = con.Cancel(cctx)
					ccancel()
				}
			}()
		}
	}

	// The faults: one broker at a time.
	faults := map[string]int{}
	end := time.Now().Add(run)
	for time.Now().Before(end) && !t.Failed() {
		time.Sleep(time.Duration(500+rng.IntN(1500)) * time.Millisecond)
		n := c.nodes[rng.IntN(len(c.nodes))]
		if double && rng.IntN(4) == 0 {
			// Two brokers at once: the groups and the controller lose
			// their majority, and must come back on their own.
			m := c.nodes[(slices.Index(c.nodes, n)+1+rng.IntN(len(c.nodes)-1))%len(c.nodes)]
			d := time.Duration(300+rng.IntN(1700)) * time.Millisecond
			if rng.IntN(2) == 0 {
				t.Logf("%dms: kill -9 %s and %s, restart after %v", time.Since(start).Milliseconds(), n.name, m.name, d)
				n.kill()
				m.kill()
				time.Sleep(d)
				n.start(t)
				m.start(t)
				n.waitUp(t, 30*time.Second)
				m.waitUp(t, 30*time.Second)
				faults["kill two"]++
			} else {
				t.Logf("%dms: SIGSTOP %s and %s for %v", time.Since(start).Milliseconds(), n.name, m.name, d)
				n.signal(syscall.SIGSTOP)
				m.signal(syscall.SIGSTOP)
				time.Sleep(d)
				n.signal(syscall.SIGCONT)
				m.signal(syscall.SIGCONT)
				faults["freeze two"]++
			}
			continue
		}
		switch rng.IntN(3) {
		case 0:
			down := time.Duration(200+rng.IntN(1800)) * time.Millisecond
			t.Logf("%dms: kill -9 %s, restart after %v", time.Since(start).Milliseconds(), n.name, down)
			n.kill()
			time.Sleep(down)
			n.start(t)
			n.waitUp(t, 30*time.Second)
			faults["kill"]++
		default:
			frozen := time.Duration(300+rng.IntN(2200)) * time.Millisecond
			t.Logf("%dms: SIGSTOP %s for %v", time.Since(start).Milliseconds(), n.name, frozen)
			n.signal(syscall.SIGSTOP)
			time.Sleep(frozen)
			n.signal(syscall.SIGCONT)
			faults["freeze"]++
		}
	}

	defer func() {
		if !t.Failed() {
			return
		}
		for _, sp := range suspects {
			sp.q.mu.Lock()
			t.Logf("%s message %d:\n  %s", sp.q.name, sp.i, strings.Join(sp.q.history[sp.i], "\n  "))
			sp.q.mu.Unlock()
		}
	}()
	// Heal: every group whole again, as the controller records it.
	for g := range uint32(groups) {
		c.waitServing(g)
	}
	// Let the producers run past the last failover, then stop the work.
	time.Sleep(time.Second)
	stopWork()
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(90 * time.Second):
		t.Fatal("the producers and consumers did not stop within 90 s")
	}
	for g := range uint32(groups) {
		c.waitServing(g)
	}

	for _, q := range queues {
		// Every broker's copy agrees with the master's.
		g := replication.GroupOf(q.name, groups)
		_, mnode := c.waitServing(g)
		var want int
		defer func() {
			if t.Failed() {
				for _, n := range c.nodes {
					var gv, qv any
					_ = c.getJSON(n, "/v1/groups", &gv)
					_ = c.getJSON(n, "/v1/queues", &qv)
					t.Logf("%s groups %v queues %v", n.name, gv, qv)
				}
			}
		}()
		testutil.WaitFor(t, 20*time.Second, func() error {
			ready, unacked, err := c.depth(mnode, q.name)
			if err != nil {
				return err
			}
			if unacked != 0 {
				return fmt.Errorf("%s: %d unacked at the master", q.name, unacked)
			}
			want = ready
			for _, n := range c.nodes {
				got, _, err := c.depth(n, q.name)
				if err != nil {
					return err
				}
				if got != want {
					return fmt.Errorf("%s: %s holds %d ready, the master %s %d", q.name, n.name, got, mnode.name, want)
				}
			}
			return nil
		})
		// Drain it at the master.
		rc := dial(t, ctx, mnode.client)
		con, err := rc.Subscribe(ctx, q.name, client.SubscribeOptions{Credit: 1000, AutoCredit: true, AckMode: client.AckNone})
		if err != nil {
			t.Fatal(err)
		}
		var drained []int
		for len(drained) < want {
			nctx, ncancel := context.WithTimeout(ctx, 10*time.Second)
			d, err := con.Next(nctx)
			ncancel()
			if err != nil {
				t.Fatalf("%s: drained %d of %d: %v", q.name, len(drained), want, err)
			}
			i, _ := strconv.Atoi(string(d.Payload))
			drained = append(drained, i)
		}
		rc.Close()

		q.mu.Lock()
		seen := map[int]int{}
		for k, i := range drained {
			seen[i]++
			if seen[i] == 2 {
				t.Errorf("%s: message %d enqueued twice", q.name, i)
			}
			if k > 0 && i < drained[k-1] {
				t.Errorf("%s: %d after %d: publish order lost", q.name, i, drained[k-1])
			}
			if q.accepted[i] {
				t.Errorf("%s: message %d came back after its accept completed", q.name, i)
			}
		}
		lost := 0
		for i := range q.completed {
			if seen[i] == 0 && !q.accepted[i] && !q.acceptUnknown[i] {
				lost++
				if lost <= 10 {
					t.Errorf("%s: completed publish %d lost", q.name, i)
				}
			}
		}
		failedDelivered := 0
		for i := range q.failed {
			if seen[i] > 0 || q.accepted[i] || q.acceptUnknown[i] {
				failedDelivered++
				if q.refused[i] {
					t.Errorf("%s: publish %d was refused as not taken, and delivered", q.name, i)
				}
			}
		}
		for e, n := range q.errs {
			t.Logf("%s: %d publishes failed with %q", q.name, n, e)
		}
		t.Logf("%s: %d published, %d completed, %d failed (%d of them delivered all the same), %d deliveries (%d again without the redelivered flag, %d after their accept completed), %d accepted (%d more unknown), %d consumer restarts, %d drained, %d lost",
			q.name, q.published, len(q.completed), len(q.failed), failedDelivered, q.delivered, q.unflagged, q.acceptedBack, len(q.accepted), len(q.acceptUnknown), q.restarts, len(drained), lost)
		if len(q.completed) == 0 {
			t.Errorf("%s: no publish completed", q.name)
		}
		q.mu.Unlock()
	}
	t.Logf("faults: %v", faults)
}

// refusedForSure reports whether a publish's error says the broker did
// not take it (so it must never be delivered), rather than that its
// outcome is unknown: by its code (protocol 1.4), not its text.
func refusedForSure(err error) bool {
	var se *client.Error
	return errors.As(err, &se) && !errors.Is(err, client.ErrOutcomeUnknown) && se.Code.Outcome() == wire.OutcomeNotCarriedOut
}

// chaosErrorCheck says what is wrong with a publish's error, if anything:
// a refusal whose text says that the outcome is unknown (the code should
// say so), or a code the chaos never causes (store, internal).
func chaosErrorCheck(err error) string {
	var se *client.Error
	if !errors.As(err, &se) {
		return ""
	}
	switch {
	case refusedForSure(err) && (strings.Contains(se.Text, "unknown") || strings.Contains(se.Text, "may or may not")):
		return "refused as not taken, with a text saying its outcome is unknown"
	case se.Code == wire.CodeStore || se.Code == wire.CodeInternal:
		return "a code no fault of the chaos should cause"
	}
	return ""
}
