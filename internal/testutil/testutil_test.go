package testutil

import (
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// fakeTB records a Fatal instead of ending the test, so a helper's
// failure can be checked. Fatal panics with fatal{} to leave the helper,
// as testing.T's Goexit would; catch recovers it.
type fakeTB struct {
	testing.TB
	failed []string
}

type fatal struct{}

func (f *fakeTB) Helper() {}
func (f *fakeTB) Fatal(args ...any) {
	f.failed = append(f.failed, fmt.Sprint(args...))
	panic(fatal{})
}
func (f *fakeTB) Fatalf(format string, args ...any) {
	f.failed = append(f.failed, fmt.Sprintf(format, args...))
	panic(fatal{})
}
func (f *fakeTB) Errorf(format string, args ...any) {
	f.failed = append(f.failed, fmt.Sprintf(format, args...))
}

// catch runs fn with a fakeTB and returns what it reported.
func catch(t *testing.T, fn func(tb testing.TB)) []string {
	f := &fakeTB{TB: t}
	func() {
		defer func() {
			if r := recover(); r != nil {
				if _, ok := r.(fatal); !ok {
					panic(r)
				}
			}
		}()
		fn(f)
	}()
	return f.failed
}

func TestWaitFor(t *testing.T) {
	calls := 0
	WaitFor(t, 5*time.Second, func() error {
		calls++
		if calls < 4 {
			return errors.New("not yet")
		}
		return nil
	})
	if calls != 4 {
		t.Fatalf("f called %d times, want 4 (until it returned nil)", calls)
	}

	start := time.Now()
	failed := catch(t, func(tb testing.TB) {
		WaitFor(tb, 50*time.Millisecond, func() error { return errors.New("never ready") })
	})
	if len(failed) != 1 || !strings.Contains(failed[0], "never ready") {
		t.Fatalf("WaitFor on a condition that never holds reported %q, want its last error", failed)
	}
	if waited := time.Since(start); waited < 50*time.Millisecond {
		t.Fatalf("gave up after %v, before the 50ms", waited)
	}
}

// TestFreeAddrNeverRepeats: the addresses are distinct and listenable,
// although each probe listener is closed before the next is opened, so the
// kernel may offer the same port again.
func TestFreeAddrNeverRepeats(t *testing.T) {
	seen := map[string]bool{}
	for i := 0; i < 200; i++ {
		addr := FreeAddr(t)
		if seen[addr] {
			t.Fatalf("FreeAddr returned %s twice", addr)
		}
		seen[addr] = true
	}
	addr := FreeAddr(t)
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatalf("listen on a free address: %v", err)
	}
	ln.Close()
	// Below the ephemeral range, where no outgoing connection takes it.
	if low, high := freePortRange(); high > low {
		_, p, _ := net.SplitHostPort(addr)
		port, _ := strconv.Atoi(p)
		if port < low || port >= high {
			t.Fatalf("FreeAddr gave port %d, outside [%d, %d)", port, low, high)
		}
	}
}

