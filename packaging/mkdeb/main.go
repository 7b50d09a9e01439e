// Command mkdeb builds Berth's Debian packages with nfpm, used as a
// library. `make deb` runs it after `make release`:
//
//	mkdeb -version 1.2.0 -root ../.. -dist ../../dist -arch amd64,arm64
//
// For each architecture it packages DIST/linux-ARCH/berthd and berthctl
// with the systemd unit, the example configuration (as the conffile
// /etc/berth/berth.toml) and the operations docs, and writes
// DIST/berth_VERSION_ARCH.deb, printing each path.
//
// It is a module of its own (packaging/mkdeb/go.mod) so that nfpm and its
// dependencies (git, OpenPGP, rpm and apk writers) stay out of the broker's
// go.mod.
package main

import (
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"

	"github.com/goreleaser/nfpm/v2"
	_ "github.com/goreleaser/nfpm/v2/deb" // registers the deb packager
	"github.com/goreleaser/nfpm/v2/files"
)

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "mkdeb:", err)
		os.Exit(1)
	}
}

func run(args []string) error {
	fs := flag.NewFlagSet("mkdeb", flag.ContinueOnError)
	version := fs.String("version", "", "Berth version as `make` stamps it: 1.2.0, v1.2.0, 1.2.0-3-gabc1234, 0.0.0-dev")
	root := fs.String("root", "../..", "the repository's root `DIR` (unit, scripts, docs)")
	dist := fs.String("dist", "../../dist", "`DIR` holding linux-ARCH/berthd and linux-ARCH/berthctl; the packages go here")
	arches := fs.String("arch", "amd64,arm64", "Debian architectures (amd64, arm64), separated by commas or spaces")
	maintainer := fs.String("maintainer", "Berth maintainers <maintainers@berthmq.invalid>", "the package's Maintainer field")
	printVersion := fs.Bool("print-version", false, "print the Debian version for -version and exit")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	debVer, err := debVersion(*version)
	if err != nil {
		return err
	}
	if *printVersion {
		fmt.Println(debVer)
		return nil
	}
	list := strings.FieldsFunc(*arches, func(r rune) bool { return r == ',' || r == ' ' })
	if len(list) == 0 {
		return errors.New("-arch names no architecture")
	}
	for _, arch := range list {
		switch arch {
		case "amd64", "arm64":
		default:
			return fmt.Errorf("-arch %q: want amd64 or arm64", arch)
		}
		out := filepath.Join(*dist, fmt.Sprintf("berth_%s_%s.deb", debVer, arch))
		if err := build(info(debVer, arch, *maintainer, *root, filepath.Join(*dist, "linux-"+arch)), out); err != nil {
			return fmt.Errorf("%s: %w", out, err)
		}
		fmt.Println(out)
	}
	return nil
}

// Paths the package installs; the systemd unit and docs/OPERATIONS.md name
// them too.
const (
	binDir     = "/usr/bin"
	unitPath   = "/usr/lib/systemd/system/berthd.service"
	configPath = "/etc/berth/berth.toml"
	docDir     = "/usr/share/doc/berth"
)

