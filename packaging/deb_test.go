package packaging

import (
	"archive/tar"
	"bufio"
	"bytes"
	"compress/gzip"
	"crypto/md5"
	"debug/elf"
	"encoding/hex"
	"errors"
	"fmt"
	"github.com/berthmq/berth/internal/testutil"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
)

const versionPkg = "github.com/berthmq/berth/internal/version"

// mkdeb builds packaging/mkdeb once per test binary.
var mkdeb = sync.OnceValues(func() (string, error) {
	dir, err := os.MkdirTemp("", "berth-mkdeb")
	if err != nil {
		return "", err
	}
	bin := filepath.Join(dir, "mkdeb")
	if out, err := exec.Command("go", "build", "-C", "mkdeb", "-o", bin, ".").CombinedOutput(); err != nil {
		return "", fmt.Errorf("go build mkdeb: %v\n%s", err, out)
	}
	return bin, nil
})

func mkdebPath(t *testing.T) string {
	t.Helper()
	bin, err := mkdeb()
	if err != nil {
		t.Fatal(err)
	}
	return bin
}

func TestMain(m *testing.M) {
	code := m.Run()
	if bin, err := mkdeb(); err == nil {
		os.RemoveAll(filepath.Dir(bin))
	}
	os.Exit(code)
}

// arMember is one file of an ar archive.
type arMember struct {
	name string
	mode int64
	data []byte
}

// readAr reads a common-format ar archive, as dpkg writes and reads .deb
// files: "!<arch>\n", then per member a 60-byte header (name 16, mtime 12,
// uid 6, gid 6, octal mode 8, decimal size 10, "`\n") and the data, padded
// to an even length.
func readAr(b []byte) ([]arMember, error) {
	const magic = "!<arch>\n"
	if !bytes.HasPrefix(b, []byte(magic)) {
		return nil, errors.New("not an ar archive")
	}
	b = b[len(magic):]
	var ms []arMember
	for len(b) > 0 {
		if len(b) < 60 {
			return nil, fmt.Errorf("truncated header after %d members", len(ms))
		}
		h := b[:60]
		if string(h[58:60]) != "`\n" {
			return nil, fmt.Errorf("member %d: bad header end %q", len(ms), h[58:60])
		}
		size, err := strconv.ParseInt(strings.TrimSpace(string(h[48:58])), 10, 64)
		if err != nil || size < 0 || size > int64(len(b)-60) {
			return nil, fmt.Errorf("member %d: bad size %q", len(ms), h[48:58])
		}
		mode, err := strconv.ParseInt(strings.TrimSpace(string(h[40:48])), 8, 64)
		if err != nil {
			return nil, fmt.Errorf("member %d: bad mode %q", len(ms), h[40:48])
		}
		name := strings.TrimSuffix(strings.TrimSpace(string(h[:16])), "/")
		ms = append(ms, arMember{name: name, mode: mode, data: b[60 : 60+size]})
		b = b[60+size:]
		if size%2 == 1 && len(b) > 0 {
			b = b[1:]
		}
	}
	return ms, nil
}

// tarEntry is a file of a gzipped tar, names without the leading "./".
type tarEntry struct {
	hdr  *tar.Header
	data []byte
}

func readTarGz(b []byte) (map[string]tarEntry, []string, error) {
	zr, err := gzip.NewReader(bytes.NewReader(b))
	if err != nil {
		return nil, nil, err
	}
	tr := tar.NewReader(zr)
	entries := map[string]tarEntry{}
	var order []string
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return entries, order, nil
		}
		if err != nil {
			return nil, nil, err
		}
		data, err := io.ReadAll(tr)
		if err != nil {
			return nil, nil, err
		}
		name := strings.TrimPrefix(strings.TrimPrefix(h.Name, "."), "/")
		if name == "" {
			continue
		}
		entries[name] = tarEntry{hdr: h, data: data}
		order = append(order, name)
	}
}

