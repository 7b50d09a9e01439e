package main

import (
	"bytes"
	"errors"
	"flag"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/berthmq/berth/internal/testutil"
	"github.com/berthmq/berth/journal"
	"github.com/berthmq/berth/server"
)

// writeConfig writes a config file into a fresh directory and returns its
// path.
func writeConfig(t *testing.T, doc string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "berth.toml")
	if err := os.WriteFile(path, []byte(doc), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

// clearEnv unsets every BERTH_ variable for the test, so that the
// environment the tests run in cannot decide them.
func clearEnv(t *testing.T) {
	for _, kv := range os.Environ() {
		if k, _, _ := strings.Cut(kv, "="); strings.HasPrefix(k, envPrefix) {
			t.Setenv(k, "") // restores the value after the test
			os.Unsetenv(k)
		}
	}
}

// TestConfigPrecedence: each setting comes from the highest source that
// has it: command line, then environment, then file, then default.
func TestConfigPrecedence(t *testing.T) {
	clearEnv(t)
	path := writeConfig(t, `
listen = "127.0.0.1:7601"           # file only
admin = "127.0.0.1:7681"            # file, then an empty variable
shards = 3                          # file, then environment
loops = 2                           # file, then environment, then flag
fsync = "never"                     # file only
controller-wait = "7s"              # file, then flag
controller-lease-read = true        # file only
log-format = "json"
`)
	t.Setenv("BERTH_ADMIN", "")
	t.Setenv("BERTH_SHARDS", "5")
	t.Setenv("BERTH_LOOPS", "6")
	t.Setenv("BERTH_HEARTBEAT_MS", "2500") // environment only
	o, err := parseArgs([]string{"-config", path, "-data", "d", "-loops", "4", "-controller-wait", "9s"})
	if err != nil {
		t.Fatal(err)
	}
	c := o.cfg
	for _, check := range []struct {
		what      string
		got, want any
	}{
		{"listen (file)", c.ClientAddr, "127.0.0.1:7601"},
		{"admin (empty BERTH_ADMIN over file)", c.AdminAddr, ""},
		{"shards (BERTH_SHARDS over file)", c.Shards, 5},
		{"loops (flag over environment and file)", c.Loops, 4},
		{"fsync (file)", c.Fsync, journal.FsyncNever},
		{"controller-wait (flag over file)", c.ControllerWait, 9 * time.Second},
		{"controller-lease-read (file)", c.ControllerLeaseRead, true},
		{"heartbeat-ms (environment)", c.Heartbeat, 2500 * time.Millisecond},
		{"data (flag)", c.DataDir, "d"},
		{"controller (default)", c.ControllerAddr, "127.0.0.1:7402"},
		{"role (default)", c.Role, server.RoleBroker},
	} {
		if !reflect.DeepEqual(check.got, check.want) {
			t.Errorf("%s = %v, want %v", check.what, check.got, check.want)
		}
	}
	if _, ok := o.cfg.Logger.Handler().(*slog.JSONHandler); !ok {
		t.Errorf("log-format json from the file: handler %T", o.cfg.Logger.Handler())
	}
	wantOrigin := map[string]string{
		"listen":       `config ` + path + ` line 2, key "listen"`,
		"admin":        "BERTH_ADMIN",
		"shards":       "BERTH_SHARDS",
		"heartbeat-ms": "BERTH_HEARTBEAT_MS",
	}
	for k, want := range wantOrigin {
		if got := o.origins[k]; got != want {
			t.Errorf("origin of %s = %q, want %q", k, got, want)
		}
	}
	if _, ok := o.origins["loops"]; ok || !o.cmdline["loops"] {
		t.Errorf("loops: origin %q, command line %v; want the command line", o.origins["loops"], o.cmdline["loops"])
	}

	// BERTH_CONFIG names the file when -config does not; -config wins.
	other := writeConfig(t, `listen = "127.0.0.1:7602"`)
	t.Setenv("BERTH_CONFIG", other)
	if o, err = parseArgs([]string{"-data", "d"}); err != nil || o.cfg.ClientAddr != "127.0.0.1:7602" {
		t.Fatalf("BERTH_CONFIG: listen %q, %v", o.cfg.ClientAddr, err)
	}
	if o, err = parseArgs([]string{"-data", "d", "-config", path}); err != nil || o.cfg.ClientAddr != "127.0.0.1:7601" {
		t.Fatalf("-config over BERTH_CONFIG: listen %q, %v", o.cfg.ClientAddr, err)
	}
	// An empty -config reads no file, even with BERTH_CONFIG set.
	if o, err = parseArgs([]string{"-data", "d", "-config", ""}); err != nil || o.cfg.ClientAddr != "127.0.0.1:7400" {
		t.Fatalf("-config '': listen %q, %v", o.cfg.ClientAddr, err)
	}
	// A variable the file would have overridden is still checked.
	t.Setenv("BERTH_SHARDS", "many")
	if _, err := parseArgs([]string{"-config", path}); err == nil || !strings.Contains(err.Error(), "BERTH_SHARDS") {
		t.Fatalf("BERTH_SHARDS=many with a file: %v", err)
	}
}

// TestConfigLogFormat: -log-format picks slog's text or JSON handler, by
// flag, variable or file; anything else is refused with where it was set.
func TestConfigLogFormat(t *testing.T) {
	clearEnv(t)
	for _, args := range [][]string{nil, {"-log-format", "text"}} {
		o, err := parseArgs(args)
		if err != nil {
			t.Fatal(err)
		}
		if _, ok := o.cfg.Logger.Handler().(*slog.TextHandler); !ok {
			t.Errorf("%q: handler %T, want text", args, o.cfg.Logger.Handler())
		}
	}
	t.Setenv("BERTH_LOG_FORMAT", "json")
	o, err := parseArgs(nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := o.cfg.Logger.Handler().(*slog.JSONHandler); !ok {
		t.Errorf("BERTH_LOG_FORMAT=json: handler %T", o.cfg.Logger.Handler())
	}
	os.Unsetenv("BERTH_LOG_FORMAT")
	path := writeConfig(t, "\n\nlog-format = \"xml\"\n")
	_, err = parseArgs([]string{"-config", path})
	if err == nil || !strings.Contains(err.Error(), `-log-format "xml": want text or json`) || !strings.Contains(err.Error(), `line 3, key "log-format"`) {
		t.Fatalf("log-format xml: %v", err)
	}
}

// TestConfigUnknownKey: an unknown key stops the start with the key's name
// and line; every unknown key is reported, not just the first.
func TestConfigUnknownKey(t *testing.T) {
	clearEnv(t)
	path := writeConfig(t, `# a comment
listen = "127.0.0.1:7601"
heartbeat_ms = 1000
colour = "blue"

[cluster]
peers = 3
`)
	_, err := parseArgs([]string{"-config", path})
	if err == nil {
		t.Fatal("a file with unknown keys passed")
	}
	for _, want := range []string{
		"config " + path + ` line 3: key "heartbeat_ms": unknown key; did you mean "heartbeat-ms"?`,
		"config " + path + ` line 4: key "colour": unknown key`,
		"config " + path + ` line 6: key "cluster": unknown key`,
	} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error lacks %q:\n%v", want, err)
		}
	}
	if strings.Contains(err.Error(), `"listen"`) {
		t.Errorf("a known key reported: %v", err)
	}
	if code := run([]string{"-config", path}); code != 2 {
		t.Errorf("run with unknown keys = %d, want 2", code)
	}
	// Actions and the file's own name are not settings.
	for _, key := range []string{"version = true", "print-config = true", `config = "other.toml"`} {
		path := writeConfig(t, key+"\n")
		name, _, _ := strings.Cut(key, " ")
		_, err := parseArgs([]string{"-config", path})
		if err == nil || !strings.Contains(err.Error(), `line 1: key "`+name+`": not a setting`) {
			t.Errorf("%s in a file: %v", key, err)
		}
	}
}

