package main

import (
	"errors"
	"flag"
	"maps"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/berthmq/berth/internal/testutil"
	"github.com/berthmq/berth/journal"
)

func TestControllerFlags(t *testing.T) {
	ok := []struct {
		id, peers string
		wantID    uint64
		want      map[uint64]string
	}{
		{"", "", 0, nil},
		{"2", "1=127.0.0.1:7402,2=127.0.0.1:7412,3=127.0.0.1:7422", 2,
			map[uint64]string{1: "127.0.0.1:7402", 2: "127.0.0.1:7412", 3: "127.0.0.1:7422"}},
		{" 1 ", " 1 = 10.0.0.1:7402 , 3=10.0.0.3:7402,2=10.0.0.2:7402", 1,
			map[uint64]string{1: "10.0.0.1:7402", 2: "10.0.0.2:7402", 3: "10.0.0.3:7402"}},
		{"7", "7=localhost:7402", 7, map[uint64]string{7: "localhost:7402"}},
		{"5", "1=h1:1,2=h2:1,3=h3:1,4=h4:1,5=[::1]:7402", 5,
			map[uint64]string{1: "h1:1", 2: "h2:1", 3: "h3:1", 4: "h4:1", 5: "[::1]:7402"}},
	}
	for _, c := range ok {
		id, peers, err := controllerFlags(c.id, c.peers, false)
		if err != nil {
			t.Errorf("controllerFlags(%q, %q): %v", c.id, c.peers, err)
			continue
		}
		if id != c.wantID || !maps.Equal(peers, c.want) {
			t.Errorf("controllerFlags(%q, %q) = %d %v, want %d %v", c.id, c.peers, id, peers, c.wantID, c.want)
		}
	}

	bad := []struct{ id, peers, msg string }{
		{"1", "", "needs -controller-peers"},
		{"", "1=127.0.0.1:7402,2=127.0.0.1:7412,3=127.0.0.1:7422", "needs -controller-id"},
		{"4", "1=127.0.0.1:7402,2=127.0.0.1:7412,3=127.0.0.1:7422", "not in -controller-peers"},
		{"x", "1=127.0.0.1:7402", "positive integer"},
		{"0", "1=127.0.0.1:7402", "positive integer"},
		{"-1", "1=127.0.0.1:7402", "positive integer"},
		{"1", "1=127.0.0.1:7402,2=127.0.0.1:7412", "1, 3 or 5 members, not 2"},
		{"1", "1=a:1,2=b:1,3=c:1,4=d:1", "not 4"},
		{"1", "1=a:1,2=b:1,3=c:1,4=d:1,5=e:1,6=f:1", "not 6"},
		{"1", "1=127.0.0.1:7402,1=127.0.0.1:7412,3=127.0.0.1:7422", "appears twice"},
		{"1", "1=127.0.0.1:7402,2=127.0.0.1:7402,3=127.0.0.1:7422", "share the address"},
		{"1", "1=127.0.0.1:7402,,3=127.0.0.1:7422", "want id=host:port"},
		{"1", "127.0.0.1:7402", "want id=host:port"},
		{"1", "0=127.0.0.1:7402", "positive integer"},
		{"1", "a=127.0.0.1:7402", "positive integer"},
		{"1", "1=", "host:port"},
		{"1", "1=127.0.0.1", "host:port"},
		{"1", "1=:7402", "host:port"},
		{"1", "1=127.0.0.1:0", "port must be"},
		{"1", "1=127.0.0.1:70000", "port must be"},
		{"1", "1=127.0.0.1:http", "port must be"},
	}
	for _, c := range bad {
		_, _, err := controllerFlags(c.id, c.peers, false)
		if err == nil || !strings.Contains(err.Error(), c.msg) {
			t.Errorf("controllerFlags(%q, %q) = %v, want an error with %q", c.id, c.peers, err, c.msg)
		}
	}
}

