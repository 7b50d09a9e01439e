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
	"github.com/berthmq/berth/perf/proc"
)

// Bounds on waiting for a server.
const (
	startTimeout       = 20 * time.Second
	rabbitStartTimeout = 90 * time.Second
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
				start func(dir string) (*proc.Proc, error)
			}{
				{compare.Berth, func(dir string) (*proc.Proc, error) { return startBerth(ctx, *berthd, dir, durable, hasFsync) }},
				{"nats", func(dir string) (*proc.Proc, error) { return startNATS(ctx, *natsServer, dir, durable) }},
			}
			// RabbitMQ quorum queues fsync their Raft log before confirming
			// and cannot be told not to, so RabbitMQ runs in durable only.
			if rabbitPath != "" && durable {
				brokers = append(brokers, struct {
					name  string
					start func(dir string) (*proc.Proc, error)
				}{"amqp", func(dir string) (*proc.Proc, error) { return startRabbit(ctx, rabbitPath, dir) }})
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

func runOne(ctx context.Context, w bench.Workload, broker, dir string, start func(string) (*proc.Proc, error)) (*bench.Result, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("bench-compare: %w", err)
	}
	srv, err := start(dir)
	if err != nil {
		return nil, err
	}
	defer srv.Stop()
	d, err := driver.New(broker, driver.Options{Addrs: []string{srv.Addr}, Persistent: w.Persistent, Window: w.InFlight()})
	if err != nil {
		return nil, err
	}
	defer d.Close()
	return bench.Run(ctx, w, bench.Options{DriverName: broker, Driver: d, Addrs: []string{srv.Addr}, Progress: os.Stderr})
}

func berthHasFsyncFlag(berthd string) bool {
	out, _ := exec.Command(berthd, "-h").CombinedOutput()
	return bytes.Contains(out, []byte("-fsync"))
}

func startBerth(ctx context.Context, bin, dir string, durable, hasFsync bool) (*proc.Proc, error) {
	ports, err := proc.FreePorts(2)
	if err != nil {
		return nil, err
	}
	args := compare.BerthArgs(ports[0], ports[1], filepath.Join(dir, "data"), durable, hasFsync)
	return proc.Start(ctx, "berthd", dir, fmt.Sprintf("127.0.0.1:%d", ports[0]), startTimeout, nil, bin, args...)
}

func startNATS(ctx context.Context, bin, dir string, durable bool) (*proc.Proc, error) {
	port, err := proc.FreePort()
	if err != nil {
		return nil, err
	}
	conf := filepath.Join(dir, "nats.conf")
	if err := os.WriteFile(conf, []byte(compare.NATSConfig(port, filepath.Join(dir, "jetstream"), durable)), 0o644); err != nil {
		return nil, fmt.Errorf("bench-compare: %w", err)
	}
	return proc.Start(ctx, "nats-server", dir, fmt.Sprintf("127.0.0.1:%d", port), startTimeout, nil, bin, "-c", conf)
}

// startRabbit runs a private RabbitMQ node: its own data and log dirs,
// loopback listeners, and its own epmd on a free port, killed afterwards.
func startRabbit(ctx context.Context, bin, dir string) (*proc.Proc, error) {
	ports, err := proc.FreePorts(3)
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
				proc.StopPid(pid)
			}
		}
		killEpmd()
	}
	s, err := proc.Start(ctx, "rabbitmq-server", dir, fmt.Sprintf("127.0.0.1:%d", ports[0]), rabbitStartTimeout, env, bin)
	if err != nil {
		cleanup()
		return nil, err
	}
	s.OnStop = cleanup
	return s, nil
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
