// Package testutil holds the helpers Berth's tests share: polling until a
// condition holds, loopback addresses that are free and never handed out
// twice, and berthd run as a real process (built once per test binary,
// started, waited for on its port, signalled and stopped).
//
// A package that starts berthd processes builds the binary before its
// tests and removes it after them with
//
//	func TestMain(m *testing.M) { testutil.Main(m) }
package testutil

import (
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// pollMax is the longest sleep between two calls of WaitFor's condition;
// the first sleeps are shorter, so a condition that holds soon is seen
// soon.
const pollMax = 20 * time.Millisecond

// WaitFor calls f until it returns nil, and fails t with f's last error
// if within passes first. f runs on the caller's goroutine, so it may
// call t.Fatal itself.
func WaitFor(t testing.TB, within time.Duration, f func() error) {
	t.Helper()
	deadline := time.Now().Add(within)
	sleep := time.Millisecond
	for {
		err := f()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("not within %v: %v", within, err)
			return
		}
		time.Sleep(sleep)
		sleep = min(2*sleep, pollMax)
	}
}

// WaitUntil is WaitFor for a condition that holds or not; what names it
// in the failure.
func WaitUntil(t testing.TB, within time.Duration, what string, cond func() bool) {
	t.Helper()
	WaitFor(t, within, func() error {
		if cond() {
			return nil
		}
		return errors.New("waiting for " + what)
	})
}

// WaitReady waits until the admin endpoint at admin answers /readyz with
// 200, and fails t with the last answer if within passes first.
func WaitReady(t testing.TB, admin string, within time.Duration) {
	t.Helper()
	WaitFor(t, within, func() error {
		resp, err := http.Get("http://" + admin + "/readyz")
		if err != nil {
			return err
		}
		body, _ := io.ReadAll(io.LimitReader(resp.Body, 4<<10))
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("/readyz: %s: %s", resp.Status, body)
		}
		return nil
	})
}

// handedOut holds every address FreeAddr returned in this process, and
// where its walk through the ports stands.
var handedOut struct {
	sync.Mutex
	addrs map[string]bool
	next  int // 0 until the first call
}

// Ports FreeAddr picks from: below the kernel's ephemeral range, which
// outgoing connections and listeners on port 0 take their ports from.
// A port handed out from that range could be taken by any process's next
// connect before the caller listened on it: make test once failed with a
// berthd's peer port "already in use" that way.
const (
	freePortLow     = 10000
	freePortSpanMin = 1024
)

// freePortRange is [low, high): from freePortLow up to the ephemeral
// range's start, or nothing (0, 0) when that leaves too few ports.
func freePortRange() (low, high int) {
	high = 32768 // Linux's default ephemeral start
	if b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range"); err == nil {
		var lo, hi int
		if n, _ := fmt.Sscan(string(b), &lo, &hi); n == 2 {
			high = lo
		}
	}
	if high-freePortLow < freePortSpanMin {
		return 0, 0
	}
	return freePortLow, high
}

// FreeAddr returns a 127.0.0.1 host:port that nothing listened on when it
// was picked. It never returns the same address twice within a process
// (two members of one test must not share a port). Ports come from below
// the ephemeral range (freePortRange), walked from a point that depends on
// the process id, so test binaries running at once mostly walk apart;
// another process may still take the port before the caller listens on
// it, but no outgoing connection does.
func FreeAddr(t testing.TB) string {
	t.Helper()
	handedOut.Lock()
	defer handedOut.Unlock()
	if handedOut.addrs == nil {
		handedOut.addrs = map[string]bool{}
	}
	low, high := freePortRange()
	if high > low {
		span := high - low
		if handedOut.next == 0 {
			handedOut.next = low + os.Getpid()*7919%span
		}
		for range span {
			port := handedOut.next
			handedOut.next++
			if handedOut.next >= high {
				handedOut.next = low
			}
			addr := fmt.Sprintf("127.0.0.1:%d", port)
			if handedOut.addrs[addr] {
				continue
			}
			ln, err := net.Listen("tcp", addr)
			if err != nil {
				continue // someone has it
			}
			ln.Close()
			handedOut.addrs[addr] = true
			return addr
		}
	}
	for {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		addr := ln.Addr().String()
		ln.Close()
		if !handedOut.addrs[addr] {
			handedOut.addrs[addr] = true
			return addr
		}
	}
}

// BerthdPackage is the import path Berthd builds.
const BerthdPackage = "github.com/berthmq/berth/cmd/berthd"

// BerthdEnv names an environment variable holding the path of a berthd
// binary built beforehand: when it is set, Berthd and Main use that
// binary and build none. make test builds berthd once and sets it, so
// that the packages of process tests do not each link their own.
const BerthdEnv = "BERTH_TEST_BERTHD"

// BerthdRaceEnv names an environment variable that, set to 1, says the
// binary BerthdEnv names was built with -race (make test-race-procs).
// Then StartBerthd runs its processes even in a test binary built with
// -race, and a race the detector reports in a berthd's log fails the
// test that started it.
const BerthdRaceEnv = "BERTH_TEST_BERTHD_RACE"

