// Package bench runs a workload through a driver and reports what it
// measured: counts, rates, and HdrHistogram latencies from publish to
// completion and from publish to delivery.
package bench

import (
	"errors"
	"flag"
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/berthmq/berth/perf/driver"
)

// Bounds on a workload: a typo must not start a million goroutines or ask
// for a payload the brokers would refuse anyway.
const (
	producersMax = 1024
	consumersMax = 1024
	queuesMax    = 1024
	windowMax    = 1 << 16
	batchMax     = 1 << 16
	creditMax    = 1 << 16
	// sizeMin leaves room for the send timestamp and sequence number
	// every payload carries.
	sizeMin = 16
	sizeMax = 16 << 20
	// durationMax bounds every run.
	durationMax = 24 * time.Hour
)

// Mode is how producers wait for publish completions.
type Mode string

const (
	// ModeSync waits for each message's completion before the next.
	ModeSync Mode = "sync"
	// ModeAsync keeps up to Window messages uncompleted per producer.
	ModeAsync Mode = "async"
	// ModeBatch sends Batch messages, then waits for all of them.
	ModeBatch Mode = "batch"
)

// Workload is what a run does. The same Workload runs through every driver.
type Workload struct {
	Producers int
	Consumers int
	Queues    int
	// QueuePrefix names the queues: prefix-0, prefix-1, ... The run
	// declares those that do not exist and deletes them when it ends.
	QueuePrefix string
	Size        int // payload bytes
	Mode        Mode
	Window      int // ModeAsync
	Batch       int // ModeBatch
	Credit      int // per consumer
	Ack         driver.AckMode
	Persistent  bool
	// Rate is the target publish rate over all producers in messages per
	// second (open loop); 0 publishes as fast as completions allow.
	Rate float64
	// Duration and Count bound the measured phase; whichever is reached
	// first ends it. At least one must be set.
	Duration time.Duration
	Count    int64
	// Warmup runs the workload unmeasured before the measured phase.
	Warmup time.Duration
}

// DefaultWorkload is the standard run: two producers and two consumers on
// one queue, 1 KiB messages, async window 256, credit 256, explicit acks,
// 2 s of warm-up and 10 s measured.
func DefaultWorkload() Workload {
	return Workload{
		Producers: 2, Consumers: 2, Queues: 1, QueuePrefix: "berth-bench",
		Size: 1024, Mode: ModeAsync, Window: 256, Batch: 64, Credit: 256,
		Ack: driver.AckExplicit, Duration: 10 * time.Second, Warmup: 2 * time.Second,
	}
}

// RegisterFlags binds w's fields to flags of fs; w's values are the
// defaults. Call Validate after parsing.
func (w *Workload) RegisterFlags(fs *flag.FlagSet) {
	fs.IntVar(&w.Producers, "producers", w.Producers, "producer connections")
	fs.IntVar(&w.Consumers, "consumers", w.Consumers, "consumer connections (0: publish only)")
	fs.IntVar(&w.Queues, "queues", w.Queues, "queues; producers and consumers are spread over them round robin")
	fs.StringVar(&w.QueuePrefix, "queue-prefix", w.QueuePrefix, "queue names are <prefix>-<n>; the run declares those that do not exist, and deletes only those")
	fs.Func("size", fmt.Sprintf("message size in bytes, with optional KiB/MiB suffix, %d..%d (default %d)", sizeMin, sizeMax, w.Size), func(s string) error {
		n, err := ParseSize(s)
		w.Size = n
		return err
	})
	fs.Func("mode", "publish mode: sync, async or batch; async:N and batch:N also set the window or batch (default "+string(w.Mode)+")", func(s string) error {
		return w.setMode(s)
	})
	fs.IntVar(&w.Window, "window", w.Window, "async mode: uncompleted messages per producer")
	fs.IntVar(&w.Batch, "batch", w.Batch, "batch mode: messages per batch")
	fs.IntVar(&w.Credit, "credit", w.Credit, "consumer credit (prefetch)")
	fs.Func("ack", "consumer ack mode: explicit or none (default "+string(w.Ack)+")", func(s string) error {
		switch driver.AckMode(s) {
		case driver.AckExplicit, driver.AckNone:
			w.Ack = driver.AckMode(s)
			return nil
		}
		return fmt.Errorf("bench: ack mode %q is not explicit or none", s)
	})
	fs.BoolVar(&w.Persistent, "persistent", w.Persistent, "durable queues and persistent messages")
	fs.Func("rate", "open-loop target rate in msg/s over all producers, k/M suffix allowed; 0 = closed loop (default 0)", func(s string) error {
		r, err := ParseRate(s)
		w.Rate = r
		return err
	})
	fs.DurationVar(&w.Duration, "duration", w.Duration, "measured duration (0: bounded by -count only; with -count and no -duration, 0)")
	fs.Func("count", "measured messages over all producers, k/M suffix allowed (0: bounded by -duration only); given alone, it is the only bound: no default duration, no warm-up", func(s string) error {
		r, err := ParseRate(s)
		if err == nil && r != math.Trunc(r) {
			err = fmt.Errorf("bench: count %q is not a whole number", s)
		}
		w.Count = int64(r)
		return err
	})
	fs.DurationVar(&w.Warmup, "warmup", w.Warmup, "unmeasured warm-up before the measured phase (with -count and no -warmup, 0)")
}

