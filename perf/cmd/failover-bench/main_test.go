package main

import (
	"bytes"
	"regexp"
	"strings"
	"testing"
	"time"
)

func TestArgs(t *testing.T) {
	c, err := parse([]string{"--kills", "3", "--follower-kills", "0", "--rate", "5k", "--size", "1KiB", "--berthd-flags", "-controller-heartbeat-ms 200"}, &bytes.Buffer{})
	if err != nil {
		t.Fatal(err)
	}
	if c.kills != 3 || c.followerKills != 0 || c.rate != 5000 || c.size != 1024 || strings.Join(c.berthdFlags, " ") != "-controller-heartbeat-ms 200" ||
		c.freeze || c.clientHeartbeat != 0 {
		t.Fatalf("parsed %+v", c)
	}
	c, err = parse([]string{"--freeze", "--client-heartbeat", "200ms"}, &bytes.Buffer{})
	if err != nil {
		t.Fatal(err)
	}
	if !c.freeze || c.clientHeartbeat != 200*time.Millisecond {
		t.Fatalf("--freeze --client-heartbeat 200ms parsed as freeze %v, client heartbeat %v", c.freeze, c.clientHeartbeat)
	}
	for _, bad := range [][]string{
		{"--kills", "0", "--follower-kills", "0"},
		{"--kills", "-1"},
		{"--rate", "0"},
		{"--size", "big"},
		{"--window", "0"},
		{"--observe", "1ms"},
		{"--queue", "a b"},
		{"--spare-controller-leader", "--leader-master"},
		{"--client-heartbeat", "-1s"},
		{"--client-heartbeat", "2m"},
		{"stray"},
	} {
		var stderr bytes.Buffer
		if code := run(bad, &stderr, &stderr); code != 2 {
			t.Errorf("%q: exit %d, want 2", bad, code)
		}
		if stderr.Len() == 0 {
			t.Errorf("%q: no message", bad)
		}
	}
}

func TestQuantileAndSummary(t *testing.T) {
	var ds []time.Duration
	for i := 1; i <= 20; i++ {
		ds = append(ds, time.Duration(i)*100*time.Millisecond)
	}
	if q := quantile(ds, 0.5); q != time.Second {
		t.Errorf("p50 %v", q)
	}
	if q := quantile(ds, 0.99); q != 2*time.Second {
		t.Errorf("p99 %v", q)
	}
	if q := quantile(nil, 0.5); q != -1 {
		t.Errorf("p50 of none %v", q)
	}
	got := summary(results{failovers: ds, notLeader: ds[:10], leader: ds[10:], stalls: []time.Duration{120 * time.Millisecond, 90 * time.Millisecond},
		elected: ds[:4]})
	want := []string{
		"failover master-kill, controller leader spared n=10 p50=500ms p99=1000ms max=1000ms",
		"failover master-kill, master led the controller n=10 p50=1500ms p99=2000ms max=2000ms",
		"failover master-kill n=20 p50=1000ms p99=2000ms max=2000ms",
		"new master named n=4 p50=200ms p99=400ms max=400ms",
		"stall follower-kill n=2 p50=90ms max=120ms",
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Fatalf("summary\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	if l := summary(results{})[2]; !regexp.MustCompile(`^failover master-kill n=0 p50=n/a p99=n/a max=n/a$`).MatchString(l) {
		t.Errorf("empty summary %q", l)
	}
}

func TestGaps(t *testing.T) {
	t0 := time.Unix(1000, 0)
	at := func(ms int) completion { return completion{at: t0.Add(time.Duration(ms) * time.Millisecond)} }
	// 10 ms apart before the kill at 0, then nothing until 250 ms.
	cs := []completion{at(-30), at(-20), at(-10), at(250), at(260), at(2000)}
	before, around, after := gaps(cs, t0, t0.Add(time.Second))
	if before != 10*time.Millisecond || around != 740*time.Millisecond || after != 2 {
		t.Fatalf("before %v around %v after %d", before, around, after)
	}
	// No completion after the kill: the gap runs to the end.
	before, around, after = gaps(cs[:3], t0, t0.Add(time.Second))
	if before != 10*time.Millisecond || around != 1010*time.Millisecond || after != 0 {
		t.Fatalf("before %v around %v after %d", before, around, after)
	}
}

func TestLastBefore(t *testing.T) {
	t0 := time.Unix(1000, 0)
	cs := []completion{{t0.Add(-2 * time.Millisecond), "a"}, {t0, "b"}, {t0.Add(time.Millisecond), "c"}}
	if got := lastBefore(cs, t0); got != "b" {
		t.Errorf("last before %q, want b", got)
	}
	if got := lastBefore(cs[2:], t0); got != "" {
		t.Errorf("last before %q, want none", got)
	}
}
