// Command restart-bench measures how long a berthd takes to serve again
// after a stop when its durable queues hold a deep backlog (issue 12).
//
// It starts the given berthd on loopback with its data in a fresh
// directory (under -dir), fills -queues durable queues with -count
// persistent messages of -size bytes, stops it (SIGTERM, or SIGKILL with
// -kill), starts it again on the same data, and reports the time from
// the exec to /readyz answering 200, to a consumer's first message, and
// the process's RSS then. -restarts repeats the stop and start. With
// -profile FILE it saves a CPU profile of the first restart, taken from
// /debug/pprof/profile (the admin HTTP answers before recovery ends).
//
//	go build -o /tmp/berthd ./cmd/berthd
//	go run ./perf/cmd/restart-bench -berthd /tmp/berthd -count 1000000
//	go run ./perf/cmd/restart-bench -berthd /tmp/berthd -count 1000000 -kill
//
// Everything listens on 127.0.0.1 only. The data directory is removed at
// the end unless -keep; -reuse DIR restarts on a directory an earlier run
// kept, without filling it again.
package main

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/berthmq/berth/client"
)

func main() { os.Exit(run(os.Args[1:])) }

type opts struct {
	berthd, dir, reuse, memLimit, profile string
	count, queues, size, restarts, shards int
	kill, keep, fsyncAlways               bool
	timeout                               time.Duration
	extra                                 string
}

func run(args []string) int {
	var o opts
	fs := flag.NewFlagSet("restart-bench", flag.ContinueOnError)
	fs.StringVar(&o.berthd, "berthd", "", "path of the berthd binary (go build ./cmd/berthd)")
	fs.StringVar(&o.dir, "dir", os.TempDir(), "where to make the data directory")
	fs.StringVar(&o.reuse, "reuse", "", "restart on this data directory (kept by an earlier -keep run) instead of filling a new one")
	fs.IntVar(&o.count, "count", 1_000_000, "persistent messages to publish")
	fs.IntVar(&o.queues, "queues", 100, "durable queues, filled round robin")
	fs.IntVar(&o.size, "size", 128, "payload bytes")
	fs.IntVar(&o.shards, "shards", 0, "berthd -shards (0: its default)")
	fs.IntVar(&o.restarts, "restarts", 1, "stop/start rounds")
	fs.BoolVar(&o.kill, "kill", false, "stop with SIGKILL instead of SIGTERM")
	fs.BoolVar(&o.keep, "keep", false, "keep the data directory")
	fs.StringVar(&o.memLimit, "memory-limit", "", "berthd -memory-limit (empty: its default)")
	fs.StringVar(&o.profile, "profile", "", "save a CPU profile of the first restart here")
	fs.StringVar(&o.extra, "args", "", "more berthd flags, space separated")
	fs.DurationVar(&o.timeout, "timeout", 30*time.Minute, "bound on the whole run")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if o.berthd == "" || o.count <= 0 || o.queues <= 0 || o.size < 0 {
		fmt.Fprintln(os.Stderr, "restart-bench: need -berthd, and positive -count and -queues")
		return 2
	}
	ctx, cancel := context.WithTimeout(context.Background(), o.timeout)
	defer cancel()
	if err := bench(ctx, o); err != nil {
		fmt.Fprintln(os.Stderr, "restart-bench:", err)
		return 1
	}
	return 0
}

type broker struct {
	cmd           *exec.Cmd
	client, admin string
	log           *os.File
	exited        chan error
}

func freeAddr() (string, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer l.Close()
	return l.Addr().String(), nil
}

