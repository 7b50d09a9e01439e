// Package proc starts and stops the broker processes the perf commands
// measure. Every process runs in its own process group with a parent-death
// signal, so Stop reaches whatever it forks and nothing outlives the
// command that started it; the commands stop every process they started
// when a run ends, fails or is interrupted.
package proc

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// StopTimeout bounds the wait for a process after SIGTERM; then it gets
// SIGKILL.
const StopTimeout = 10 * time.Second

// Proc is a process this package started.
type Proc struct {
	Name string
	// Addr is the address Start waited for.
	Addr string
	// Log is the file that takes the process's output.
	Log    string
	cmd    *exec.Cmd
	exited chan struct{}
	// OnStop, if set, runs first in Stop (to reach helpers outside the
	// process group).
	OnStop func()
}

// FreePort is a TCP port on 127.0.0.1 that was free a moment ago.
func FreePort() (int, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("proc: free port: %w", err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port, nil
}

// FreePorts is n distinct free ports.
func FreePorts(n int) ([]int, error) {
	ports := make([]int, 0, n)
	for len(ports) < n {
		p, err := FreePort()
		if err != nil {
			return nil, err
		}
		dup := false
		for _, q := range ports {
			dup = dup || q == p
		}
		if !dup {
			ports = append(ports, p)
		}
	}
	return ports, nil
}

// Start runs bin with args in dir, its output appended to dir/name.log,
// and waits until addr accepts TCP connections (bounded by timeout, by the
// process exiting and by ctx). env is added to this process's environment.
func Start(ctx context.Context, name, dir, addr string, timeout time.Duration, env []string, bin string, args ...string) (*Proc, error) {
	logPath := filepath.Join(dir, name+".log")
	logf, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, fmt.Errorf("proc: %w", err)
	}
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.Dir = dir // crash dumps and the like stay in the run's directory
	cmd.Env = append(os.Environ(), env...)
	// Own process group so Stop reaches helpers the server forks; killed
	// with us if we die without cleaning up.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		logf.Close()
		return nil, fmt.Errorf("proc: start %s: %w", name, err)
	}
	p := &Proc{Name: name, cmd: cmd, Addr: addr, Log: logPath, exited: make(chan struct{})}
	go func() { cmd.Wait(); logf.Close(); close(p.exited) }()
	deadline := time.Now().Add(timeout)
	for {
		c, err := net.DialTimeout("tcp", addr, 200*time.Millisecond)
		if err == nil {
			c.Close()
			return p, nil
		}
		select {
		case <-p.exited:
			return nil, fmt.Errorf("proc: %s exited before listening on %s: %s", name, addr, Tail(logPath))
		case <-ctx.Done():
			p.Stop()
			return nil, ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			p.Stop()
			return nil, fmt.Errorf("proc: %s not listening on %s after %v: %s", name, addr, timeout, Tail(logPath))
		}
	}
}

// Pid is the process id (also its process group id).
func (p *Proc) Pid() int { return p.cmd.Process.Pid }

// Exited is closed once the process has exited and been reaped.
func (p *Proc) Exited() <-chan struct{} { return p.exited }

// Stop sends SIGTERM to the process group, then SIGKILL if the process
// has not exited within StopTimeout.
func (p *Proc) Stop() {
	if p.OnStop != nil {
		p.OnStop()
	}
	pgid := -p.cmd.Process.Pid
	_ = syscall.Kill(pgid, syscall.SIGTERM)
	select {
	case <-p.exited:
	case <-time.After(StopTimeout):
		_ = syscall.Kill(pgid, syscall.SIGKILL)
		<-p.exited
	}
	// Helpers left in the group (none expected) go too.
	_ = syscall.Kill(pgid, syscall.SIGKILL)
}

// Kill sends SIGKILL to the process group (a crash, as kill -9) and waits,
// bounded, until the process is reaped. It returns when the signal was
// sent, the moment a crash measurement starts from.
func (p *Proc) Kill() (sent time.Time) {
	sent = time.Now()
	_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
	select {
	case <-p.exited:
	case <-time.After(StopTimeout):
	}
	return sent
}

// Signal sends sig to the process group (SIGSTOP to freeze it, SIGCONT
// to thaw it) and returns when it was sent.
func (p *Proc) Signal(sig syscall.Signal) (sent time.Time, err error) {
	sent = time.Now()
	return sent, syscall.Kill(-p.cmd.Process.Pid, sig)
}

// Tail is the end of a log file, for error messages.
func Tail(path string) string {
	b, _ := os.ReadFile(path)
	if len(b) > 800 {
		b = b[len(b)-800:]
	}
	return strings.TrimSpace(string(b))
}

// StopPid sends SIGTERM to pid and SIGKILL if it is still there after
// StopTimeout (for a process that left our process group).
func StopPid(pid int) {
	_ = syscall.Kill(pid, syscall.SIGTERM)
	deadline := time.Now().Add(StopTimeout)
	for time.Now().Before(deadline) {
		if syscall.Kill(pid, 0) != nil {
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
	_ = syscall.Kill(pid, syscall.SIGKILL)
}

// StablePorts is n distinct free ports below the kernel's ephemeral range
// (net.ipv4.ip_local_port_range), for a server that is stopped and started
// again on the same ports: a port from the ephemeral range can be taken as
// the local port of any outgoing connection while the server is down.
func StablePorts(n int) ([]int, error) {
	lo := 32768
	if b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range"); err == nil {
		if f := strings.Fields(string(b)); len(f) == 2 {
			if v, err := strconv.Atoi(f[0]); err == nil {
				lo = v
			}
		}
	}
	base := 10000
	if lo-base < 1000 {
		return FreePorts(n) // no room below the range: take what the kernel gives
	}
	ports := make([]int, 0, n)
	for tries := 0; len(ports) < n; tries++ {
		if tries > 100*n {
			return nil, fmt.Errorf("proc: no %d free ports in %d..%d", n, base, lo-1)
		}
		p := base + rand.IntN(lo-base)
		if slices.Contains(ports, p) {
			continue
		}
		ln, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", p))
		if err != nil {
			continue
		}
		ln.Close()
		ports = append(ports, p)
	}
	return ports, nil
}
