// Package crashtest kills a real berthd process with SIGKILL at random
// moments while producers publish persistent messages and consumers accept
// some, restarts it, and checks the durability guarantees after each
// restart:
//   - every completed publish is present exactly once, unless its accept
//     was completed;
//   - no completed accept ever reappears;
//   - order within each queue is preserved.
//
// `go test ./server/crashtest` runs a short form. BERTH_CRASH_ROUNDS sets the
// number of kill rounds (default 3) for the long form (`make crash`).
package crashtest

import (
	"context"
	"fmt"
	"math/rand"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/berthmq/berth/client"
	"github.com/berthmq/berth/internal/testutil"
)

func TestMain(m *testing.M) { testutil.Main(m) }

type broker struct {
	proc *testutil.Proc
	addr string
}

// startBroker starts berthd on dataDir, its output appended to logPath,
// and waits until it accepts clients on addr.
func startBroker(t *testing.T, dataDir, logPath, addr string) *broker {
	t.Helper()
	p := testutil.StartBerthd(t, logPath, "-listen", addr, "-admin", "", "-data", dataDir, "-shards", "2", "-loops", "2", "-fsync", "always", "-controller", "127.0.0.1:0", "-log-level", "warn")
	p.WaitPort(t, addr, 10*time.Second)
	return &broker{proc: p, addr: addr}
}

func (b *broker) kill() { b.proc.Kill() }

// logOnFailure logs the end of the berthd log if the test fails.
func logOnFailure(t *testing.T, logPath string) {
	t.Cleanup(func() {
		if !t.Failed() {
			return
		}
		t.Logf("berthd log:\n%s", testutil.FileTail(logPath, 8000))
	})
}

const (
	queues    = 3
	producers = 3
	perRound  = 200000 // messages per producer per round, at most
)

// ledger is what the test knows from completions.
type ledger struct {
	mu        sync.Mutex
	sent      map[string]bool // every message id ever sent
	completed map[string]bool // publish completed
	accepted  map[string]bool // accept completed
	// acceptSent holds every message whose accept was sent: it may be gone
	// even if the completion never arrived before the kill.
	acceptSent map[string]bool
}

func msgID(p, seq int) string { return fmt.Sprintf("p%d-%08d", p, seq) }

func parseID(id string) (p, seq int) {
	fmt.Sscanf(id, "p%d-%d", &p, &seq)
	return
}

func TestKill9Durability(t *testing.T) {
	rounds := 3
	if v := os.Getenv("BERTH_CRASH_ROUNDS"); v != "" {
		rounds, _ = strconv.Atoi(v)
	}
	seed := time.Now().UnixNano()
	if v := os.Getenv("BERTH_CRASH_SEED"); v != "" {
		seed, _ = strconv.ParseInt(v, 10, 64)
	}
	t.Logf("seed %d (BERTH_CRASH_SEED reproduces the kill timing)", seed)
	rng := rand.New(rand.NewSource(seed))
	dataDir, logPath := t.TempDir(), filepath.Join(t.TempDir(), "berthd.log")
	logOnFailure(t, logPath)
	addr := testutil.FreeAddr(t)
	led := &ledger{sent: map[string]bool{}, completed: map[string]bool{}, accepted: map[string]bool{}, acceptSent: map[string]bool{}}
	nextSeq := make([]int, producers)

	for round := 0; round < rounds; round++ {
		b := startBroker(t, dataDir, logPath, addr)
		check(t, round, b.addr, led)
		runLoad(t, b.addr, led, nextSeq, time.Duration(50+rng.Intn(400))*time.Millisecond)
		b.kill()
	}
	b := startBroker(t, dataDir, logPath, addr)
	check(t, rounds, b.addr, led)
	led.mu.Lock()
	t.Logf("%d rounds: %d sent, %d publishes completed, %d accepts completed", rounds, len(led.sent), len(led.completed), len(led.accepted))
	if len(led.completed) == 0 || len(led.accepted) == 0 {
		t.Fatal("the load completed nothing: the test checked nothing")
	}
	led.mu.Unlock()
}

// runLoad publishes and accepts until the kill time, then returns at once,
// leaving everything in flight for the kill.
func runLoad(t *testing.T, addr string, led *ledger, nextSeq []int, until time.Duration) {
	ctx, cancel := context.WithTimeout(context.Background(), until)
	defer cancel()
	var wg sync.WaitGroup
	for p := 0; p < producers; p++ {
		wg.Add(1)
		go func(p int) {
			defer wg.Done()
			c, err := client.Dial(ctx, addr)
			if err != nil {
				return
			}
			for sent := 0; sent < perRound && ctx.Err() == nil; sent++ {
				seq := nextSeq[p]
				nextSeq[p]++
				id := msgID(p, seq)
				led.mu.Lock()
				led.sent[id] = true
				led.mu.Unlock()
				err := c.PublishAsync(ctx, "", fmt.Sprint("crash", seq%queues), []byte(id), client.PublishOptions{Persistent: true}, func(err error) {
					if err == nil {
						led.mu.Lock()
						led.completed[id] = true
						led.mu.Unlock()
					}
				})
				if err != nil {
					return
				}
			}
		}(p)
	}
	for q := 0; q < queues; q++ {
		wg.Add(1)
		go func(q int) {
			defer wg.Done()
			c, err := client.Dial(ctx, addr)
			if err != nil {
				return
			}
			con, err := c.Subscribe(ctx, fmt.Sprint("crash", q), client.SubscribeOptions{Credit: 256, AutoCredit: true})
			if err != nil {
				return
			}
			for {
				d, err := con.Next(ctx)
				if err != nil {
					return
				}
				id := string(d.Payload)
				_, seq := parseID(id)
				if seq%2 == 0 {
					led.mu.Lock()
					led.acceptSent[id] = true
					led.mu.Unlock()
					_ = con.AcceptAsync(ctx, []uint64{d.Tag}, func(err error) {
						if err == nil {
							led.mu.Lock()
							led.accepted[id] = true
							led.mu.Unlock()
						}
					})
				} else {
					_ = con.ReleaseAsync(ctx, []uint64{d.Tag}, nil)
				}
			}
		}(q)
	}
	wg.Wait()
}

