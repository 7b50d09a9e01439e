// Command pprof2cpuprofile converts a Go CPU profile into a V8 .cpuprofile
// call tree, the input of the flame graph renderer `make flamegraph` uses:
//
//	go tool pprof -traces cpu.pprof | pprof2cpuprofile > cpu.cpuprofile
//	flamegraph -t cpuprofile --countname ms < cpu.cpuprofile > cpu.svg
package main

import (
	"bufio"
	"fmt"
	"os"
	"time"

	"github.com/berthmq/berth/perf/flame"
)

func main() {
	traces, err := flame.ParseTraces(bufio.NewReader(os.Stdin))
	if err != nil {
		fmt.Fprintln(os.Stderr, "pprof2cpuprofile:", err)
		os.Exit(1)
	}
	w := bufio.NewWriter(os.Stdout)
	if err := flame.Build(traces, time.Millisecond).Write(w); err != nil {
		fmt.Fprintln(os.Stderr, "pprof2cpuprofile:", err)
		os.Exit(1)
	}
	if err := w.Flush(); err != nil {
		fmt.Fprintln(os.Stderr, "pprof2cpuprofile:", err)
		os.Exit(1)
	}
}