func TestProc(t *testing.T) {
	if _, err := exec.LookPath("sh"); err != nil {
		t.Skip("no sh")
	}
	dir := t.TempDir()

	// A process that exits by itself: Wait gives its status, its output
	// is in the log.
	p := Start(t, exec.Command("sh", "-c", "echo to-the-log; exit 3"), filepath.Join(dir, "exit.log"))
	var ee *exec.ExitError
	if err := p.Wait(t, 10*time.Second); !errors.As(err, &ee) || ee.ExitCode() != 3 {
		t.Fatalf("Wait = %v, want exit status 3", err)
	}
	if p.Running() || !strings.Contains(p.LogTail(), "to-the-log") {
		t.Fatalf("running %v, log %q", p.Running(), p.LogTail())
	}
	// WaitPort on a process that has exited fails at once with its log.
	addr := FreeAddr(t)
	failed := catch(t, func(tb testing.TB) { p.WaitPort(tb, addr, 10*time.Second) })
	if len(failed) != 1 || !strings.Contains(failed[0], "exited") || !strings.Contains(failed[0], "to-the-log") {
		t.Fatalf("WaitPort on an exited process reported %q", failed)
	}

	// A process that runs until signalled; WaitPort sees a listener
	// once one is there.
	long := Start(t, exec.Command("sleep", "60"), filepath.Join(dir, "sleep.log"))
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	long.WaitPort(t, ln.Addr().String(), 10*time.Second)
	failed = catch(t, func(tb testing.TB) { long.WaitPort(tb, FreeAddr(t), 100*time.Millisecond) })
	if len(failed) != 1 || !strings.Contains(failed[0], "did not accept") {
		t.Fatalf("WaitPort on a closed port reported %q", failed)
	}
	// That failure sent SIGQUIT, which ends sleep.
	select {
	case <-long.Exited():
	case <-time.After(10 * time.Second):
		t.Fatal("SIGQUIT did not end the process")
	}

	term := Start(t, exec.Command("sleep", "60"), filepath.Join(dir, "term.log"))
	if !term.Running() {
		t.Fatal("sleep 60 not running")
	}
	term.Stop(t, syscall.SIGTERM, 10*time.Second)
	if term.Running() {
		t.Fatal("running after Stop")
	}
	if err := term.Signal(syscall.SIGTERM); err != nil {
		t.Fatalf("signal to an exited process: %v", err)
	}
}

// A berthd log with a race detector's report fails the test that started
// the process, once however many restarts appended to it; a clean log
// does not.
func TestCheckRaceLog(t *testing.T) {
	dir := t.TempDir()
	clean := filepath.Join(dir, "clean.log")
	racy := filepath.Join(dir, "racy.log")
	if err := os.WriteFile(clean, []byte("level=INFO msg=started\nlevel=INFO msg=stopped\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	report := "==================\nWARNING: DATA RACE\nWrite at 0x00c000 by goroutine 7:\n  main.f()\n==================\n"
	if err := os.WriteFile(racy, []byte("level=INFO msg=started\n"+report+"level=INFO msg=more\n"+report), 0o644); err != nil {
		t.Fatal(err)
	}
	if got := catch(t, func(tb testing.TB) { checkRaceLog(tb, clean) }); len(got) != 0 {
		t.Errorf("clean log: %q", got)
	}
	if got := catch(t, func(tb testing.TB) { checkRaceLog(tb, filepath.Join(dir, "missing.log")) }); len(got) != 0 {
		t.Errorf("missing log: %q", got)
	}
	got := catch(t, func(tb testing.TB) { checkRaceLog(tb, racy) })
	if len(got) != 1 || !strings.Contains(got[0], "2 race report(s)") || !strings.Contains(got[0], "Write at 0x00c000 by goroutine 7") {
		t.Fatalf("racy log: %q", got)
	}
	if strings.Contains(got[0], "msg=more") {
		t.Errorf("the message runs past the first report: %q", got[0])
	}
	if got := catch(t, func(tb testing.TB) { checkRaceLog(tb, racy) }); len(got) != 0 {
		t.Errorf("racy log reported twice: %q", got)
	}
}

// BerthdEnv names a binary to use instead of building one; it must be
// an executable file, and comes back absolute.
func TestPrebuilt(t *testing.T) {
	dir := t.TempDir()
	bin := filepath.Join(dir, "berthd")
	if err := os.WriteFile(bin, []byte("#!/bin/sh\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	notExec := filepath.Join(dir, "plain")
	if err := os.WriteFile(notExec, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if got, err := prebuilt(bin); err != nil || got != bin {
		t.Errorf("prebuilt(%s) = %q, %v", bin, got, err)
	}
	t.Chdir(dir)
	if got, err := prebuilt("berthd"); err != nil || got != bin {
		t.Errorf("prebuilt(relative) = %q, %v; want %s", got, err, bin)
	}
	for _, bad := range []string{notExec, dir, filepath.Join(dir, "missing")} {
		if got, err := prebuilt(bad); err == nil {
			t.Errorf("prebuilt(%s) = %q, no error", bad, got)
		}
	}
}