// TestConfigBadValue: a value of the wrong type, one its flag refuses, and
// one a later check refuses all stop the start with the key and its line.
func TestConfigBadValue(t *testing.T) {
	clearEnv(t)
	cases := []struct {
		doc  string
		line int
		key  string
		want string
	}{
		{"listen = \"127.0.0.1:7601\"\nshards = \"four\"\n", 2, "shards", `want an integer, got the string "four"`},
		{"shards = 2.5", 1, "shards", "want an integer, got the float 2.5"},
		{"\n\nheartbeat-ms = true", 3, "heartbeat-ms", "want an integer, got the boolean true"},
		{"controller-join = \"yes\"", 1, "controller-join", `want true or false, got the string "yes"`},
		{"controller-wait = 30", 1, "controller-wait", `want a duration string such as "500ms" or "30s", got the integer 30`},
		{"controller-wait = \"soon\"", 1, "controller-wait", "want a duration such as 500ms or 30s"},
		{"listen = [\"a\", \"b\"]", 1, "listen", "want a string, got an array"},
		{"admin = 1979-05-27", 1, "admin", "want a string, got a date or time"},
		{"[listen]\nport = 1", 1, "listen", "want a string, got a table"},
		{"fsync = \"sometimes\"", 1, "fsync", `-fsync "sometimes": want always or never`},
		{"role = \"gateway\"", 1, "role", `want broker or controller`},
		{"log-level = \"loud\"", 1, "log-level", `bad -log-level "loud"`},
		{"heartbeat-ms = -5", 1, "heartbeat-ms", "-heartbeat-ms -5"},
		{"controller-wait = \"0s\"", 1, "controller-wait", "want a positive duration"},
		{"advertise = \"no-port\"", 1, "advertise", "want host:port"},
		{"group-lag = \"10ms\"", 1, "group-lag", "-group-lag 10ms: want 20ms to 1h"},
		{"\nlisten-tls = \"127.0.0.1:7443\"", 2, "listen-tls", "needs -tls-cert and -tls-key"},
		{"admin-token = \"short\"", 1, "admin-token", "want at least 16"},
		{"\ncontroller-peers = \"1=127.0.0.1:7402,2=127.0.0.1:7412,3=127.0.0.1:7422\"\ncontroller-id = \"9\"", 3, "controller-id", "-controller-id 9 is not in -controller-peers"},
	}
	for _, c := range cases {
		path := writeConfig(t, c.doc)
		_, err := parseArgs([]string{"-config", path, "-data", t.TempDir()})
		if err == nil {
			t.Errorf("%q passed", c.doc)
			continue
		}
		msg := err.Error()
		where := "config " + path + " line " + strconv.Itoa(c.line)
		if !strings.Contains(msg, where) || !strings.Contains(msg, `"`+c.key+`"`) || !strings.Contains(msg, c.want) {
			t.Errorf("%q:\n  got  %v\n  want %q, key %q and %q", c.doc, err, where, c.key, c.want)
		}
	}
	// A syntax error names its line and column.
	path := writeConfig(t, "listen = \"127.0.0.1:7400\"\nshards = \n")
	if _, err := parseArgs([]string{"-config", path}); err == nil || !strings.Contains(err.Error(), "config "+path+" line 2") {
		t.Errorf("syntax error: %v", err)
	}
	// So does a key given twice.
	path = writeConfig(t, "shards = 1\nloops = 1\nshards = 2\n")
	if _, err := parseArgs([]string{"-config", path}); err == nil || !strings.Contains(err.Error(), "line 3") || !strings.Contains(err.Error(), "shards") {
		t.Errorf("duplicate key: %v", err)
	}
	// Integers beyond int64 are a syntax error in TOML itself.
	path = writeConfig(t, "listen = \"127.0.0.1:7400\"\n\nshards = 99999999999999999999\nloops = 1\n")
	if _, err := parseArgs([]string{"-config", path}); err == nil || !strings.Contains(err.Error(), `line 3: key "shards"`) {
		t.Errorf("huge integer: %v", err)
	}
	// A missing file is an error naming it.
	missing := filepath.Join(t.TempDir(), "nope.toml")
	if _, err := parseArgs([]string{"-config", missing}); err == nil || !strings.Contains(err.Error(), missing) {
		t.Errorf("missing file: %v", err)
	}
	if code := run([]string{"-config", missing}); code != 2 {
		t.Errorf("run with a missing file = %d, want 2", code)
	}
	// A flag on the command line does not excuse a bad value in the file:
	// the file is wrong either way.
	path = writeConfig(t, "shards = \"four\"\n")
	if _, err := parseArgs([]string{"-config", path, "-shards", "2"}); err == nil || !strings.Contains(err.Error(), `"shards"`) {
		t.Errorf("bad file value with the flag given: %v", err)
	}
	// But a value a later check refuses is not reported when a higher
	// source replaced it.
	path = writeConfig(t, "fsync = \"sometimes\"\n")
	if _, err := parseArgs([]string{"-config", path, "-fsync", "never", "-data", t.TempDir()}); err != nil {
		t.Errorf("refused file value replaced by the flag: %v", err)
	}
}