// TestArgs checks that bad controller settings, by flag or by environment,
// make run exit with 2, and that good ones reach the server config.
func TestArgs(t *testing.T) {
	dir := t.TempDir()
	peers := "1=127.0.0.1:7402,2=127.0.0.1:7412,3=127.0.0.1:7422"
	cases := []struct {
		args []string
		env  map[string]string
	}{
		{args: []string{"-controller-peers", peers}},
		{args: []string{"-controller-peers", peers, "-controller-id", "9"}},
		{args: []string{"-controller-peers", "1=127.0.0.1:7402,2=127.0.0.1:7412", "-controller-id", "1"}},
		{args: []string{"-role", "gateway"}},
		{args: []string{"-role", "controller", "-controller", ""}},
		{args: []string{"-controller-peers", peers, "-controller-id", "1", "-data", ""}},
		{args: []string{"-data", dir, "stray"}},
		{env: map[string]string{"BERTH_CONTROLLER_PEERS": peers, "BERTH_CONTROLLER_ID": "one"}},
		{env: map[string]string{"BERTH_CONTROLLER_PEERS": "1=127.0.0.1:7402,3", "BERTH_CONTROLLER_ID": "1"}},
		{env: map[string]string{"BERTH_ROLE": "both"}},
		{args: []string{"-advertise", "no-port"}},
		{args: []string{"-controller-heartbeat-ms", "0"}},
		{args: []string{"-controller-heartbeat-ms", "800"}},
		{args: []string{"-controller-heartbeat-ms", "1000", "-controller-broker-timeout", "1s"}},
		{args: []string{"-controller-wait", "0s"}},
		{env: map[string]string{"BERTH_CONTROLLER_WAIT": "-1s"}},
		{args: []string{"-group-lag", "10ms"}},
		{args: []string{"-group-lag", "0s"}},
		{env: map[string]string{"BERTH_GROUP_LAG": "2h"}},
	}
	for _, c := range cases {
		for k, v := range c.env {
			t.Setenv(k, v)
		}
		args := append([]string{"-data", dir, "-admin", "", "-listen", "127.0.0.1:0"}, c.args...)
		if _, err := parseArgs(args); err == nil {
			t.Errorf("parseArgs(%q) with env %v passed", c.args, c.env)
		} else if code := run(args); code != 2 {
			t.Errorf("run(%q) with env %v = %d, want 2", c.args, c.env, code)
		}
		for k := range c.env {
			t.Setenv(k, "")
		}
	}
}

func TestArgsGood(t *testing.T) {
	peers := "1=127.0.0.1:7402,2=127.0.0.1:7412,3=127.0.0.1:7422"
	o, err := parseArgs([]string{"-data", "d", "-controller-peers", peers, "-controller-id", "3", "-role", "controller"})
	if err != nil {
		t.Fatal(err)
	}
	if o.cfg.ControllerID != 3 || len(o.cfg.ControllerPeers) != 3 || o.cfg.Role != "controller" || o.cfg.ControllerPeers[3] != "127.0.0.1:7422" {
		t.Fatalf("config %+v", o.cfg)
	}
	t.Setenv("BERTH_CONTROLLER_PEERS", peers)
	t.Setenv("BERTH_CONTROLLER_ID", "2")
	o, err = parseArgs([]string{"-data", "d"})
	if err != nil {
		t.Fatal(err)
	}
	if o.cfg.ControllerID != 2 || len(o.cfg.ControllerPeers) != 3 || o.cfg.Role != "broker" {
		t.Fatalf("config from env %+v", o.cfg)
	}
	// The default stays the one-member controller on -controller.
	t.Setenv("BERTH_CONTROLLER_PEERS", "")
	t.Setenv("BERTH_CONTROLLER_ID", "")
	o, err = parseArgs(nil)
	if err != nil {
		t.Fatal(err)
	}
	if o.cfg.ControllerAddr != "127.0.0.1:7402" || o.cfg.ControllerPeers != nil || o.cfg.ControllerID != 0 {
		t.Fatalf("default config %+v", o.cfg)
	}
	o, err = parseArgs([]string{"-advertise", "broker1.example:7400", "-controller-heartbeat-ms", "500", "-controller-lease-read"})
	if err != nil {
		t.Fatal(err)
	}
	if o.cfg.AdvertiseAddr != "broker1.example:7400" || o.cfg.ControllerHeartbeat != 500*time.Millisecond || !o.cfg.ControllerLeaseRead {
		t.Fatalf("advertise/heartbeat config %+v", o.cfg)
	}
	if o.cfg.GroupLag != 500*time.Millisecond {
		t.Fatalf("default -group-lag %v, want 500ms", o.cfg.GroupLag)
	}
	if o, err = parseArgs([]string{"-group-lag", "200ms"}); err != nil || o.cfg.GroupLag != 200*time.Millisecond {
		t.Fatalf("-group-lag 200ms: %v, %v", o.cfg.GroupLag, err)
	}
}

