package client_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log"
	"log/slog"
	"os"
	"sync/atomic"
	"time"

	"github.com/berthmq/berth/client"
	"github.com/berthmq/berth/server"
	"github.com/berthmq/berth/wire"
)

// startBroker runs a real in-memory broker on a random loopback port, as
// the examples need one. A program would dial a running berthd instead.
func startBroker() (*server.Server, func()) {
	dir, err := os.MkdirTemp("", "berth-example-")
	if err != nil {
		log.Fatal(err)
	}
	cfg := server.DefaultConfig()
	cfg.ClientAddr = "127.0.0.1:0"
	cfg.AdminAddr = ""
	cfg.DataDir = dir
	cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	s, err := server.Start(cfg)
	if err != nil {
		log.Fatal(err)
	}
	return s, func() { s.Close(); os.RemoveAll(dir) }
}

// Publish one message and consume it.
func Example() {
	srv, stop := startBroker()
	defer stop()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	conn, err := client.Dial(ctx, srv.ClientAddr())
	if err != nil {
		log.Fatal(err)
	}
	defer conn.Close()

	if err := conn.DeclareQueue(ctx, "greetings", client.QueueOptions{}); err != nil {
		log.Fatal(err)
	}
	// The default exchange "" routes by queue name. Publish returns once
	// the broker has the message.
	if err := conn.Publish(ctx, "", "greetings", []byte("hello, berth"), client.PublishOptions{}); err != nil {
		log.Fatal(err)
	}

	sub, err := conn.Subscribe(ctx, "greetings", client.SubscribeOptions{Credit: 10, AutoCredit: true})
	if err != nil {
		log.Fatal(err)
	}
	d, err := sub.Next(ctx)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("%s (tag %d, routing key %q)\n", d.Payload, d.Tag, d.RoutingKey)
	// Accept returns once the broker has forgotten the message.
	if err := d.Accept(ctx); err != nil {
		log.Fatal(err)
	}
	// Output: hello, berth (tag 1, routing key "greetings")
}

// Publish many messages without waiting for each one; the connection
// batches them into few frames and bounds how many are in flight.
func ExampleConn_PublishAsync() {
	srv, stop := startBroker()
	defer stop()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conn, err := client.Dial(ctx, srv.ClientAddr())
	if err != nil {
		log.Fatal(err)
	}
	defer conn.Close()
	if err := conn.DeclareQueue(ctx, "events", client.QueueOptions{}); err != nil {
		log.Fatal(err)
	}

	var ok, failed atomic.Int64
	done := func(err error) { // runs on the connection's reader goroutine
		if err != nil {
			failed.Add(1)
			return
		}
		ok.Add(1)
	}
	buf := make([]byte, 8)
	for i := 0; i < 10000; i++ {
		buf[0] = byte(i) // PublishAsync copied the last one: reuse is safe
		if err := conn.PublishAsync(ctx, "", "events", buf, client.PublishOptions{}, done); err != nil {
			log.Fatal(err)
		}
	}
	// Wait for every completion.
	if err := conn.Flush(ctx); err != nil {
		log.Fatal(err)
	}
	fmt.Println("completed:", ok.Load(), "failed:", failed.Load())
	// Output: completed: 10000 failed: 0
}

// Settle deliveries in batches: accept some, release one back to its
// place in the queue, reject one to the dead-letter exchange.
func ExampleConsumer_Accept() {
	srv, stop := startBroker()
	defer stop()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conn, err := client.Dial(ctx, srv.ClientAddr())
	if err != nil {
		log.Fatal(err)
	}
	defer conn.Close()

	must := func(err error) {
		if err != nil {
			log.Fatal(err)
		}
	}
	must(conn.DeclareExchange(ctx, "dead-letters", client.Fanout, client.ExchangeOptions{}))
	must(conn.DeclareQueue(ctx, "graveyard", client.QueueOptions{}))
	must(conn.Bind(ctx, "dead-letters", "graveyard", ""))
	must(conn.DeclareQueue(ctx, "jobs", client.QueueOptions{DeadLetterExchange: "dead-letters"}))
	for _, job := range []string{"a", "b", "c", "d"} {
		must(conn.Publish(ctx, "", "jobs", []byte(job), client.PublishOptions{}))
	}

	sub, err := conn.Subscribe(ctx, "jobs", client.SubscribeOptions{Credit: 4})
	must(err)
	var ds []*client.Delivery
	for i := 0; i < 4; i++ {
		d, err := sub.Next(ctx)
		must(err)
		ds = append(ds, d)
	}
	must(sub.Accept(ctx, ds[0].Tag, ds[2].Tag)) // a and c are done
	must(sub.Release(ctx, ds[1].Tag))           // b goes back to the queue
	must(sub.Reject(ctx, ds[3].Tag))            // d is dead-lettered

	_, err = sub.Credit(1)
	must(err)
	again, err := sub.Next(ctx)
	must(err)
	fmt.Printf("redelivered %s (redelivered=%v)\n", again.Payload, again.Redelivered)
	must(again.Accept(ctx))

	dead, err := conn.Subscribe(ctx, "graveyard", client.SubscribeOptions{Credit: 1, AckMode: client.AckNone})
	must(err)
	d, err := dead.Next(ctx)
	must(err)
	fmt.Printf("dead-lettered %s\n", d.Payload)
	// Output:
	// redelivered b (redelivered=true)
	// dead-lettered d
}

