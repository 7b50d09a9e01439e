package bench

import (
	"bufio"
	"fmt"
	"html"
	"io"
	"math"
	"os"
	"strings"
)

// Plot geometry, in SVG user units.
const (
	plotWidth       = 960
	plotPanelHeight = 260
	plotMarginLeft  = 80
	plotMarginRight = 150
	plotMarginTop   = 50
	plotPanelGap    = 60
	plotTicks       = 5
)

type plotSeries struct {
	name  string
	color string
	value func(Sample) float64
}

// WritePlot draws r's timeline as a self-contained SVG: throughput on top,
// publish and end-to-end latency (p50, p99) below, against seconds since
// the measured phase began.
func WritePlot(w io.Writer, r *Result) error {
	bw := bufio.NewWriter(w)
	height := plotMarginTop + 2*plotPanelHeight + plotPanelGap + 50
	fmt.Fprintf(bw, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" font-family="sans-serif" font-size="12">`+"\n",
		plotWidth, height, plotWidth, height)
	fmt.Fprintf(bw, `<rect width="100%%" height="100%%" fill="white"/>`+"\n")
	title := fmt.Sprintf("%s %s: %s", r.Driver, r.Label, r.Workload)
	fmt.Fprintf(bw, `<text x="%d" y="20" font-size="14" font-weight="bold">%s</text>`+"\n", plotMarginLeft, html.EscapeString(title))
	fmt.Fprintf(bw, `<text x="%d" y="38">publish %.0f msg/s, consume %.0f msg/s, publish p99 %s, e2e p99 %s</text>`+"\n", plotMarginLeft,
		r.PublishRate, r.ConsumeRate, FormatLatency(r.Publish.P99), FormatLatency(r.EndToEnd.P99))
	tp := []plotSeries{
		{"publish msg/s", "#1f77b4", func(s Sample) float64 { return s.PublishRate }},
		{"consume msg/s", "#ff7f0e", func(s Sample) float64 { return s.ConsumeRate }},
	}
	lat := []plotSeries{
		{"publish p50 ms", "#2ca02c", func(s Sample) float64 { return float64(s.PublishP50) / 1e3 }},
		{"publish p99 ms", "#98df8a", func(s Sample) float64 { return float64(s.PublishP99) / 1e3 }},
		{"e2e p50 ms", "#d62728", func(s Sample) float64 { return float64(s.E2EP50) / 1e3 }},
		{"e2e p99 ms", "#ff9896", func(s Sample) float64 { return float64(s.E2EP99) / 1e3 }},
	}
	drawPanel(bw, r.Timeline, "throughput (msg/s)", plotMarginTop, tp)
	drawPanel(bw, r.Timeline, "latency (ms)", plotMarginTop+plotPanelHeight+plotPanelGap, lat)
	fmt.Fprintln(bw, "</svg>")
	if err := bw.Flush(); err != nil {
		return fmt.Errorf("bench: write plot: %w", err)
	}
	return nil
}

// WritePlotFile writes the plot to path.
func WritePlotFile(path string, r *Result) error {
	f, err := os.Create(path)
	if err != nil {
		return fmt.Errorf("bench: %w", err)
	}
	if err := WritePlot(f, r); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("bench: %w", err)
	}
	return nil
}

func drawPanel(w io.Writer, tl []Sample, label string, top int, series []plotSeries) {
	innerW := float64(plotWidth - plotMarginLeft - plotMarginRight)
	innerH := float64(plotPanelHeight)
	tMax, yMax := 1.0, 0.0
	for _, s := range tl {
		tMax = math.Max(tMax, s.T)
		for _, ser := range series {
			yMax = math.Max(yMax, ser.value(s))
		}
	}
	yMax = niceCeil(yMax)
	x := func(t float64) float64 { return plotMarginLeft + innerW*t/tMax }
	y := func(v float64) float64 { return float64(top) + innerH - innerH*v/yMax }
	fmt.Fprintf(w, `<g class="panel" data-label="%s">`+"\n", html.EscapeString(label))
	fmt.Fprintf(w, `<rect x="%d" y="%d" width="%.0f" height="%.0f" fill="none" stroke="#999"/>`+"\n", plotMarginLeft, top, innerW, innerH)
	fmt.Fprintf(w, `<text x="%d" y="%d">%s</text>`+"\n", plotMarginLeft, top-6, html.EscapeString(label))
	for i := 0; i <= plotTicks; i++ {
		v := yMax * float64(i) / plotTicks
		fmt.Fprintf(w, `<line x1="%d" x2="%.1f" y1="%.1f" y2="%.1f" stroke="#eee"/>`+"\n", plotMarginLeft, plotMarginLeft+innerW, y(v), y(v))
		fmt.Fprintf(w, `<text x="%d" y="%.1f" text-anchor="end">%s</text>`+"\n", plotMarginLeft-6, y(v)+4, formatTick(v))
		t := tMax * float64(i) / plotTicks
		fmt.Fprintf(w, `<text x="%.1f" y="%.1f" text-anchor="middle">%.0fs</text>`+"\n", x(t), float64(top)+innerH+16, t)
	}
	for i, ser := range series {
		pts := make([]string, 0, len(tl))
		for _, s := range tl {
			pts = append(pts, fmt.Sprintf("%.1f,%.1f", x(s.T), y(ser.value(s))))
		}
		fmt.Fprintf(w, `<polyline class="series" data-name="%s" fill="none" stroke="%s" stroke-width="1.5" points="%s"/>`+"\n",
			html.EscapeString(ser.name), ser.color, strings.Join(pts, " "))
		ly := top + 14 + 18*i
		fmt.Fprintf(w, `<line x1="%.1f" x2="%.1f" y1="%d" y2="%d" stroke="%s" stroke-width="3"/>`, plotMarginLeft+innerW+10, plotMarginLeft+innerW+30, ly, ly, ser.color)
		fmt.Fprintf(w, `<text x="%.1f" y="%d">%s</text>`+"\n", plotMarginLeft+innerW+36, ly+4, html.EscapeString(ser.name))
	}
	fmt.Fprintln(w, "</g>")
}

// niceCeil rounds v up to 1, 2 or 5 times a power of ten, so axis ticks
// read well; 0 becomes 1 to keep the scale finite.
func niceCeil(v float64) float64 {
	if v <= 0 || math.IsNaN(v) || math.IsInf(v, 0) {
		return 1
	}
	p := math.Pow(10, math.Floor(math.Log10(v)))
	for _, m := range []float64{1, 2, 5, 10} {
		if v <= m*p {
			return m * p
		}
	}
	return 10 * p
}

func formatTick(v float64) string {
	switch {
	case v >= 1e6:
		return fmt.Sprintf("%gM", v/1e6)
	case v >= 1e3:
		return fmt.Sprintf("%gk", v/1e3)
	}
	return fmt.Sprintf("%g", v)
}