// TestPrintConfigRoundTrip: -print-config prints every setting; the output
// loaded with -config, and nothing else, gives the same configuration and
// prints the same settings again.
func TestPrintConfigRoundTrip(t *testing.T) {
	clearEnv(t)
	data := filepath.Join(t.TempDir(), `dir with "quotes", 'apostrophes', a \ and ünïcode`)
	path := writeConfig(t, `
shards = 3
controller-wait = "1m30s"
controller-peers = "1=127.0.0.1:7402,2=127.0.0.1:7412,3=127.0.0.1:7422"
controller-id = "2"
`)
	t.Setenv("BERTH_FSYNC", "never")
	t.Setenv("BERTH_ADMIN", "")
	args := []string{"-config", path, "-data", data, "-controller-lease-read", "-log-format", "json", "-print-config"}
	o, err := parseArgs(args)
	if err != nil {
		t.Fatal(err)
	}
	if !o.printConfig {
		t.Fatal("-print-config not seen")
	}
	var first bytes.Buffer
	if err := printConfig(&first, o.fs, o.origins, o.cmdline); err != nil {
		t.Fatal(err)
	}
	out := first.String()
	// Every setting is printed, with where a non-default came from.
	fs, _ := newFlagSet()
	fs.VisitAll(func(fl *flag.Flag) {
		printed := strings.Contains(out, "\n"+fl.Name+" = ")
		if printed == notInFile[fl.Name] {
			t.Errorf("-%s printed: %v", fl.Name, printed)
		}
	})
	for _, want := range []string{
		"# (from config " + path + ` line 2, key "shards")` + "\nshards = 3\n",
		"# (from BERTH_FSYNC)\nfsync = 'never'\n",
		"# (from the command line)\ncontroller-lease-read = true\n",
		"controller-wait = '1m30s'\n",
		"heartbeat-ms = 5000\n",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("print-config lacks %q:\n%s", want, out)
		}
	}

	clearEnv(t)
	printed := writeConfig(t, out)
	o2, err := parseArgs([]string{"-config", printed})
	if err != nil {
		t.Fatalf("loading the printed configuration: %v\n%s", err, out)
	}
	c1, c2 := o.cfg, o2.cfg
	c1.Logger, c2.Logger = nil, nil
	if !reflect.DeepEqual(c1, c2) {
		t.Errorf("configuration after the round trip:\n  %+v\nwant\n  %+v", c2, c1)
	}
	if c2.DataDir != data || c2.Fsync != journal.FsyncNever || c2.AdminAddr != "" || c2.ControllerWait != 90*time.Second || c2.ControllerID != 2 {
		t.Errorf("round trip lost values: %+v", c2)
	}
	var second bytes.Buffer
	if err := printConfig(&second, o2.fs, o2.origins, o2.cmdline); err != nil {
		t.Fatal(err)
	}
	if a, b := settings(out), settings(second.String()); a != b {
		t.Errorf("printed settings differ after the round trip:\n%s\n---\n%s", a, b)
	}
}

