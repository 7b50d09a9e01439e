// Command bench-compare-cluster runs one berth-bench workload against a
// replicated Berth cluster and a NATS JetStream cluster, both of three
// processes on 127.0.0.1, and prints the figures side by side, per message
// size. Its last line is
//
//	ratio berth/nats r3 durable=<x> nofsync=<y>
//
// the ratio of delivered messages per second at the first size of --sizes
// (lines for every size come before it, with "size=<n>" after "r3").
//
// Berth: three berthd, each with a member of a 3-member controller and the
// replication groups, initialised with --groups groups; every durable
// queue is replicated on the three brokers and fsynced (berthd's default,
// -fsync always) on each before it completes. Only a group's master takes
// its queues' publishes and delivers them, so producers keep a session to
// every broker and send each queue's messages to its master, and each
// consumer reads its queue at its master (the masters come from the
// brokers' admin endpoints). The queue names are picked so that the
// queues fall in distinct groups and every broker masters its share.
//
// NATS: three nats-servers in one cluster, a work-queue stream per queue
// with --replicas 3 (and its consumer likewise), clients spread over the
// three servers (NATS forwards to the stream leader itself). "durable" runs
// them with sync_interval always (fsync before each PubAck), "nofsync" at
// an interval no run reaches, which is what NATS does by default. Berth
// always fsyncs: its one run per size stands against both.
//
// With --single (the default) the workload also runs on one berthd (no
// groups, fsync always), and "ratio berth r3/single size=<n>
// delivered=<x>" compares the replicated run with it.
//
// --peers none leaves NATS out (for the shard scaling runs: --shards).
// Every server it starts runs in its own process group and is stopped when
// the run ends, fails or is interrupted.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/berthmq/berth/perf/bench"
	"github.com/berthmq/berth/perf/cluster"
	"github.com/berthmq/berth/perf/compare"
	"github.com/berthmq/berth/perf/driver"
	"github.com/berthmq/berth/perf/proc"
)

const (
	startTimeout = 30 * time.Second
	// spreadTries bounds the search for queue names that spread well.
	spreadTries = 20000
	replicas    = 3
	members     = 3
)

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

// config is the parsed command line.
type config struct {
	w          bench.Workload
	sizes      []int
	settings   []string
	peers      string
	berthd     string
	berthctl   string
	natsServer string
	out        string
	groups     int
	shards     int
	keepLogs   string
	single     bool
	colocated  bool
}

func parse(args []string, stderr io.Writer) (*config, error) {
	fs := flag.NewFlagSet("bench-compare-cluster", flag.ContinueOnError)
	fs.SetOutput(stderr)
	c := &config{w: bench.DefaultWorkload()}
	c.w.Persistent = true
	c.w.Duration = 8 * time.Second
	c.w.Producers, c.w.Consumers, c.w.Queues = 3, 6, 6
	c.w.RegisterFlags(fs)
	sizes := fs.String("sizes", "128,1KiB", "message sizes, comma-separated; one run per size and broker (--size is ignored); the last line is the first size's")
	settings := fs.String("settings", "durable,nofsync", "NATS durability settings to run (Berth always fsyncs)")
	fs.StringVar(&c.peers, "peers", "nats", `"nats", or "none" to run Berth alone`)
	fs.StringVar(&c.berthd, "berthd", "bin/berthd", "berthd binary")
	fs.StringVar(&c.berthctl, "berthctl", "bin/berthctl", "berthctl binary (cluster init)")
	fs.StringVar(&c.natsServer, "nats-server", "nats-server", "nats-server binary")
	fs.StringVar(&c.out, "out", "", "directory for each run's JSON result and SVG plot (default: none kept)")
	fs.IntVar(&c.groups, "groups", 12, "Berth replication groups (berthctl cluster init --groups)")
	fs.IntVar(&c.shards, "shards", 0, "berthd -shards on every broker; 0 leaves berthd's default (one per core)")
	fs.StringVar(&c.keepLogs, "logs", "", "copy the servers' logs into this directory when the run ends")
	fs.BoolVar(&c.colocated, "colocated", false, "the three clustered servers share this machine: each clustered berthd runs -shards 1 -loops 1, and every clustered server (berthd and nats-server) GOMAXPROCS=1; the single berthd keeps its defaults")
	fs.BoolVar(&c.single, "single", true, "also run the workload on one berthd (fsync always, no groups), for the replicated/single ratio")
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	c.w.CountAlone(fs)
	for _, s := range strings.Split(*sizes, ",") {
		n, err := bench.ParseSize(s)
		if err != nil {
			return nil, err
		}
		c.sizes = append(c.sizes, n)
	}
	for _, s := range strings.Split(*settings, ",") {
		if s != compare.SettingDurable && s != compare.SettingNoFsync {
			return nil, fmt.Errorf("unknown setting %q", s)
		}
		c.settings = append(c.settings, s)
	}
	if c.peers != "nats" && c.peers != "none" {
		return nil, fmt.Errorf(`--peers %q: want "nats" or "none"`, c.peers)
	}
	if c.groups < 1 || c.groups > 1<<16 {
		return nil, fmt.Errorf("--groups %d not in 1..65536", c.groups)
	}
	if c.shards < 0 || c.shards > 256 {
		return nil, fmt.Errorf("--shards %d not in 0..256", c.shards)
	}
	if !c.w.Persistent {
		return nil, errors.New("--persistent=false: the cluster comparison is of replicated durable queues")
	}
	for _, n := range c.sizes {
		w := c.w
		w.Size = n
		if err := w.Validate(); err != nil {
			return nil, err
		}
	}
	if c.w.Consumers > 0 && c.w.Consumers < c.w.Queues {
		return nil, fmt.Errorf("%d consumers cannot drain %d queues", c.w.Consumers, c.w.Queues)
	}
	return c, nil
}