// TestControllerJoinArgs checks -controller-join and BERTH_CONTROLLER_JOIN:
// a joining member lists itself and the members it knows (2 to 6 entries),
// which a member of a fixed group may not.
func TestControllerJoinArgs(t *testing.T) {
	four := "1=127.0.0.1:7402,2=127.0.0.1:7412,3=127.0.0.1:7422,4=127.0.0.1:7432"
	id, peers, err := controllerFlags("4", four, true)
	if err != nil || id != 4 || len(peers) != 4 || peers[4] != "127.0.0.1:7432" {
		t.Fatalf("join with four entries: %d %v %v", id, peers, err)
	}
	if _, _, err := controllerFlags("4", "1=127.0.0.1:7402,4=127.0.0.1:7432", true); err != nil {
		t.Fatalf("join knowing one member: %v", err)
	}
	for _, c := range []struct{ id, peers, msg string }{
		{"4", "4=127.0.0.1:7432", "at least one running member"},
		{"7", "1=a:1,2=b:1,3=c:1,4=d:1,5=e:1,6=f:1,7=g:1", "at most 5 members, not 7"},
		{"9", four, "not in -controller-peers"},
		{"4", "1=127.0.0.1:7402,4=127.0.0.1:7402", "share the address"},
	} {
		_, _, err := controllerFlags(c.id, c.peers, true)
		if err == nil || !strings.Contains(err.Error(), c.msg) {
			t.Errorf("controllerFlags(%q, %q, join) = %v, want an error with %q", c.id, c.peers, err, c.msg)
		}
	}
	if _, _, err := controllerFlags("", "", true); err == nil || !strings.Contains(err.Error(), "-controller-join needs") {
		t.Errorf("join without peers: %v", err)
	}
	// Four entries are refused without -controller-join.
	if _, err := parseArgs([]string{"-data", "d", "-controller-peers", four, "-controller-id", "4"}); err == nil {
		t.Error("four peers without -controller-join passed")
	}
	o, err := parseArgs([]string{"-data", "d", "-controller-peers", four, "-controller-id", "4", "-controller-join", "-role", "controller"})
	if err != nil {
		t.Fatal(err)
	}
	if !o.cfg.ControllerJoin || o.cfg.ControllerID != 4 || len(o.cfg.ControllerPeers) != 4 {
		t.Fatalf("join config %+v", o.cfg)
	}
	t.Setenv("BERTH_CONTROLLER_JOIN", "true")
	o, err = parseArgs([]string{"-data", "d", "-controller-peers", four, "-controller-id", "4"})
	if err != nil || !o.cfg.ControllerJoin {
		t.Fatalf("join from env: %+v %v", o.cfg, err)
	}
	// The flag overrides the environment.
	if _, err := parseArgs([]string{"-data", "d", "-controller-peers", four, "-controller-id", "4", "-controller-join=false"}); err == nil {
		t.Error("-controller-join=false with four peers passed")
	}
	t.Setenv("BERTH_CONTROLLER_JOIN", "perhaps")
	if _, err := parseArgs([]string{"-data", "d"}); err == nil || !strings.Contains(err.Error(), "BERTH_CONTROLLER_JOIN") {
		t.Errorf("BERTH_CONTROLLER_JOIN=perhaps: %v", err)
	}
	t.Setenv("BERTH_CONTROLLER_JOIN", "")
	if o, err := parseArgs([]string{"-data", "d"}); err != nil || o.cfg.ControllerJoin {
		t.Errorf("empty BERTH_CONTROLLER_JOIN: %+v %v", o.cfg.ControllerJoin, err)
	}
}