// info describes the package for one architecture.
func info(debVer, arch, maintainer, root, bin string) *nfpm.Info {
	src := func(rel string) string { return filepath.Join(root, filepath.FromSlash(rel)) }
	file := func(source, dest string, mode os.FileMode) *files.Content {
		return &files.Content{Source: source, Destination: dest, FileInfo: &files.ContentFileInfo{Owner: "root", Group: "root", Mode: mode}}
	}
	contents := files.Contents{
		file(filepath.Join(bin, "berthd"), binDir+"/berthd", 0o755),
		file(filepath.Join(bin, "berthctl"), binDir+"/berthctl", 0o755),
		file(src("packaging/berthd.service"), unitPath, 0o644),
		file(src("docs/berth.example.toml"), docDir+"/berth.example.toml", 0o644),
		file(src("docs/OPERATIONS.md"), docDir+"/OPERATIONS.md", 0o644),
		file(src("docs/METRICS.md"), docDir+"/METRICS.md", 0o644),
		file(src("packaging/grafana-dashboard.json"), docDir+"/grafana-dashboard.json", 0o644),
		file(src("README.md"), docDir+"/README.md", 0o644),
	}
	// The configuration starts as the example (every key at its default)
	// and is the operator's from then on: a conffile that upgrades never
	// overwrite without asking.
	conf := file(src("docs/berth.example.toml"), configPath, 0o644)
	conf.Type = files.TypeConfigNoReplace
	contents = append(contents, conf)

	return nfpm.WithDefaults(&nfpm.Info{
		Name:          "berth",
		Arch:          arch,
		Platform:      "linux",
		Version:       debVer,
		VersionSchema: "none", // debVersion has already made it a Debian version
		Section:       "net",
		Priority:      "optional",
		Maintainer:    maintainer,
		Description: "Berth clustered message broker\n" +
			"berthd, a message broker with durable replicated queues, AMQP-style\n" +
			"delivery semantics and a Raft controller, and berthctl, its admin CLI.\n" +
			"Installs the berthd systemd unit (not started on a fresh install) and\n" +
			"/etc/berth/berth.toml.",
		Homepage: "https://github.com/berthmq/berth",
		Overridables: nfpm.Overridables{
			Depends:  []string{"adduser"},
			Contents: contents,
			Scripts: nfpm.Scripts{
				PostInstall: src("packaging/scripts/postinst"),
				PreRemove:   src("packaging/scripts/prerm"),
				PostRemove:  src("packaging/scripts/postrm"),
			},
			Deb: nfpm.Deb{Compression: "gzip:6"},
		},
	})
}

func build(info *nfpm.Info, out string) (err error) {
	pkg, err := nfpm.Get("deb")
	if err != nil {
		return err
	}
	if err := nfpm.Validate(info); err != nil {
		return err
	}
	for _, c := range info.Contents {
		if _, err := os.Stat(c.Source); err != nil {
			return fmt.Errorf("package content %s: %w", c.Destination, err)
		}
	}
	tmp := out + ".tmp"
	f, err := os.Create(tmp)
	if err != nil {
		return err
	}
	defer func() {
		if err != nil {
			f.Close()
			os.Remove(tmp)
		}
	}()
	if err := pkg.Package(info, f); err != nil {
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	return os.Rename(tmp, out)
}

var (
	// git describe's form: the tag, commits since it, the abbreviated
	// commit, and -dirty with uncommitted changes.
	describeRE = regexp.MustCompile(`^([0-9][0-9A-Za-z.]*)-([0-9]+)-g([0-9a-f]+)(-dirty)?$`)
	debCharsRE = regexp.MustCompile(`^[0-9][0-9A-Za-z.+~]*$`)
)

// debVersion turns a version as `make` stamps it into a Debian version that
// sorts as releases should:
//
//	v1.2.0                  1.2.0
//	1.2.0-3-gabc1234        1.2.0+git3.gabc1234   (after 1.2.0, before 1.2.1)
//	1.2.0-3-gabc1234-dirty  1.2.0+git3.gabc1234.dirty
//	1.3.0-rc.1              1.3.0~rc.1            (before 1.3.0)
//	0.0.0-dev               0.0.0~dev
func debVersion(v string) (string, error) {
	orig := v
	v = strings.TrimPrefix(strings.TrimSpace(v), "v")
	if v == "" {
		return "", errors.New("-version is required (make passes VERSION)")
	}
	var out string
	if m := describeRE.FindStringSubmatch(v); m != nil {
		out = m[1] + "+git" + m[2] + ".g" + m[3]
		if m[4] != "" {
			out += ".dirty"
		}
	} else {
		base, meta, hasMeta := strings.Cut(v, "+")
		base, pre, hasPre := strings.Cut(base, "-")
		out = base
		if hasPre {
			out += "~" + strings.ReplaceAll(pre, "-", ".")
		}
		if hasMeta {
			out += "+" + strings.ReplaceAll(meta, "-", ".")
		}
	}
	if !debCharsRE.MatchString(out) {
		return "", fmt.Errorf("-version %q: want a version starting with a digit, of letters, digits and . + - ~ (such as 1.2.0 or v1.3.0-rc.1)", orig)
	}
	return out, nil
}