func start(o opts, data string, logName string) (*broker, error) {
	ca, err := freeAddr()
	if err != nil {
		return nil, err
	}
	aa, err := freeAddr()
	if err != nil {
		return nil, err
	}
	args := []string{"-data", data, "-listen", ca, "-admin", aa, "-controller", "", "-fsync", "never"}
	if o.fsyncAlways {
		args[len(args)-1] = "always"
	}
	if o.shards > 0 {
		args = append(args, "-shards", strconv.Itoa(o.shards))
	}
	if o.memLimit != "" {
		args = append(args, "-memory-limit", o.memLimit)
	}
	if o.extra != "" {
		args = append(args, strings.Fields(o.extra)...)
	}
	lf, err := os.Create(filepath.Join(filepath.Dir(data), logName))
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(o.berthd, args...)
	cmd.Stdout, cmd.Stderr = lf, lf
	if err := cmd.Start(); err != nil {
		lf.Close()
		return nil, err
	}
	b := &broker{cmd: cmd, client: ca, admin: aa, log: lf, exited: make(chan error, 1)}
	go func() { b.exited <- cmd.Wait() }()
	return b, nil
}

// ready polls /readyz until it answers 200.
func (b *broker) ready(ctx context.Context) error {
	hc := &http.Client{Timeout: time.Second}
	for {
		select {
		case err := <-b.exited:
			b.exited <- err
			return fmt.Errorf("berthd exited: %v (log %s)", err, b.log.Name())
		case <-ctx.Done():
			return ctx.Err()
		default:
		}
		resp, err := hc.Get("http://" + b.admin + "/readyz")
		if err == nil {
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		time.Sleep(2 * time.Millisecond)
	}
}

func (b *broker) stop(kill bool) error {
	sig := syscall.SIGTERM
	if kill {
		sig = syscall.SIGKILL
	}
	if err := b.cmd.Process.Signal(sig); err != nil {
		return err
	}
	select {
	case <-b.exited:
	case <-time.After(5 * time.Minute):
		_ = b.cmd.Process.Kill()
		<-b.exited
		return errors.New("berthd did not stop within 5 minutes of SIGTERM")
	}
	b.log.Close()
	return nil
}

func rssKiB(pid int) int64 {
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return -1
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "VmRSS:"); ok {
			n, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			return n
		}
	}
	return -1
}

// cpuTime is the process's user and system CPU time so far (from
// /proc/PID/stat, in clock ticks of 10 ms): unlike the time to ready, it
// hardly depends on what else the machine runs.
func cpuTime(pid int) time.Duration {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return -1
	}
	// The command name, in parentheses, may hold spaces: fields count
	// from after it. utime and stime are fields 14 and 15.
	i := strings.LastIndexByte(string(b), ')')
	if i < 0 {
		return -1
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 13 {
		return -1
	}
	ut, _ := strconv.ParseInt(f[11], 10, 64)
	st, _ := strconv.ParseInt(f[12], 10, 64)
	return time.Duration(ut+st) * 10 * time.Millisecond
}

func queueName(i int) string { return fmt.Sprintf("deep-%03d", i) }

func fill(ctx context.Context, o opts, b *broker) error {
	c, err := client.Dial(ctx, b.client)
	if err != nil {
		return err
	}
	for q := 0; q < o.queues; q++ {
		if err := c.DeclareQueue(ctx, queueName(q), client.QueueOptions{Durable: true}); err != nil {
			c.Close()
			return err
		}
	}
	c.Close()
	conns := 4
	var wg sync.WaitGroup
	errs := make(chan error, conns)
	var sent atomic.Int64
	started := time.Now()
	payload := make([]byte, o.size)
	for w := 0; w < conns; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			c, err := client.Dial(ctx, b.client)
			if err != nil {
				errs <- err
				return
			}
			defer c.Close()
			var failed atomic.Pointer[error]
			for i := w; i < o.count; i += conns {
				q := queueName(i % o.queues)
				if err := c.PublishAsync(ctx, "", q, payload, client.PublishOptions{Persistent: true}, func(err error) {
					if err != nil {
						failed.CompareAndSwap(nil, &err)
					}
				}); err != nil {
					errs <- err
					return
				}
				if n := sent.Add(1); n%1_000_000 == 0 {
					fmt.Printf("  filled %d in %v\n", n, time.Since(started).Round(time.Millisecond))
				}
			}
			if err := c.Flush(ctx); err != nil {
				errs <- err
				return
			}
			if p := failed.Load(); p != nil {
				errs <- *p
			}
		}(w)
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		return err
	}
	took := time.Since(started)
	fmt.Printf("filled %d messages of %d B over %d queues in %v (%.0f msgs/s)\n", o.count, o.size, o.queues, took.Round(time.Millisecond), float64(o.count)/took.Seconds())
	return nil
}

