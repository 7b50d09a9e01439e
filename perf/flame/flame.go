// Package flame turns a Go pprof profile, as printed by
// `go tool pprof -traces`, into the V8 .cpuprofile tree that the flame
// graph renderer we use (the npm package "flamegraph", -t cpuprofile)
// reads. It converts; it draws nothing.
package flame

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"time"
)

// Bounds on the input, so a corrupt file cannot make us hold unbounded
// state.
const (
	tracesMax    = 1 << 20
	depthMax     = 1024
	nameLenMax   = 300
	lineBytesMax = 1 << 20
)

// Trace is one call stack with its weight; Stack[0] is the leaf.
type Trace struct {
	Weight time.Duration
	Stack  []string
}

const separator = "-----------+"

// ParseTraces reads `go tool pprof -traces` output of a CPU profile.
func ParseTraces(r io.Reader) ([]Trace, error) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), lineBytesMax)
	var traces []Trace
	var cur *Trace
	inBody := false
	lineNo := 0
	for sc.Scan() {
		lineNo++
		line := sc.Text()
		if strings.HasPrefix(line, separator) {
			inBody = true
			cur = nil
			continue
		}
		if !inBody || strings.TrimSpace(line) == "" {
			continue
		}
		if cur == nil {
			// "      60ms   runtime.memmove": weight, then the leaf.
			fields := strings.Fields(line)
			if len(fields) < 2 {
				return nil, fmt.Errorf("flame: line %d: want a weight and a function, got %q", lineNo, line)
			}
			d, err := time.ParseDuration(fields[0])
			if err != nil || d < 0 {
				return nil, fmt.Errorf("flame: line %d: bad weight %q", lineNo, fields[0])
			}
			if len(traces) == tracesMax {
				return nil, fmt.Errorf("flame: more than %d traces", tracesMax)
			}
			traces = append(traces, Trace{Weight: d})
			cur = &traces[len(traces)-1]
			line = strings.TrimSpace(strings.TrimPrefix(strings.TrimSpace(line), fields[0]))
		}
		if len(cur.Stack) == depthMax {
			return nil, fmt.Errorf("flame: line %d: stack deeper than %d", lineNo, depthMax)
		}
		cur.Stack = append(cur.Stack, shorten(strings.TrimSpace(line)))
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("flame: %w", err)
	}
	if !inBody {
		return nil, fmt.Errorf("flame: no traces found (is this `go tool pprof -traces` output?)")
	}
	return traces, nil
}

// shorten drops the generic shape dictionaries the compiler prints, which
// can run to kilobytes, and bounds the rest.
func shorten(name string) string {
	if i := strings.Index(name, "[go.shape"); i >= 0 {
		if j := strings.LastIndex(name, "]"); j > i {
			name = name[:i] + "[...]" + name[j+1:]
		}
	}
	if len(name) > nameLenMax {
		name = name[:nameLenMax] + "..."
	}
	return name
}

// Node is a node of the .cpuprofile call tree.
type Node struct {
	ID           int     `json:"id"`
	FunctionName string  `json:"functionName"`
	URL          string  `json:"url"`
	LineNumber   int     `json:"lineNumber"`
	HitCount     int64   `json:"hitCount"`
	Children     []*Node `json:"children"`
}

// CPUProfile is the .cpuprofile document.
type CPUProfile struct {
	Head       *Node `json:"head"`
	StartTime  int64 `json:"startTime"`
	EndTime    int64 `json:"endTime"`
	Samples    []int `json:"samples"`
	TimeDeltas []int `json:"timeDeltas"`
}

// Build merges traces into a call tree rooted at an unnamed node (the
// renderer calls it "all"). Hit counts are in unit (e.g. a millisecond of
// CPU time), rounded to the nearest.
func Build(traces []Trace, unit time.Duration) *CPUProfile {
	if unit <= 0 {
		unit = time.Millisecond
	}
	nextID := 1
	head := &Node{ID: nextID, Children: []*Node{}}
	var total time.Duration
	for _, t := range traces {
		n := head
		for i := len(t.Stack) - 1; i >= 0; i-- {
			n = child(n, t.Stack[i], &nextID)
		}
		n.HitCount += int64((t.Weight + unit/2) / unit)
		total += t.Weight
	}
	return &CPUProfile{Head: head, EndTime: total.Microseconds(), Samples: []int{}, TimeDeltas: []int{}}
}

func child(n *Node, name string, nextID *int) *Node {
	for _, c := range n.Children {
		if c.FunctionName == name {
			return c
		}
	}
	*nextID++
	c := &Node{ID: *nextID, FunctionName: name, Children: []*Node{}}
	n.Children = append(n.Children, c)
	return c
}

// Write encodes p as JSON.
func (p *CPUProfile) Write(w io.Writer) error {
	if err := json.NewEncoder(w).Encode(p); err != nil {
		return fmt.Errorf("flame: %w", err)
	}
	return nil
}
