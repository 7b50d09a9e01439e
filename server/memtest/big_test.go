package memtest

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/berthmq/berth/client"
	"github.com/berthmq/berth/internal/testutil"
)

// TestBacklogTenGiB is issue 12's measurement, and asserts only that
// every message comes back in order: 10 GiB of 1 KiB messages, half
// persistent to a durable queue and half transient to a plain one, are
// published to a real berthd under -memory-limit 2GiB with no consumer,
// then consumed. It samples the broker's RSS and what its budget counts
// every second and logs them, with the rates of each phase. It runs only
// with BERTH_BIG_BENCH=1 (BERTH_BIG_MIB sets the total, 10240 by
// default; BERTH_BIG_CSV a file for the samples):
//
//	BERTH_BIG_BENCH=1 go test ./server/memtest -run TenGiB -v -timeout 60m
func TestBacklogTenGiB(t *testing.T) {
	if os.Getenv("BERTH_BIG_BENCH") == "" {
		t.Skip("a measurement: set BERTH_BIG_BENCH=1")
	}
	total := 10240 // MiB
	if v, err := strconv.Atoi(os.Getenv("BERTH_BIG_MIB")); err == nil && v > 0 {
		total = v
	}
	n := total << 10 / 2 // 1 KiB messages per queue
	dir := t.TempDir()
	addr, admin := testutil.FreeAddr(t), testutil.FreeAddr(t)
	p := testutil.StartBerthd(t, filepath.Join(dir, "berthd.log"), "-listen", addr, "-admin", admin,
		"-data", filepath.Join(dir, "data"), "-controller", "", "-memory-limit", "2GiB")
	defer p.Stop(t, os.Interrupt, 60*time.Second)
	testutil.WaitReady(t, admin, 60*time.Second)
	ctx, cancel := context.WithTimeout(context.Background(), 55*time.Minute)
	defer cancel()

	// The sampler: RSS and the budget's count, every second.
	var phase atomic.Value
	phase.Store("start")
	var samples strings.Builder
	samples.WriteString("seconds,phase,rss_mib,counted_mib,paged,published,delivered\n")
	t0 := time.Now()
	stopSampling := make(chan struct{})
	var sampled sync.WaitGroup
	sampled.Add(1)
	go func() {
		defer sampled.Done()
		tick := time.NewTicker(time.Second)
		defer tick.Stop()
		for {
			select {
			case <-stopSampling:
				return
			case <-tick.C:
			}
			st, stats, _ := tryStatus(admin) // a miss leaves zeros in the sample
			fmt.Fprintf(&samples, "%.0f,%s,%d,%d,%d,%d,%d\n", time.Since(t0).Seconds(), phase.Load(), rssOf(p.Pid())>>20, st.UsedBytes>>20, st.PagedMessages,
				stats.Published, stats.Delivered)
		}
	}()

	c, err := client.Dial(ctx, addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	queues := []struct {
		name       string
		persistent bool
	}{{"big-persistent", true}, {"big-transient", false}}
	for _, q := range queues {
		if err := c.DeclareQueue(ctx, q.name, client.QueueOptions{Durable: q.persistent}); err != nil {
			t.Fatal(err)
		}
	}
	payload := make([]byte, 1024)
	for _, q := range queues {
		phase.Store("publish " + q.name)
		start := time.Now()
		var failed atomic.Value
		for i := range n {
			binary.BigEndian.PutUint64(payload, uint64(i))
			if err := c.PublishAsync(ctx, "", q.name, payload, client.PublishOptions{Persistent: q.persistent}, func(err error) {
				if err != nil {
					failed.Store(err)
				}
			}); err != nil {
				t.Fatal(err)
			}
		}
		if err := c.Publish(ctx, "", q.name, payload[:8], client.PublishOptions{Persistent: q.persistent}); err != nil {
			t.Fatal(err)
		}
		if err, _ := failed.Load().(error); err != nil {
			t.Fatalf("a publish to %s failed: %v", q.name, err)
		}
		d := time.Since(start)
		t.Logf("published %d x 1 KiB to %s in %v: %.0f msgs/s; RSS %d MiB", n, q.name, d.Round(time.Millisecond), float64(n)/d.Seconds(), rssOf(p.Pid())>>20)
	}
	for _, q := range queues {
		phase.Store("consume " + q.name)
		sub, err := c.Subscribe(ctx, q.name, client.SubscribeOptions{Credit: 4000, AutoCredit: true, AckMode: client.AckNone})
		if err != nil {
			t.Fatal(err)
		}
		cctx, stop := context.WithCancel(ctx)
		got := 0
		start := time.Now()
		cerr := sub.Consume(cctx, func(d *client.Delivery) error {
			if got < n && binary.BigEndian.Uint64(d.Payload) != uint64(got) {
				t.Errorf("%s: delivery %d carries %d", q.name, got, binary.BigEndian.Uint64(d.Payload))
				stop()
			}
			got++
			if got == n+1 {
				stop()
			}
			return nil
		})
		stop()
		d := time.Since(start)
		if got != n+1 {
			t.Fatalf("%s: consumed %d of %d: %v\n%s", q.name, got, n+1, cerr, p.LogTail())
		}
		t.Logf("consumed %d from %s in %v: %.0f msgs/s; RSS %d MiB", got, q.name, d.Round(time.Millisecond), float64(got)/d.Seconds(), rssOf(p.Pid())>>20)
	}
	close(stopSampling)
	sampled.Wait()
	if path := os.Getenv("BERTH_BIG_CSV"); path != "" {
		if err := os.WriteFile(path, []byte(samples.String()), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	// The samples at every tenth of the run, and the peak.
	lines := strings.Split(strings.TrimSpace(samples.String()), "\n")[1:]
	peak, peakAt := 0, ""
	for _, l := range lines {
		f := strings.Split(l, ",")
		if rss, _ := strconv.Atoi(f[2]); rss > peak {
			peak, peakAt = rss, l
		}
	}
	for i := 0; i < len(lines); i += max(1, len(lines)/20) {
		t.Logf("sample s,phase,rss_mib,counted_mib,paged,published,delivered: %s", lines[i])
	}
	t.Logf("peak RSS %d MiB at %s", peak, peakAt)
}

// brokerStats are the counters of /v1/status that the samples keep.
type brokerStats struct{ Published, Delivered int64 }

// tryStatus reads the memory and stats sections of /v1/status (status,
// without failing the test: the sampler runs on its own goroutine).
func tryStatus(admin string) (memoryStatus, brokerStats, error) {
	resp, err := http.Get("http://" + admin + "/v1/status")
	if err != nil {
		return memoryStatus{}, brokerStats{}, err
	}
	defer resp.Body.Close()
	var st struct {
		Memory *memoryStatus `json:"memory"`
		Stats  brokerStats   `json:"stats"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&st); err != nil || st.Memory == nil {
		return memoryStatus{}, brokerStats{}, fmt.Errorf("no memory section: %v", err)
	}
	return *st.Memory, st.Stats, nil
}

// rssOf is a process's resident set in bytes, or 0.
func rssOf(pid int) int64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0
	}
	for _, l := range strings.Split(string(b), "\n") {
		if rest, ok := strings.CutPrefix(l, "VmRSS:"); ok {
			kb, _ := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(rest), "kB")), 10, 64)
			return kb << 10
		}
	}
	return 0
}