// Hand each delivery to a function: nil accepts it, an error wrapping
// ErrReject dead-letters it, any other error releases it for redelivery.
func ExampleConsumer_Consume() {
	srv, stop := startBroker()
	defer stop()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conn, err := client.Dial(ctx, srv.ClientAddr())
	if err != nil {
		log.Fatal(err)
	}
	defer conn.Close()
	if err := conn.DeclareQueue(ctx, "orders", client.QueueOptions{}); err != nil {
		log.Fatal(err)
	}
	for _, o := range []string{"apple", "pear", "plum"} {
		if err := conn.Publish(ctx, "", "orders", []byte(o), client.PublishOptions{}); err != nil {
			log.Fatal(err)
		}
	}
	sub, err := conn.Subscribe(ctx, "orders", client.SubscribeOptions{Credit: 10, AutoCredit: true})
	if err != nil {
		log.Fatal(err)
	}
	run, stopRun := context.WithCancel(ctx)
	handled := 0
	err = sub.Consume(run, func(d *client.Delivery) error {
		fmt.Printf("order %s\n", d.Payload)
		if handled++; handled == 3 {
			stopRun()
		}
		return nil
	})
	fmt.Println("stopped:", err)
	// Output:
	// order apple
	// order pear
	// order plum
	// stopped: context canceled
}

// Route by topic pattern through a named exchange.
func ExampleConn_Bind() {
	srv, stop := startBroker()
	defer stop()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conn, err := client.Dial(ctx, srv.ClientAddr())
	if err != nil {
		log.Fatal(err)
	}
	defer conn.Close()
	must := func(err error) {
		if err != nil {
			log.Fatal(err)
		}
	}
	must(conn.DeclareExchange(ctx, "logs", client.Topic, client.ExchangeOptions{}))
	must(conn.DeclareQueue(ctx, "errors", client.QueueOptions{}))
	must(conn.Bind(ctx, "logs", "errors", "*.error"))
	for _, key := range []string{"db.info", "db.error", "web.error", "web.debug"} {
		must(conn.Publish(ctx, "logs", key, []byte("from "+key), client.PublishOptions{}))
	}
	sub, err := conn.Subscribe(ctx, "errors", client.SubscribeOptions{Credit: 10, AckMode: client.AckNone})
	must(err)
	for i := 0; i < 2; i++ {
		d, err := sub.Next(ctx)
		must(err)
		fmt.Println(d.RoutingKey, string(d.Payload))
	}
	// Output:
	// db.error from db.error
	// web.error from web.error
}

// Server errors are *client.Error values carrying the wire code.
func ExampleError() {
	srv, stop := startBroker()
	defer stop()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conn, err := client.Dial(ctx, srv.ClientAddr())
	if err != nil {
		log.Fatal(err)
	}
	defer conn.Close()

	err = conn.DeclareQueue(ctx, "missing", client.QueueOptions{Passive: true})
	var se *client.Error
	if errors.As(err, &se) {
		fmt.Println("code:", se.Code, "not found:", se.Code == wire.CodeNotFound)
	}
	// Output: code: not-found not found: true
}

// A Conn with a ReconnectPolicy outlives a broker restart: it dials
// again, subscribes its consumer again and goes on.
func ExampleReconnectPolicy() {
	dir, err := os.MkdirTemp("", "berth-example-")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)
	cfg := server.DefaultConfig()
	cfg.ClientAddr = "127.0.0.1:0"
	cfg.AdminAddr = ""
	cfg.DataDir = dir
	cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	srv, err := server.Start(cfg)
	if err != nil {
		log.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()

	up := make(chan struct{}, 1)
	conn, err := client.DialConfig(ctx, client.Config{Reconnect: &client.ReconnectPolicy{
		MaxTime: 10 * time.Second,
		OnEvent: func(e client.Event) {
			fmt.Println("event:", e.Kind)
			if e.Kind == client.EventReconnected {
				up <- struct{}{}
			}
		},
	}}, srv.ClientAddr())
	if err != nil {
		log.Fatal(err)
	}
	defer conn.Close()
	if err := conn.DeclareQueue(ctx, "jobs", client.QueueOptions{Durable: true}); err != nil {
		log.Fatal(err)
	}
	sub, err := conn.Subscribe(ctx, "jobs", client.SubscribeOptions{Credit: 10, AutoCredit: true})
	if err != nil {
		log.Fatal(err)
	}

	// The broker restarts on the same address and data.
	srv.Close()
	cfg.ClientAddr = srv.ClientAddr()
	if srv, err = server.Start(cfg); err != nil {
		log.Fatal(err)
	}
	defer srv.Close()
	<-up

	if err := conn.Publish(ctx, "", "jobs", []byte("after the restart"), client.PublishOptions{Persistent: true}); err != nil {
		log.Fatal(err)
	}
	d, err := sub.Next(ctx)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("the same consumer got %q\n", d.Payload)
	conn.Close() // before the broker's deferred Close, which it would report
	// Output:
	// event: disconnected
	// event: reconnected
	// the same consumer got "after the restart"
}
