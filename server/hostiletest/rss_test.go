//go:build !race

package hostiletest

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/berthmq/berth/client"
	"github.com/berthmq/berth/internal/testutil"
	"github.com/berthmq/berth/wire"
)

// TestSlowConsumersRSS measures berthd's RSS when many consumers take
// unlimited credit and never read: 20 queues, each with one such
// consumer and nothing else, get 20 MiB each (16 KiB messages, 400 MiB
// in all) under -memory-limit 256MiB, once with the default -outbound-max
// (4 MiB) and once with no cap (-outbound-max -1), publishing for at most
// 20 s each. With the cap each connection holds at most about 4 MiB and
// the rest stays in the queues, paged to disk; without it every delivery
// (ack mode none) leaves its queue for a connection buffer nobody reads,
// until those buffers, which the budget counts, fill it and the
// publisher is held back. It checks that the capped peak is below the
// uncapped one and below 512 MiB, and logs both for docs/BENCHMARKS.md. Long (about a minute): `make hostile` runs it
// (BERTH_HOSTILE_LONG=1).
func TestSlowConsumersRSS(t *testing.T) {
	if os.Getenv("BERTH_HOSTILE_LONG") == "" {
		t.Skip("long: set BERTH_HOSTILE_LONG=1 (make hostile)")
	}
	capped := slowConsumersPeak(t, "4194304")
	uncapped := slowConsumersPeak(t, "-1")
	t.Logf("peak RSS with 20 non-reading consumers, 400 MiB published: %d MiB with -outbound-max 4MiB, %d MiB with no cap",
		capped>>20, uncapped>>20)
	if capped >= uncapped || capped > 512<<20 {
		t.Fatalf("peak RSS %d MiB with the cap, %d MiB without", capped>>20, uncapped>>20)
	}
}

func slowConsumersPeak(t *testing.T, outboundMax string) int64 {
	const queues, perQueue, size = 20, 1280, 16 << 10
	dir := t.TempDir()
	addr, admin := testutil.FreeAddr(t), testutil.FreeAddr(t)
	p := testutil.StartBerthd(t, filepath.Join(dir, "berthd.log"), "-listen", addr, "-admin", admin,
		"-data", filepath.Join(dir, "data"), "-controller", "", "-shards", "2", "-loops", "2",
		"-memory-limit", "256MiB", "-fsync", "never", "-outbound-max", outboundMax, "-outbound-timeout", "10m")
	defer p.Kill()
	testutil.WaitReady(t, admin, 60*time.Second)
	var peak int64
	stop := make(chan struct{})
	var sampler sync.WaitGroup
	sampler.Add(1)
	go func() {
		defer sampler.Done()
		for {
			if rss, err := rssBytes(p.Pid()); err == nil && rss > peak {
				peak = rss
			}
			select {
			case <-stop:
				return
			case <-time.After(20 * time.Millisecond):
			}
		}
	}()
	c, err := client.Dial(ctx(t), addr)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = c.Close() }()
	grantStop := make(chan struct{})
	var grants sync.WaitGroup
	for q := 0; q < queues; q++ {
		name := "slow-" + strconv.Itoa(q)
		if err := c.DeclareQueue(ctx(t), name, client.QueueOptions{}); err != nil {
			t.Fatal(err)
		}
		r := dialRawWith(t, net.Dialer{Timeout: 5 * time.Second, Control: func(_, _ string, rc syscall.RawConn) error {
			return rc.Control(func(fd uintptr) { _ = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, 64<<10) })
		}}, addr)
		subscribeRaw(t, r, name, wire.AckNone)
		grants.Add(1)
		go func() { defer grants.Done(); grantForever(r, grantStop) }()
	}
	// Publish for at most 20 s: the budget, which counts the connections'
	// buffers, may hold the publisher back for good while nobody reads.
	payload := make([]byte, size)
	pctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	var published atomic.Int64
	done := func(err error) {
		if err == nil {
			published.Add(1)
		}
	}
publish:
	for i := 0; i < perQueue; i++ {
		for q := 0; q < queues; q++ {
			if err := c.PublishAsync(pctx, "", "slow-"+strconv.Itoa(q), payload, client.PublishOptions{}, done); err != nil {
				break publish
			}
		}
	}
	_ = c.Flush(pctx)
	time.Sleep(time.Second) // the last deliveries reach the buffers
	t.Logf("-outbound-max %s: %d of %d messages of %d KiB published", outboundMax, published.Load(), queues*perQueue, size>>10)
	close(grantStop)
	grants.Wait()
	close(stop)
	sampler.Wait()
	rss, _ := rssBytes(p.Pid())
	t.Logf("-outbound-max %s: peak RSS %d MiB, %d MiB at the end; %s", outboundMax, peak>>20, rss>>20, memoryLine(t, admin))
	return peak
}

func memoryLine(t *testing.T, admin string) string {
	b := &broker{admin: admin}
	return fmt.Sprintf("outbound_bytes %d MiB", b.outboundBytes(t)>>20)
}