// RaceBerthd reports whether the berthd binary the tests start was built
// with -race (BerthdRaceEnv). Such a broker is several times slower and
// larger than the one make test runs: a test whose point is a bound on
// memory or time skips it there.
var RaceBerthd = os.Getenv(BerthdRaceEnv) == "1" && os.Getenv(BerthdEnv) != ""

// raceReport is how the race detector starts each report it writes.
const raceReport = "WARNING: DATA RACE"

var built struct {
	sync.Mutex
	dir, path string
	err       error
}

// Berthd returns the path of a berthd binary built from this module's
// cmd/berthd: the one Main built, or, in a package without that TestMain,
// one built on the first call (left in the temporary directory). A
// failed build fails t.
func Berthd(t testing.TB) string {
	t.Helper()
	path, err := berthd()
	if err != nil {
		t.Fatalf("build berthd: %v", err)
	}
	return path
}

func berthd() (string, error) {
	built.Lock()
	defer built.Unlock()
	if built.path == "" && built.err == nil {
		if path := os.Getenv(BerthdEnv); path != "" {
			built.path, built.err = prebuilt(path)
		} else {
			built.path, built.err = build()
		}
	}
	return built.path, built.err
}

// prebuilt checks that path (BerthdEnv) is an executable file and
// returns it made absolute: tests start berthd from directories of their
// own.
func prebuilt(path string) (string, error) {
	abs, err := filepath.Abs(path)
	if err != nil {
		return "", fmt.Errorf("%s=%s: %v", BerthdEnv, path, err)
	}
	fi, err := os.Stat(abs)
	if err != nil {
		return "", fmt.Errorf("%s: %v", BerthdEnv, err)
	}
	if fi.IsDir() || fi.Mode()&0o111 == 0 {
		return "", fmt.Errorf("%s=%s is not an executable file", BerthdEnv, path)
	}
	return abs, nil
}

func build() (string, error) {
	dir, err := os.MkdirTemp("", "berth-testutil-bin")
	if err != nil {
		return "", err
	}
	built.dir = dir
	path := filepath.Join(dir, "berthd")
	out, err := exec.Command("go", "build", "-o", path, BerthdPackage).CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("%v\n%s", err, out)
	}
	return path, nil
}

// Main builds berthd, so that no test's time limits include the build,
// runs the package's tests, removes the binary and exits with the tests'
// status. A failed build exits with status 1 before any test runs. With
// BerthdEnv set it builds nothing and removes nothing, and a binary that
// is not there fails the tests that start it. Under the race
// detector it builds nothing up front: StartBerthd skips there (unless
// RaceBerthd), and Berthd still builds on a first call.
func Main(m *testing.M) {
	// With BerthdEnv there is nothing to build, and the first Berthd
	// call, inside a test, reads the variable and stats the binary:
	// go's test cache records only what tests do after m.Run starts, and
	// so keys the package's result on the binary (make check).
	if (Race && !RaceBerthd) || os.Getenv(BerthdEnv) != "" {
		code := m.Run()
		removeBuild()
		os.Exit(code)
	}
	if _, err := berthd(); err != nil {
		fmt.Fprintf(os.Stderr, "build berthd: %v\n", err)
		removeBuild()
		os.Exit(1)
	}
	code := m.Run()
	removeBuild()
	os.Exit(code)
}

func removeBuild() {
	built.Lock()
	defer built.Unlock()
	if built.dir != "" {
		os.RemoveAll(built.dir)
	}
}

// Proc is a process started by Start, its output appended to a log file.
type Proc struct {
	cmd     *exec.Cmd
	logPath string
	exited  chan struct{}
	err     error // cmd.Wait's result, set before exited is closed
}

// Start starts cmd with its standard output and error appended to
// logPath. The test's cleanup kills the process if it still runs.
func Start(t testing.TB, cmd *exec.Cmd, logPath string) *Proc {
	t.Helper()
	logf, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		logf.Close()
		t.Fatalf("start %s: %v", cmd.Path, err)
	}
	p := &Proc{cmd: cmd, logPath: logPath, exited: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		logf.Close()
		close(p.exited)
	}()
	t.Cleanup(p.Kill)
	return p
}

// StartBerthd starts the berthd binary Berthd built with args.
//
// Under the race detector it skips the test: berthd is built without
// -race, so the detector would see only the test's own client code (which
// the client package's tests cover) while the processes held the
// machine's cores; make test runs every process test in its plain pass.
// It does not skip when the binary itself was built with -race
// (RaceBerthd).
//
// The test's cleanup, once the process is gone, fails the test if the
// process's log holds a report of the race detector.
func StartBerthd(t testing.TB, logPath string, args ...string) *Proc {
	t.Helper()
	if Race && !RaceBerthd {
		t.Skip("berthd processes are built without -race: this test runs in the plain pass")
	}
	bin := Berthd(t)
	// Registered before Start's p.Kill, so it runs after it (cleanups run
	// last first): the log is complete by then.
	t.Cleanup(func() { checkRaceLog(t, logPath) })
	return Start(t, exec.Command(bin, args...), logPath)
}