// controlFields parses a deb control file's "Key: value" lines;
// continuation lines belong to the field before them.
func controlFields(b []byte) map[string]string {
	f := map[string]string{}
	var last string
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, " ") && last != "" {
			f[last] += "\n" + line
			continue
		}
		if k, v, ok := strings.Cut(line, ":"); ok {
			last = k
			f[k] = strings.TrimSpace(v)
		}
	}
	return f
}

// buildDeb builds berthd and berthctl static and stamped, as `make
// release` does (without -trimpath, which would recompile the whole tree
// once more), and packages them with mkdeb as `make deb` does. It returns
// the .deb's path.
func buildDeb(t *testing.T, version, commit string) string {
	t.Helper()
	arch := runtime.GOARCH
	if arch != "amd64" && arch != "arm64" {
		t.Skipf("packages are built for amd64 and arm64, not %s", arch)
	}
	dist := t.TempDir()
	ldflags := "-X " + versionPkg + ".Version=" + version + " -X " + versionPkg + ".Commit=" + commit
	cmd := exec.Command("go", "build", "-ldflags", ldflags, "-o", filepath.Join(dist, "linux-"+arch)+"/", "./cmd/berthd", "./tools/berthctl")
	cmd.Dir = ".."
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux", "GOARCH="+arch)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	cmd = exec.Command(mkdebPath(t), "-version", version, "-root", "..", "-dist", dist, "-arch", arch)
	cmd.Env = append(os.Environ(), "SOURCE_DATE_EPOCH=1700000000")
	out, err := cmd.Output()
	if err != nil {
		var stderr []byte
		if ee, ok := err.(*exec.ExitError); ok {
			stderr = ee.Stderr
		}
		t.Fatalf("mkdeb: %v\n%s", err, stderr)
	}
	path := strings.TrimSpace(string(out))
	if want := filepath.Join(dist, "berth_1.2.3~rc.1_"+arch+".deb"); path != want {
		t.Fatalf("mkdeb wrote %q, want %q", path, want)
	}
	return path
}

