package bench

import (
	"bytes"
	"encoding/json"
	"encoding/xml"
	"math"
	"strings"
	"testing"
	"time"
)

func TestSummarizePercentiles(t *testing.T) {
	r := newRecorder()
	// 1..1000 ms: p50 is 500 ms, p99 990 ms, max 1000 ms.
	for i := 1; i <= 1000; i++ {
		r.record(time.Duration(i)*time.Millisecond, true)
	}
	r.record(time.Hour, false) // warm-up: interval only
	h := newHistogram()
	r.mergeTotal(h)
	s := Summarize(h)
	near := func(name string, got, want int64) {
		t.Helper()
		// HdrHistogram at 3 significant digits is within 0.1%.
		if math.Abs(float64(got-want)) > float64(want)/1000+1 {
			t.Errorf("%s = %d µs, want about %d", name, got, want)
		}
	}
	if s.Count != 1000 {
		t.Fatalf("count %d, want 1000 (the warm-up value must stay out)", s.Count)
	}
	near("p50", s.P50, 500_000)
	near("p90", s.P90, 900_000)
	near("p99", s.P99, 990_000)
	near("p99.9", s.P999, 999_000)
	near("max", s.Max, 1000_000)
	near("mean", int64(s.Mean), 500_500)

	iv := newHistogram()
	r.takeInterval(iv)
	if iv.TotalCount() != 1001 {
		t.Fatalf("interval count %d, want 1001", iv.TotalCount())
	}
	iv.Reset()
	r.takeInterval(iv)
	if iv.TotalCount() != 0 {
		t.Fatalf("interval not reset: %d", iv.TotalCount())
	}
}

func TestRecorderClamps(t *testing.T) {
	r := newRecorder()
	r.record(-time.Second, true)
	r.record(time.Nanosecond, true)
	r.record(time.Hour, true)
	h := newHistogram()
	r.mergeTotal(h)
	if h.TotalCount() != 3 {
		t.Fatalf("lost out-of-range values: count %d", h.TotalCount())
	}
	if h.Min() != latencyUsMin || h.Max() < latencyUsMax*999/1000 {
		t.Fatalf("min %d max %d, want clamped to %d..%d", h.Min(), h.Max(), latencyUsMin, latencyUsMax)
	}
	if s := Summarize(newHistogram()); s != (LatencySummary{}) {
		t.Fatalf("empty summary %+v", s)
	}
}

func sampleResult() *Result {
	w := DefaultWorkload()
	return &Result{
		Version: ResultVersion, Driver: "berth", Addrs: []string{"127.0.0.1:1"}, Label: "t", Workload: w.String(),
		Settings: settingsOf(&w), Started: time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC), ElapsedSec: 10,
		Published: 100, Completed: 99, Failed: 1, Consumed: 99, PublishRate: 9.9, ConsumeRate: 9.9, PublishMBps: 0.01,
		Publish:  LatencySummary{Count: 99, Mean: 1500, P50: 1000, P90: 2000, P99: 3000, P999: 4000, Max: 5000},
		EndToEnd: LatencySummary{Count: 99, Mean: 2500, P50: 2000, P90: 3000, P99: 4000, P999: 5000, Max: 6000},
		Timeline: []Sample{{T: 1, PublishRate: 10, ConsumeRate: 9, PublishP50: 1000, PublishP99: 3000, E2EP50: 2000, E2EP99: 4000},
			{T: 2, PublishRate: 12, ConsumeRate: 11, PublishP50: 900, PublishP99: 2500, E2EP50: 1800, E2EP99: 3900}},
		Notes: []string{"a note"},
	}
}

// The JSON shape is a contract with scripts and bench-compare: these keys
// must stay.
func TestJSONShape(t *testing.T) {
	var buf bytes.Buffer
	r := sampleResult()
	if err := r.WriteJSON(&buf); err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := json.Unmarshal(buf.Bytes(), &m); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"version", "driver", "addrs", "workload", "settings", "started", "elapsed_s", "published",
		"completed", "failed", "consumed", "lost", "publish_rate", "consume_rate", "publish_mb_per_s",
		"publish_latency", "e2e_latency", "timeline", "notes"} {
		if _, ok := m[k]; !ok {
			t.Errorf("key %q missing", k)
		}
	}
	lat := m["publish_latency"].(map[string]any)
	for _, k := range []string{"count", "mean_us", "p50_us", "p90_us", "p99_us", "p999_us", "max_us"} {
		if _, ok := lat[k]; !ok {
			t.Errorf("publish_latency.%s missing", k)
		}
	}
	if lat["p99_us"].(float64) != 3000 {
		t.Errorf("p99_us = %v", lat["p99_us"])
	}
	tl := m["timeline"].([]any)
	if len(tl) != 2 || tl[1].(map[string]any)["e2e_p99_us"].(float64) != 3900 {
		t.Errorf("timeline = %v", tl)
	}
	settings := m["settings"].(map[string]any)
	if settings["mode"] != "async" || settings["window"].(float64) != 256 {
		t.Errorf("settings = %v", settings)
	}
	back, err := ReadJSON(&buf)
	if err != nil {
		t.Fatal(err)
	}
	if back.Publish != r.Publish || back.Consumed != r.Consumed || !back.Started.Equal(r.Started) || len(back.Timeline) != 2 {
		t.Fatalf("round trip changed the result: %+v", back)
	}
	if _, err := ReadJSON(strings.NewReader(`{"version": 99}`)); err == nil {
		t.Fatal("accepted another version")
	}
	if _, err := ReadJSON(strings.NewReader(`{"version": 1, "bogus": 2}`)); err == nil {
		t.Fatal("accepted an unknown field")
	}
}