// raceLogsChecked holds the logs checkRaceLog has already failed a test
// for: restarts of one broker append to one log, which should fail its
// test once.
var raceLogsChecked sync.Map

// checkRaceLog fails t if the log at logPath holds a report of the race
// detector, with the first report in the message.
func checkRaceLog(t testing.TB, logPath string) {
	t.Helper()
	b, err := os.ReadFile(logPath)
	if err != nil {
		return // the test removed it, or the process never started
	}
	i := strings.Index(string(b), raceReport)
	if i < 0 {
		return
	}
	if _, done := raceLogsChecked.LoadOrStore(logPath, true); done {
		return
	}
	report := string(b[i:])
	if j := strings.Index(report[len(raceReport):], "=================="); j >= 0 {
		report = report[:len(raceReport)+j]
	}
	if len(report) > 16<<10 {
		report = report[:16<<10]
	}
	t.Errorf("%d race report(s) in %s; the first:\n%s", strings.Count(string(b), raceReport), logPath, report)
}

// Pid is the process id.
func (p *Proc) Pid() int { return p.cmd.Process.Pid }

// Exited is closed once the process has exited.
func (p *Proc) Exited() <-chan struct{} { return p.exited }

// Running reports whether the process has not exited yet.
func (p *Proc) Running() bool {
	select {
	case <-p.exited:
		return false
	default:
		return true
	}
}

// Signal sends sig to the process; a process that has exited is not an
// error.
func (p *Proc) Signal(sig os.Signal) error {
	if !p.Running() {
		return nil
	}
	err := p.cmd.Process.Signal(sig)
	if errors.Is(err, os.ErrProcessDone) {
		return nil
	}
	return err
}

// Kill sends SIGKILL and waits until the process has exited.
func (p *Proc) Kill() {
	_ = p.Signal(syscall.SIGKILL)
	<-p.exited
}

// Wait waits for the process to exit by itself and returns how it ended
// (nil for exit status 0, an *exec.ExitError otherwise). If within passes
// first, it kills the process and fails t.
func (p *Proc) Wait(t testing.TB, within time.Duration) error {
	t.Helper()
	select {
	case <-p.exited:
		return p.err
	case <-time.After(within):
		p.Kill()
		t.Fatalf("%s did not exit within %v\n%s", p.cmd.Path, within, p.LogTail())
		return nil
	}
}

// Stop sends sig and waits for the process to exit. If it has not exited
// within the given time, Stop kills it and reports an error on t.
func (p *Proc) Stop(t testing.TB, sig os.Signal, within time.Duration) {
	t.Helper()
	if err := p.Signal(sig); err != nil {
		t.Errorf("signal %v: %v", sig, err)
	}
	select {
	case <-p.exited:
	case <-time.After(within):
		p.Kill()
		t.Errorf("%s did not stop on %v within %v", p.cmd.Path, sig, within)
	}
}

// WaitPort waits until addr accepts a TCP connection. It fails t with the
// end of the log if the process exits first or addr does not accept
// within the given time; then it first sends SIGQUIT, so that a Go
// process's log ends with its goroutines.
func (p *Proc) WaitPort(t testing.TB, addr string, within time.Duration) {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		select {
		case <-p.exited:
			t.Fatalf("%s exited (%v) before %s accepted connections:\n%s", p.cmd.Path, p.err, addr, p.LogTail())
		default:
		}
		c, err := net.DialTimeout("tcp", addr, time.Second)
		if err == nil {
			c.Close()
			return
		}
		if time.Now().After(deadline) {
			_ = p.Signal(syscall.SIGQUIT)
			select {
			case <-p.exited:
			case <-time.After(2 * time.Second):
			}
			t.Fatalf("%s did not accept connections on %s within %v: %v\n%s", p.cmd.Path, addr, within, err, p.logTail(64<<10))
		}
		time.Sleep(pollMax)
	}
}

// LogTail returns the last 4 KiB of the process's log file.
func (p *Proc) LogTail() string { return FileTail(p.logPath, 4<<10) }

func (p *Proc) logTail(n int) string { return FileTail(p.logPath, n) }

// FileTail returns the last n bytes of the file at path, or why it cannot.
func FileTail(path string, n int) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return fmt.Sprintf("(%v)", err)
	}
	if len(b) > n {
		b = b[len(b)-n:]
	}
	return string(b)
}

// Long skips, under -short (make check, the edit loop), one of the
// longest process tests, which make test runs in full: a long cluster
// test, the hostile suite, the package build. why says what it covers.
func Long(t testing.TB, why string) {
	t.Helper()
	if testing.Short() {
		t.Skipf("a long process test (%s): make test runs it, make check does not", why)
	}
}