// TestDeb builds the .deb and reads it back: its members, control data,
// maintainer scripts, md5sums and file list; the binaries in it are static
// and print the stamped version; the unit it installs starts what it
// installs with the configuration it installs.
func TestDeb(t *testing.T) {
	testutil.Long(t, "the Debian package")
	const version, commit = "1.2.3-rc.1", "c0ffee0000000000000000000000000000000001"
	path := buildDeb(t, version, commit)
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	members, err := readAr(raw)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, m := range members {
		names = append(names, m.name)
	}
	if want := []string{"debian-binary", "control.tar.gz", "data.tar.gz"}; !slices.Equal(names, want) {
		t.Fatalf("ar members %q, want %q", names, want)
	}
	if string(members[0].data) != "2.0\n" {
		t.Fatalf("debian-binary %q", members[0].data)
	}
	control, _, err := readTarGz(members[1].data)
	if err != nil {
		t.Fatalf("control.tar.gz: %v", err)
	}
	data, order, err := readTarGz(members[2].data)
	if err != nil {
		t.Fatalf("data.tar.gz: %v", err)
	}

	// Control data.
	fields := controlFields(control["control"].data)
	for k, want := range map[string]string{
		"Package":      "berth",
		"Version":      "1.2.3~rc.1",
		"Architecture": runtime.GOARCH,
		"Depends":      "adduser",
		"Section":      "net",
		"Priority":     "optional",
	} {
		if fields[k] != want {
			t.Errorf("control %s = %q, want %q\n%s", k, fields[k], want, control["control"].data)
		}
	}
	if !strings.Contains(fields["Maintainer"], "<") || !strings.HasPrefix(fields["Description"], "Berth") {
		t.Errorf("control Maintainer %q, Description %q", fields["Maintainer"], fields["Description"])
	}
	if got := string(control["conffiles"].data); got != "/etc/berth/berth.toml\n" {
		t.Errorf("conffiles %q, want only /etc/berth/berth.toml", got)
	}
	for script, src := range map[string]string{"postinst": "scripts/postinst", "prerm": "scripts/prerm", "postrm": "scripts/postrm"} {
		e, ok := control[script]
		if !ok {
			t.Errorf("control.tar.gz has no %s", script)
			continue
		}
		want, err := os.ReadFile(src)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(e.data, want) {
			t.Errorf("%s differs from packaging/%s", script, src)
		}
		if e.hdr.Mode&0o111 != 0o111 {
			t.Errorf("%s mode %o, not executable", script, e.hdr.Mode)
		}
	}
	if !bytes.Contains(control["postinst"].data, []byte("adduser --system")) {
		t.Error("postinst creates no system user")
	}

	// The file list: exactly these regular files, owned by root.
	wantFiles := map[string]struct {
		mode int64
		src  string // repository file it must equal, if any
	}{
		"usr/bin/berthd":                             {0o755, ""},
		"usr/bin/berthctl":                           {0o755, ""},
		"usr/lib/systemd/system/berthd.service":      {0o644, "berthd.service"},
		"etc/berth/berth.toml":                       {0o644, "../docs/berth.example.toml"},
		"usr/share/doc/berth/berth.example.toml":     {0o644, "../docs/berth.example.toml"},
		"usr/share/doc/berth/OPERATIONS.md":          {0o644, "../docs/OPERATIONS.md"},
		"usr/share/doc/berth/METRICS.md":             {0o644, "../docs/METRICS.md"},
		"usr/share/doc/berth/grafana-dashboard.json": {0o644, "grafana-dashboard.json"},
		"usr/share/doc/berth/README.md":              {0o644, "../README.md"},
	}
	var regular []string
	for _, name := range order {
		e := data[name]
		if e.hdr.Uid != 0 || e.hdr.Gid != 0 {
			t.Errorf("%s owned by %d:%d, want root", name, e.hdr.Uid, e.hdr.Gid)
		}
		if e.hdr.Typeflag != tar.TypeReg {
			continue
		}
		regular = append(regular, name)
		w, ok := wantFiles[name]
		if !ok {
			t.Errorf("unexpected file %s in the package", name)
			continue
		}
		if e.hdr.Mode&0o7777 != w.mode {
			t.Errorf("%s mode %o, want %o", name, e.hdr.Mode&0o7777, w.mode)
		}
		if w.src != "" {
			if want, err := os.ReadFile(w.src); err != nil {
				t.Fatal(err)
			} else if !bytes.Equal(e.data, want) {
				t.Errorf("%s differs from %s", name, w.src)
			}
		}
	}
	for name := range wantFiles {
		if !slices.Contains(regular, name) {
			t.Errorf("the package lacks %s", name)
		}
	}

	// md5sums lists every file with its checksum, as dpkg --verify reads it.
	sums := map[string]string{}
	for _, line := range strings.Split(strings.TrimSpace(string(control["md5sums"].data)), "\n") {
		sum, name, ok := strings.Cut(line, "  ")
		if ok {
			sums[name] = sum
		}
	}
	for _, name := range regular {
		h := md5.Sum(data[name].data)
		if sums[name] != hex.EncodeToString(h[:]) {
			t.Errorf("md5sums: %s is %q, want %x", name, sums[name], h)
		}
	}

	// The binaries: static, and stamped with the version and commit.
	dir := t.TempDir()
	for _, bin := range []string{"berthd", "berthctl"} {
		p := filepath.Join(dir, bin)
		if err := os.WriteFile(p, data["usr/bin/"+bin].data, 0o755); err != nil {
			t.Fatal(err)
		}
		f, err := elf.Open(p)
		if err != nil {
			t.Fatalf("%s: %v", bin, err)
		}
		for _, prog := range f.Progs {
			if prog.Type == elf.PT_INTERP || prog.Type == elf.PT_DYNAMIC {
				t.Errorf("%s is dynamically linked (%v)", bin, prog.Type)
			}
		}
		f.Close()
	}
	out, err := exec.Command(filepath.Join(dir, "berthd"), "-version").Output()
	if err != nil || !strings.HasPrefix(string(out), "berthd "+version+" (commit "+commit+", ") {
		t.Errorf("packaged berthd -version: %q, %v", out, err)
	}
	out, err = exec.Command(filepath.Join(dir, "berthctl"), "version").Output()
	if err != nil || !strings.HasPrefix(string(out), "berthctl "+version+" (commit "+commit+", ") {
		t.Errorf("packaged berthctl version: %q, %v", out, err)
	}

	// The unit starts the packaged binary on the packaged configuration.
	unit := string(data["usr/lib/systemd/system/berthd.service"].data)
	if !strings.Contains(unit, "\nExecStart=/usr/bin/berthd -config /etc/berth/berth.toml\n") {
		t.Error("the unit does not run /usr/bin/berthd -config /etc/berth/berth.toml")
	}

	// dpkg itself, where installed, reads the package the same way.
	if dpkg, err := exec.LookPath("dpkg-deb"); err == nil {
		out, err := exec.Command(dpkg, "--field", path, "Package", "Version", "Architecture").CombinedOutput()
		want := "Package: berth\nVersion: 1.2.3~rc.1\nArchitecture: " + runtime.GOARCH + "\n"
		if err != nil || string(out) != want {
			t.Errorf("dpkg-deb --field: %v\n%s\nwant\n%s", err, out, want)
		}
		out, err = exec.Command(dpkg, "--contents", path).CombinedOutput()
		if err != nil || !strings.Contains(string(out), "./usr/bin/berthd") {
			t.Errorf("dpkg-deb --contents: %v\n%s", err, out)
		}
	} else {
		t.Log("dpkg-deb not installed: the package was read with this test's own reader only")
	}

	// systemd, where installed, accepts the unit as the package installs
	// it, and rates its sandbox.
	verifyUnit(t, data)
}