// firstMessage subscribes to the first queue and waits for one delivery,
// which it leaves unsettled (it goes back on close).
func firstMessage(ctx context.Context, b *broker) error {
	c, err := client.Dial(ctx, b.client)
	if err != nil {
		return err
	}
	defer c.Close()
	sub, err := c.Subscribe(ctx, queueName(0), client.SubscribeOptions{Credit: 1})
	if err != nil {
		return err
	}
	_, err = sub.Next(ctx)
	return err
}

func profile(ctx context.Context, b *broker, path string, done chan<- error) {
	hc := &http.Client{Timeout: time.Minute}
	for ctx.Err() == nil {
		resp, err := hc.Get("http://" + b.admin + "/debug/pprof/profile?seconds=10")
		if err != nil {
			time.Sleep(time.Millisecond)
			continue
		}
		f, err := os.Create(path)
		if err == nil {
			_, err = io.Copy(f, resp.Body)
			f.Close()
		}
		resp.Body.Close()
		done <- err
		return
	}
	done <- ctx.Err()
}

func dirBytes(dir string) int64 {
	var n int64
	_ = filepath.Walk(dir, func(_ string, fi os.FileInfo, err error) error {
		if err == nil && !fi.IsDir() {
			n += fi.Size()
		}
		return nil
	})
	return n
}

func bench(ctx context.Context, o opts) error {
	var data string
	if o.reuse != "" {
		data = o.reuse
	} else {
		top, err := os.MkdirTemp(o.dir, "restart-bench-")
		if err != nil {
			return err
		}
		data = filepath.Join(top, "data")
		if !o.keep {
			defer os.RemoveAll(top)
		}
		b, err := start(o, data, "fill.log")
		if err != nil {
			return err
		}
		if err := b.ready(ctx); err != nil {
			return err
		}
		if err := fill(ctx, o, b); err != nil {
			_ = b.stop(true)
			return err
		}
		stopStart := time.Now()
		if err := b.stop(o.kill); err != nil {
			return err
		}
		fmt.Printf("stopped with %s in %v\n", map[bool]string{true: "SIGKILL", false: "SIGTERM"}[o.kill], time.Since(stopStart).Round(time.Millisecond))
	}
	fmt.Printf("data %s: %.1f MiB\n", data, float64(dirBytes(data))/(1<<20))
	for r := 0; r < o.restarts; r++ {
		t0 := time.Now()
		b, err := start(o, data, fmt.Sprintf("restart-%d.log", r))
		if err != nil {
			return err
		}
		var profDone chan error
		if r == 0 && o.profile != "" {
			profDone = make(chan error, 1)
			go profile(ctx, b, o.profile, profDone)
		}
		if err := b.ready(ctx); err != nil {
			_ = b.stop(true)
			return err
		}
		ready := time.Since(t0)
		rss := rssKiB(b.cmd.Process.Pid)
		cpu := cpuTime(b.cmd.Process.Pid)
		if err := firstMessage(ctx, b); err != nil {
			_ = b.stop(true)
			return fmt.Errorf("first message: %w", err)
		}
		first := time.Since(t0)
		fmt.Printf("restart %d: ready %v, first message %v, RSS at ready %.1f MiB, after %.1f MiB, CPU at ready %v\n", r, ready.Round(time.Millisecond),
			first.Round(time.Millisecond), float64(rss)/1024, float64(rssKiB(b.cmd.Process.Pid))/1024, cpu)
		if profDone != nil {
			if err := <-profDone; err != nil {
				fmt.Println("profile:", err)
			} else {
				fmt.Println("profile saved to", o.profile)
			}
		}
		stopStart := time.Now()
		if err := b.stop(o.kill); err != nil {
			return err
		}
		fmt.Printf("stopped with %s in %v\n", map[bool]string{true: "SIGKILL", false: "SIGTERM"}[o.kill], time.Since(stopStart).Round(time.Millisecond))
	}
	if o.keep {
		fmt.Println("kept", data)
	}
	return nil
}
