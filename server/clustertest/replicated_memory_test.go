package clustertest

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/berthmq/berth/client"
	"github.com/berthmq/berth/internal/testutil"
)

// TestReplicatedQueueMemoryBudget: three brokers with a 16 MiB memory
// budget each (one shard) and a backlog of 50,000 persistent 2 KiB
// messages (100 MiB, six times the budget) published to a replicated
// queue nobody consumes yet. Above the high watermark the master and the
// followers drop each message's body from memory with its event's data in
// the group log, and read it back from the group journal when they need
// it. Checked: every publish completes (without paging, the master
// throttles the publisher at the budget and the backlog never gets
// there); every broker pages most of the backlog and counts no more than
// its budget; no broker's RSS passes rssBound (the bodies alone are
// 80 MiB); the master delivers the first messages with the right bodies;
// after kill -9 of the master the new one, a follower that paged them,
// delivers the rest in order with the right bodies, while the killed
// broker, restarted, replays the backlog without loading it (its peak RSS
// stays under rssBound, and it pages the backlog again).
func TestReplicatedQueueMemoryBudget(t *testing.T) {
	testutil.Long(t, "a replicated backlog within the memory budget")
	const (
		groups      = 3
		n           = 50_000
		payloadSize = 2048
		limit       = 16 << 20
		accepted    = 1000
		// rssBound: the runtime, the controller, the connections'
		// buffers, the group journal's index and the GC's slack sit on
		// top of the budget.
		rssBound = 160 << 20
	)
	ctx, cancel := context.WithTimeout(context.Background(), 240*time.Second)
	defer cancel()
	c := startReplicatedWith(t, ctx, groups, 3, 0, "-memory-limit", "16MiB", "-shards", "1")
	const queue = "budget"
	g, master, mnode, conn := c.declare(queue, groups)

	var maxRSS [3]atomic.Int64
	stopSampling := make(chan struct{})
	var sampling sync.WaitGroup
	sampling.Add(1)
	go func() {
		defer sampling.Done()
		for {
			for i, nd := range c.nodes {
				if nd.proc == nil {
					continue
				}
				if rss, err := rssOf(nd.proc.Pid()); err == nil && rss > maxRSS[i].Load() {
					maxRSS[i].Store(rss)
				}
			}
			select {
			case <-stopSampling:
				return
			case <-time.After(20 * time.Millisecond):
			}
		}
	}()
	stopped := false
	stop := func() {
		if !stopped {
			stopped = true
			close(stopSampling)
			sampling.Wait()
		}
	}
	defer stop()

	var completed, failed atomic.Int64
	var firstErr atomic.Value
	started := time.Now()
	pubCtx, pubStop := context.WithCancel(ctx)
	defer pubStop()
	pubErr := make(chan error, 1)
	go func() {
		for i := range n {
			err := conn.PublishAsync(pubCtx, "", queue, budgetPayload(i, payloadSize), client.PublishOptions{Persistent: true}, func(err error) {
				if err != nil && failed.Add(1) == 1 {
					firstErr.Store(err)
				}
				completed.Add(1)
			})
			if err != nil {
				pubErr <- fmt.Errorf("publish %d: %w", i, err)
				return
			}
		}
		pubErr <- nil
	}()
	testutil.WaitFor(t, 30*time.Second, func() error {
		if done := completed.Load(); done < n {
			var st budgetStatus
			_ = c.getJSON(mnode, "/v1/status", &st)
			return fmt.Errorf("%d of %d publishes completed; master counts %d bytes, %d paged, throttled shards %v",
				done, n, st.Memory.UsedBytes, st.Memory.PagedMessages, st.Memory.ThrottledShards)
		}
		return nil
	})
	if err := <-pubErr; err != nil {
		t.Fatal(err)
	}
	if failed.Load() != 0 {
		t.Fatalf("%d publishes failed, the first with %v", failed.Load(), firstErr.Load())
	}
	t.Logf("%d publishes of %d bytes completed in %v", n, payloadSize, time.Since(started).Round(time.Millisecond))
	c.waitReady(queue, n)
	for i, nd := range c.nodes {
		var st budgetStatus
		if err := c.getJSON(nd, "/v1/status", &st); err != nil {
			t.Fatal(err)
		}
		m := st.Memory
		t.Logf("%s: %d bytes counted of %d, %d paged, max RSS %d MiB", nd.name, m.UsedBytes, m.LimitBytes, m.PagedMessages, maxRSS[i].Load()>>20)
		if m.PagedMessages < n/2 {
			t.Errorf("%s paged %d of %d messages", nd.name, m.PagedMessages, n)
		}
		if m.UsedBytes > limit {
			t.Errorf("%s counts %d bytes against a %d-byte budget", nd.name, m.UsedBytes, limit)
		}
	}
	stop()
	for i, nd := range c.nodes {
		if testutil.RaceBerthd {
			// The race detector's shadow memory is several times the heap.
			t.Logf("%s: RSS not bounded: berthd is built with -race", nd.name)
			continue
		}
		if rss := maxRSS[i].Load(); rss > rssBound {
			t.Errorf("%s reached %d MiB of RSS with a %d-MiB backlog under a %d-MiB budget", nd.name, rss>>20, n*payloadSize>>20, limit>>20)
		}
	}
	if t.Failed() {
		t.FailNow()
	}

	// The master delivers the first messages, read back from its group
	// journal past the head it kept; they are accepted.
	consumeBudget(t, ctx, mnode, queue, 0, accepted, payloadSize, true)

	// kill -9 of the master: the new one, a follower that paged the
	// backlog too, delivers the rest in order.
	mnode.signal(syscall.SIGKILL)
	nm := c.nodeOf(c.waitNewMaster(g, master))

	// The killed broker, restarted, replays its group journal without
	// loading the backlog (it reads each entry back to apply it, and
	// pages it again) and follows with the backlog paged.
	mnode.stop(t, syscall.SIGKILL)
	mnode.start(t)
	mnode.waitUp(t, 30*time.Second)
	testutil.WaitFor(t, 60*time.Second, func() error {
		ready, _, err := c.depth(mnode, queue)
		if err != nil || ready != n-accepted {
			return fmt.Errorf("the restarted broker holds %d ready of %d (%v)", ready, n-accepted, err)
		}
		return nil
	})
	var st budgetStatus
	if err := c.getJSON(mnode, "/v1/status", &st); err != nil {
		t.Fatal(err)
	}
	peak, err := procStatusBytes(mnode.proc.Pid(), "VmHWM:")
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("restarted %s: %d bytes counted, %d paged, peak RSS %d MiB", mnode.name, st.Memory.UsedBytes, st.Memory.PagedMessages, peak>>20)
	if (peak > rssBound && !testutil.RaceBerthd) || st.Memory.PagedMessages < n/2 {
		t.Fatalf("the restarted %s peaked at %d MiB of RSS and paged %d of %d messages", mnode.name, peak>>20, st.Memory.PagedMessages, n-accepted)
	}
	began := time.Now()
	consumeBudget(t, ctx, nm, queue, accepted, n, payloadSize, false)
	t.Logf("the new master delivered %d paged messages in %v", n-accepted, time.Since(began).Round(time.Millisecond))
}

