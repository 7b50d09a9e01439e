package main

import (
	"bytes"
	"regexp"
	"strings"
	"testing"

	"github.com/berthmq/berth/perf/bench"
	"github.com/berthmq/berth/perf/compare"
)

func TestArgs(t *testing.T) {
	c, err := parse([]string{"--sizes", "128,4KiB", "--settings", "nofsync", "--queues", "12", "--consumers", "12", "--shards", "4"}, &bytes.Buffer{})
	if err != nil {
		t.Fatal(err)
	}
	if len(c.sizes) != 2 || c.sizes[0] != 128 || c.sizes[1] != 4096 || len(c.settings) != 1 || c.settings[0] != "nofsync" ||
		c.w.Queues != 12 || c.shards != 4 || !c.w.Persistent || c.peers != "nats" {
		t.Fatalf("parsed %+v", c)
	}
	for _, bad := range [][]string{
		{"--sizes", "12x"},
		{"--sizes", "4"}, // below the payload's header
		{"--settings", "durable,fast"},
		{"--peers", "rabbit"},
		{"--queues", "8", "--consumers", "4"},
		{"--persistent=false"},
		{"--groups", "0"},
		{"stray"},
	} {
		var stderr bytes.Buffer
		if code := run(bad, &stderr, &stderr); code != 2 {
			t.Errorf("%q: exit %d, want 2", bad, code)
		}
		if !strings.Contains(stderr.String(), "bench-compare-cluster:") && !strings.Contains(stderr.String(), "invalid") {
			t.Errorf("%q: no message: %q", bad, stderr.String())
		}
	}
}

func TestSummaryLines(t *testing.T) {
	res := func(rate float64) *bench.Result {
		return &bench.Result{ConsumeRate: rate, PublishRate: rate, Settings: bench.Settings{Consumers: 6}}
	}
	berth := res(60000)
	runs := []sizeRun{
		{size: 128, entries: []compare.Entry{
			{Setting: "durable", Broker: "berth", Result: berth}, {Setting: "nofsync", Broker: "berth", Result: berth},
			{Setting: "durable", Broker: "nats", Result: res(2000)}, {Setting: "nofsync", Broker: "nats", Result: res(20000)},
		}},
		{size: 1024, entries: []compare.Entry{
			{Setting: "durable", Broker: "berth", Result: res(30000)}, {Setting: "nofsync", Broker: "berth", Result: res(30000)},
			{Setting: "durable", Broker: "nats", Err: "nats-server exited"}, {Setting: "nofsync", Broker: "nats", Result: res(10000)},
		}, single: res(120000)},
	}
	got := summary(runs, []string{"durable", "nofsync"})
	want := []string{
		"ratio berth/nats r3 size=128 durable=30.00 nofsync=3.00",
		"ratio berth/nats r3 size=1024 durable=n/a nofsync=3.00",
		"ratio berth/nats r3 durable=30.00 nofsync=3.00",
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Fatalf("summary\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	if l := singleLine(runs[0]); l != "ratio berth r3/single size=128 delivered=n/a" {
		t.Errorf("single line %q", l)
	}
	if l := singleLine(runs[1]); l != "ratio berth r3/single size=1024 delivered=0.25" {
		t.Errorf("single line %q", l)
	}
	last := regexp.MustCompile(`^ratio berth/nats r3 durable=(\d+\.\d\d|n/a) nofsync=(\d+\.\d\d|n/a)$`)
	if !last.MatchString(got[len(got)-1]) {
		t.Fatalf("last line %q", got[len(got)-1])
	}
}
