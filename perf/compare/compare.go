// Package compare lays out berth-bench results of Berth and its peers side
// by side, per durability setting, with the ratio berth/peer of every
// figure.
package compare

import (
	"fmt"
	"io"
	"strings"
	"text/tabwriter"

	"github.com/berthmq/berth/perf/bench"
)

// Berth is the broker every peer is compared with.
const Berth = "berth"

// Workload kinds: the closed-loop throughput run, and an open-loop run at a
// rate every broker sustains, whose latencies are comparable.
const (
	KindThroughput = "throughput"
	KindLatency    = "latency"
)

func kindOf(e Entry) string {
	if e.Kind == "" {
		return KindThroughput
	}
	return e.Kind
}

// Entry is one broker's run in one setting. Err is set, and Result may be
// nil, when the run failed; the table shows it instead of numbers.
type Entry struct {
	// Kind is the workload: KindThroughput (also when empty) or
	// KindLatency. Ratios in the summary line come from throughput runs.
	Kind    string
	Setting string
	Broker  string
	Result  *bench.Result
	Err     string
}

// Figure is one compared number. HigherBetter tells how to read its ratio.
type Figure struct {
	Name         string
	HigherBetter bool
	Value        func(*bench.Result) float64
	Format       func(float64) string
}

func rate(v float64) string { return fmt.Sprintf("%.0f/s", v) }
func lat(v float64) string  { return bench.FormatLatency(int64(v)) }

// Figures are the rows of the table, in order.
var Figures = []Figure{
	{"publish msg/s", true, func(r *bench.Result) float64 { return r.PublishRate }, rate},
	{"consume msg/s", true, func(r *bench.Result) float64 { return r.ConsumeRate }, rate},
	{"publish p50", false, func(r *bench.Result) float64 { return float64(r.Publish.P50) }, lat},
	{"publish p90", false, func(r *bench.Result) float64 { return float64(r.Publish.P90) }, lat},
	{"publish p99", false, func(r *bench.Result) float64 { return float64(r.Publish.P99) }, lat},
	{"publish p99.9", false, func(r *bench.Result) float64 { return float64(r.Publish.P999) }, lat},
	{"publish max", false, func(r *bench.Result) float64 { return float64(r.Publish.Max) }, lat},
	{"e2e p50", false, func(r *bench.Result) float64 { return float64(r.EndToEnd.P50) }, lat},
	{"e2e p90", false, func(r *bench.Result) float64 { return float64(r.EndToEnd.P90) }, lat},
	{"e2e p99", false, func(r *bench.Result) float64 { return float64(r.EndToEnd.P99) }, lat},
	{"e2e p99.9", false, func(r *bench.Result) float64 { return float64(r.EndToEnd.P999) }, lat},
	{"e2e max", false, func(r *bench.Result) float64 { return float64(r.EndToEnd.Max) }, lat},
}

func find(entries []Entry, kind, setting, broker string) *Entry {
	for i := range entries {
		if kindOf(entries[i]) == kind && entries[i].Setting == setting && entries[i].Broker == broker {
			return &entries[i]
		}
	}
	return nil
}

// ordered lists the distinct values of key in first-seen order.
func ordered(entries []Entry, key func(Entry) string) []string {
	var out []string
	seen := map[string]bool{}
	for _, e := range entries {
		if k := key(e); !seen[k] {
			seen[k] = true
			out = append(out, k)
		}
	}
	return out
}

// Headline is the figure the summary ratio uses: delivered messages per
// second, the end-to-end throughput of a queue, or the publish rate when a
// run had no consumers.
func Headline(r *bench.Result) float64 {
	if r.Settings.Consumers == 0 {
		return r.PublishRate
	}
	return r.ConsumeRate
}

// Ratio is Headline(berth)/Headline(peer) of the throughput runs in
// setting; ok is false when
// either run is missing, failed or measured nothing.
func Ratio(entries []Entry, setting, peer string) (ratio float64, ok bool) {
	b, p := find(entries, KindThroughput, setting, Berth), find(entries, KindThroughput, setting, peer)
	if b == nil || p == nil || b.Result == nil || p.Result == nil || b.Err != "" || p.Err != "" {
		return 0, false
	}
	hb, hp := Headline(b.Result), Headline(p.Result)
	if hp <= 0 || hb <= 0 {
		return 0, false
	}
	return hb / hp, true
}

// WriteTable prints, per setting and peer, every figure of Berth and the
// peer and their ratio; a failed run shows "-" and its error below.
func WriteTable(w io.Writer, entries []Entry) error {
	for _, kind := range ordered(entries, kindOf) {
		for _, setting := range ordered(entries, func(e Entry) string { return e.Setting }) {
			if err := writeBlocks(w, entries, kind, setting); err != nil {
				return err
			}
		}
	}
	return nil
}

func writeBlocks(w io.Writer, entries []Entry, kind, setting string) error {
	b := find(entries, kind, setting, Berth)
	for _, peer := range ordered(entries, func(e Entry) string { return e.Broker }) {
		if peer == Berth {
			continue
		}
		p := find(entries, kind, setting, peer)
		if p == nil {
			continue
		}
		tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
		fmt.Fprintf(tw, "%s %s\tberth\t%s\tberth/%s\t\n", kind, setting, peer, peer)
		for _, f := range Figures {
			bv, pv := "-", "-"
			ratio := "-"
			if failure(b) == "" {
				bv = f.Format(f.Value(b.Result))
			}
			if failure(p) == "" {
				pv = f.Format(f.Value(p.Result))
			}
			if failure(b) == "" && failure(p) == "" && f.Value(p.Result) > 0 {
				ratio = fmt.Sprintf("%.2f", f.Value(b.Result)/f.Value(p.Result))
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t\n", f.Name, bv, pv, ratio)
		}
		if err := tw.Flush(); err != nil {
			return err
		}
		if msg := failure(b); msg != "" {
			fmt.Fprintf(w, "  berth failed: %s\n", msg)
		}
		if msg := failure(p); msg != "" {
			fmt.Fprintf(w, "  %s failed: %s\n", peer, msg)
		}
		fmt.Fprintln(w)
	}
	return nil
}

func failure(e *Entry) string {
	switch {
	case e == nil:
		return "not run"
	case e.Err != "":
		return oneLine(e.Err)
	case e.Result == nil:
		return "no result"
	}
	return ""
}

// SummaryLine is the last line of a comparison:
// "ratio berth/<peer> <setting>=<x> ..." with "n/a" where a ratio is
// missing.
func SummaryLine(entries []Entry, peer string, settings []string) string {
	return SummaryLineTag(entries, peer, "", settings)
}

// SummaryLineTag is SummaryLine with tag after the peer's name:
// "ratio berth/<peer> <tag> <setting>=<x> ...".
func SummaryLineTag(entries []Entry, peer, tag string, settings []string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "ratio berth/%s", peer)
	if tag != "" {
		b.WriteString(" " + tag)
	}
	for _, s := range settings {
		if r, ok := Ratio(entries, s, peer); ok {
			fmt.Fprintf(&b, " %s=%.2f", s, r)
		} else {
			fmt.Fprintf(&b, " %s=n/a", s)
		}
	}
	return b.String()
}

// errShownMax bounds how much of an error the table shows; the full text
// went to stderr when the run failed.
const errShownMax = 160

func oneLine(s string) string {
	s, _, _ = strings.Cut(s, "\n")
	if len(s) > errShownMax {
		s = s[:errShownMax] + "..."
	}
	return s
}
