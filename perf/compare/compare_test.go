package compare

import (
	"bytes"
	"strings"
	"testing"

	"github.com/berthmq/berth/perf/bench"
)

func result(pubRate, conRate float64, p99 int64, consumers int) *bench.Result {
	return &bench.Result{
		PublishRate: pubRate, ConsumeRate: conRate,
		Settings: bench.Settings{Consumers: consumers},
		Publish:  bench.LatencySummary{P50: p99 / 2, P99: p99, Max: p99 * 2},
		EndToEnd: bench.LatencySummary{P50: p99, P99: p99 * 2, Max: p99 * 3},
	}
}

func entries() []Entry {
	return []Entry{
		{Setting: SettingDurable, Broker: Berth, Result: result(1000, 900, 4000, 2)},
		{Setting: SettingDurable, Broker: "nats", Result: result(500, 300, 8000, 2)},
		{Setting: SettingNoFsync, Broker: Berth, Result: result(5000, 5000, 1000, 2)},
		{Setting: SettingNoFsync, Broker: "nats", Result: result(2000, 2500, 2000, 2)},
		{Setting: SettingDurable, Broker: "amqp", Err: "bench-compare: rabbitmq-server exited\nlong log"},
		// Open-loop runs: equal rates, and they must not move the ratio.
		{Kind: KindLatency, Setting: SettingDurable, Broker: Berth, Result: result(500, 500, 700, 2)},
		{Kind: KindLatency, Setting: SettingDurable, Broker: "nats", Result: result(500, 50, 1400, 2)},
	}
}

func TestRatioAndSummary(t *testing.T) {
	e := entries()
	if r, ok := Ratio(e, SettingDurable, "nats"); !ok || r != 3 {
		t.Fatalf("durable ratio %v %v, want 3 (900/300 delivered/s)", r, ok)
	}
	if r, ok := Ratio(e, SettingNoFsync, "nats"); !ok || r != 2 {
		t.Fatalf("nofsync ratio %v %v, want 2", r, ok)
	}
	if _, ok := Ratio(e, SettingDurable, "amqp"); ok {
		t.Fatal("ratio against a failed run")
	}
	if _, ok := Ratio(e, SettingNoFsync, "amqp"); ok {
		t.Fatal("ratio against a missing run")
	}
	got := SummaryLine(e, "nats", []string{SettingDurable, SettingNoFsync})
	if got != "ratio berth/nats durable=3.00 nofsync=2.00" {
		t.Fatalf("summary %q", got)
	}
	if got := SummaryLine(e, "amqp", []string{SettingDurable}); got != "ratio berth/amqp durable=n/a" {
		t.Fatalf("summary %q", got)
	}
	// Without consumers the publish rate is the headline.
	pubOnly := []Entry{
		{Setting: SettingDurable, Broker: Berth, Result: result(800, 0, 1, 0)},
		{Setting: SettingDurable, Broker: "nats", Result: result(400, 0, 1, 0)},
	}
	if r, ok := Ratio(pubOnly, SettingDurable, "nats"); !ok || r != 2 {
		t.Fatalf("publish-only ratio %v %v, want 2", r, ok)
	}
}

func TestTable(t *testing.T) {
	var buf bytes.Buffer
	if err := WriteTable(&buf, entries()); err != nil {
		t.Fatal(err)
	}
	out := buf.String()
	for _, want := range []string{
		"durable", "nofsync", "berth/nats", "berth/amqp",
		"consume msg/s", "900/s", "300/s", "3.00", // delivered rate and its ratio
		"publish p99", "4.00ms", "8.00ms", "0.50",
		"amqp failed: bench-compare: rabbitmq-server exited",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("table lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "long log") {
		t.Error("table shows more than the first line of an error")
	}
	// One row per figure in each block.
	if n := strings.Count(out, "e2e max"); n != 4 {
		t.Errorf("%d blocks, want 4 (throughput: durable nats, durable amqp, nofsync nats; latency: durable nats)", n)
	}
	for _, want := range []string{"throughput durable", "throughput nofsync", "latency durable", "1.40ms"} {
		if !strings.Contains(out, want) {
			t.Errorf("table lacks %q", want)
		}
	}
	if strings.Index(out, "latency durable") < strings.Index(out, "throughput nofsync") {
		t.Error("latency blocks come before all throughput blocks")
	}
}

func TestServerConfigs(t *testing.T) {
	durable := NATSConfig(4222, "/tmp/x y", true)
	for _, want := range []string{"listen: 127.0.0.1:4222", `store_dir: "/tmp/x y"`, `sync_interval: "always"`} {
		if !strings.Contains(durable, want) {
			t.Errorf("durable config lacks %q:\n%s", want, durable)
		}
	}
	if nofsync := NATSConfig(1, "/d", false); strings.Contains(nofsync, "always") {
		t.Errorf("nofsync config fsyncs:\n%s", nofsync)
	}
	args := strings.Join(BerthArgs(7400, 7480, "/d", true, true), " ")
	if !strings.Contains(args, "-listen 127.0.0.1:7400") || !strings.Contains(args, "-admin 127.0.0.1:7480") || !strings.Contains(args, "-fsync always") {
		t.Errorf("durable berthd args %q", args)
	}
	if args := strings.Join(BerthArgs(1, 2, "/d", false, true), " "); !strings.Contains(args, "-fsync never") {
		t.Errorf("nofsync berthd args %q", args)
	}
	if args := strings.Join(BerthArgs(1, 2, "/d", false, false), " "); strings.Contains(args, "-fsync") {
		t.Errorf("args for a berthd without the flag %q", args)
	}
}

func TestNATSClusterConfig(t *testing.T) {
	conf := NATSClusterConfig("n2", 4223, 6223, []int{6222, 6223, 6224}, "/tmp/js", true)
	for _, want := range []string{`server_name: "n2"`, "listen: 127.0.0.1:4223", `store_dir: "/tmp/js"`, `sync_interval: "always"`,
		"listen: 127.0.0.1:6223", "routes: [nats-route://127.0.0.1:6222, nats-route://127.0.0.1:6223, nats-route://127.0.0.1:6224]"} {
		if !strings.Contains(conf, want) {
			t.Errorf("cluster config lacks %q:\n%s", want, conf)
		}
	}
	if strings.Contains(NATSClusterConfig("n1", 1, 2, []int{2}, "/d", false), "always") {
		t.Error("nofsync cluster config fsyncs")
	}
	if got := SummaryLineTag(entries(), "nats", "r3", []string{SettingDurable}); got != "ratio berth/nats r3 durable=3.00" {
		t.Errorf("tagged summary %q", got)
	}
}
