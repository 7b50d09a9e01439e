package memtest

import (
	"context"
	"encoding/binary"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/berthmq/berth/client"
	"github.com/berthmq/berth/internal/testutil"
)

// TestConsumeRatePagedVsMemory measures, and only reports, the rate at
// which a consumer drains a backlog of 200,000 1 KiB messages from a real
// berthd that holds it in memory (-memory-limit 0) and from one that paged
// it out (-memory-limit 32MiB, one shard: all but about 15,000 bodies on
// disk), for transient and for persistent messages, the runs alternated.
// It asserts nothing about speed; it runs only with BERTH_MEM_BENCH=1:
//
//	BERTH_MEM_BENCH=1 go test ./server/memtest -run ConsumeRate -v
func TestConsumeRatePagedVsMemory(t *testing.T) {
	if os.Getenv("BERTH_MEM_BENCH") == "" {
		t.Skip("a measurement: set BERTH_MEM_BENCH=1")
	}
	const n = 200_000
	for round := 0; round < 2; round++ {
		for _, persistent := range []bool{false, true} {
			for _, limit := range []string{"0", "32MiB"} {
				pubRate, conRate, paged := drainRate(t, n, persistent, limit)
				t.Logf("round %d persistent=%v memory-limit=%s: publish %.0f msgs/s, consume %.0f msgs/s, %d paged at the start of the drain",
					round, persistent, limit, pubRate, conRate, paged)
			}
		}
	}
}

func drainRate(t *testing.T, n int, persistent bool, limit string) (pubRate, conRate float64, paged int64) {
	dir := t.TempDir()
	addr, admin := testutil.FreeAddr(t), testutil.FreeAddr(t)
	p := testutil.StartBerthd(t, filepath.Join(dir, "berthd.log"), "-listen", addr, "-admin", admin,
		"-data", filepath.Join(dir, "data"), "-controller", "", "-shards", "1", "-loops", "1",
		"-memory-limit", limit, "-fsync", "never")
	defer p.Stop(t, os.Interrupt, 30*time.Second)
	testutil.WaitReady(t, admin, 60*time.Second)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	c, err := client.Dial(ctx, addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if err := c.DeclareQueue(ctx, "deep", client.QueueOptions{Durable: true}); err != nil {
		t.Fatal(err)
	}
	payload := make([]byte, 1024)
	start := time.Now()
	errs := make(chan error, 1)
	for i := 0; i < n; i++ {
		binary.BigEndian.PutUint64(payload, uint64(i))
		if err := c.PublishAsync(ctx, "", "deep", payload, client.PublishOptions{Persistent: persistent}, func(err error) {
			if err != nil {
				select {
				case errs <- err:
				default:
				}
			}
		}); err != nil {
			t.Fatal(err)
		}
	}
	if err := c.Publish(ctx, "", "deep", payload[:8], client.PublishOptions{}); err != nil { // waits for the ones before it
		t.Fatal(err)
	}
	pubRate = float64(n) / time.Since(start).Seconds()
	select {
	case err := <-errs:
		t.Fatal(err)
	default:
	}
	paged = status(t, admin).PagedMessages
	sub, err := c.Subscribe(ctx, "deep", client.SubscribeOptions{Credit: 2000, AutoCredit: true})
	if err != nil {
		t.Fatal(err)
	}
	cctx, stop := context.WithCancel(ctx)
	got := 0
	start = time.Now()
	_ = sub.Consume(cctx, func(d *client.Delivery) error {
		if got < n && binary.BigEndian.Uint64(d.Payload) != uint64(got) {
			t.Errorf("delivery %d carries %d", got, binary.BigEndian.Uint64(d.Payload))
			stop()
		}
		got++
		if got == n+1 {
			stop()
		}
		return nil
	})
	conRate = float64(n) / time.Since(start).Seconds()
	if got != n+1 {
		t.Fatalf("consumed %d of %d", got, n+1)
	}
	return pubRate, conRate, paged
}
