// Package driver puts each broker berth-bench can load behind one small
// interface, so that a single workload definition runs unchanged through
// Berth, NATS JetStream and RabbitMQ.
//
// A driver maps the workload's words onto the broker's:
//   - queue: a Berth queue, a JetStream work-queue stream, a quorum queue;
//   - publish completion: Berth's COMPLETE, a JetStream PubAck, a publisher
//     confirm;
//   - credit: Berth consumer credit, JetStream pull batch and MaxAckPending,
//     AMQP prefetch (basic.qos);
//   - explicit ack: ACCEPT, a JetStream ack, basic.ack.
package driver

import (
	"context"
	"errors"
	"fmt"
	"sort"
)

// AckMode is how consumers settle what they receive.
type AckMode string

const (
	// AckExplicit settles every message after the handler saw it.
	AckExplicit AckMode = "explicit"
	// AckNone lets the broker forget a message once it is sent.
	AckNone AckMode = "none"
)

// Options configure a driver for one run.
type Options struct {
	// Addrs are the broker addresses (host:port). Connection i starts with
	// Addrs[i%len(Addrs)], so a cluster's members share the load.
	Addrs []string
	// Persistent asks for durable queues and persistent messages.
	Persistent bool
	// Window is the most uncompleted publishes one producer keeps; the
	// driver sizes its client to admit at least that many.
	Window int
	// Replicas is the JetStream stream replica count (nats only).
	Replicas int
}

// ConsumerConfig is the consumer side of a workload.
type ConsumerConfig struct {
	// Credit is how many unsettled messages one consumer may hold.
	Credit int
	Ack    AckMode
	// PerQueue is how many consumers will read each queue; drivers whose
	// broker shares one cursor among them size it from this.
	PerQueue int
}

// Driver connects the workload to one broker.
type Driver interface {
	// Setup deletes whatever an earlier run left in the named queues and
	// declares them afresh.
	Setup(ctx context.Context, queues []string, cc ConsumerConfig) error
	// NewProducer opens the connection of producer id.
	NewProducer(ctx context.Context, id int) (Producer, error)
	// NewConsumer starts consumer id on queue. handle runs for every
	// message, on a goroutine of the driver, before the message is settled;
	// payload is valid only during the call.
	NewConsumer(ctx context.Context, id int, queue string, cc ConsumerConfig, handle func(payload []byte)) (Consumer, error)
	// Close releases what Setup opened.
	Close() error
}

// Producer publishes on one connection.
type Producer interface {
	// Publish sends payload to queue. It may block for the broker's own
	// flow control; done is called exactly once with the outcome, from a
	// goroutine of the driver, and must not block. If Publish returns an
	// error, done is not called.
	Publish(ctx context.Context, queue string, payload []byte, done func(error)) error
	Close() error
}

// Consumer is one running subscription.
type Consumer interface {
	// Close stops the subscription and its connection; unsettled messages
	// go back to the broker.
	Close() error
}

// ErrUnknown is returned by New for a driver name it does not know.
var ErrUnknown = errors.New("driver: unknown driver")

var registry = map[string]func(Options) (Driver, error){}

func register(name string, open func(Options) (Driver, error)) { registry[name] = open }

// Names lists the drivers, sorted.
func Names() []string {
	names := make([]string, 0, len(registry))
	for n := range registry {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

// New opens the named driver.
func New(name string, opts Options) (Driver, error) {
	open, ok := registry[name]
	if !ok {
		return nil, fmt.Errorf("%w %q (have %v)", ErrUnknown, name, Names())
	}
	if len(opts.Addrs) == 0 {
		return nil, errors.New("driver: no broker address given")
	}
	if opts.Window < 1 {
		opts.Window = 1
	}
	if opts.Replicas < 1 {
		opts.Replicas = 1
	}
	return open(opts)
}

// addrFor spreads connections over the addresses.
func addrFor(addrs []string, id int) string { return addrs[id%len(addrs)] }

// rotated returns addrs starting at id's share, so a client that fails
// over still tries all of them.
func rotated(addrs []string, id int) []string {
	out := make([]string, 0, len(addrs))
	for i := range addrs {
		out = append(out, addrs[(id+i)%len(addrs)])
	}
	return out
}