// sizeRun is one size's entries, and the single-node run's result.
type sizeRun struct {
	size      int
	entries   []compare.Entry
	single    *bench.Result
	singleErr string
}

// singleLine compares the replicated run with the single node's:
// "ratio berth r3/single size=<n> delivered=<x>".
func singleLine(r sizeRun) string {
	ratio := "n/a"
	if len(r.entries) > 0 && r.entries[0].Result != nil && r.entries[0].Err == "" && r.single != nil && r.singleErr == "" {
		if s := compare.Headline(r.single); s > 0 {
			ratio = fmt.Sprintf("%.2f", compare.Headline(r.entries[0].Result)/s)
		}
	}
	return fmt.Sprintf("ratio berth r%d/single size=%d delivered=%s", replicas, r.size, ratio)
}

// summary is the closing lines: one per size, then the first size's
// again as "ratio berth/nats r3 durable=<x> nofsync=<y>".
func summary(runs []sizeRun, settings []string) []string {
	var out []string
	for _, r := range runs {
		out = append(out, compare.SummaryLineTag(r.entries, "nats", fmt.Sprintf("r%d size=%d", replicas, r.size), settings))
	}
	if len(runs) > 0 {
		out = append(out, compare.SummaryLineTag(runs[0].entries, "nats", fmt.Sprintf("r%d", replicas), settings))
	}
	return out
}