// CountAlone applies the rule for a count given on its own, after fs (on
// which RegisterFlags registered w's flags) was parsed: a --count without
// --duration is not cut short by the default duration, and one without
// --warmup gets no warm-up added to it. A count is then the whole run.
func (w *Workload) CountAlone(fs *flag.FlagSet) {
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	if !set["count"] || w.Count == 0 {
		return
	}
	if !set["duration"] {
		w.Duration = 0
	}
	if !set["warmup"] {
		w.Warmup = 0
	}
}

func (w *Workload) setMode(s string) error {
	name, arg, hasArg := strings.Cut(s, ":")
	var n int
	if hasArg {
		v, err := strconv.Atoi(arg)
		if err != nil || v < 1 {
			return fmt.Errorf("bench: mode %q: %q is not a positive number", s, arg)
		}
		n = v
	}
	switch Mode(name) {
	case ModeSync:
		if hasArg {
			return fmt.Errorf("bench: mode sync takes no argument")
		}
	case ModeAsync:
		if hasArg {
			w.Window = n
		}
	case ModeBatch:
		if hasArg {
			w.Batch = n
		}
	default:
		return fmt.Errorf("bench: mode %q is not sync, async or batch", name)
	}
	w.Mode = Mode(name)
	return nil
}

// Validate reports the first setting out of bounds.
func (w *Workload) Validate() error {
	var errs []error
	check := func(ok bool, format string, args ...any) {
		if !ok {
			errs = append(errs, fmt.Errorf("bench: "+format, args...))
		}
	}
	check(w.Producers >= 1 && w.Producers <= producersMax, "producers %d not in 1..%d", w.Producers, producersMax)
	check(w.Consumers >= 0 && w.Consumers <= consumersMax, "consumers %d not in 0..%d", w.Consumers, consumersMax)
	check(w.Queues >= 1 && w.Queues <= queuesMax, "queues %d not in 1..%d", w.Queues, queuesMax)
	check(w.QueuePrefix != "" && !strings.ContainsAny(w.QueuePrefix, " .*>\t\n"), "queue prefix %q must be non-empty, without spaces, dots or wildcards", w.QueuePrefix)
	check(w.Size >= sizeMin && w.Size <= sizeMax, "size %d not in %d..%d", w.Size, sizeMin, sizeMax)
	check(w.Mode == ModeSync || w.Mode == ModeAsync || w.Mode == ModeBatch, "mode %q is not sync, async or batch", w.Mode)
	check(w.Window >= 1 && w.Window <= windowMax, "window %d not in 1..%d", w.Window, windowMax)
	check(w.Batch >= 1 && w.Batch <= batchMax, "batch %d not in 1..%d", w.Batch, batchMax)
	check(w.Credit >= 1 && w.Credit <= creditMax, "credit %d not in 1..%d", w.Credit, creditMax)
	check(w.Ack == driver.AckExplicit || w.Ack == driver.AckNone, "ack mode %q is not explicit or none", w.Ack)
	check(w.Rate >= 0 && !math.IsInf(w.Rate, 0) && !math.IsNaN(w.Rate), "rate %v must be 0 or positive", w.Rate)
	check(w.Duration >= 0 && w.Duration <= durationMax, "duration %v not in 0..%v", w.Duration, durationMax)
	check(w.Count >= 0, "count %d is negative", w.Count)
	check(w.Duration > 0 || w.Count > 0, "set a duration or a count: the run must be bounded")
	check(w.Warmup >= 0 && w.Warmup <= durationMax, "warmup %v not in 0..%v", w.Warmup, durationMax)
	return errors.Join(errs...)
}

