// Package golden compares encodings with golden files, for tests.
//
// The controller's encodings are stored (events in the raft log, the state
// in snapshots, address books in membership entries) and spoken between
// processes of different builds (service requests and replies). Golden
// files in a package's testdata hold their bytes as an earlier build wrote
// them, one "name hex" line each, so a test fails if any encoding changes.
// Rewrite a golden file only for a deliberate, versioned format change:
//
//	go test ./controlplane/... -run Golden -rewrite
package golden

import (
	"bufio"
	"bytes"
	"encoding/hex"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// Rewrite is the -rewrite flag of the tests that import this package.
var Rewrite = flag.Bool("rewrite", false, "rewrite the golden files in testdata from the current code")

// Entry is one named encoding.
type Entry struct {
	Name  string
	Bytes []byte
}

// Check compares got, in order, with testdata/file, or rewrites the file
// under -rewrite.
func Check(t *testing.T, file string, got []Entry) {
	t.Helper()
	path := filepath.Join("testdata", file)
	if *Rewrite {
		var buf bytes.Buffer
		for _, g := range got {
			fmt.Fprintf(&buf, "%s %s\n", g.Name, hex.EncodeToString(g.Bytes))
		}
		if err := os.MkdirAll("testdata", 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, buf.Bytes(), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want := Read(t, file)
	if len(want) != len(got) {
		t.Errorf("%s holds %d encodings, the test made %d", path, len(want), len(got))
	}
	for i := 0; i < len(want) && i < len(got); i++ {
		if want[i].Name != got[i].Name {
			t.Fatalf("%s line %d is %s, the test made %s", path, i+1, want[i].Name, got[i].Name)
		}
		if !bytes.Equal(want[i].Bytes, got[i].Bytes) {
			t.Errorf("%s changed:\n stored %x\n now    %x", got[i].Name, want[i].Bytes, got[i].Bytes)
		}
	}
}

// Read returns the entries of testdata/file.
func Read(t *testing.T, file string) []Entry {
	t.Helper()
	path := filepath.Join("testdata", file)
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var out []Entry
	sc := bufio.NewScanner(f)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		name, hx, ok := strings.Cut(sc.Text(), " ")
		if !ok {
			t.Fatalf("%s: bad line %q", path, sc.Text())
		}
		b, err := hex.DecodeString(hx)
		if err != nil {
			t.Fatalf("%s: %s: %v", path, name, err)
		}
		out = append(out, Entry{name, b})
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}