func run(args []string, stdout, stderr io.Writer) int {
	c, err := parse(args, stderr)
	if err != nil {
		if !errors.Is(err, flag.ErrHelp) {
			fmt.Fprintln(stderr, "bench-compare-cluster:", err)
		}
		return 2
	}
	for _, bin := range []*string{&c.berthd, &c.berthctl, &c.natsServer} {
		if strings.Contains(*bin, "/") {
			if abs, err := filepath.Abs(*bin); err == nil {
				*bin = abs
			}
		}
	}
	work, err := os.MkdirTemp("", "bench-compare-cluster-")
	if err != nil {
		fmt.Fprintln(stderr, "bench-compare-cluster:", err)
		return 1
	}
	defer os.RemoveAll(work)
	if c.out != "" {
		if err := os.MkdirAll(c.out, 0o755); err != nil {
			fmt.Fprintln(stderr, "bench-compare-cluster:", err)
			return 1
		}
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM, syscall.SIGHUP)
	defer stop()

	peers := "no peer"
	if c.peers == "nats" {
		peers = fmt.Sprintf("NATS: 3 servers, R%d, settings %v", replicas, c.settings)
	}
	fmt.Fprintf(stdout, "bench-compare-cluster: workload %s, warm-up %v, duration %v; Berth: 3 brokers, %d groups, shards %s, fsync always; %s\n",
		strings.Replace(c.w.String(), fmt.Sprintf("size=%d", c.w.Size), "size="+sizesText(c.sizes), 1), c.w.Warmup, c.w.Duration, c.groups, shardsText(c.shards), peers)
	if c.colocated {
		fmt.Fprintf(stdout, "bench-compare-cluster: colocated: each clustered server runs with %s, each clustered berthd with -shards 1 -loops 1; the single berthd has its defaults\n", strings.Join(colocatedEnv, " "))
	}
	var runs []sizeRun
	failed := false
	for _, size := range c.sizes {
		w := c.w
		w.Size = size
		sr := sizeRun{size: size}
		name := fmt.Sprintf("size%d", size)
		fmt.Fprintf(stdout, "bench-compare-cluster: %d B: berth, 3 brokers\n", size)
		res, err := runBerth(ctx, c, &w, filepath.Join(work, name+"-berth"), stdout)
		save(c, name+"-berth", res, stderr)
		for _, s := range c.settings {
			e := compare.Entry{Setting: s, Broker: compare.Berth, Result: res}
			if err != nil {
				e.Err = err.Error()
			}
			sr.entries = append(sr.entries, e)
		}
		if err != nil {
			failed = true
			fmt.Fprintf(stderr, "bench-compare-cluster: %d B berth: %v\n", size, err)
		}
		if c.single && ctx.Err() == nil {
			fmt.Fprintf(stdout, "bench-compare-cluster: %d B: berth, one broker\n", size)
			res, err := runSingle(ctx, c, w, filepath.Join(work, name+"-single"))
			save(c, name+"-single", res, stderr)
			sr.single = res
			if err != nil {
				sr.singleErr = err.Error()
				failed = true
				fmt.Fprintf(stderr, "bench-compare-cluster: %d B berth single: %v\n", size, err)
			}
		}
		if c.peers == "nats" {
			for _, s := range c.settings {
				if ctx.Err() != nil {
					break
				}
				fmt.Fprintf(stdout, "bench-compare-cluster: %d B: nats %s, 3 servers R%d\n", size, s, replicas)
				res, err := runNATS(ctx, c, w, filepath.Join(work, name+"-nats-"+s), s == compare.SettingDurable)
				save(c, name+"-nats-"+s, res, stderr)
				e := compare.Entry{Setting: s, Broker: "nats", Result: res}
				if err != nil {
					e.Err = err.Error()
					failed = true
					fmt.Fprintf(stderr, "bench-compare-cluster: %d B nats %s: %v\n", size, s, err)
				}
				sr.entries = append(sr.entries, e)
			}
		}
		runs = append(runs, sr)
		if c.keepLogs != "" {
			copyLogs(filepath.Join(work), c.keepLogs)
		}
		if ctx.Err() != nil {
			break
		}
	}
	if ctx.Err() != nil {
		fmt.Fprintln(stderr, "bench-compare-cluster: interrupted")
		return 1
	}
	fmt.Fprintln(stdout)
	for _, r := range runs {
		fmt.Fprintf(stdout, "%d B messages\n", r.size)
		if c.peers == "none" {
			writeAlone(stdout, r)
			continue
		}
		compare.WriteTable(stdout, r.entries)
	}
	for _, r := range runs {
		if len(r.entries) > 0 && r.entries[0].Result != nil {
			res := r.entries[0].Result
			fmt.Fprintf(stdout, "berth r%d shards=%s size=%d delivered=%.0f/s publish-p50=%s publish-p99=%s\n", replicas, shardsText(c.shards), r.size,
				res.ConsumeRate, bench.FormatLatency(res.Publish.P50), bench.FormatLatency(res.Publish.P99))
		}
	}
	if c.single {
		for _, r := range runs {
			if r.single != nil {
				fmt.Fprintf(stdout, "berth single node, %d B: delivered %.0f/s, publish p50 %s p99 %s\n", r.size, r.single.ConsumeRate,
					bench.FormatLatency(r.single.Publish.P50), bench.FormatLatency(r.single.Publish.P99))
			}
			fmt.Fprintln(stdout, singleLine(r))
		}
	}
	if c.out != "" {
		fmt.Fprintf(stdout, "results in %s\n", c.out)
	}
	if c.peers == "nats" {
		for _, l := range summary(runs, c.settings) {
			fmt.Fprintln(stdout, l)
		}
	}
	if failed {
		return 1
	}
	return 0
}