// TestMalformedEnv: a variable its flag cannot parse is an error naming
// the variable, for every kind of flag, and run exits with 2; it is an
// error even when the command line sets the flag too.
func TestMalformedEnv(t *testing.T) {
	dir := t.TempDir()
	cases := []struct{ key, value, want string }{
		{"BERTH_SHARDS", "four", "want an integer"},
		{"BERTH_HEARTBEAT_MS", "1.5", "want an integer"},
		{"BERTH_CONTROLLER_HEARTBEAT_MS", "99999999999999999999", "out of range"},
		{"BERTH_JOURNAL_SEGMENT_BYTES", "2MiB", "want an integer"},
		{"BERTH_CONTROLLER_LEASE_READ", "perhaps", "want true or false"},
		{"BERTH_CONTROLLER_JOIN", "yes", "want true or false"},
		{"BERTH_CONTROLLER_WAIT", "30", "want a duration"},
		{"BERTH_CONTROLLER_WAIT", "soon", "want a duration"},
	}
	args := []string{"-data", dir, "-admin", "", "-listen", "127.0.0.1:0", "-controller", ""}
	for _, c := range cases {
		t.Run(c.key+"="+c.value, func(t *testing.T) {
			t.Setenv(c.key, c.value)
			_, err := parseArgs(args)
			if err == nil || !strings.Contains(err.Error(), c.key) || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("parseArgs with %s=%q: %v, want an error naming %s and saying %q", c.key, c.value, err, c.key, c.want)
			}
			if code := run(args); code != 2 {
				t.Fatalf("run with %s=%q = %d, want 2", c.key, c.value, code)
			}
		})
	}
	t.Setenv("BERTH_SHARDS", "four")
	if _, err := parseArgs(append(args, "-shards", "4")); err == nil || !strings.Contains(err.Error(), "BERTH_SHARDS") {
		t.Fatalf("BERTH_SHARDS=four with -shards 4: %v, want an error naming BERTH_SHARDS", err)
	}
	// Blank counts as unset for a flag that is not a string.
	t.Setenv("BERTH_SHARDS", " ")
	if o, err := parseArgs(args); err != nil || o.cfg.Shards != 0 {
		t.Fatalf("blank BERTH_SHARDS: shards %d, %v", o.cfg.Shards, err)
	}
}

// TestFlagOverridesEnv: each variable sets its flag's value; the command
// line wins over it.
func TestFlagOverridesEnv(t *testing.T) {
	env := map[string]string{
		"BERTH_LISTEN":                "127.0.0.1:7501",
		"BERTH_ADMIN":                 "", // a set empty string is a value: no admin listener
		"BERTH_SHARDS":                "3",
		"BERTH_JOURNAL_SEGMENT_BYTES": "1048576",
		"BERTH_CONTROLLER_LEASE_READ": "true",
		"BERTH_CONTROLLER_WAIT":       "5s",
		"BERTH_FSYNC":                 "never",
	}
	for k, v := range env {
		t.Setenv(k, v)
	}
	o, err := parseArgs([]string{"-data", "d"})
	if err != nil {
		t.Fatal(err)
	}
	c := o.cfg
	if c.ClientAddr != "127.0.0.1:7501" || c.AdminAddr != "" || c.Shards != 3 || c.JournalSegmentBytes != 1<<20 ||
		!c.ControllerLeaseRead || c.ControllerWait != 5*time.Second || c.Fsync != journal.FsyncNever {
		t.Fatalf("config from the environment: %+v", c)
	}
	o, err = parseArgs([]string{"-data", "d", "-listen", "127.0.0.1:7502", "-admin", "127.0.0.1:7580", "-shards", "5",
		"-journal-segment-bytes", "4096", "-controller-lease-read=false", "-controller-wait", "2s", "-fsync", "always"})
	if err != nil {
		t.Fatal(err)
	}
	c = o.cfg
	if c.ClientAddr != "127.0.0.1:7502" || c.AdminAddr != "127.0.0.1:7580" || c.Shards != 5 || c.JournalSegmentBytes != 4096 ||
		c.ControllerLeaseRead || c.ControllerWait != 2*time.Second || c.Fsync != journal.FsyncAlways {
		t.Fatalf("flags did not override the environment: %+v", c)
	}
}

