package version

import (
	"runtime"
	"runtime/debug"
	"strings"
	"testing"
)

func TestResolve(t *testing.T) {
	vcs := func(rev, modified string) *debug.BuildInfo {
		bi := &debug.BuildInfo{GoVersion: "go1.99.1"}
		bi.Main.Version = "(devel)"
		if rev != "" {
			bi.Settings = append(bi.Settings, debug.BuildSetting{Key: "vcs.revision", Value: rev})
		}
		if modified != "" {
			bi.Settings = append(bi.Settings, debug.BuildSetting{Key: "vcs.modified", Value: modified})
		}
		return bi
	}
	installed := &debug.BuildInfo{GoVersion: "go1.99.2"}
	installed.Main.Version = "v1.4.0"
	cases := []struct {
		name                            string
		version, commit                 string
		bi                              *debug.BuildInfo
		wantVersion, wantCommit, wantGo string
	}{
		{"stamped wins over build info", "1.2.0", "abc123", vcs("fff", "true"), "1.2.0", "abc123", "go1.99.1"},
		{"vcs fallback", "", "", vcs("0123abcd", "false"), DevVersion, "0123abcd", "go1.99.1"},
		{"vcs dirty", "", "", vcs("0123abcd", "true"), DevVersion, "0123abcd-dirty", "go1.99.1"},
		{"module version from go install", "", "", installed, "v1.4.0", UnknownCommit, "go1.99.2"},
		{"nothing recorded", "", "", nil, DevVersion, UnknownCommit, runtime.Version()},
		{"stamped version, commit from vcs", "2.0.0", "", vcs("beef", ""), "2.0.0", "beef", "go1.99.1"},
	}
	for _, c := range cases {
		got := resolve(c.version, c.commit, c.bi)
		if got.Version != c.wantVersion || got.Commit != c.wantCommit || got.GoVersion != c.wantGo {
			t.Errorf("%s: got %+v, want version %q commit %q go %q", c.name, got, c.wantVersion, c.wantCommit, c.wantGo)
		}
		if got.Platform != runtime.GOOS+"/"+runtime.GOARCH {
			t.Errorf("%s: platform %q", c.name, got.Platform)
		}
	}
}

func TestString(t *testing.T) {
	s := Info{Version: "1.2.0", Commit: "abc", GoVersion: "go1.26.8", Platform: "linux/arm64"}.String()
	for _, want := range []string{"1.2.0", "commit abc", "go1.26.8", "linux/arm64"} {
		if !strings.Contains(s, want) {
			t.Errorf("%q lacks %q", s, want)
		}
	}
}