func shardsText(n int) string {
	if n == 0 {
		return "default"
	}
	return strconv.Itoa(n)
}

// writeAlone prints Berth's figures when no peer ran.
func writeAlone(w io.Writer, r sizeRun) {
	if len(r.entries) == 0 || r.entries[0].Result == nil {
		fmt.Fprintln(w, "  berth: no result")
		return
	}
	for _, f := range compare.Figures {
		fmt.Fprintf(w, "  %-14s %s\n", f.Name, f.Format(f.Value(r.entries[0].Result)))
	}
	fmt.Fprintln(w)
}

func save(c *config, name string, res *bench.Result, stderr io.Writer) {
	if c.out == "" || res == nil {
		return
	}
	base := filepath.Join(c.out, name)
	if err := res.WriteJSONFile(base + ".json"); err != nil {
		fmt.Fprintln(stderr, "bench-compare-cluster:", err)
	}
	if err := bench.WritePlotFile(base+".svg", res); err != nil {
		fmt.Fprintln(stderr, "bench-compare-cluster:", err)
	}
}

// copyLogs copies every *.log under dir into to, named by their path.
func copyLogs(dir, to string) {
	_ = os.MkdirAll(to, 0o755)
	_ = filepath.Walk(dir, func(path string, info os.FileInfo, err error) error {
		if err != nil || info.IsDir() || !strings.HasSuffix(path, ".log") {
			return nil
		}
		rel, _ := filepath.Rel(dir, path)
		b, err := os.ReadFile(path)
		if err == nil {
			_ = os.WriteFile(filepath.Join(to, strings.ReplaceAll(rel, "/", "_")), b, 0o644)
		}
		return nil
	})
}

// colocatedEnv is the environment of each clustered server with
// --colocated: one Go scheduler thread each, since the three share the
// machine's cores.
var colocatedEnv = []string{"GOMAXPROCS=1"}

// runBerth starts a fresh 3-broker cluster, picks queue names that spread
// over its masters (and their shards), runs w and stops the cluster.
func runBerth(ctx context.Context, c *config, w *bench.Workload, dir string, stdout io.Writer) (*bench.Result, error) {
	cfg := cluster.Config{Berthd: c.berthd, Berthctl: c.berthctl, Dir: dir, Groups: c.groups, Shards: c.shards, StartTimeout: startTimeout}
	if c.colocated {
		cfg.Shards, cfg.Args, cfg.Env = 1, []string{"-loops", "1"}, colocatedEnv
	}
	cl, err := cluster.Start(ctx, cfg)
	if err != nil {
		return nil, err
	}
	defer cl.Stop()
	view, err := cl.Router.View(ctx)
	if err != nil {
		return nil, err
	}
	shards, err := cl.Shards(ctx, cl.Brokers[0])
	if err != nil {
		return nil, err
	}
	prefix, placement, err := cluster.Spread(view, w.QueuePrefix, w.Queues, shards, spreadTries)
	if err != nil {
		return nil, err
	}
	w.QueuePrefix = prefix
	fmt.Fprintf(stdout, "bench-compare-cluster: %d shards per broker; queues: %s\n", shards, placementText(placement))
	var addrs []string
	for _, b := range cl.Brokers {
		addrs = append(addrs, b.Client)
	}
	d, err := driver.New(compare.Berth, driver.Options{Addrs: addrs, Persistent: w.Persistent, Window: w.InFlight(),
		Admin: cl.Brokers[0].Admin, Route: cl.Router.Route})
	if err != nil {
		return nil, err
	}
	defer d.Close()
	return bench.Run(ctx, *w, bench.Options{DriverName: compare.Berth, Driver: d, Addrs: addrs, Progress: os.Stderr,
		Label: fmt.Sprintf("berth 3 brokers, %d groups, %d shards", c.groups, shards)})
}

