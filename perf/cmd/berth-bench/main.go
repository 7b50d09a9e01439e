// Command berth-bench loads a message broker with a workload and reports
// throughput and HdrHistogram latencies (publish to completion, publish to
// delivery). The same workload runs through Berth (the default), NATS
// JetStream or RabbitMQ:
//
//	berth-bench --addr 127.0.0.1:7400 --producers 4 --consumers 4 --mode async:512 --duration 30s
//	berth-bench --driver nats --addr 127.0.0.1:4222 --persistent --json out.json --plot out.svg
//	berth-bench --profile prof/ --admin 127.0.0.1:7480
//	berth-bench --count 100k   # exactly 100,000 measured messages, no warm-up, no time limit
//
// It does no harm to queues it did not make: it works on the queues
// <queue-prefix>-0, -1, ..., declares those that do not exist, refuses one
// that exists and holds messages (or has consumers, or whose depth it
// cannot read: Berth's comes from --admin) unless --reuse, and when the
// run ends, however it ends, deletes the queues it declared and only
// those, unless --keep.
package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/berthmq/berth/perf/bench"
	"github.com/berthmq/berth/perf/driver"
)

var defaultAddr = map[string]string{
	"berth": "127.0.0.1:7400",
	"nats":  "127.0.0.1:4222",
	"amqp":  "127.0.0.1:5672",
}

type addrList []string

func (a *addrList) String() string { return strings.Join(*a, ",") }
func (a *addrList) Set(s string) error {
	for _, part := range strings.Split(s, ",") {
		if part = strings.TrimSpace(part); part != "" {
			*a = append(*a, part)
		}
	}
	return nil
}

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

func run(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("berth-bench", flag.ContinueOnError)
	fs.SetOutput(stderr)
	w := bench.DefaultWorkload()
	w.RegisterFlags(fs)
	driverName := fs.String("driver", "berth", "broker driver: "+strings.Join(driver.Names(), ", "))
	var addrs addrList
	fs.Var(&addrs, "addr", "broker address host:port; repeat (or comma-separate) for a cluster (default per driver: berth 127.0.0.1:7400, nats 127.0.0.1:4222, amqp 127.0.0.1:5672)")
	replicas := fs.Int("replicas", 1, "nats: JetStream stream and consumer replicas")
	jsonPath := fs.String("json", "", "write the result as JSON to this file")
	plotPath := fs.String("plot", "", "write an SVG chart of throughput and latency over time to this file")
	profileDir := fs.String("profile", "", "fetch CPU, heap, allocs, mutex and block profiles from the server into this directory (needs --admin)")
	admin := fs.String("admin", "", "berth: the broker's admin HTTP address, serving /debug/pprof for --profile and the depths of queues that exist already")
	reuse := fs.Bool("reuse", false, "run on queues that exist and hold messages (or whose depth cannot be read); their messages are consumed too")
	keep := fs.Bool("keep", false, "leave the queues the run declared in place when it ends")
	profileSecs := fs.Int("profile-seconds", 10, "CPU profile length when the run is bounded by --count only")
	label := fs.String("label", "", "free-form label stored in the result")
	quiet := fs.Bool("quiet", false, "no progress line")
	tlsCA := fs.String("tls-ca", "", "berth: speak TLS to --addr (the broker's -listen-tls), trusting the CA certificates in this PEM file")
	user := fs.String("user", "", "berth: log in as this user (SCRAM-SHA-256); none = the default user, loopback only")
	password := fs.String("password", "", "berth: the user's password; default: the BERTH_PASSWORD environment variable")
	maxPriority := fs.Uint("max-priority", 0, "berth: declare priority queues with priorities 0..N (at most 10) and publish priorities 0..N in turn")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "berth-bench: unexpected arguments %q\n", fs.Args())
		return 2
	}
	w.CountAlone(fs)
	if err := w.Validate(); err != nil {
		fmt.Fprintln(stderr, "berth-bench:", err)
		return 2
	}
	if len(addrs) == 0 {
		def, ok := defaultAddr[*driverName]
		if !ok {
			fmt.Fprintf(stderr, "berth-bench: unknown driver %q (have %v)\n", *driverName, driver.Names())
			return 2
		}
		addrs = addrList{def}
	}
	var tlsCfg *tls.Config
	if *tlsCA != "" {
		pem, err := os.ReadFile(*tlsCA)
		if err != nil {
			fmt.Fprintln(stderr, "berth-bench:", err)
			return 2
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			fmt.Fprintf(stderr, "berth-bench: --tls-ca %s: no PEM certificate in it\n", *tlsCA)
			return 2
		}
		tlsCfg = &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}
	}
	if *maxPriority > 10 {
		fmt.Fprintf(stderr, "berth-bench: --max-priority must be 0 to 10, got %d\n", *maxPriority)
		return 2
	}
	if *user != "" && *password == "" {
		*password = os.Getenv("BERTH_PASSWORD")
	}
	d, err := driver.New(*driverName, driver.Options{Addrs: addrs, Persistent: w.Persistent, Window: w.InFlight(), Replicas: *replicas, Admin: *admin, TLS: tlsCfg,
		User: *user, Password: *password, MaxPriority: uint8(*maxPriority)})
	if err != nil {
		fmt.Fprintln(stderr, "berth-bench:", err)
		return 2
	}
	defer d.Close()
	opts := bench.Options{DriverName: *driverName, Driver: d, Addrs: addrs, Label: *label, Reuse: *reuse, Keep: *keep}
	if !*quiet {
		opts.Progress = stderr
		if f, ok := stderr.(*os.File); ok {
			if st, err := f.Stat(); err == nil && st.Mode()&os.ModeCharDevice != 0 {
				opts.ProgressCR = true
			}
		}
	}
	if *profileDir != "" {
		p, err := bench.NewProfiler(*admin, *profileDir)
		if err != nil {
			fmt.Fprintln(stderr, "berth-bench:", err)
			return 2
		}
		p.Seconds = *profileSecs
		opts.Profiler = p
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	res, err := bench.Run(ctx, w, opts)
	if res != nil {
		res.WriteTable(stdout)
		if *jsonPath != "" {
			if werr := res.WriteJSONFile(*jsonPath); werr != nil {
				fmt.Fprintln(stderr, "berth-bench:", werr)
				return 1
			}
		}
		if *plotPath != "" {
			if werr := bench.WritePlotFile(*plotPath, res); werr != nil {
				fmt.Fprintln(stderr, "berth-bench:", werr)
				return 1
			}
		}
	}
	if err != nil {
		if err == context.Canceled {
			fmt.Fprintln(stderr, "berth-bench: interrupted")
		} else {
			fmt.Fprintln(stderr, "berth-bench:", err)
		}
		return 1
	}
	return 0
}
