package bench

import (
	"sync"
	"time"

	"github.com/HdrHistogram/hdrhistogram-go"
)

// Histogram range in microseconds: 1 µs to 5 minutes at 3 significant
// digits; longer values are clamped to the top so none is lost.
const (
	latencyUsMin   = 1
	latencyUsMax   = int64(5 * time.Minute / time.Microsecond)
	latencySigFigs = 3
)

func newHistogram() *hdrhistogram.Histogram {
	return hdrhistogram.New(latencyUsMin, latencyUsMax, latencySigFigs)
}

// recorder keeps a histogram for the whole run and one for the current
// progress interval. Each producer and consumer has its own, so the lock is
// nearly always uncontended: only the progress ticker takes it from outside.
type recorder struct {
	mu struct {
		sync.Mutex
		total    *hdrhistogram.Histogram
		interval *hdrhistogram.Histogram
	}
}

func newRecorder() *recorder {
	r := &recorder{}
	r.mu.total = newHistogram()
	r.mu.interval = newHistogram()
	return r
}

// record adds d to the interval, and to the total when measured (warm-up
// traffic shows in the progress line only).
func (r *recorder) record(d time.Duration, measured bool) {
	us := int64(d / time.Microsecond)
	us = min(max(us, latencyUsMin), latencyUsMax)
	r.mu.Lock()
	// In range by the clamp above, so the errors cannot happen.
	if measured {
		_ = r.mu.total.RecordValue(us)
	}
	_ = r.mu.interval.RecordValue(us)
	r.mu.Unlock()
}

// takeInterval merges the interval histogram into into and starts a new
// interval.
func (r *recorder) takeInterval(into *hdrhistogram.Histogram) {
	r.mu.Lock()
	into.Merge(r.mu.interval)
	r.mu.interval.Reset()
	r.mu.Unlock()
}

func (r *recorder) mergeTotal(into *hdrhistogram.Histogram) {
	r.mu.Lock()
	into.Merge(r.mu.total)
	r.mu.Unlock()
}

// LatencySummary is a latency distribution in microseconds.
type LatencySummary struct {
	Count int64   `json:"count"`
	Mean  float64 `json:"mean_us"`
	P50   int64   `json:"p50_us"`
	P90   int64   `json:"p90_us"`
	P99   int64   `json:"p99_us"`
	P999  int64   `json:"p999_us"`
	Max   int64   `json:"max_us"`
}

// Summarize reads the reported percentiles off h. An empty histogram gives
// all zeros.
func Summarize(h *hdrhistogram.Histogram) LatencySummary {
	if h.TotalCount() == 0 {
		return LatencySummary{}
	}
	return LatencySummary{
		Count: h.TotalCount(),
		Mean:  h.Mean(),
		P50:   h.ValueAtQuantile(50),
		P90:   h.ValueAtQuantile(90),
		P99:   h.ValueAtQuantile(99),
		P999:  h.ValueAtQuantile(99.9),
		Max:   h.Max(),
	}
}
