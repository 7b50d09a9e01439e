// Command topic-bench measures publishes through a topic exchange as its
// bindings grow (issue 14): for each level of -bindings it adds bindings
// up to that many, then -publishers connections publish -count messages
// in all, pipelined (PublishAsync, each connection's window full), to a
// routing key that matches exactly one binding. It reports completed
// publishes per second at each level (the best of -rounds runs, after one
// untimed warm-up run before the first level) and that rate relative to
// the first level's.
//
//	topic-bench -broker 127.0.0.1:7400 -bindings 10,10000,1000000 -count 200000
//
// Binding i is "dev<i>.*.temp" to queue PREFIX-q<i mod -queues>; the
// messages go to "dev0.x.temp", so they land on PREFIX-q0 only. Every
// queue is bounded (-max-length, drop-head), so the run holds at most
// that many messages. It declares the exchange PREFIX-x and the queues,
// refuses to start when the exchange exists, and deletes what it declared
// at the end unless -keep. Nothing here is durable.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/berthmq/berth/client"
)

func main() { os.Exit(run(os.Args[1:])) }

func run(args []string) int {
	fs := flag.NewFlagSet("topic-bench", flag.ContinueOnError)
	broker := fs.String("broker", "127.0.0.1:7400", "broker client address")
	levels := fs.String("bindings", "10,10000,1000000", "binding counts to measure at, increasing")
	queues := fs.Int("queues", 1000, "queues the bindings spread over")
	publishers := fs.Int("publishers", 4, "publishing connections")
	binders := fs.Int("binders", 32, "connections that add the bindings")
	count := fs.Int("count", 200000, "messages to publish in each run")
	rounds := fs.Int("rounds", 3, "timed runs at each level; the best counts")
	size := fs.Int("size", 128, "payload bytes")
	maxLength := fs.Uint64("max-length", 10000, "bound of every queue (drop-head)")
	prefix := fs.String("prefix", fmt.Sprintf("topic-bench-%d", os.Getpid()), "name prefix of the exchange and queues")
	keep := fs.Bool("keep", false, "keep the exchange and queues")
	timeout := fs.Duration("timeout", 20*time.Minute, "bound on the run")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	var targets []int
	for _, f := range strings.Split(*levels, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n <= 0 || (len(targets) > 0 && n <= targets[len(targets)-1]) {
			fmt.Fprintln(os.Stderr, "topic-bench: -bindings must be increasing positive counts")
			return 2
		}
		targets = append(targets, n)
	}
	if *queues <= 0 || *publishers <= 0 || *binders <= 0 || *count <= 0 || *rounds <= 0 {
		fmt.Fprintln(os.Stderr, "topic-bench: -queues, -publishers, -binders and -count must be positive")
		return 2
	}
	ctx, cancel := context.WithTimeout(context.Background(), *timeout)
	defer cancel()
	conns := make([]*client.Conn, max(*publishers, *binders))
	for i := range conns {
		c, err := client.Dial(ctx, *broker)
		if err != nil {
			fmt.Fprintln(os.Stderr, "topic-bench: dial:", err)
			return 1
		}
		defer c.Close()
		conns[i] = c
	}
	ex := *prefix + "-x"
	qname := func(i int) string { return fmt.Sprintf("%s-q%d", *prefix, i) }
	if err := conns[0].DeclareExchange(ctx, ex, client.Topic, client.ExchangeOptions{Passive: true}); err == nil {
		fmt.Fprintf(os.Stderr, "topic-bench: exchange %q exists; pick another -prefix\n", ex)
		return 1
	}
	if err := conns[0].DeclareExchange(ctx, ex, client.Topic, client.ExchangeOptions{}); err != nil {
		fmt.Fprintln(os.Stderr, "topic-bench: declare the exchange:", err)
		return 1
	}
	nq := min(*queues, targets[len(targets)-1])
	if !*keep {
		defer cleanup(conns[:*binders], ex, nq, qname)
	}
	qopts := client.QueueOptions{MaxLength: *maxLength, Overflow: client.OverflowDropHead}
	if err := parallel(ctx, conns[:*binders], nq, func(c *client.Conn, i int) error {
		return c.DeclareQueue(ctx, qname(i), qopts)
	}); err != nil {
		fmt.Fprintln(os.Stderr, "topic-bench: declare the queues:", err)
		return 1
	}
	payload := make([]byte, *size)
	bound := 0
	var first float64
	for _, target := range targets {
		t0 := time.Now()
		from := bound
		if err := parallel(ctx, conns[:*binders], target-from, func(c *client.Conn, i int) error {
			i += from
			return c.Bind(ctx, ex, qname(i%nq), "dev"+strconv.Itoa(i)+".*.temp")
		}); err != nil {
			fmt.Fprintln(os.Stderr, "topic-bench: bind:", err)
			return 1
		}
		bound = target
		bindTime := time.Since(t0)
		if from == 0 {
			if _, _, err := publish(ctx, conns[:*publishers], ex, "dev0.x.temp", payload, *count); err != nil {
				fmt.Fprintln(os.Stderr, "topic-bench: warm-up:", err)
				return 1
			}
		}
		var rates []string
		best, failed := 0.0, int64(0)
		for range *rounds {
			rate, errs, err := publish(ctx, conns[:*publishers], ex, "dev0.x.temp", payload, *count)
			if err != nil {
				fmt.Fprintln(os.Stderr, "topic-bench: publish:", err)
				return 1
			}
			best, failed = max(best, rate), failed+errs
			rates = append(rates, fmt.Sprintf("%.0f", rate))
		}
		if first == 0 {
			first = best
		}
		fmt.Printf("bindings=%d added_in=%v publishes=%dx%d failed=%d rates=%s best=%.0f/s relative=%.2f\n",
			bound, bindTime.Round(time.Millisecond), *rounds, *count, failed, strings.Join(rates, ","), best, best/first)
	}
	return 0
}

