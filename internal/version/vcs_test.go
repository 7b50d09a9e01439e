package version

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestVCSStampFromPlainBuild builds, with plain go build and no -ldflags,
// a program that prints Get() inside a fresh git clone of this
// repository, and checks that it reports the clone's commit (and -dirty
// once a tracked file changes) and the pseudo-version Go derives from it,
// not "devel (commit unknown)" (issue 25 item 7).
//
// The go command stamps vcs.revision and vcs.modified only when it finds
// a .git directory above the package and -buildvcs is not false: a git
// worktree (whose .git is a file) or GOFLAGS=-buildvcs=false, as this
// project's development machines have, records no commit, and Get can
// only say "unknown" there (make build stamps it with -ldflags instead).
// So the test clones, and asks for -buildvcs=true.
func TestVCSStampFromPlainBuild(t *testing.T) {
	git, err := exec.LookPath("git")
	if err != nil {
		t.Skip("no git")
	}
	top, err := exec.Command(git, "rev-parse", "--show-toplevel").Output()
	if err != nil {
		t.Skipf("not in a git work tree: %v", err)
	}
	dir := filepath.Join(t.TempDir(), "clone")
	run := func(name string, args ...string) string {
		t.Helper()
		cmd := exec.Command(name, args...)
		cmd.Dir = dir
		cmd.Env = append(os.Environ(), "GOFLAGS=-buildvcs=true", "GIT_AUTHOR_NAME=t", "GIT_AUTHOR_EMAIL=t@t.invalid",
			"GIT_COMMITTER_NAME=t", "GIT_COMMITTER_EMAIL=t@t.invalid")
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("%s %v: %v\n%s", name, args, err, out)
		}
		return strings.TrimSpace(string(out))
	}
	if out, err := exec.Command(git, "clone", "-q", "--depth", "1", "file://"+strings.TrimSpace(string(top)), dir).CombinedOutput(); err != nil {
		t.Fatalf("git clone: %v\n%s", err, out)
	}
	// The package as it is in this work tree, which may differ from its
	// last commit, is what is tested.
	for _, name := range []string{"version.go"} {
		b, err := os.ReadFile(name)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, "internal", "version", name), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	probe := filepath.Join(dir, "cmd", "vcsprobe")
	if err := os.MkdirAll(probe, 0o755); err != nil {
		t.Fatal(err)
	}
	src := "package main\n\nimport (\n\t\"fmt\"\n\n\t\"github.com/berthmq/berth/internal/version\"\n)\n\n" +
		"func main() { i := version.Get(); fmt.Println(i.Version, i.Commit) }\n"
	if err := os.WriteFile(filepath.Join(probe, "main.go"), []byte(src), 0o644); err != nil {
		t.Fatal(err)
	}
	run(git, "add", "cmd/vcsprobe", "internal/version")
	run(git, "commit", "-q", "--allow-empty", "-m", "vcsprobe")
	rev := run(git, "rev-parse", "HEAD")
	bin := filepath.Join(t.TempDir(), "vcsprobe")
	build := func() (ver, commit string) {
		t.Helper()
		run("go", "build", "-o", bin, "./cmd/vcsprobe")
		ver, commit, _ = strings.Cut(run(bin), " ")
		return ver, commit
	}
	ver, commit := build()
	if commit != rev {
		t.Errorf("plain go build in a clone: commit %q, want %q", commit, rev)
	}
	if ver == DevVersion || !strings.Contains(ver, rev[:12]) {
		t.Errorf("plain go build in a clone: version %q, want Go's pseudo-version naming %s", ver, rev[:12])
	}
	f, err := os.OpenFile(filepath.Join(dir, "go.mod"), os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	_, _ = f.WriteString("\n")
	f.Close()
	if _, commit := build(); commit != rev+"-dirty" {
		t.Errorf("with a tracked file changed: commit %q, want %q", commit, rev+"-dirty")
	}
}
