package crashtest

import (
	"context"
	"encoding/binary"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/berthmq/berth/client"
	"github.com/berthmq/berth/internal/testutil"
)

// A reconnecting producer publishes while its broker is killed with -9 and
// started again on the same data: every publish completes (those in flight
// at the kill are resent), and after the restart each message is in the
// queue once, in publish order. Without producer ids
// (BERTH_NO_PRODUCER_ID=1) the resent ones that the broker had journalled
// before the kill are there twice, and the test fails.
func TestKill9ReconnectingProducerNoDuplicates(t *testing.T) {
	dataDir, logPath := t.TempDir(), filepath.Join(t.TempDir(), "berthd.log")
	logOnFailure(t, logPath)
	addr := testutil.FreeAddr(t)
	b := startBroker(t, dataDir, logPath, addr)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	var mu sync.Mutex
	var events []client.Event
	c, err := client.DialConfig(ctx, client.Config{Reconnect: &client.ReconnectPolicy{
		DelayMin: 10 * time.Millisecond, DelayMax: 200 * time.Millisecond, MaxTime: 30 * time.Second, NoProducerID: os.Getenv("BERTH_NO_PRODUCER_ID") != "",
		OnEvent: func(e client.Event) { mu.Lock(); events = append(events, e); mu.Unlock() },
	}}, addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if (c.ProducerID() == 0) != (os.Getenv("BERTH_NO_PRODUCER_ID") != "") {
		t.Fatal("producer id not as asked")
	}
	if err := c.DeclareQueue(ctx, "rq", client.QueueOptions{Durable: true}); err != nil {
		t.Fatal(err)
	}

	const n = 20000
	const killAt = 4000 // completions before the kill
	var completed atomic.Int64
	var failed atomic.Pointer[error]
	var wg sync.WaitGroup
	killed := make(chan struct{})
	go func() {
		defer close(killed)
		for completed.Load() < killAt && ctx.Err() == nil {
			time.Sleep(time.Millisecond)
		}
		b.kill()
		b.proc.Wait(t, 10*time.Second)
		b = startBroker(t, dataDir, logPath, addr)
	}()
	payload := make([]byte, 4)
	for i := 0; i < n; i++ {
		binary.BigEndian.PutUint32(payload, uint32(i))
		wg.Add(1)
		if err := c.PublishAsync(ctx, "", "rq", payload, client.PublishOptions{Persistent: true}, func(err error) {
			if err != nil {
				failed.Store(&err)
			}
			completed.Add(1)
			wg.Done()
		}); err != nil {
			t.Fatalf("publish %d: %v", i, err)
		}
	}
	wg.Wait()
	<-killed
	if e := failed.Load(); e != nil {
		t.Fatalf("a publish failed across the restart: %v", *e)
	}
	mu.Lock()
	var resent int
	for _, e := range events {
		if e.Kind == client.EventReconnected {
			resent += e.Resent
			t.Logf("reconnected to %s after %v, %d rounds, %d commands resent", e.Addr, e.Down, e.Rounds, e.Resent)
		}
	}
	if len(events) < 2 {
		t.Fatalf("events %v: the kill did not break the connection", events)
	}
	mu.Unlock()

	// Read the queue back on a plain connection.
	r, err := client.Dial(ctx, addr)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	cons, err := r.Subscribe(ctx, "rq", client.SubscribeOptions{Credit: 1000, AutoCredit: true, AckMode: client.AckNone})
	if err != nil {
		t.Fatal(err)
	}
	seen := make([]int, n)
	last, dups := -1, 0
	for got := 0; ; got++ {
		// Past n, a short wait tells an empty queue from a late message.
		wait := 5 * time.Second
		if got >= n {
			wait = 300 * time.Millisecond
		}
		dctx, dcancel := context.WithTimeout(ctx, wait)
		d, err := cons.Next(dctx)
		dcancel()
		if err != nil {
			if got >= n {
				break
			}
			t.Fatalf("after %d messages: %v", got, err)
		}
		i := int(binary.BigEndian.Uint32(d.Payload))
		seen[i]++
		if seen[i] > 1 {
			dups++
			continue
		}
		if i <= last {
			t.Fatalf("message %d after %d: publish order lost", i, last)
		}
		last = i
	}
	if dups > 0 {
		t.Fatalf("%d messages enqueued twice (%d publishes resent)", dups, resent)
	}
	for i, k := range seen {
		if k == 0 {
			t.Fatalf("completed publish %d lost", i)
		}
	}
	t.Logf("%d published, %d resent after the kill, 0 duplicates", n, resent)
}