// TestEveryFlagHasEnv walks berthd's flags: each one's variable, set to a
// value other than the default, sets the flag; a flag that is not a
// string refuses a malformed value naming its variable; each flag's help
// names its variable. The action flags (-version, -print-config) have no
// variable: theirs set nothing and their help names none.
func TestEveryFlagHasEnv(t *testing.T) {
	fs, _ := newFlagSet()
	n := 0
	fs.VisitAll(func(fl *flag.Flag) {
		n++
		key := envName(fl.Name)
		if notInEnv[fl.Name] {
			if strings.Contains(fl.Usage, "(env ") {
				t.Errorf("-%s is not bound to a variable, but its help says %q", fl.Name, fl.Usage)
			}
			fs, _ := newFlagSet()
			if err := bindEnv(fs, func(k string) (string, bool) { return "true", k == key }); err != nil {
				t.Errorf("%s=true: %v", key, err)
			}
			if got := fs.Lookup(fl.Name).Value.String(); got != fl.DefValue {
				t.Errorf("%s=true set -%s to %q", key, fl.Name, got)
			}
			return
		}
		if !strings.HasPrefix(key, "BERTH_") || strings.ContainsAny(key, "-.") {
			t.Errorf("-%s: variable %q", fl.Name, key)
		}
		if !strings.Contains(fl.Usage, "(env "+key+")") {
			t.Errorf("-%s: help %q does not name %s", fl.Name, fl.Usage, key)
		}
		var good, bad string
		switch def := fl.Value.(flag.Getter).Get().(type) {
		case string:
			good = "from-env"
		case bool:
			good = strconv.FormatBool(!def)
			bad = "maybe"
		case int, int64:
			good, bad = "12345", "12x"
		case time.Duration:
			good, bad = "42s", "42"
		default:
			t.Errorf("-%s: a %T flag; teach this test its values", fl.Name, def)
			return
		}
		if good == fl.DefValue {
			t.Fatalf("-%s: the test value %q is the default", fl.Name, good)
		}
		fs, _ := newFlagSet()
		lookup := func(k string) (string, bool) {
			if k == key {
				return good, true
			}
			return "", false
		}
		if err := bindEnv(fs, lookup); err != nil {
			t.Errorf("%s=%s: %v", key, good, err)
			return
		}
		if got := fs.Lookup(fl.Name).Value.String(); got != good {
			t.Errorf("%s=%s: -%s is %q", key, good, fl.Name, got)
		}
		fs.VisitAll(func(other *flag.Flag) {
			if other.Name != fl.Name && other.Value.String() != other.DefValue {
				t.Errorf("%s set -%s too", key, other.Name)
			}
		})
		if bad == "" {
			return
		}
		fs, _ = newFlagSet()
		err := bindEnv(fs, func(k string) (string, bool) { return bad, k == key })
		if err == nil || !strings.Contains(err.Error(), key) {
			t.Errorf("%s=%s: %v, want an error naming %s", key, bad, err, key)
		}
	})
	if n < 20 {
		t.Fatalf("walked %d flags", n)
	}
}