func TestTable(t *testing.T) {
	var buf bytes.Buffer
	if err := sampleResult().WriteTable(&buf); err != nil {
		t.Fatal(err)
	}
	out := buf.String()
	for _, want := range []string{"100 / 99 / 1", "publish->complete", "1.00ms", "3.00ms", "5.00ms", "publish->deliver", "6.00ms", "a note"} {
		if !strings.Contains(out, want) {
			t.Errorf("table lacks %q:\n%s", want, out)
		}
	}
	for us, want := range map[int64]string{999: "999µs", 1500: "1.50ms", 2_500_000: "2.50s"} {
		if got := FormatLatency(us); got != want {
			t.Errorf("FormatLatency(%d) = %q, want %q", us, got, want)
		}
	}
}

type svgDoc struct {
	XMLName xml.Name `xml:"svg"`
	Groups  []struct {
		Label     string `xml:"data-label,attr"`
		Polylines []struct {
			Name   string `xml:"data-name,attr"`
			Points string `xml:"points,attr"`
		} `xml:"polyline"`
	} `xml:"g"`
}

func TestPlot(t *testing.T) {
	var buf bytes.Buffer
	r := sampleResult()
	r.Label = `<script>&"`
	if err := WritePlot(&buf, r); err != nil {
		t.Fatal(err)
	}
	var doc svgDoc
	if err := xml.Unmarshal(buf.Bytes(), &doc); err != nil {
		t.Fatalf("not well-formed XML: %v\n%s", err, buf.String())
	}
	if strings.Contains(buf.String(), "<script>") {
		t.Fatal("label not escaped")
	}
	if len(doc.Groups) != 2 {
		t.Fatalf("%d panels, want 2", len(doc.Groups))
	}
	wantSeries := []int{2, 4}
	for i, g := range doc.Groups {
		if len(g.Polylines) != wantSeries[i] {
			t.Fatalf("panel %q has %d series, want %d", g.Label, len(g.Polylines), wantSeries[i])
		}
		for _, pl := range g.Polylines {
			if n := len(strings.Fields(pl.Points)); n != len(r.Timeline) {
				t.Fatalf("series %q has %d points, want %d", pl.Name, n, len(r.Timeline))
			}
		}
	}
	// The highest throughput point (12/s, scaled to a nice 20) sits
	// above the lower one: SVG y grows downwards.
	pts := strings.Fields(doc.Groups[0].Polylines[0].Points)
	var x0, y0, x1, y1 float64
	parsePoint(t, pts[0], &x0, &y0)
	parsePoint(t, pts[1], &x1, &y1)
	if !(x1 > x0 && y1 < y0) {
		t.Fatalf("points %v do not rise left to right", pts)
	}
	// An empty timeline still draws a valid document.
	buf.Reset()
	r.Timeline = nil
	if err := WritePlot(&buf, r); err != nil {
		t.Fatal(err)
	}
	if err := xml.Unmarshal(buf.Bytes(), &doc); err != nil {
		t.Fatalf("empty plot not well-formed: %v", err)
	}
}

func parsePoint(t *testing.T, s string, x, y *float64) {
	t.Helper()
	var sx, sy string
	sx, sy, ok := strings.Cut(s, ",")
	if !ok {
		t.Fatalf("point %q", s)
	}
	if err := json.Unmarshal([]byte(sx), x); err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal([]byte(sy), y); err != nil {
		t.Fatal(err)
	}
}

func TestNiceCeil(t *testing.T) {
	for in, want := range map[float64]float64{0: 1, 0.3: 0.5, 7: 10, 12: 20, 150: 200, 50000: 50000, 51000: 100000} {
		if got := niceCeil(in); math.Abs(got-want) > 1e-9 {
			t.Errorf("niceCeil(%v) = %v, want %v", in, got, want)
		}
	}
}
