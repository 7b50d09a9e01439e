package server_test

import (
	"bufio"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/berthmq/berth/client"
	"github.com/berthmq/berth/server"
	"github.com/berthmq/berth/shards"
)

// scrape fetches /metrics and returns its series, keyed by name and
// labels as written ("berth_queue_depth{queue=\"q\"}").
func scrape(t testing.TB, admin string) map[string]float64 {
	t.Helper()
	return scrapePath(t, admin, "/metrics")
}

// scrapePath is scrape of another path of the admin HTTP.
func scrapePath(t testing.TB, admin, path string) map[string]float64 {
	t.Helper()
	resp, err := http.Get("http://" + admin + path)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(resp.Body)
		t.Fatalf("/metrics: %s\n%s", resp.Status, b)
	}
	out := map[string]float64{}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || line[0] == '#' {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		v, err := strconv.ParseFloat(line[i+1:], 64)
		if err != nil {
			t.Fatalf("/metrics line %q: %v", line, err)
		}
		out[line[:i]] = v
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// expectSeries checks series values exactly.
func expectSeries(t testing.TB, got map[string]float64, want map[string]float64) {
	t.Helper()
	for k, w := range want {
		g, ok := got[k]
		if !ok {
			t.Errorf("no series %s", k)
			continue
		}
		if g != w {
			t.Errorf("%s = %v, want %v", k, g, w)
		}
	}
}

// TestMetricsAfterKnownTraffic publishes 100 persistent messages to a
// durable queue, has a consumer receive all of them and accept 40, and
// checks what one scrape of /metrics says about the queue, its shard's
// journal, the broker and the controller.
func TestMetricsAfterKnownTraffic(t *testing.T) {
	s := startServer(t, func(c *server.Config) {
		c.AdminAddr = "127.0.0.1:0"
		c.ControllerAddr = "127.0.0.1:0"
	})
	ctx := ctxT(t)
	c := dial(t, s)
	const queue, published, accepted = "metered", 100, 40
	payload := []byte("twelve bytes")
	if err := c.DeclareQueue(ctx, queue, client.QueueOptions{Durable: true}); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < published; i++ {
		if err := c.Publish(ctx, "", queue, payload, client.PublishOptions{Persistent: true}); err != nil {
			t.Fatal(err)
		}
	}
	con, err := c.Subscribe(ctx, queue, client.SubscribeOptions{Credit: published})
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < published; i++ {
		d := next(t, con, 5*time.Second)
		if i < accepted {
			// Completed once the dequeue is durable.
			if err := d.Accept(ctx); err != nil {
				t.Fatal(err)
			}
		}
	}

	got := scrape(t, s.AdminAddr())
	q := fmt.Sprintf("{queue=%q}", queue)
	shard := fmt.Sprintf("{shard=\"%d\"}", s.Broker().ShardFor(queue))
	other := fmt.Sprintf("{shard=\"%d\"}", 1-s.Broker().ShardFor(queue))
	unacked := float64(published - accepted)
	expectSeries(t, got, map[string]float64{
		"berth_queue_published_total" + q:     published,
		"berth_queue_delivered_total" + q:     published,
		"berth_queue_accepted_total" + q:      accepted,
		"berth_queue_dead_lettered_total" + q: 0,
		"berth_queue_depth" + q:               unacked,
		"berth_queue_ready" + q:               0,
		"berth_queue_unacked" + q:             unacked,
		"berth_queue_consumers" + q:           1,
		"berth_queue_bytes" + q:               unacked * float64(len(payload)),

		"berth_messages_published_total": published,
		"berth_messages_delivered_total": published,
		"berth_messages_accepted_total":  accepted,
		"berth_queues":                   1,

		// 100 enqueue records and 40 dequeue records, all durable: each
		// accept completed after the fsync that covered it.
		"berth_journal_appends_total" + shard:         published + accepted,
		"berth_journal_records_per_fsync_sum" + shard: published + accepted,
		"berth_journal_appends_total" + other:         0,
		"berth_journal_fsyncs_total" + other:          0,
		"berth_shard_store_errors_total" + shard:      0,
		"berth_shard_recovered_messages" + shard:      0,
		"berth_journal_failed" + shard:                0,

		"berth_controller_leader":    1,
		"berth_controller_is_leader": 1,
		"berth_ready":                1,
	})
	fsyncs := got["berth_journal_fsyncs_total"+shard]
	if fsyncs < 1 || fsyncs > published+accepted {
		t.Errorf("berth_journal_fsyncs_total%s = %v, want 1 to %d", shard, fsyncs, published+accepted)
	}
	// Both histograms count every fsync, and the +Inf bucket holds all.
	for _, h := range []string{"berth_journal_records_per_fsync", "berth_journal_fsync_seconds"} {
		inf := fmt.Sprintf("%s_bucket{shard=\"%d\",le=\"+Inf\"}", h, s.Broker().ShardFor(queue))
		if got[h+"_count"+shard] != fsyncs || got[inf] != fsyncs {
			t.Errorf("%s: count %v, +Inf bucket %v, want the %v fsyncs", h, got[h+"_count"+shard], got[inf], fsyncs)
		}
	}
	if got["berth_journal_fsync_seconds_sum"+shard] <= 0 {
		t.Errorf("fsync time %v", got["berth_journal_fsync_seconds_sum"+shard])
	}
	if _, ok := got["berth_shard_ring_full_total"+shard]; !ok {
		t.Error("no berth_shard_ring_full_total")
	}
	if _, ok := got["berth_shard_recovery_seconds"+shard]; !ok {
		t.Error("no berth_shard_recovery_seconds")
	}
	// The controller took at least the broker id, the registration and
	// the durable queue.
	if got["berth_controller_term"] < 1 || got["berth_controller_applied_index"] < 3 ||
		got["berth_controller_proposals_per_entry_count"] < 3 || got["berth_controller_proposals_per_entry_sum"] < 3 {
		t.Errorf("controller: term %v applied %v entries %v proposals %v", got["berth_controller_term"], got["berth_controller_applied_index"],
			got["berth_controller_proposals_per_entry_count"], got["berth_controller_proposals_per_entry_sum"])
	}
}

// TestMetricsQueueLimit: past Config.MetricsQueueLimit queues, /metrics
// drops the per-queue series (all of them, and says how many) but keeps
// their sums, and /metrics/queues lists them, all or by name prefix.
func TestMetricsQueueLimit(t *testing.T) {
	s := startServer(t, func(c *server.Config) {
		c.AdminAddr = "127.0.0.1:0"
		c.MetricsQueueLimit = 3
	})
	ctx := ctxT(t)
	c := dial(t, s)
	names := []string{"a1", "a2", "b1", "b2", "b3"}
	publish := func(i int) {
		t.Helper()
		if err := c.DeclareQueue(ctx, names[i], client.QueueOptions{}); err != nil {
			t.Fatal(err)
		}
		for range i + 1 {
			if err := c.Publish(ctx, "", names[i], []byte("x"), client.PublishOptions{}); err != nil {
				t.Fatal(err)
			}
		}
	}
	series := func(got map[string]float64, metric string) []string {
		var out []string
		for k := range got {
			if strings.HasPrefix(k, metric+"{") {
				out = append(out, k)
			}
		}
		return out
	}
	for i := range 3 {
		publish(i)
	}
	got := scrape(t, s.AdminAddr())
	expectSeries(t, got, map[string]float64{
		`berth_queue_ready{queue="a1"}`: 1,
		`berth_queue_ready{queue="b1"}`: 3,
		"berth_messages_ready":          6,
		"berth_queues":                  3,
		"berth_queue_metrics_omitted":   0,
	})
	for i := 3; i < len(names); i++ {
		publish(i)
	}
	got = scrape(t, s.AdminAddr())
	if q := series(got, "berth_queue_ready"); len(q) != 0 {
		t.Errorf("/metrics over the limit lists %v", q)
	}
	expectSeries(t, got, map[string]float64{
		"berth_messages_ready":        15,
		"berth_messages_unacked":      0,
		"berth_queues":                5,
		"berth_queue_metrics_omitted": 5,
	})
	all := scrapePath(t, s.AdminAddr(), "/metrics/queues")
	for i, n := range names {
		expectSeries(t, all, map[string]float64{fmt.Sprintf("berth_queue_ready{queue=%q}", n): float64(i + 1)})
	}
	if n := len(series(all, "berth_queue_ready")); n != len(names) {
		t.Errorf("/metrics/queues lists %d queues, want %d", n, len(names))
	}
	b := scrapePath(t, s.AdminAddr(), "/metrics/queues?prefix=b")
	if q := series(b, "berth_queue_depth"); len(q) != 3 {
		t.Errorf("/metrics/queues?prefix=b lists %v, want b1, b2, b3", q)
	}
	expectSeries(t, b, map[string]float64{`berth_queue_depth{queue="b3"}`: 5})
}

// BenchmarkMetricsScrape times one scrape of /metrics with many idle
// queues: by default (past Config.MetricsQueueLimit, sums only) and with
// no limit (a series per queue and counter, as before the limit).
//
//	go test ./server -run '^$' -bench MetricsScrape -benchtime 5x
func BenchmarkMetricsScrape(b *testing.B) {
	for _, n := range []int{100_000, 1_000_000} {
		for _, limit := range []int{0, -1} {
			name := fmt.Sprintf("queues=%d/limit=default", n)
			if limit < 0 {
				name = fmt.Sprintf("queues=%d/limit=none", n)
			}
			b.Run(name, func(b *testing.B) {
				s := startServer(b, func(c *server.Config) {
					c.AdminAddr = "127.0.0.1:0"
					c.MetricsQueueLimit = limit
				})
				specs := make([]shards.QueueSpec, n)
				for i := range specs {
					specs[i].Name = fmt.Sprintf("idle-%07d", i)
				}
				if _, err := s.Broker().AddQueues(specs); err != nil {
					b.Fatal(err)
				}
				var bytes int64
				b.ResetTimer()
				for range b.N {
					resp, err := http.Get("http://" + s.AdminAddr() + "/metrics")
					if err != nil {
						b.Fatal(err)
					}
					k, err := io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
					if err != nil || resp.StatusCode != http.StatusOK {
						b.Fatal(resp.Status, err)
					}
					bytes = k
				}
				b.ReportMetric(float64(bytes), "bytes/scrape")
			})
		}
	}
}
