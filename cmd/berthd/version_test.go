package main

import (
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"github.com/berthmq/berth/internal/testutil"
)

const versionPkg = "github.com/berthmq/berth/internal/version"

// TestVersionStamped builds berthd the way `make build` does, with the
// version and commit given to the linker, and checks that -version prints
// them with the Go version, then exits 0 without starting anything (no
// data directory is created).
func TestVersionStamped(t *testing.T) {
	dir := t.TempDir()
	bin := filepath.Join(dir, "berthd")
	const ver, commit = "9.8.7-test.1", "0123456789abcdef0123456789abcdef01234567"
	ldflags := "-X " + versionPkg + ".Version=" + ver + " -X " + versionPkg + ".Commit=" + commit
	if out, err := exec.Command("go", "build", "-ldflags", ldflags, "-o", bin, testutil.BerthdPackage).CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	cmd := exec.Command(bin, "-version", "-data", filepath.Join(dir, "data"))
	cmd.Dir = dir
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("berthd -version: %v", err)
	}
	want := "berthd " + ver + " (commit " + commit + ", " + runtime.Version() + ", " + runtime.GOOS + "/" + runtime.GOARCH + ")\n"
	if string(out) != want {
		t.Fatalf("berthd -version printed %q, want %q", out, want)
	}
	if m, _ := filepath.Glob(filepath.Join(dir, "data*")); len(m) > 0 {
		t.Fatalf("-version created %v", m)
	}
}

// TestVersionUnstamped: a plain go build still answers -version, with the
// toolchain's Go version and whatever the build info holds.
func TestVersionUnstamped(t *testing.T) {
	out, err := exec.Command(testutil.Berthd(t), "-version").Output()
	if err != nil {
		t.Fatalf("berthd -version: %v", err)
	}
	s := string(out)
	if !strings.HasPrefix(s, "berthd ") || !strings.Contains(s, "(commit ") || !strings.Contains(s, runtime.Version()) {
		t.Fatalf("berthd -version printed %q", s)
	}
}
