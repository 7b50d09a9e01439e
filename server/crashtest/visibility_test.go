package crashtest

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/berthmq/berth/client"
	"github.com/berthmq/berth/internal/testutil"
)

// TestDeliveredMeansDurable: a consumer must never receive a persistent
// message on a durable queue before its enqueue is durable, because the
// broker may still forget it. Each round, background producers keep the
// journals busy with large persistent messages, a probe message is
// published to a durable queue with a waiting consumer, and the broker is
// killed with SIGKILL the moment the consumer receives it. The consumer
// never accepted it, so after the restart it must be in the queue.
//
// Delivering at enqueue time, before the write, lost the probe in every
// round: the record was still in the journal's memory when the process
// died.
func TestDeliveredMeansDurable(t *testing.T) {
	testutil.Long(t, "delivered means durable, across kill -9")
	rounds := 5
	if v := os.Getenv("BERTH_VISIBILITY_ROUNDS"); v != "" {
		rounds, _ = strconv.Atoi(v)
	}
	dataDir, logPath := t.TempDir(), filepath.Join(t.TempDir(), "berthd.log")
	logOnFailure(t, logPath)
	addr := testutil.FreeAddr(t)
	// A slow disk: each journal write waits, so records sit appended but
	// unwritten for a while. kill -9 keeps what was written (the page
	// cache survives), so only unwritten records can be lost.
	t.Setenv("BERTH_FAULT_JOURNAL_WRITE_DELAY", "30ms")
	lost := 0
	for round := 0; round < rounds; round++ {
		b := startBroker(t, dataDir, logPath, addr)
		probe := fmt.Sprintf("probe-%d", round)
		deliveredProbe(t, b.addr, probe, b.kill)

		b = startBroker(t, dataDir, logPath, addr)
		if !probePresent(t, b.addr, probe) {
			lost++
			t.Errorf("round %d: %s was delivered, never accepted, and is gone after SIGKILL", round, probe)
		}
		b.kill()
	}
	t.Logf("%d rounds, probe lost in %d", rounds, lost)
}

const bgQueues = 4

// deliveredProbe calls kill the moment a consumer has received the probe,
// with background producers still publishing.
func deliveredProbe(t *testing.T, addr, probe string, kill func()) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := client.Dial(ctx, addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	for q := 0; q < bgQueues; q++ {
		if err := c.DeclareQueue(ctx, fmt.Sprint("bg", q), client.QueueOptions{Durable: true}); err != nil {
			t.Fatal(err)
		}
		if err := c.Purge(ctx, fmt.Sprint("bg", q)); err != nil {
			t.Fatal(err)
		}
	}
	if err := c.DeclareQueue(ctx, "probe", client.QueueOptions{Durable: true}); err != nil {
		t.Fatal(err)
	}
	con, err := c.Subscribe(ctx, "probe", client.SubscribeOptions{Credit: 16})
	if err != nil {
		t.Fatal(err)
	}

	// Background load on every shard: persistent 16 KiB messages.
	bgCtx, bgStop := context.WithCancel(ctx)
	defer bgStop()
	var wg sync.WaitGroup
	payload := make([]byte, 1<<10)
	for p := 0; p < 4; p++ {
		wg.Add(1)
		go func(p int) {
			defer wg.Done()
			pc, err := client.Dial(bgCtx, addr)
			if err != nil {
				return
			}
			defer pc.Close()
			for i := 0; i < 100000 && bgCtx.Err() == nil; i++ {
				if pc.PublishAsync(bgCtx, "", fmt.Sprint("bg", i%bgQueues), payload, client.PublishOptions{Persistent: true}, nil) != nil {
					return
				}
			}
		}(p)
	}
	time.Sleep(150 * time.Millisecond) // let the journals get busy
	if err := c.PublishAsync(ctx, "", "probe", []byte(probe), client.PublishOptions{Persistent: true}, nil); err != nil {
		t.Fatal(err)
	}
	for {
		d, err := con.Next(ctx)
		if err != nil {
			t.Fatalf("waiting for %s: %v", probe, err)
		}
		if string(d.Payload) == probe {
			kill()
			return
		}
	}
}

// probePresent drains the probe queue, accepting what it finds, and
// reports whether probe was among it.
func probePresent(t *testing.T, addr, probe string) bool {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := client.Dial(ctx, addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if err := c.DeclareQueue(ctx, "probe", client.QueueOptions{Durable: true}); err != nil {
		t.Fatal(err)
	}
	con, err := c.Subscribe(ctx, "probe", client.SubscribeOptions{Credit: 64})
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for {
		dctx, dcancel := context.WithTimeout(ctx, 500*time.Millisecond)
		d, err := con.Next(dctx)
		dcancel()
		if err != nil {
			break
		}
		if string(d.Payload) == probe {
			found = true
		}
		if err := con.Accept(ctx, d.Tag); err != nil {
			t.Fatal(err)
		}
	}
	return found
}
