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
	"crypto/tls"
	"errors"
	"fmt"
	"sort"
	"sync"
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
	// Admin is the broker's admin HTTP address (berth only): where Setup
	// reads how many messages a queue that exists already holds.
	Admin string
	// TLS, if set, makes the berth driver dial with TLS.
	TLS *tls.Config
	// User and Password log the berth driver in (SCRAM-SHA-256); no User
	// is the broker's default user.
	User, Password string
	// Route, if set, names the broker address that serves queue (berth
	// only): in a cluster, the master of the queue's replication group.
	// The driver then declares and deletes a queue there, a producer
	// keeps one connection per address it publishes to and sends each
	// queue's messages to its address, and a consumer reads its queue
	// there. Addrs still serve the first lookups of a queue's state.
	Route func(ctx context.Context, queue string) (addr string, err error)
	// MaxPriority (berth only) declares priority queues with priorities
	// 0 to MaxPriority, and each producer gives its messages priorities
	// 0, 1, ..., MaxPriority in turn.
	MaxPriority uint8
}

// SetupOptions say what Setup may do with queues that exist already.
type SetupOptions struct {
	// Reuse lets Setup use a queue that exists and holds messages, or has
	// consumers, or whose content the driver cannot see. Without it such
	// a queue stops Setup with ErrQueueInUse. An empty, unused queue is
	// used either way. Setup never deletes a queue.
	Reuse bool
}

// ErrQueueInUse is returned by Setup for a queue that exists and holds
// messages, has consumers, or cannot be inspected, when not told to reuse
// it.
var ErrQueueInUse = errors.New("driver: queue exists and may be in use")

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
//
// A driver does no harm to what it did not make: Setup declares the
// queues that do not exist and remembers them; it uses a queue that
// exists only when it is empty and unused (or SetupOptions.Reuse says
// so), and deletes nothing. Cleanup deletes what Setup made, and only
// that.
type Driver interface {
	// Setup makes the named queues ready for a run, by the rules above.
	// After an error, what it made so far is still Cleanup's to delete.
	Setup(ctx context.Context, queues []string, cc ConsumerConfig, so SetupOptions) error
	// Created lists the queues Setup declared and Cleanup has not deleted.
	Created() []string
	// Cleanup deletes the queues Setup declared (and, on a queue it
	// reused, whatever it added to it, such as a JetStream consumer).
	Cleanup(ctx context.Context) error
	// NewProducer opens the connection of producer id.
	NewProducer(ctx context.Context, id int) (Producer, error)
	// NewConsumer starts consumer id on queue. handle runs for every
	// message, on a goroutine of the driver, before the message is settled;
	// payload is valid only during the call.
	NewConsumer(ctx context.Context, id int, queue string, cc ConsumerConfig, handle func(payload []byte)) (Consumer, error)
	// Close releases what the driver holds open; it deletes nothing.
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

// queueState is what a driver can see of a queue.
type queueState struct {
	exists bool
	// messages held (ready, and where the broker tells, unacked); -1 when
	// the driver cannot tell, with unknown saying why.
	messages  int64
	consumers int
	unknown   string
}

// queueOps are the broker-specific steps setupQueues and cleanupQueues
// combine.
type queueOps interface {
	inspect(ctx context.Context, queue string) (queueState, error)
	// create declares a queue that did not exist. If it fails it leaves
	// nothing of its own behind.
	create(ctx context.Context, queue string, cc ConsumerConfig) error
	// adopt readies a queue that existed for the run, and reports whether
	// it added something to it that unadopt takes away.
	adopt(ctx context.Context, queue string, cc ConsumerConfig) (added bool, err error)
	// remove deletes a queue create made; one already gone is no error.
	remove(ctx context.Context, queue string) error
	// unadopt takes away what adopt added.
	unadopt(ctx context.Context, queue string) error
}

// owned is what a driver made: queues it created, and queues it added
// something to.
type owned struct {
	mu    sync.Mutex
	steps []ownedStep
}

type ownedStep struct {
	queue   string
	created bool // the queue itself; else something adopt added to it
}

func (o *owned) add(queue string, created bool) {
	o.mu.Lock()
	o.steps = append(o.steps, ownedStep{queue, created})
	o.mu.Unlock()
}

func (o *owned) created() []string {
	o.mu.Lock()
	defer o.mu.Unlock()
	var out []string
	for _, s := range o.steps {
		if s.created {
			out = append(out, s.queue)
		}
	}
	return out
}

func (o *owned) empty() bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	return len(o.steps) == 0
}

// cleanupQueues undoes what setupQueues made, newest first; what fails to
// go stays for another try.
func cleanupQueues(ctx context.Context, ops queueOps, own *owned) error {
	own.mu.Lock()
	steps := own.steps
	own.steps = nil
	own.mu.Unlock()
	var errs []error
	var left []ownedStep
	for i := len(steps) - 1; i >= 0; i-- {
		st := steps[i]
		var err error
		if st.created {
			err = ops.remove(ctx, st.queue)
		} else {
			err = ops.unadopt(ctx, st.queue)
		}
		if err != nil {
			errs = append(errs, err)
			left = append([]ownedStep{st}, left...)
		}
	}
	own.mu.Lock()
	own.steps = append(left, own.steps...)
	own.mu.Unlock()
	return errors.Join(errs...)
}

// setupQueues applies the rules of Driver.Setup through ops.
func setupQueues(ctx context.Context, ops queueOps, own *owned, queues []string, cc ConsumerConfig, so SetupOptions) error {
	for _, q := range queues {
		st, err := ops.inspect(ctx, q)
		if err != nil {
			return err
		}
		if !st.exists {
			if err := ops.create(ctx, q, cc); err != nil {
				return err
			}
			own.add(q, true)
			continue
		}
		if !so.Reuse {
			var why string
			switch {
			case st.messages < 0:
				why = "berth-bench cannot tell whether it holds messages: " + st.unknown
			case st.messages > 0:
				why = fmt.Sprintf("it holds %d messages", st.messages)
			case st.consumers > 0:
				why = fmt.Sprintf("it has %d consumers", st.consumers)
			}
			if why != "" {
				return fmt.Errorf("%w: %s exists and %s; pick another queue prefix, or pass --reuse to run on it anyway (its messages would be consumed)", ErrQueueInUse, q, why)
			}
		}
		added, err := ops.adopt(ctx, q, cc)
		if err != nil {
			return err
		}
		if added {
			own.add(q, false)
		}
	}
	return nil
}
