// Command declare-bench measures how fast a broker takes queue declares:
// -clients connections declare -count queues in all, each client its own
// share, one declare at a time per client (each waits for its completion,
// as a program that declares before it publishes does). It reports
// declares per second and the latency percentiles of one declare.
//
//	declare-bench -broker 127.0.0.1:7400 -clients 64 -count 20000 -durable
//	declare-bench -existing 100000 -count 20000   # the rate with 100k queues present
//
// With -existing N it first declares N queues (PREFIX-existing-N, not
// durable, as fast as -clients connections can), untimed, so the timed
// declares measure the cost with that many queues present; they are
// deleted afterwards too unless -keep.
//
// The queues it declares are named PREFIX-N; it deletes them afterwards
// unless -keep. It refuses to start when a queue of that name exists, so
// it never touches queues it did not create.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/berthmq/berth/client"
)

func main() { os.Exit(run(os.Args[1:])) }

func run(args []string) int {
	fs := flag.NewFlagSet("declare-bench", flag.ContinueOnError)
	broker := fs.String("broker", "127.0.0.1:7400", "broker client address")
	clients := fs.Int("clients", 64, "concurrent connections")
	count := fs.Int("count", 10000, "queues to declare in all")
	durable := fs.Bool("durable", false, "declare durable queues (committed in the controller)")
	prefix := fs.String("prefix", fmt.Sprintf("declare-bench-%d", os.Getpid()), "queue name prefix")
	keep := fs.Bool("keep", false, "keep the declared queues")
	existing := fs.Int("existing", 0, "queues to declare first, untimed")
	timeout := fs.Duration("timeout", 5*time.Minute, "bound on the run")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if *clients <= 0 || *count <= 0 || *existing < 0 {
		fmt.Fprintln(os.Stderr, "declare-bench: -clients and -count must be positive")
		return 2
	}
	ctx, cancel := context.WithTimeout(context.Background(), *timeout)
	defer cancel()
	conns := make([]*client.Conn, *clients)
	for i := range conns {
		c, err := client.Dial(ctx, *broker)
		if err != nil {
			fmt.Fprintln(os.Stderr, "declare-bench: dial:", err)
			return 1
		}
		defer c.Close()
		conns[i] = c
	}
	name := func(i int) string { return fmt.Sprintf("%s-%d", *prefix, i) }
	for _, i := range []int{0, *count - 1} {
		err := conns[0].DeclareQueue(ctx, name(i), client.QueueOptions{Passive: true})
		if err == nil {
			fmt.Fprintf(os.Stderr, "declare-bench: queue %q exists; pick another -prefix\n", name(i))
			return 1
		}
		if client.Code(err) == 0 {
			fmt.Fprintln(os.Stderr, "declare-bench:", err)
			return 1
		}
	}
	if *existing > 0 {
		t0 := time.Now()
		if err := declareAll(ctx, conns, *existing, func(i int) string { return fmt.Sprintf("%s-existing-%d", *prefix, i) }); err != nil {
			fmt.Fprintln(os.Stderr, "declare-bench: declare the existing queues:", err)
			return 1
		}
		fmt.Printf("existing=%d declared in %v\n", *existing, time.Since(t0).Round(time.Millisecond))
		if !*keep {
			defer deleteAll(*timeout, conns, *existing, func(i int) string { return fmt.Sprintf("%s-existing-%d", *prefix, i) })
		}
	}
	opts := client.QueueOptions{Durable: *durable}
	lat := make([][]time.Duration, *clients)
	var next atomic.Int64
	var failed atomic.Pointer[error]
	var wg sync.WaitGroup
	start := time.Now()
	for w := range conns {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1) - 1)
				if i >= *count || ctx.Err() != nil {
					return
				}
				t0 := time.Now()
				if err := conns[w].DeclareQueue(ctx, name(i), opts); err != nil {
					failed.CompareAndSwap(nil, &err)
					return
				}
				lat[w] = append(lat[w], time.Since(t0))
			}
		}()
	}
	wg.Wait()
	elapsed := time.Since(start)
	var all []time.Duration
	for _, l := range lat {
		all = append(all, l...)
	}
	rc := 0
	if p := failed.Load(); p != nil {
		fmt.Fprintln(os.Stderr, "declare-bench: declare failed:", *p)
		rc = 1
	}
	if len(all) > 0 {
		sort.Slice(all, func(i, j int) bool { return all[i] < all[j] })
		pct := func(p float64) time.Duration { return all[min(len(all)-1, int(p*float64(len(all))))] }
		fmt.Printf("declares=%d clients=%d durable=%v elapsed=%v rate=%.0f/s p50=%v p99=%v max=%v\n",
			len(all), *clients, *durable, elapsed.Round(time.Millisecond), float64(len(all))/elapsed.Seconds(),
			pct(0.50).Round(time.Microsecond), pct(0.99).Round(time.Microsecond), all[len(all)-1].Round(time.Microsecond))
	}
	if !*keep {
		deleteAll(*timeout, conns, *count, name)
	}
	return rc
}

// declareAll declares queues name(0..count-1), not durable, spread over
// conns.
func declareAll(ctx context.Context, conns []*client.Conn, count int, name func(int) string) error {
	var next atomic.Int64
	var failed atomic.Pointer[error]
	var wg sync.WaitGroup
	for w := range conns {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1) - 1)
				if i >= count || ctx.Err() != nil || failed.Load() != nil {
					return
				}
				if err := conns[w].DeclareQueue(ctx, name(i), client.QueueOptions{}); err != nil {
					failed.CompareAndSwap(nil, &err)
					return
				}
			}
		}()
	}
	wg.Wait()
	if p := failed.Load(); p != nil {
		return *p
	}
	return ctx.Err()
}

// deleteAll deletes queues name(0..count-1), spread over conns; a queue
// already gone is no error.
func deleteAll(timeout time.Duration, conns []*client.Conn, count int, name func(int) string) {
	dctx, dcancel := context.WithTimeout(context.Background(), timeout)
	defer dcancel()
	var dwg sync.WaitGroup
	var dnext atomic.Int64
	for w := range conns {
		dwg.Add(1)
		go func() {
			defer dwg.Done()
			for {
				i := int(dnext.Add(1) - 1)
				if i >= count || dctx.Err() != nil {
					return
				}
				err := conns[w].DeleteQueue(dctx, name(i), client.QueueDeleteOptions{})
				if err != nil && client.Code(err) == 0 && !errors.Is(err, context.Canceled) {
					fmt.Fprintln(os.Stderr, "declare-bench: delete:", err)
					return
				}
			}
		}()
	}
	dwg.Wait()
}
