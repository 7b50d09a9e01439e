package bench

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"strings"
	"text/tabwriter"
	"time"
)

// ResultVersion changes whenever a JSON field changes meaning or goes away.
const ResultVersion = 1

// Result is what a run measured. Counts and latencies cover the measured
// phase only: a message counts when its send time (carried in its payload)
// falls in it.
type Result struct {
	Version  int       `json:"version"`
	Driver   string    `json:"driver"`
	Addrs    []string  `json:"addrs"`
	Label    string    `json:"label,omitempty"`
	Workload string    `json:"workload"`
	Settings Settings  `json:"settings"`
	Started  time.Time `json:"started"`
	// ElapsedSec is the measured phase, from its start to the last
	// publish completion (or the last delivery, if later).
	ElapsedSec float64 `json:"elapsed_s"`
	Published  int64   `json:"published"`
	Completed  int64   `json:"completed"`
	Failed     int64   `json:"failed"`
	Consumed   int64   `json:"consumed"`
	// Lost counts completed messages no consumer received before the
	// drain timeout (0 when the run has no consumers).
	Lost int64 `json:"lost"`
	// PublishRate is completed messages per second; ConsumeRate delivered
	// messages per second, each over its own span from the phase start.
	PublishRate float64        `json:"publish_rate"`
	ConsumeRate float64        `json:"consume_rate"`
	PublishMBps float64        `json:"publish_mb_per_s"`
	Publish     LatencySummary `json:"publish_latency"`
	EndToEnd    LatencySummary `json:"e2e_latency"`
	Timeline    []Sample       `json:"timeline"`
	Notes       []string       `json:"notes,omitempty"`
}

// Settings is the workload in machine-readable form.
type Settings struct {
	Producers  int     `json:"producers"`
	Consumers  int     `json:"consumers"`
	Queues     int     `json:"queues"`
	Size       int     `json:"size"`
	Mode       string  `json:"mode"`
	Window     int     `json:"window"`
	Batch      int     `json:"batch"`
	Credit     int     `json:"credit"`
	Ack        string  `json:"ack"`
	Persistent bool    `json:"persistent"`
	Rate       float64 `json:"rate"`
	DurationS  float64 `json:"duration_s"`
	Count      int64   `json:"count"`
	WarmupS    float64 `json:"warmup_s"`
}

func settingsOf(w *Workload) Settings {
	return Settings{
		Producers: w.Producers, Consumers: w.Consumers, Queues: w.Queues, Size: w.Size,
		Mode: string(w.Mode), Window: w.Window, Batch: w.Batch, Credit: w.Credit, Ack: string(w.Ack),
		Persistent: w.Persistent, Rate: w.Rate, DurationS: w.Duration.Seconds(), Count: w.Count,
		WarmupS: w.Warmup.Seconds(),
	}
}

// Sample is one progress interval of the measured phase.
type Sample struct {
	// T is the interval's end, in seconds since the measured phase began.
	T           float64 `json:"t_s"`
	PublishRate float64 `json:"publish_rate"`
	ConsumeRate float64 `json:"consume_rate"`
	PublishP50  int64   `json:"publish_p50_us"`
	PublishP99  int64   `json:"publish_p99_us"`
	E2EP50      int64   `json:"e2e_p50_us"`
	E2EP99      int64   `json:"e2e_p99_us"`
}

// WriteJSON writes r, indented, to w.
func (r *Result) WriteJSON(w io.Writer) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	if err := enc.Encode(r); err != nil {
		return fmt.Errorf("bench: encode result: %w", err)
	}
	return nil
}

// WriteJSONFile writes r to path.
func (r *Result) WriteJSONFile(path string) error {
	f, err := os.Create(path)
	if err != nil {
		return fmt.Errorf("bench: %w", err)
	}
	if err := r.WriteJSON(f); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("bench: %w", err)
	}
	return nil
}

// ReadJSON reads a result written by WriteJSON.
func ReadJSON(rd io.Reader) (*Result, error) {
	var r Result
	dec := json.NewDecoder(rd)
	dec.DisallowUnknownFields()
	if err := dec.Decode(&r); err != nil {
		return nil, fmt.Errorf("bench: decode result: %w", err)
	}
	if r.Version != ResultVersion {
		return nil, fmt.Errorf("bench: result version %d, this tool reads %d", r.Version, ResultVersion)
	}
	return &r, nil
}

// FormatLatency prints microseconds with a unit that keeps three digits.
func FormatLatency(us int64) string {
	switch {
	case us < 1000:
		return fmt.Sprintf("%dµs", us)
	case us < 1000_000:
		return fmt.Sprintf("%.2fms", float64(us)/1e3)
	}
	return fmt.Sprintf("%.2fs", float64(us)/1e6)
}

// WriteTable prints the final table.
func (r *Result) WriteTable(w io.Writer) error {
	kv := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintf(kv, "driver\t%s\n", r.Driver)
	fmt.Fprintf(kv, "addrs\t%s\n", strings.Join(r.Addrs, ","))
	fmt.Fprintf(kv, "workload\t%s\n", r.Workload)
	fmt.Fprintf(kv, "measured\t%.2fs\n", r.ElapsedSec)
	fmt.Fprintf(kv, "published / completed / failed\t%d / %d / %d\n", r.Published, r.Completed, r.Failed)
	fmt.Fprintf(kv, "consumed / lost\t%d / %d\n", r.Consumed, r.Lost)
	fmt.Fprintf(kv, "publish rate\t%.0f msg/s (%.1f MB/s)\n", r.PublishRate, r.PublishMBps)
	fmt.Fprintf(kv, "consume rate\t%.0f msg/s\n", r.ConsumeRate)
	for _, n := range r.Notes {
		fmt.Fprintf(kv, "note\t%s\n", n)
	}
	if err := kv.Flush(); err != nil {
		return err
	}
	fmt.Fprintln(w)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "latency\tp50\tp90\tp99\tp99.9\tmax\tmean\tcount\t")
	for _, row := range []struct {
		name string
		s    LatencySummary
	}{{"publish->complete", r.Publish}, {"publish->deliver", r.EndToEnd}} {
		s := row.s
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%d\t\n", row.name, FormatLatency(s.P50), FormatLatency(s.P90),
			FormatLatency(s.P99), FormatLatency(s.P999), FormatLatency(s.Max), FormatLatency(int64(s.Mean)), s.Count)
	}
	return tw.Flush()
}
