// Command ctl-bench drives a Berth controller group the way etcdcompare's
// loadgen drives etcd: 256 goroutines over 16 client connections, 256-byte
// writes (SetAttribute) over 1,024 keys, then linearizable reads by the
// leader (ReadIndex or lease, as the controllers run) and by any member
// (follower reads). Every phase is bounded by -ops and by -timeout.
//
//	ctl-bench -endpoints 127.0.0.1:7402,127.0.0.1:7412,127.0.0.1:7422
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/berthmq/berth/controlplane/ctlapi"
	"github.com/berthmq/berth/controlplane/ctlclient"
)

func main() {
	os.Exit(run(os.Args[1:]))
}

func run(args []string) int {
	fs := flag.NewFlagSet("ctl-bench", flag.ContinueOnError)
	endpoints := fs.String("endpoints", "127.0.0.1:7402", "controller addresses, comma-separated")
	clients := fs.Int("clients", 256, "concurrent goroutines")
	conns := fs.Int("conns", 16, "client connections")
	ops := fs.Int("ops", 30000, "operations per phase")
	size := fs.Int("size", 256, "value bytes")
	phases := fs.String("phases", "put,linearizable-get,follower-get", "phases to run, in order")
	timeout := fs.Duration("timeout", 2*time.Minute, "bound on each phase")
	warmup := fs.Int("warmup", 10000, "unmeasured writes before the phases (connections, leader, first disk writes)")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if *clients <= 0 || *conns <= 0 || *ops <= 0 || *size < 0 || *warmup < 0 {
		fmt.Fprintln(os.Stderr, "ctl-bench: -clients, -conns and -ops must be positive, -size and -warmup not negative")
		return 2
	}
	eps := strings.Split(*endpoints, ",")
	cls := make([]*ctlclient.Client, *conns)
	for i := range cls {
		cls[i] = ctlclient.NewClient(eps)
		defer cls[i].Close()
	}
	value := strings.Repeat("v", *size)
	// Wait for a leader: the first write succeeds.
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	err := cls[0].SetAttribute(ctx, "k0", value)
	cancel()
	if err != nil {
		fmt.Fprintln(os.Stderr, "ctl-bench: no controller leader:", err)
		return 1
	}
	ok := true
	phaseN := func(name string, n int, op func(c *ctlclient.Client, ctx context.Context, i int) error) {
		var next, failed atomic.Int64
		var firstErr atomic.Value
		deadline := time.Now().Add(*timeout)
		var wg sync.WaitGroup
		start := time.Now()
		for g := 0; g < *clients; g++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				c := cls[g%len(cls)]
				for time.Now().Before(deadline) {
					i := next.Add(1) - 1
					if i >= int64(n) {
						return
					}
					ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
					err := op(c, ctx, int(i))
					cancel()
					if err != nil {
						failed.Add(1)
						firstErr.CompareAndSwap(nil, err)
					}
				}
			}()
		}
		wg.Wait()
		el := time.Since(start)
		done := min(next.Load(), int64(n))
		if name == "" {
			if failed.Load() > done/100 {
				fmt.Fprintf(os.Stderr, "ctl-bench: warm-up: %d failed: %v\n", failed.Load(), firstErr.Load())
				ok = false
			}
			return
		}
		fmt.Printf("%s: %d ops in %v = %.0f ops/s (%d failed)\n", name, done, el.Round(time.Millisecond), float64(done)/el.Seconds(), failed.Load())
		if f := failed.Load(); f > 0 {
			fmt.Fprintf(os.Stderr, "ctl-bench: %s: first error: %v\n", name, firstErr.Load())
			if f > done/100 {
				ok = false
			}
		}
	}
	phase := func(name string, op func(c *ctlclient.Client, ctx context.Context, i int) error) {
		phaseN(name, *ops, op)
	}
	put := func(c *ctlclient.Client, ctx context.Context, i int) error {
		return c.SetAttribute(ctx, "k"+strconv.Itoa(i%1024), value)
	}
	phaseN("", *warmup, put)
	for _, p := range strings.Split(*phases, ",") {
		switch p {
		case "put":
			phase(p, put)
		case "linearizable-get", "follower-get":
			mode := ctlapi.ReadConsistent
			if p == "follower-get" {
				mode = ctlapi.ReadFollower
			}
			phase(p, func(c *ctlclient.Client, ctx context.Context, i int) error {
				_, found, err := c.GetAttribute(ctx, mode, "k"+strconv.Itoa(i%1024))
				if err == nil && !found && i%1024 == 0 {
					err = errors.New("k0 missing")
				}
				return err
			})
		default:
			fmt.Fprintf(os.Stderr, "ctl-bench: unknown phase %q\n", p)
			return 2
		}
	}
	if !ok {
		return 1
	}
	return 0
}