// TestREADMEFlagTable: the README's berthd flag table lists every flag
// with its variable and nothing else.
func TestREADMEFlagTable(t *testing.T) {
	b, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	_, table, ok := strings.Cut(string(b), "## berthd flags")
	if !ok {
		t.Fatal("README has no berthd flags section")
	}
	table, _, _ = strings.Cut(table, "\n## ")
	listed := map[string]string{} // flag -> the table row naming it
	for _, line := range strings.Split(table, "\n") {
		cells := strings.Split(line, "|")
		if len(cells) < 3 || !strings.Contains(cells[1], "`-") {
			continue
		}
		for _, f := range strings.Split(cells[1], ",") {
			listed[strings.Trim(strings.TrimSpace(f), "`-")] = cells[2]
		}
	}
	fs, _ := newFlagSet()
	fs.VisitAll(func(fl *flag.Flag) {
		row, ok := listed[fl.Name]
		if !ok {
			t.Errorf("README's berthd flag table lacks -%s", fl.Name)
		} else if notInEnv[fl.Name] {
			if strings.Contains(row, "BERTH_") {
				t.Errorf("README's row for -%s names a variable, but it has none: %q", fl.Name, row)
			}
		} else if !strings.Contains(row, "`"+envName(fl.Name)+"`") {
			t.Errorf("README's row for -%s does not name %s: %q", fl.Name, envName(fl.Name), row)
		}
		delete(listed, fl.Name)
	})
	for name := range listed {
		t.Errorf("README's berthd flag table lists -%s, which berthd does not have", name)
	}
}

func TestMain(m *testing.M) { testutil.Main(m) }

// TestProcessEnv runs the berthd binary configured by the environment: it
// listens where the -listen flag says, not BERTH_LISTEN, stops cleanly on
// SIGTERM, and exits with 2 and the variable's name on a malformed one.
func TestProcessEnv(t *testing.T) {
	dir := t.TempDir()
	envAddr, flagAddr := testutil.FreeAddr(t), testutil.FreeAddr(t)
	cmd := exec.Command(testutil.Berthd(t), "-listen", flagAddr)
	cmd.Env = append(os.Environ(), "BERTH_LISTEN="+envAddr, "BERTH_ADMIN=", "BERTH_DATA="+filepath.Join(dir, "data"),
		"BERTH_CONTROLLER=", "BERTH_SHARDS=1", "BERTH_LOOPS=1", "BERTH_LOG_LEVEL=warn")
	p := testutil.Start(t, cmd, filepath.Join(dir, "berthd.log"))
	p.WaitPort(t, flagAddr, 20*time.Second)
	if c, err := net.DialTimeout("tcp", envAddr, time.Second); err == nil {
		c.Close()
		t.Fatalf("berthd listens on BERTH_LISTEN %s although -listen says %s", envAddr, flagAddr)
	}
	p.Stop(t, syscall.SIGTERM, 20*time.Second)
	if err := p.Wait(t, time.Second); err != nil {
		t.Fatalf("exit after SIGTERM: %v\n%s", err, p.LogTail())
	}

	cmd = exec.Command(testutil.Berthd(t), "-listen", flagAddr)
	cmd.Env = append(os.Environ(), "BERTH_DATA="+filepath.Join(dir, "data"), "BERTH_SHARDS=many")
	p = testutil.Start(t, cmd, filepath.Join(dir, "bad.log"))
	var ee *exec.ExitError
	if err := p.Wait(t, 20*time.Second); !errors.As(err, &ee) || ee.ExitCode() != 2 {
		t.Fatalf("berthd with BERTH_SHARDS=many: %v, want exit status 2\n%s", err, p.LogTail())
	}
	if !strings.Contains(p.LogTail(), `BERTH_SHARDS="many"`) {
		t.Fatalf("stderr does not name the variable:\n%s", p.LogTail())
	}
}