// parallel runs f(conn, i) for i in [0, n), spread over conns, and
// returns the first error.
func parallel(ctx context.Context, conns []*client.Conn, n int, f func(*client.Conn, int) error) error {
	var next atomic.Int64
	var failed atomic.Pointer[error]
	var wg sync.WaitGroup
	for _, c := range conns {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1) - 1)
				if i >= n || ctx.Err() != nil || failed.Load() != nil {
					return
				}
				if err := f(c, i); err != nil {
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

// publish sends count messages over conns, pipelined, and returns the
// completed publishes per second and how many failed.
func publish(ctx context.Context, conns []*client.Conn, ex, key string, payload []byte, count int) (float64, int64, error) {
	var errs atomic.Int64
	done := func(err error) {
		if err != nil {
			errs.Add(1)
		}
	}
	var wg sync.WaitGroup
	var failed atomic.Pointer[error]
	start := time.Now()
	for w, c := range conns {
		n := count / len(conns)
		if w < count%len(conns) {
			n++
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range n {
				if err := c.PublishAsync(ctx, ex, key, payload, client.PublishOptions{}, done); err != nil {
					failed.CompareAndSwap(nil, &err)
					return
				}
			}
			if err := c.Flush(ctx); err != nil {
				failed.CompareAndSwap(nil, &err)
			}
		}()
	}
	wg.Wait()
	elapsed := time.Since(start)
	if p := failed.Load(); p != nil {
		return 0, errs.Load(), *p
	}
	return float64(count) / elapsed.Seconds(), errs.Load(), nil
}

// cleanup deletes the exchange (and so its bindings) and the queues.
func cleanup(conns []*client.Conn, ex string, nq int, qname func(int) string) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	if err := conns[0].DeleteExchange(ctx, ex, client.ExchangeDeleteOptions{}); err != nil {
		fmt.Fprintln(os.Stderr, "topic-bench: delete the exchange:", err)
	}
	if err := parallel(ctx, conns, nq, func(c *client.Conn, i int) error {
		err := c.DeleteQueue(ctx, qname(i), client.QueueDeleteOptions{})
		if client.Code(err) != 0 {
			return nil // gone already
		}
		return err
	}); err != nil {
		fmt.Fprintln(os.Stderr, "topic-bench: delete the queues:", err)
	}
}
