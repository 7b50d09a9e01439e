package main

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/berthmq/berth/internal/testutil"
)

// TestClusterScriptPortBase runs tools/cluster.sh (make cluster) with
// CLUSTER_PORT_BASE: the three brokers listen on the ports it moves to,
// the script initialises the groups and prints the addresses, and
// SIGTERM stops all of them (issue 25 item 7: the ports were fixed at
// 74xx).
func TestClusterScriptPortBase(t *testing.T) {
	if testutil.Race {
		t.Skip("runs berthd processes, built without -race")
	}
	if _, err := exec.LookPath("curl"); err != nil {
		t.Skip("cluster.sh needs curl")
	}
	bin := t.TempDir()
	if err := os.Symlink(testutil.Berthd(t), filepath.Join(bin, "berthd")); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("go", "build", "-o", filepath.Join(bin, "berthctl"), ".").CombinedOutput(); err != nil {
		t.Fatalf("go build berthctl: %v\n%s", err, out)
	}
	base := freePortBase(t)
	ports := func(i, k int) string { return fmt.Sprintf("127.0.0.1:%d", base+10*i+k) }
	dir := t.TempDir()
	cmd := exec.Command("bash", "../cluster.sh")
	cmd.Env = append(os.Environ(), "BIN="+bin, "CLUSTER_DIR="+filepath.Join(dir, "cluster"), "CLUSTER_GROUPS=4",
		fmt.Sprintf("CLUSTER_PORT_BASE=%d", base), "CLUSTER_ARGS=-shards 1 -loops 1", "CLUSTER_TLS=")
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	t.Cleanup(func() {
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) // the script's group: bash and its three berthd
		if t.Failed() {
			t.Logf("cluster.sh output:\n%s", out.String())
			for n := 1; n <= 3; n++ {
				t.Logf("berthd-%d log:\n%s", n, testutil.FileTail(filepath.Join(dir, "cluster", fmt.Sprintf("berthd-%d.log", n)), 2000))
			}
		}
	})
	testutil.WaitFor(t, 60*time.Second, func() error {
		select {
		case err := <-exited:
			t.Fatalf("cluster.sh exited early: %v", err)
		default:
		}
		if !strings.Contains(out.String(), "Ctrl-C stops the cluster.") {
			return fmt.Errorf("cluster.sh has not printed the addresses yet")
		}
		return nil
	})
	printed := out.String()
	for i := range 3 {
		for _, want := range []string{"clients " + ports(i, 0), "peer " + ports(i, 1), "controller " + ports(i, 2),
			fmt.Sprintf("admin http://127.0.0.1:%d/ui/", base+80+i)} {
			if !strings.Contains(printed, want) {
				t.Errorf("cluster.sh did not print %q:\n%s", want, printed)
			}
		}
		testutil.WaitReady(t, fmt.Sprintf("127.0.0.1:%d", base+80+i), 10*time.Second)
	}
	code, cout, cerr := runCtl("--controller", ports(0, 2)+","+ports(1, 2)+","+ports(2, 2), "cluster")
	if code != exitOK || !strings.Contains(cout, "groups 4,") {
		t.Fatalf("berthctl cluster: %d %q %q", code, cout, cerr)
	}
	if err := syscall.Kill(cmd.Process.Pid, syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case <-exited:
	case <-time.After(30 * time.Second):
		t.Fatal("cluster.sh did not stop on SIGTERM")
	}
	for i := range 3 {
		if c, err := net.DialTimeout("tcp", ports(i, 0), time.Second); err == nil {
			c.Close()
			t.Errorf("broker %d still listens on %s after the script stopped", i+1, ports(i, 0))
		}
	}
}

// runCtl runs berthctl with args.
func runCtl(args ...string) (int, string, string) {
	var stdout, stderr bytes.Buffer
	code := run(args, &stdout, &stderr)
	return code, stdout.String(), stderr.String()
}

// freePortBase picks a CLUSTER_PORT_BASE whose ports (base to base+22,
// base+80 to base+82) all take a listener now.
func freePortBase(t *testing.T) int {
	t.Helper()
	for range 50 {
		base := 20000 + 100*rand.IntN(110) // below the ephemeral ports (32768 up)
		ok := true
		var lns []net.Listener
		for _, p := range []int{0, 1, 2, 3, 10, 11, 12, 13, 20, 21, 22, 23, 80, 81, 82} {
			ln, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", base+p))
			if err != nil {
				ok = false
				break
			}
			lns = append(lns, ln)
		}
		for _, ln := range lns {
			ln.Close()
		}
		if ok {
			return base
		}
	}
	t.Fatal("no free range of ports for the cluster")
	return 0
}
