// Package version says which build of Berth is running: the release
// version and commit stamped by the linker, and the Go toolchain that built
// it.
//
// `make build` and `make release` stamp the two variables:
//
//	go build -ldflags "-X github.com/berthmq/berth/internal/version.Version=1.2.0 \
//	                   -X github.com/berthmq/berth/internal/version.Commit=$(git rev-parse HEAD)"
//
// A binary built without them (go build, go install, go test) falls back to
// what the toolchain recorded: the module version when it was installed as
// module@version, and the VCS revision when it was built inside a work tree
// with VCS stamping on (vcs.revision, with -dirty when vcs.modified), and
// the pseudo-version Go derives from it. The go command stamps these only
// when it finds a .git directory above the package and -buildvcs is not
// false: a build in a git worktree (whose .git is a file) or with
// GOFLAGS=-buildvcs=false records no commit, and the commit reads
// "unknown" (TestVCSStampFromPlainBuild builds in a clone).
package version

import (
	"fmt"
	"runtime"
	"runtime/debug"
)

// Version and Commit are set with -ldflags -X at build time; leave them
// empty in the source.
var (
	Version string
	Commit  string
)

// DevVersion and UnknownCommit stand for a version or commit that neither
// the linker nor the toolchain's build information recorded.
const (
	DevVersion    = "devel"
	UnknownCommit = "unknown"
)

// Info describes one build.
type Info struct {
	Version   string `json:"version"`
	Commit    string `json:"commit"`
	GoVersion string `json:"go_version"`
	Platform  string `json:"platform"` // GOOS/GOARCH
}

// Get returns this binary's build information.
func Get() Info {
	bi, _ := debug.ReadBuildInfo()
	return resolve(Version, Commit, bi)
}

// resolve prefers the stamped values, then the build information, then
// DevVersion and UnknownCommit.
func resolve(version, commit string, bi *debug.BuildInfo) Info {
	info := Info{
		Version:   version,
		Commit:    commit,
		GoVersion: runtime.Version(),
		Platform:  runtime.GOOS + "/" + runtime.GOARCH,
	}
	if bi != nil {
		if info.Version == "" && bi.Main.Version != "" && bi.Main.Version != "(devel)" {
			info.Version = bi.Main.Version
		}
		if info.Commit == "" {
			var rev string
			var modified bool
			for _, s := range bi.Settings {
				switch s.Key {
				case "vcs.revision":
					rev = s.Value
				case "vcs.modified":
					modified = s.Value == "true"
				}
			}
			if rev != "" && modified {
				rev += "-dirty"
			}
			info.Commit = rev
		}
		if bi.GoVersion != "" {
			info.GoVersion = bi.GoVersion
		}
	}
	if info.Version == "" {
		info.Version = DevVersion
	}
	if info.Commit == "" {
		info.Commit = UnknownCommit
	}
	return info
}

// String is the one line `berthd -version` and `berthctl version` print
// after the program's name: "1.2.0 (commit 3c29ed6..., go1.26.8,
// linux/amd64)".
func (i Info) String() string {
	return fmt.Sprintf("%s (commit %s, %s, %s)", i.Version, i.Commit, i.GoVersion, i.Platform)
}