type budgetStatus struct {
	Memory struct {
		LimitBytes      int64 `json:"limit_bytes"`
		UsedBytes       int64 `json:"used_bytes"`
		PagedMessages   int64 `json:"paged_messages"`
		ThrottledShards []int `json:"throttled_shards"`
	} `json:"memory"`
}

// budgetPayload is message i's body: its number, then a filler that
// depends on it.
func budgetPayload(i, size int) []byte {
	p := bytes.Repeat([]byte{byte('a' + i%26)}, size)
	copy(p, fmt.Sprintf("%08d:", i))
	return p
}

// consumeBudget takes messages from..to of queue at n, in order, checking
// each body, accepting them if accept (else with ack mode none); a try
// that fails (the master changing) goes on from the first not taken.
func consumeBudget(t *testing.T, ctx context.Context, n *node, queue string, from, to, size int, accept bool) {
	t.Helper()
	next := from
	testutil.WaitFor(t, 60*time.Second, func() error {
		conn, err := client.Dial(ctx, n.client)
		if err != nil {
			return err
		}
		defer conn.Close()
		sctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		opts := client.SubscribeOptions{Credit: 1000, AutoCredit: true}
		if !accept {
			opts.AckMode = client.AckNone
		}
		con, err := conn.Subscribe(sctx, queue, opts)
		cancel()
		if err != nil {
			return err
		}
		for next < to {
			nctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			d, err := con.Next(nctx)
			cancel()
			if err != nil {
				return fmt.Errorf("after %d deliveries from %s: %w", next-from, n.name, err)
			}
			if want := budgetPayload(next, size); !bytes.Equal(d.Payload, want) {
				t.Fatalf("%s delivered %.12q… (%d bytes) as message %d, want %.12q…", n.name, d.Payload, len(d.Payload), next, want)
			}
			if accept {
				if err := d.Accept(ctx); err != nil {
					return fmt.Errorf("accept after %d deliveries: %w", next-from, err)
				}
			}
			next++
		}
		return nil
	})
}

// rssOf reads VmRSS of process pid.
func rssOf(pid int) (int64, error) { return procStatusBytes(pid, "VmRSS:") }

// procStatusBytes reads a size in kB from /proc/<pid>/status (key with
// its colon, as "VmHWM:").
func procStatusBytes(pid int, key string) (int64, error) {
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if rest, ok := bytes.CutPrefix(sc.Bytes(), []byte(key)); ok {
			kb, err := strconv.ParseInt(string(bytes.TrimSpace(bytes.TrimSuffix(bytes.TrimSpace(rest), []byte("kB")))), 10, 64)
			return kb << 10, err
		}
	}
	return 0, fmt.Errorf("no %s in /proc/%d/status", key, pid)
}