// check drains every queue without accepting and verifies the guarantees.
func check(t *testing.T, round int, addr string, led *ledger) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	c, err := client.Dial(ctx, addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	led.mu.Lock()
	defer led.mu.Unlock()
	present := map[string]int{}
	for q := 0; q < queues; q++ {
		name := fmt.Sprint("crash", q)
		if err := c.DeclareQueue(ctx, name, client.QueueOptions{Durable: true}); err != nil {
			t.Fatal(err)
		}
		con, err := c.Subscribe(ctx, name, client.SubscribeOptions{Credit: 65536})
		if err != nil {
			t.Fatal(err)
		}
		last := map[int]int{}
		var tags []uint64
		var ids []string
		for {
			dctx, dcancel := context.WithTimeout(ctx, 300*time.Millisecond)
			d, err := con.Next(dctx)
			dcancel()
			if err != nil {
				break
			}
			// Keep the credit topped up: a queue may hold more than one
			// grant of credit, and this drain settles only at the end.
			if _, err := con.Credit(1); err != nil {
				t.Fatalf("round %d: credit: %v", round, err)
			}
			id := string(d.Payload)
			p, seq := parseID(id)
			if prev, ok := last[p]; ok && seq <= prev {
				t.Fatalf("round %d: queue %s out of order: %s after seq %d", round, name, id, prev)
			}
			last[p] = seq
			present[id]++
			if !led.sent[id] {
				t.Fatalf("round %d: %s was never sent", round, id)
			}
			if led.accepted[id] {
				t.Fatalf("round %d: %s reappeared after its accept completed", round, id)
			}
			tags = append(tags, d.Tag)
			ids = append(ids, id)
		}
		// Accept what was checked, so queues stay short over rounds.
		if len(tags) == 0 {
			// nothing to accept
		} else if err := con.Accept(ctx, tags...); err != nil {
			t.Fatalf("round %d: accept: %v", round, err)
		}
		for _, id := range ids {
			led.acceptSent[id] = true
			led.accepted[id] = true
		}
		if err := con.Cancel(ctx); err != nil {
			t.Fatal(err)
		}
	}
	for id, n := range present {
		if n != 1 {
			t.Fatalf("round %d: %s present %d times", round, id, n)
		}
	}
	missing := 0
	for id := range led.completed {
		if !led.acceptSent[id] && present[id] == 0 {
			missing++
			if missing < 5 {
				t.Errorf("round %d: completed publish %s lost", round, id)
			}
		}
	}
	if missing > 0 {
		t.Fatalf("round %d: %d completed publishes lost", round, missing)
	}
	t.Logf("round %d: %d messages present, every completed publish not accepted is there", round, len(present))
}

// TestSIGTERMFinishesInFlight sends SIGTERM while publishes are in flight:
// berthd exits 0, and every publish it completed is there after a restart.
func TestSIGTERMFinishesInFlight(t *testing.T) {
	dataDir, logPath := t.TempDir(), filepath.Join(t.TempDir(), "berthd.log")
	logOnFailure(t, logPath)
	addr := testutil.FreeAddr(t)
	b := startBroker(t, dataDir, logPath, addr)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := client.Dial(ctx, addr)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.DeclareQueue(ctx, "term", client.QueueOptions{Durable: true}); err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	completed := map[string]bool{}
	go func() {
		time.Sleep(100 * time.Millisecond)
		_ = b.proc.Signal(syscall.SIGTERM)
	}()
	for i := 0; ; i++ {
		id := fmt.Sprintf("m%08d", i)
		err := c.PublishAsync(ctx, "", "term", []byte(id), client.PublishOptions{Persistent: true}, func(err error) {
			if err == nil {
				mu.Lock()
				completed[id] = true
				mu.Unlock()
			}
		})
		if err != nil {
			break
		}
	}
	if err := b.proc.Wait(t, 30*time.Second); err != nil {
		t.Fatalf("berthd did not exit cleanly on SIGTERM: %v", err)
	}
	b2 := startBroker(t, dataDir, logPath, addr)
	c2, err := client.Dial(ctx, b2.addr)
	if err != nil {
		t.Fatal(err)
	}
	con, err := c2.Subscribe(ctx, "term", client.SubscribeOptions{Credit: 65536, AckMode: client.AckNone, AutoCredit: true})
	if err != nil {
		t.Fatal(err)
	}
	present := map[string]bool{}
	for {
		dctx, dcancel := context.WithTimeout(ctx, 300*time.Millisecond)
		d, err := con.Next(dctx)
		dcancel()
		if err != nil {
			break
		}
		present[string(d.Payload)] = true
	}
	mu.Lock()
	defer mu.Unlock()
	if len(completed) == 0 {
		t.Fatal("nothing completed before SIGTERM: the test checked nothing")
	}
	for id := range completed {
		if !present[id] {
			t.Fatalf("completed publish %s lost across SIGTERM", id)
		}
	}
	t.Logf("%d completed before shutdown, %d present after restart", len(completed), len(present))
}
