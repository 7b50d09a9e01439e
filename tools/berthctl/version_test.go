package main

import (
	"bytes"
	"encoding/json"
	"os/exec"
	"path/filepath"
	"runtime"
	"testing"
)

const versionPkg = "github.com/berthmq/berth/internal/version"

// TestVersionStamped builds berthctl with the version and commit given to
// the linker, as `make build` does, and checks `berthctl version` and
// `berthctl --json version` print them with the Go version.
func TestVersionStamped(t *testing.T) {
	bin := filepath.Join(t.TempDir(), "berthctl")
	const ver, commit = "9.8.7-test.2", "fedcba9876543210fedcba9876543210fedcba98"
	ldflags := "-X " + versionPkg + ".Version=" + ver + " -X " + versionPkg + ".Commit=" + commit
	if out, err := exec.Command("go", "build", "-ldflags", ldflags, "-o", bin, "github.com/berthmq/berth/tools/berthctl").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	out, err := exec.Command(bin, "version").Output()
	if err != nil {
		t.Fatalf("berthctl version: %v", err)
	}
	want := "berthctl " + ver + " (commit " + commit + ", " + runtime.Version() + ", " + runtime.GOOS + "/" + runtime.GOARCH + ")\n"
	if string(out) != want {
		t.Fatalf("berthctl version printed %q, want %q", out, want)
	}
	out, err = exec.Command(bin, "--json", "version").Output()
	if err != nil {
		t.Fatalf("berthctl --json version: %v", err)
	}
	var got map[string]string
	if err := json.Unmarshal(out, &got); err != nil {
		t.Fatalf("--json version: %v\n%s", err, out)
	}
	if got["version"] != ver || got["commit"] != commit || got["go_version"] != runtime.Version() {
		t.Fatalf("--json version: %v", got)
	}
}

// TestVersionCommand runs the command in-process: it needs no server and
// refuses arguments.
func TestVersionCommand(t *testing.T) {
	var out, errb bytes.Buffer
	if code := run([]string{"version"}, &out, &errb); code != exitOK || !bytes.HasPrefix(out.Bytes(), []byte("berthctl ")) {
		t.Fatalf("version: %d %q %q", code, out.String(), errb.String())
	}
	out.Reset()
	if code := run([]string{"version", "extra"}, &out, &errb); code != exitUsage {
		t.Fatalf("version extra: exit %d, want %d", code, exitUsage)
	}
}
