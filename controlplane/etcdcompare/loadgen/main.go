// Command loadgen drives an etcd cluster the way BenchmarkWrite and
// BenchmarkRead drive Berth's controllers: 256 goroutines over 16 client
// connections, 256-byte puts over 1,024 keys, then linearizable gets.
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

	clientv3 "go.etcd.io/etcd/client/v3"
)

func main() {
	endpoints := flag.String("endpoints", "127.0.0.1:23791,127.0.0.1:23792,127.0.0.1:23793", "comma-separated")
	clients := flag.Int("clients", 256, "concurrent goroutines")
	conns := flag.Int("conns", 16, "client connections")
	ops := flag.Int("ops", 30000, "operations per phase")
	size := flag.Int("size", 256, "value bytes")
	warmup := flag.Int("warmup", 10000, "unmeasured puts before the phases")
	flag.Parse()
	eps := strings.Split(*endpoints, ",")
	cls := make([]*clientv3.Client, *conns)
	for i := range cls {
		c, err := clientv3.New(clientv3.Config{Endpoints: eps, DialTimeout: 5 * time.Second})
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		defer c.Close()
		cls[i] = c
	}
	value := strings.Repeat("v", *size)
	runN := func(name string, n int, op func(c *clientv3.Client, i int) error) {
		var next, failed atomic.Int64
		var wg sync.WaitGroup
		start := time.Now()
		for g := 0; g < *clients; g++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				c := cls[g%len(cls)]
				for {
					i := next.Add(1) - 1
					if i >= int64(n) {
						return
					}
					if err := op(c, int(i)); err != nil {
						failed.Add(1)
					}
				}
			}()
		}
		wg.Wait()
		el := time.Since(start)
		if name != "" {
			fmt.Printf("%s: %d ops in %v = %.0f ops/s (%d failed)\n", name, n, el.Round(time.Millisecond), float64(n)/el.Seconds(), failed.Load())
		}
	}
	run := func(name string, op func(c *clientv3.Client, i int) error) { runN(name, *ops, op) }
	// Warm up (connections, leader, first disk writes) without measuring,
	// as ctl-bench does for Berth.
	runN("", *warmup, func(c *clientv3.Client, i int) error {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_, err := c.Put(ctx, "k"+strconv.Itoa(i%1024), value)
		return err
	})
	run("put", func(c *clientv3.Client, i int) error {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_, err := c.Put(ctx, "k"+strconv.Itoa(i%1024), value)
		return err
	})
	run("linearizable-get", func(c *clientv3.Client, i int) error {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_, err := c.Get(ctx, "k"+strconv.Itoa(i%1024))
		return err
	})
	run("serializable-get", func(c *clientv3.Client, i int) error {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_, err := c.Get(ctx, "k"+strconv.Itoa(i%1024), clientv3.WithSerializable())
		return err
	})
}
