// Command bench-compare runs one berth-bench workload against Berth and
// NATS JetStream (and RabbitMQ quorum queues when rabbitmq-server is
// installed), each started fresh on 127.0.0.1, in two durability settings,
// and prints every figure side by side with the ratio berth/peer. Its last
// line is "ratio berth/nats durable=<x> nofsync=<y>", the ratio of
// delivered messages per second.
//
// Every server it starts runs in its own process group with a parent-death
// signal, and is stopped when the run ends, fails or is interrupted.
package main

import (
	"bytes"
	"context"
	"flag"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/berthmq/berth/perf/bench"
	"github.com/berthmq/berth/perf/compare"
	"github.com/berthmq/berth/perf/driver"
)

// Bounds on waiting for a server.
const (
	startTimeout       = 20 * time.Second
	rabbitStartTimeout = 90 * time.Second
	stopTimeout        = 10 * time.Second
)

func main() { os.Exit(run(os.Args[1:])) }

func run(args []string) int {
	fs := flag.NewFlagSet("bench-compare", flag.ContinueOnError)
	w := bench.DefaultWorkload()
	w.Persistent = true
	w.Duration = 8 * time.Second
	w.RegisterFlags(fs)
	berthd := fs.String("berthd", "bin/berthd", "berthd binary")
	natsServer := fs.String("nats-server", "nats-server", "nats-server binary")
	rabbit := fs.String("rabbitmq-server", "auto", `rabbitmq-server binary; "auto" uses it when on PATH, "" skips RabbitMQ`)
	out := fs.String("out", "", "directory for each run's JSON result and SVG plot (default: a temporary directory, removed)")
	settingsFlag := fs.String("settings", "durable,nofsync", "durability settings to run")
	latencyRate := fs.Float64("latency-rate", 500, "also run the workload open loop at this many msg/s, below every broker's capacity, for latencies at equal load; 0 skips it")
	latencyDuration := fs.Duration("latency-duration", 5*time.Second, "measured duration of the open-loop latency run")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	w.CountAlone(fs) // --count given alone is the whole run: no default duration, no warm-up
	if err := w.Validate(); err != nil {
		fmt.Fprintln(os.Stderr, "bench-compare:", err)
		return 2
	}
	settings := strings.Split(*settingsFlag, ",")
	for _, s := range settings {
		if s != compare.SettingDurable && s != compare.SettingNoFsync {
			fmt.Fprintf(os.Stderr, "bench-compare: unknown setting %q\n", s)
			return 2
		}
	}
	work, err := os.MkdirTemp("", "bench-compare-")
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench-compare:", err)
		return 1
	}
	defer os.RemoveAll(work)
	// Servers that drop privileges (rabbitmq-server as root) must reach
	// their directories inside.
	if err := os.Chmod(work, 0o755); err != nil {
		fmt.Fprintln(os.Stderr, "bench-compare:", err)
		return 1
	}
	for _, bin := range []*string{berthd, natsServer} {
		if strings.Contains(*bin, "/") {
			if abs, err := filepath.Abs(*bin); err == nil {
				*bin = abs
			}
		}
	}
	outDir := *out
	if outDir == "" {
		outDir = filepath.Join(work, "results")
	}
	if err := os.MkdirAll(outDir, 0o755); err != nil {
		fmt.Fprintln(os.Stderr, "bench-compare:", err)
		return 1
	}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM, syscall.SIGHUP)
	defer stop()

	hasFsync := berthHasFsyncFlag(*berthd)
	rabbitPath := ""
	switch *rabbit {
	case "auto":
		rabbitPath, _ = exec.LookPath("rabbitmq-server")
	case "":
	default:
		rabbitPath = *rabbit
	}
	fmt.Printf("bench-compare: workload %s, warm-up %v, duration %v\n", w.String(), w.Warmup, w.Duration)
	if !hasFsync {
		fmt.Println("bench-compare: note: this berthd has no -fsync flag; it runs with its default in both settings")
	}
	if rabbitPath == "" {
		fmt.Println("bench-compare: rabbitmq-server not installed; RabbitMQ skipped")
	}

	kinds := []struct {
		kind string
		w    bench.Workload
	}{{compare.KindThroughput, w}}
	if *latencyRate > 0 {
		lw := w
		lw.Rate, lw.Duration, lw.Count = *latencyRate, *latencyDuration, 0
		if err := lw.Validate(); err != nil {
			fmt.Fprintln(os.Stderr, "bench-compare: latency run:", err)
			return 2
		}
		kinds = append(kinds, struct {
			kind string
			w    bench.Workload
		}{compare.KindLatency, lw})
		fmt.Printf("bench-compare: latency run: open loop at %.0f msg/s, duration %v\n", lw.Rate, lw.Duration)
	}

	var entries []compare.Entry
	for _, k := range kinds {
		w := k.w
		for _, setting := range settings {
			durable := setting == compare.SettingDurable
			brokers := []struct {
				name  string
				start func(dir string) (*server, error)
			}{
				{compare.Berth, func(dir string) (*server, error) { return startBerth(ctx, *berthd, dir, durable, hasFsync) }},
				{"nats", func(dir string) (*server, error) { return startNATS(ctx, *natsServer, dir, durable) }},
			}
			// RabbitMQ quorum queues fsync their Raft log before confirming
			// and cannot be told not to, so RabbitMQ runs in durable only.
			if rabbitPath != "" && durable {
				brokers = append(brokers, struct {
					name  string
					start func(dir string) (*server, error)
				}{"amqp", func(dir string) (*server, error) { return startRabbit(ctx, rabbitPath, dir) }})
			}
			for _, b := range brokers {
				if ctx.Err() != nil {
					break
				}
				fmt.Printf("bench-compare: %s %s: %s\n", k.kind, setting, b.name)
				name := k.kind + "-" + setting + "-" + b.name
				dir := filepath.Join(work, name)
				res, err := runOne(ctx, w, b.name, dir, b.start)
				e := compare.Entry{Kind: k.kind, Setting: setting, Broker: b.name, Result: res}
				if err != nil {
					e.Err = err.Error()
					fmt.Fprintf(os.Stderr, "bench-compare: %s %s: %v\n", setting, b.name, err)
				}
				if res != nil {
					base := filepath.Join(outDir, name)
					if werr := res.WriteJSONFile(base + ".json"); werr != nil {
						fmt.Fprintln(os.Stderr, "bench-compare:", werr)
					}
					if werr := bench.WritePlotFile(base+".svg", res); werr != nil {
						fmt.Fprintln(os.Stderr, "bench-compare:", werr)
					}
				}
				entries = append(entries, e)
			}
		}
	}
	if ctx.Err() != nil {
		fmt.Fprintln(os.Stderr, "bench-compare: interrupted")
		return 1
	}
	fmt.Println()
	compare.WriteTable(os.Stdout, entries)
	if *out != "" {
		fmt.Printf("results in %s\n", *out)
	}
	if rabbitPath != "" {
		fmt.Println(compare.SummaryLine(entries, "amqp", []string{compare.SettingDurable}))
	}
	fmt.Println(compare.SummaryLine(entries, "nats", settings))
	for _, e := range entries {
		if e.Err != "" {
			return 1
		}
	}
	return 0
}

