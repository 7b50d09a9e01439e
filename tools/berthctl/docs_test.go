package main

import (
	"flag"
	"io"
	"strconv"
	"strings"
	"testing"

	"github.com/berthmq/berth/internal/testutil"
)

// TestDocsNameRealCommands: every berthctl command line in the
// documents names a command berthctl has, with flags that command (or
// every command) takes (issue 25 item 7).
func TestDocsNameRealCommands(t *testing.T) {
	docs := []string{"../../README.md", "../../docs/OPERATIONS.md", "../../docs/SECURITY.md", "../../docs/METRICS.md",
		"../../docs/PROTOCOL.md", "../../docs/BENCHMARKS.md", "../../clients/python/README.md"}
	isBool := func(fl *flag.Flag) bool {
		b, ok := fl.Value.(interface{ IsBoolFlag() bool })
		return ok && b.IsBoolFlag()
	}
	top := flag.NewFlagSet("berthctl", flag.ContinueOnError)
	top.SetOutput(io.Discard)
	var e env
	e.register(top)
	n := 0
	for _, inv := range testutil.DocInvocations(t, "berthctl", docs...) {
		line := inv.File + ":" + strconv.Itoa(inv.Line) + ": berthctl " + strings.Join(inv.Args, " ")
		fs := top
		var cmd string
		for i := 0; i < len(inv.Args); i++ {
			a := inv.Args[i]
			if a == "..." {
				continue // an elision: "berthctl ... status"
			}
			if a == "--" {
				break
			}
			if !strings.HasPrefix(a, "-") || a == "-" {
				if cmd == "" && a == "help" {
					break // help [COMMAND]: runIO's own
				}
				if cmd == "" {
					c, ok := findCommand(a)
					if !ok {
						t.Errorf("%s: berthctl has no command %q", line, a)
						break
					}
					cmd = a
					fs, _ = commandFlags(c, &e)
					n++
				}
				continue
			}
			name, _, hasValue := strings.Cut(strings.TrimLeft(a, "-"), "=")
			fl := fs.Lookup(name)
			if fl == nil {
				if cmd == "" {
					t.Errorf("%s: %s is no flag of berthctl's", line, a)
				} else {
					t.Errorf("%s: %s is no flag of berthctl %s", line, a, cmd)
				}
				continue
			}
			if !hasValue && !isBool(fl) {
				i++
			}
		}
	}
	if n < 40 {
		t.Fatalf("found %d berthctl commands in the documents; the scan is broken", n)
	}
}