// settings is a printed configuration without its comments.
func settings(doc string) string {
	var keep []string
	for _, line := range strings.Split(doc, "\n") {
		if line != "" && !strings.HasPrefix(line, "#") {
			keep = append(keep, line)
		}
	}
	return strings.Join(keep, "\n")
}

// TestExampleConfig: docs/berth.example.toml has a key for every setting,
// loads, and sets each one to its flag's default, so the example documents
// the real defaults.
func TestExampleConfig(t *testing.T) {
	clearEnv(t)
	const path = "../../docs/berth.example.toml"
	doc, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	lines, err := keyLines(doc)
	if err != nil {
		t.Fatal(err)
	}
	fs, _ := newFlagSet()
	fs.VisitAll(func(fl *flag.Flag) {
		if _, ok := lines[fl.Name]; !ok && !notInFile[fl.Name] {
			t.Errorf("%s has no key for -%s", path, fl.Name)
		}
	})
	o := origins{}
	if err := applyConfig(fs, path, doc, o); err != nil {
		t.Fatal(err)
	}
	fs.VisitAll(func(fl *flag.Flag) {
		if !notInFile[fl.Name] && o[fl.Name] == "" {
			t.Errorf("the example did not set -%s", fl.Name)
		}
		if got := fl.Value.String(); got != fl.DefValue {
			t.Errorf("the example sets %s = %q; its default is %q", fl.Name, got, fl.DefValue)
		}
	})
	if _, err := parseArgs([]string{"-config", path}); err != nil {
		t.Fatalf("berthd -config %s: %v", path, err)
	}
}