// verifyUnit runs systemd-analyze verify and security (offline) over a
// root holding the package's files and the system's own units.
func verifyUnit(t *testing.T, data map[string]tarEntry) {
	sa, err := exec.LookPath("systemd-analyze")
	if err != nil {
		t.Log("systemd-analyze not installed: the unit was not verified by systemd")
		return
	}
	systemUnits := "/usr/lib/systemd/system"
	if _, err := os.Stat(filepath.Join(systemUnits, "sysinit.target")); err != nil {
		systemUnits = "/lib/systemd/system"
		if _, err := os.Stat(filepath.Join(systemUnits, "sysinit.target")); err != nil {
			t.Log("no systemd units on this machine: the unit was not verified by systemd")
			return
		}
	}
	root := t.TempDir()
	for name, e := range data {
		if e.hdr.Typeflag != tar.TypeReg {
			continue
		}
		p := filepath.Join(root, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, e.data, os.FileMode(e.hdr.Mode)&0o777); err != nil {
			t.Fatal(err)
		}
	}
	targets, _ := filepath.Glob(filepath.Join(systemUnits, "*.target"))
	for _, src := range targets {
		b, err := os.ReadFile(src)
		if err != nil {
			continue // a dangling alias
		}
		if err := os.WriteFile(filepath.Join(root, "usr/lib/systemd/system", filepath.Base(src)), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	out, err := exec.Command(sa, "verify", "--root="+root, "--man=no", "--generators=no", "berthd.service").CombinedOutput()
	if err != nil || len(bytes.TrimSpace(out)) > 0 {
		t.Errorf("systemd-analyze verify: %v\n%s", err, out)
	}
	// Exposure on systemd's 0-10 scale times 10: 25 is 2.5, "OK". Dropping
	// the sandboxing options raises it past 5.
	out, err = exec.Command(sa, "security", "--offline=true", "--root="+root, "--threshold=25", "berthd.service").CombinedOutput()
	if err != nil {
		t.Errorf("systemd-analyze security: %v\n%s", err, out)
	}
}

// TestDebVersion: stamped versions become Debian versions that sort as
// releases should, and junk is refused.
func TestDebVersion(t *testing.T) {
	bin := mkdebPath(t)
	deb := func(v string) (string, error) {
		out, err := exec.Command(bin, "-version", v, "-print-version").CombinedOutput()
		return strings.TrimSpace(string(out)), err
	}
	for in, want := range map[string]string{
		"1.2.0":                  "1.2.0",
		"v1.2.0":                 "1.2.0",
		"1.2.0-3-gabc1234":       "1.2.0+git3.gabc1234",
		"1.2.0-3-gabc1234-dirty": "1.2.0+git3.gabc1234.dirty",
		"1.3.0-rc.1":             "1.3.0~rc.1",
		"0.0.0-dev":              "0.0.0~dev",
		"1.3.0-rc-2+build.7":     "1.3.0~rc.2+build.7",
	} {
		if got, err := deb(in); err != nil || got != want {
			t.Errorf("%q: %q, %v; want %q", in, got, err, want)
		}
	}
	for _, bad := range []string{"", "latest", "v", "1.2.0 beta", "1.2.0_1"} {
		if out, err := deb(bad); err == nil {
			t.Errorf("%q accepted as %q", bad, out)
		}
	}
	dpkg, err := exec.LookPath("dpkg")
	if err != nil {
		t.Log("dpkg not installed: the order of Debian versions was not checked")
		return
	}
	order := []string{"0.0.0-dev", "1.3.0-rc.1", "1.3.0", "1.3.0-2-gabc1234", "1.3.0-10-gdef5678", "1.3.1"}
	for i := 1; i < len(order); i++ {
		a, _ := deb(order[i-1])
		b, _ := deb(order[i])
		if err := exec.Command(dpkg, "--compare-versions", a, "lt", b).Run(); err != nil {
			t.Errorf("dpkg does not sort %s (%s) before %s (%s)", a, order[i-1], b, order[i])
		}
	}
}

// TestMakeRecipes reads `make -n release deb`: static builds for both
// architectures, stamped; sums; the package built by mkdeb from them.
func TestMakeRecipes(t *testing.T) {
	mk, err := exec.LookPath("make")
	if err != nil {
		t.Skip("make not installed")
	}
	cmd := exec.Command(mk, "-n", "release", "deb", "VERSION=9.9.9", "COMMIT=abc", "DIST=/tmp/berth-dist-test")
	cmd.Dir = ".."
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("make -n: %v\n%s", err, out)
	}
	s := string(out)
	for _, want := range []string{
		"CGO_ENABLED=0 GOOS=linux GOARCH=$arch go build -trimpath",
		"for arch in amd64 arm64",
		"-X " + versionPkg + ".Version=9.9.9 -X " + versionPkg + ".Commit=abc",
		"-o /tmp/berth-dist-test/linux-$arch/ ./cmd/berthd ./tools/berthctl",
		"sha256sum linux-*/* > SHA256SUMS",
		"cd packaging/mkdeb && SOURCE_DATE_EPOCH=",
		"go run . -version '9.9.9'",
		"-dist /tmp/berth-dist-test -arch 'amd64 arm64'",
		"sha256sum linux-*/* *.deb > SHA256SUMS",
	} {
		if !strings.Contains(s, want) {
			t.Errorf("make -n release deb lacks %q:\n%s", want, s)
		}
	}
	cmd = exec.Command(mk, "-n", "build", "VERSION=9.9.9", "COMMIT=abc")
	cmd.Dir = ".."
	out, err = cmd.CombinedOutput()
	if err != nil || !strings.Contains(string(out), "-ldflags '-X "+versionPkg+".Version=9.9.9 -X "+versionPkg+".Commit=abc'") {
		t.Errorf("make -n build does not stamp the version: %v\n%s", err, out)
	}
}