func runOne(ctx context.Context, w bench.Workload, broker, dir string, start func(string) (*server, error)) (*bench.Result, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("bench-compare: %w", err)
	}
	srv, err := start(dir)
	if err != nil {
		return nil, err
	}
	defer srv.stop()
	d, err := driver.New(broker, driver.Options{Addrs: []string{srv.addr}, Persistent: w.Persistent, Window: w.InFlight()})
	if err != nil {
		return nil, err
	}
	defer d.Close()
	return bench.Run(ctx, w, bench.Options{DriverName: broker, Driver: d, Addrs: []string{srv.addr}, Progress: os.Stderr})
}

func berthHasFsyncFlag(berthd string) bool {
	out, _ := exec.Command(berthd, "-h").CombinedOutput()
	return bytes.Contains(out, []byte("-fsync"))
}

// server is a broker process this command started.
type server struct {
	name   string
	cmd    *exec.Cmd
	addr   string
	log    string
	exited chan struct{}
	onStop func()
}

func freePort() (int, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("bench-compare: free port: %w", err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port, nil
}

func freePorts(n int) ([]int, error) {
	ports := make([]int, 0, n)
	for len(ports) < n {
		p, err := freePort()
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

func start(ctx context.Context, name, dir, addr string, timeout time.Duration, env []string, bin string, args ...string) (*server, error) {
	logPath := filepath.Join(dir, name+".log")
	logf, err := os.Create(logPath)
	if err != nil {
		return nil, fmt.Errorf("bench-compare: %w", err)
	}
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.Dir = dir // crash dumps and the like stay in the run's directory
	cmd.Env = append(os.Environ(), env...)
	// Own process group so stop reaches helpers the server forks; killed
	// with us if we die without cleaning up.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		logf.Close()
		return nil, fmt.Errorf("bench-compare: start %s: %w", name, err)
	}
	s := &server{name: name, cmd: cmd, addr: addr, log: logPath, exited: make(chan struct{})}
	go func() { cmd.Wait(); logf.Close(); close(s.exited) }()
	deadline := time.Now().Add(timeout)
	for {
		c, err := net.DialTimeout("tcp", addr, 200*time.Millisecond)
		if err == nil {
			c.Close()
			return s, nil
		}
		select {
		case <-s.exited:
			return nil, fmt.Errorf("bench-compare: %s exited before listening on %s: %s", name, addr, tail(logPath))
		case <-ctx.Done():
			s.stop()
			return nil, ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			s.stop()
			return nil, fmt.Errorf("bench-compare: %s not listening on %s after %v: %s", name, addr, timeout, tail(logPath))
		}
	}
}

// stop sends SIGTERM to the server's process group, then SIGKILL if it
// has not exited in time.
func (s *server) stop() {
	if s.onStop != nil {
		s.onStop()
	}
	pgid := -s.cmd.Process.Pid
	_ = syscall.Kill(pgid, syscall.SIGTERM)
	select {
	case <-s.exited:
	case <-time.After(stopTimeout):
		_ = syscall.Kill(pgid, syscall.SIGKILL)
		<-s.exited
	}
	// Helpers left in the group (none expected) go too.
	_ = syscall.Kill(pgid, syscall.SIGKILL)
}

func tail(path string) string {
	b, _ := os.ReadFile(path)
	if len(b) > 800 {
		b = b[len(b)-800:]
	}
	return strings.TrimSpace(string(b))
}

func startBerth(ctx context.Context, bin, dir string, durable, hasFsync bool) (*server, error) {
	ports, err := freePorts(2)
	if err != nil {
		return nil, err
	}
	args := compare.BerthArgs(ports[0], ports[1], filepath.Join(dir, "data"), durable, hasFsync)
	return start(ctx, "berthd", dir, fmt.Sprintf("127.0.0.1:%d", ports[0]), startTimeout, nil, bin, args...)
}

func startNATS(ctx context.Context, bin, dir string, durable bool) (*server, error) {
	port, err := freePort()
	if err != nil {
		return nil, err
	}
	conf := filepath.Join(dir, "nats.conf")
	if err := os.WriteFile(conf, []byte(compare.NATSConfig(port, filepath.Join(dir, "jetstream"), durable)), 0o644); err != nil {
		return nil, fmt.Errorf("bench-compare: %w", err)
	}
	return start(ctx, "nats-server", dir, fmt.Sprintf("127.0.0.1:%d", port), startTimeout, nil, bin, "-c", conf)
}

// startRabbit runs a private RabbitMQ node: its own data and log dirs,
// loopback listeners, and its own epmd on a free port, killed afterwards.
func startRabbit(ctx context.Context, bin, dir string) (*server, error) {
	ports, err := freePorts(3)
	if err != nil {
		return nil, err
	}
	conf := filepath.Join(dir, "rabbitmq.conf")
	confText := fmt.Sprintf("listeners.tcp.1 = 127.0.0.1:%d\nloopback_users = none\n", ports[0])
	if err := os.WriteFile(conf, []byte(confText), 0o644); err != nil {
		return nil, fmt.Errorf("bench-compare: %w", err)
	}
	plugins := filepath.Join(dir, "enabled_plugins")
	if err := os.WriteFile(plugins, []byte("[].\n"), 0o644); err != nil {
		return nil, fmt.Errorf("bench-compare: %w", err)
	}
	if err := chownForRabbit(dir); err != nil {
		return nil, err
	}
	epmdPort := fmt.Sprint(ports[2])
	env := []string{
		"HOME=" + dir,
		"RABBITMQ_NODENAME=berthbench@localhost",
		"RABBITMQ_NODE_IP_ADDRESS=127.0.0.1",
		fmt.Sprintf("RABBITMQ_NODE_PORT=%d", ports[0]),
		fmt.Sprintf("RABBITMQ_DIST_PORT=%d", ports[1]),
		"RABBITMQ_CONFIG_FILE=" + conf,
		"RABBITMQ_ENABLED_PLUGINS_FILE=" + plugins,
		"RABBITMQ_MNESIA_BASE=" + filepath.Join(dir, "mnesia"),
		"RABBITMQ_LOG_BASE=" + filepath.Join(dir, "log"),
		"RABBITMQ_PID_FILE=" + filepath.Join(dir, "rabbit.pid"),
		"ERL_EPMD_ADDRESS=127.0.0.1",
		"ERL_EPMD_PORT=" + epmdPort,
	}
	killEpmd := func() {
		// epmd daemonizes out of the process group; stop ours by its port.
		cmd := exec.Command("epmd", "-kill")
		cmd.Env = append(os.Environ(), "ERL_EPMD_PORT="+epmdPort)
		_ = cmd.Run()
	}
	pidFile := filepath.Join(dir, "rabbit.pid")
	cleanup := func() {
		// The Debian script runs the Erlang VM under su, outside our
		// process group; its pid file names it.
		if b, err := os.ReadFile(pidFile); err == nil {
			if pid, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil && pid > 1 {
				stopPid(pid)
			}
		}
		killEpmd()
	}
	s, err := start(ctx, "rabbitmq-server", dir, fmt.Sprintf("127.0.0.1:%d", ports[0]), rabbitStartTimeout, env, bin)
	if err != nil {
		cleanup()
		return nil, err
	}
	s.onStop = cleanup
	return s, nil
}

// stopPid sends SIGTERM to pid and SIGKILL if it is still there after
// stopTimeout.
func stopPid(pid int) {
	_ = syscall.Kill(pid, syscall.SIGTERM)
	deadline := time.Now().Add(stopTimeout)
	for time.Now().Before(deadline) {
		if syscall.Kill(pid, 0) != nil {
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
	_ = syscall.Kill(pid, syscall.SIGKILL)
}

// chownForRabbit hands dir to the rabbitmq user when we run as root: the
// Debian rabbitmq-server script switches to that user before it starts.
func chownForRabbit(dir string) error {
	if os.Geteuid() != 0 {
		return nil
	}
	u, err := user.Lookup("rabbitmq")
	if err != nil {
		return nil // no such user: the script runs as us
	}
	uid, err1 := strconv.Atoi(u.Uid)
	gid, err2 := strconv.Atoi(u.Gid)
	if err1 != nil || err2 != nil {
		return fmt.Errorf("bench-compare: rabbitmq user has ids %q/%q", u.Uid, u.Gid)
	}
	return filepath.Walk(dir, func(path string, _ os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		return os.Lchown(path, uid, gid)
	})
}