// TestProcessConfig runs the berthd binary with a config file: it listens
// where the file says, -print-config prints what it would run with, and a
// bad file exits with 2 naming the key and line.
func TestProcessConfig(t *testing.T) {
	clearEnv(t)
	dir := t.TempDir()
	addr := testutil.FreeAddr(t)
	path := writeConfig(t, strings.Join([]string{
		`listen = "` + addr + `"`,
		`admin = ""`,
		`data = "` + filepath.Join(dir, "data") + `"`,
		`controller = ""`,
		`shards = 1`,
		`loops = 1`,
		`log-format = "json"`,
	}, "\n"))
	out, err := exec.Command(testutil.Berthd(t), "-config", path, "-print-config").Output()
	if err != nil {
		t.Fatalf("-print-config: %v", err)
	}
	if !strings.Contains(string(out), "\nlisten = '"+addr+"'\n") || !strings.Contains(string(out), "\nlog-format = 'json'\n") {
		t.Fatalf("-print-config output:\n%s", out)
	}

	p := testutil.Start(t, exec.Command(testutil.Berthd(t), "-config", path), filepath.Join(dir, "berthd.log"))
	p.WaitPort(t, addr, 20*time.Second)
	p.Stop(t, os.Interrupt, 20*time.Second)
	if err := p.Wait(t, time.Second); err != nil {
		t.Fatalf("exit: %v\n%s", err, p.LogTail())
	}
	if log := p.LogTail(); !strings.Contains(log, `"msg":"berthd: stopped"`) {
		t.Fatalf("-log-format json from the file: log is not JSON lines:\n%s", log)
	}

	bad := writeConfig(t, "listen = \""+addr+"\"\nshards = \"four\"\n")
	p = testutil.Start(t, exec.Command(testutil.Berthd(t), "-config", bad), filepath.Join(dir, "bad.log"))
	var ee *exec.ExitError
	if err := p.Wait(t, 20*time.Second); !errors.As(err, &ee) || ee.ExitCode() != 2 {
		t.Fatalf("berthd with a bad file: %v, want exit status 2\n%s", err, p.LogTail())
	}
	if !strings.Contains(p.LogTail(), `line 2: key "shards"`) {
		t.Fatalf("stderr does not name the key and line:\n%s", p.LogTail())
	}
}

// TestPrintConfigHidesSecrets: the admin token is reported set, not shown.
func TestPrintConfigHidesSecrets(t *testing.T) {
	clearEnv(t)
	const token = "very-secret-admin-token-0123456789"
	t.Setenv("BERTH_ADMIN_TOKEN", token)
	o, err := parseArgs([]string{"-print-config"})
	if err != nil {
		t.Fatal(err)
	}
	if o.cfg.AdminToken != token {
		t.Fatalf("BERTH_ADMIN_TOKEN not taken: %q", o.cfg.AdminToken)
	}
	var out bytes.Buffer
	if err := printConfig(&out, o.fs, o.origins, o.cmdline); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(out.String(), token) {
		t.Fatalf("print-config shows the token:\n%s", out.String())
	}
	if !strings.Contains(out.String(), "# (set, not shown: give it through BERTH_ADMIN_TOKEN)\nadmin-token = ''\n") {
		t.Fatalf("print-config does not say the token is set:\n%s", out.String())
	}
}