// runSingle runs w on one berthd with its default durability (fsync
// always) and no replication groups.
func runSingle(ctx context.Context, c *config, w bench.Workload, dir string) (*bench.Result, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	ports, err := proc.FreePorts(3)
	if err != nil {
		return nil, err
	}
	args := compare.BerthArgs(ports[0], ports[1], filepath.Join(dir, "data"), true, true)
	args = append(args, "-controller", fmt.Sprintf("127.0.0.1:%d", ports[2]))
	if c.shards > 0 {
		args = append(args, "-shards", strconv.Itoa(c.shards))
	}
	addr := fmt.Sprintf("127.0.0.1:%d", ports[0])
	srv, err := proc.Start(ctx, "berthd", dir, addr, startTimeout, nil, c.berthd, args...)
	if err != nil {
		return nil, err
	}
	defer srv.Stop()
	d, err := driver.New(compare.Berth, driver.Options{Addrs: []string{addr}, Persistent: w.Persistent, Window: w.InFlight()})
	if err != nil {
		return nil, err
	}
	defer d.Close()
	return bench.Run(ctx, w, bench.Options{DriverName: compare.Berth, Driver: d, Addrs: []string{addr}, Progress: os.Stderr, Label: "berth single node"})
}

func placementText(pl []cluster.Placement) string {
	var parts []string
	for _, p := range pl {
		parts = append(parts, fmt.Sprintf("%s (group %d, master %d, shard %d)", p.Queue, p.Group, p.Master, p.Shard))
	}
	return strings.Join(parts, ", ")
}

// runNATS starts three clustered nats-servers, waits for JetStream, runs
// w with R3 streams and stops them.
func runNATS(ctx context.Context, c *config, w bench.Workload, dir string, durable bool) (*bench.Result, error) {
	ports, err := proc.FreePorts(2 * members)
	if err != nil {
		return nil, err
	}
	var routes []int
	for i := range members {
		routes = append(routes, ports[members+i])
	}
	var servers []*proc.Proc
	defer func() {
		for _, s := range servers {
			s.Stop()
		}
	}()
	var addrs []string
	for i := range members {
		sdir := filepath.Join(dir, fmt.Sprintf("nats-%d", i+1))
		if err := os.MkdirAll(sdir, 0o755); err != nil {
			return nil, err
		}
		conf := filepath.Join(sdir, "nats.conf")
		text := compare.NATSClusterConfig(fmt.Sprintf("n%d", i+1), ports[i], routes[i], routes, filepath.Join(sdir, "jetstream"), durable)
		if err := os.WriteFile(conf, []byte(text), 0o644); err != nil {
			return nil, err
		}
		addr := fmt.Sprintf("127.0.0.1:%d", ports[i])
		var env []string
		if c.colocated {
			env = colocatedEnv
		}
		s, err := proc.Start(ctx, "nats-server", sdir, addr, startTimeout, env, c.natsServer, "-c", conf)
		if err != nil {
			return nil, err
		}
		servers = append(servers, s)
		addrs = append(addrs, addr)
	}
	if err := waitJetStream(ctx, addrs, startTimeout); err != nil {
		return nil, err
	}
	d, err := driver.New("nats", driver.Options{Addrs: addrs, Persistent: w.Persistent, Window: w.InFlight(), Replicas: replicas})
	if err != nil {
		return nil, err
	}
	defer d.Close()
	return bench.Run(ctx, w, bench.Options{DriverName: "nats", Driver: d, Addrs: addrs, Progress: os.Stderr,
		Label: fmt.Sprintf("nats 3 servers R%d", replicas)})
}

// waitJetStream waits until JetStream answers API requests through every
// server (the cluster has a meta leader).
func waitJetStream(ctx context.Context, addrs []string, within time.Duration) error {
	deadline := time.Now().Add(within)
	for _, a := range addrs {
		var last error
		for {
			last = jetStreamUp(ctx, a)
			if last == nil {
				break
			}
			if time.Now().After(deadline) {
				return fmt.Errorf("nats: JetStream not available at %s after %v: %w", a, within, last)
			}
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(200 * time.Millisecond):
			}
		}
	}
	return nil
}

func jetStreamUp(ctx context.Context, addr string) error {
	nc, err := nats.Connect("nats://"+addr, nats.Timeout(2*time.Second))
	if err != nil {
		return err
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	_, err = js.AccountInfo(ctx)
	return err
}

func sizesText(sizes []int) string {
	var parts []string
	for _, n := range sizes {
		parts = append(parts, strconv.Itoa(n))
	}
	return strings.Join(parts, ",")
}
