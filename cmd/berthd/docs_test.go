package main

import (
	"flag"
	"os"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/berthmq/berth/internal/testutil"
)

// operatorDocs are the documents that tell operators which flags,
// variables and configuration keys to use.
var operatorDocs = []string{"../../README.md", "../../docs/OPERATIONS.md", "../../docs/SECURITY.md", "../../docs/METRICS.md",
	"../../docs/PROTOCOL.md", "../../clients/python/README.md"}

// TestDocsNameRealFlags: every berthd command line the operator documents
// show uses flags berthd has, every flag named in backquotes (`-peer`)
// is one of berthd's, and every key of their TOML examples and of a
// backquoted `key = value` is a configuration key (a flag's name). The
// documents had named behaviour berthd lacked (issue 25 item 7); this
// keeps the names at least real.
func TestDocsNameRealFlags(t *testing.T) {
	fs, _ := newFlagSet()
	isBool := func(fl *flag.Flag) bool {
		b, ok := fl.Value.(interface{ IsBoolFlag() bool })
		return ok && b.IsBoolFlag()
	}
	n := 0
	for _, inv := range testutil.DocInvocations(t, "berthd", operatorDocs...) {
		n++
		for i := 0; i < len(inv.Args); i++ {
			a := inv.Args[i]
			if !strings.HasPrefix(a, "-") || a == "-" {
				continue
			}
			name, _, hasValue := strings.Cut(strings.TrimLeft(a, "-"), "=")
			fl := fs.Lookup(name)
			if fl == nil {
				t.Errorf("%s:%d: berthd %s: berthd has no flag -%s", inv.File, inv.Line, strings.Join(inv.Args, " "), name)
				continue
			}
			if !hasValue && !isBool(fl) {
				i++ // its value
			}
		}
	}
	if n < 10 {
		t.Fatalf("found %d berthd command lines in the documents; the scan is broken", n)
	}

	// Backquoted flags in prose, and configuration keys.
	notBerthd := map[string]bool{"dirty": true, "buildvcs": true, "benchmem": true, "race": true, "trimpath": true}
	flagRef := regexp.MustCompile("`-([a-z][a-z0-9-]*)")
	keyRef := regexp.MustCompile("`([a-z][a-z0-9-]*) = [^`]*`")
	tomlKey := regexp.MustCompile(`^([a-z][a-z0-9-]*) *=`)
	for _, path := range operatorDocs {
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		inTOML := false
		for i, line := range strings.Split(string(b), "\n") {
			where := path[strings.LastIndex(path, "/")+1:] + ":" + strconv.Itoa(i+1)
			if t := strings.TrimSpace(line); strings.HasPrefix(t, "```") {
				inTOML = t == "```toml"
				continue
			}
			if inTOML {
				if m := tomlKey.FindStringSubmatch(line); m != nil && fs.Lookup(m[1]) == nil {
					t.Errorf("%s: TOML key %q is no berthd setting", where, m[1])
				}
				continue
			}
			for _, m := range flagRef.FindAllStringSubmatch(line, -1) {
				if fs.Lookup(m[1]) == nil && !notBerthd[m[1]] {
					t.Errorf("%s: `-%s` is no berthd flag: %s", where, m[1], strings.TrimSpace(line))
				}
			}
			for _, m := range keyRef.FindAllStringSubmatch(line, -1) {
				if fs.Lookup(m[1]) == nil {
					t.Errorf("%s: `%s = ...` is no berthd setting: %s", where, m[1], strings.TrimSpace(line))
				}
			}
		}
	}
}