// InFlight is the most uncompleted messages one producer keeps.
func (w *Workload) InFlight() int {
	switch w.Mode {
	case ModeAsync:
		return w.Window
	case ModeBatch:
		return w.Batch
	}
	return 1
}

// QueueNames lists the workload's queues.
func (w *Workload) QueueNames() []string {
	names := make([]string, w.Queues)
	for i := range names {
		names[i] = fmt.Sprintf("%s-%d", w.QueuePrefix, i)
	}
	return names
}

// String is a one-line summary, used as the workload's label in reports.
func (w *Workload) String() string {
	mode := string(w.Mode)
	switch w.Mode {
	case ModeAsync:
		mode += ":" + strconv.Itoa(w.Window)
	case ModeBatch:
		mode += ":" + strconv.Itoa(w.Batch)
	}
	rate := "max"
	if w.Rate > 0 {
		rate = strconv.FormatFloat(w.Rate, 'f', -1, 64) + "/s"
	}
	return fmt.Sprintf("p=%d c=%d q=%d size=%d mode=%s credit=%d ack=%s persistent=%t rate=%s",
		w.Producers, w.Consumers, w.Queues, w.Size, mode, w.Credit, w.Ack, w.Persistent, rate)
}

// ParseSize reads a byte count such as 512, 4KiB, 1MiB (also k, K, KB as
// 1024 and m, M, MB as 1048576).
func ParseSize(s string) (int, error) {
	t := strings.TrimSpace(s)
	mult := 1
	for _, suf := range []struct {
		s string
		m int
	}{{"KiB", 1 << 10}, {"MiB", 1 << 20}, {"KB", 1 << 10}, {"MB", 1 << 20}, {"k", 1 << 10}, {"K", 1 << 10}, {"m", 1 << 20}, {"M", 1 << 20}, {"B", 1}} {
		if strings.HasSuffix(t, suf.s) {
			t, mult = strings.TrimSuffix(t, suf.s), suf.m
			break
		}
	}
	n, err := strconv.Atoi(t)
	if err != nil || n < 0 || n > sizeMax/mult {
		return 0, fmt.Errorf("bench: size %q is not a byte count up to %d", s, sizeMax)
	}
	return n * mult, nil
}

// ParseRate reads a non-negative number with an optional k (thousand) or
// M (million) suffix.
func ParseRate(s string) (float64, error) {
	t := strings.TrimSpace(s)
	mult := 1.0
	switch {
	case strings.HasSuffix(t, "k"), strings.HasSuffix(t, "K"):
		t, mult = t[:len(t)-1], 1e3
	case strings.HasSuffix(t, "M"):
		t, mult = t[:len(t)-1], 1e6
	}
	v, err := strconv.ParseFloat(t, 64)
	if err != nil || v < 0 || math.IsInf(v, 0) || math.IsNaN(v) {
		return 0, fmt.Errorf("bench: %q is not a non-negative number", s)
	}
	return v * mult, nil
}
