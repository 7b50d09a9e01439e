package client

import (
	"context"
	"fmt"
	"time"

	"github.com/berthmq/berth/wire"
)

// Overflow is what a queue at its max length does with a new message.
type Overflow uint8

const (
	// OverflowRejectPublish refuses the new message: its publish fails
	// with an *Error of code resource-limit.
	OverflowRejectPublish = Overflow(wire.OverflowRejectPublish)
	// OverflowDropHead drops the oldest message (to the dead-letter
	// exchange, if any) to make room.
	OverflowDropHead = Overflow(wire.OverflowDropHead)
)

// QueueOptions are the options of DeclareQueue. Zero values mean "none" or
// "unlimited".
type QueueOptions struct {
	Durable    bool // survives a broker restart
	Exclusive  bool // only this session may use it; deleted when it ends
	AutoDelete bool // deleted when its last consumer cancels
	Passive    bool // only check that it exists (not-found otherwise)
	// NoReplicate keeps the queue on one broker. A broker running
	// replication groups refuses it (invalid) for a durable queue, which
	// it would replicate all the same (docs/PROTOCOL.md 4.1).
	NoReplicate bool

	MaxDeliveries      uint32        // dead-letter a message delivered this often
	MessageTTL         time.Duration // per-queue message TTL, whole milliseconds
	MaxLength          uint64        // messages
	MaxLengthBytes     uint64        // payload bytes
	Overflow           Overflow      // policy at MaxLength / MaxLengthBytes
	DeadLetterExchange string
	DeadLetterKey      string // "" keeps each message's routing key
	// MaxPriority makes a priority queue: a message's Priority, capped at
	// this, orders deliveries (higher first, FIFO within a priority). At
	// most 10; 0 is a plain queue. Needs a server speaking protocol 1.2.
	MaxPriority uint8
}

// wire gives the options as the protocol defines them.
func (o *QueueOptions) wire() wire.QueueOptions {
	return wire.QueueOptions{
		Durable: o.Durable, Exclusive: o.Exclusive, AutoDelete: o.AutoDelete,
		MaxDeliveries: o.MaxDeliveries, MessageTTLMs: durationMs(o.MessageTTL),
		MaxLength: o.MaxLength, MaxLengthBytes: o.MaxLengthBytes, Overflow: uint8(o.Overflow),
		DeadLetterExchange: o.DeadLetterExchange, DeadLetterKey: o.DeadLetterKey, MaxPriority: o.MaxPriority,
	}
}

// ExchangeKind is how an exchange routes.
type ExchangeKind uint8

const (
	Direct = ExchangeKind(wire.ExchangeDirect) // binding key equals routing key
	Fanout = ExchangeKind(wire.ExchangeFanout) // every bound queue
	Topic  = ExchangeKind(wire.ExchangeTopic)  // dotted words, "*" one word, "#" zero or more
)

// ExchangeOptions are the options of DeclareExchange.
type ExchangeOptions struct {
	Durable    bool
	AutoDelete bool // deleted when its last binding goes
	Passive    bool // only check that it exists
}

// QueueDeleteOptions are the options of DeleteQueue.
type QueueDeleteOptions struct {
	IfUnused bool // fail with precondition-failed if it has consumers
	IfEmpty  bool // fail with precondition-failed if it holds messages
}

// ExchangeDeleteOptions are the options of DeleteExchange.
type ExchangeDeleteOptions struct {
	IfUnused bool // fail with precondition-failed if it has bindings
}

func checkName(what, name string) error {
	if len(name) > wire.NameLenMax {
		return fmt.Errorf("%w: %s name longer than %d bytes", ErrInvalid, what, wire.NameLenMax)
	}
	return nil
}

// DeclareQueue creates queue name, or checks that it exists with the same
// options. It blocks until the server answers or ctx ends, and returns nil
// on success or an *Error (precondition-failed when the options differ,
// not-found for a passive declare of a missing queue, not-allowed for
// another session's exclusive queue).
func (c *Conn) DeclareQueue(ctx context.Context, name string, opts QueueOptions) error {
	if err := checkName("queue", name); err != nil {
		return err
	}
	if err := checkName("dead-letter exchange", opts.DeadLetterExchange); err != nil {
		return err
	}
	if len(opts.DeadLetterKey) > wire.RoutingKeyLenMax {
		return fmt.Errorf("%w: dead-letter key longer than %d bytes", ErrInvalid, wire.RoutingKeyLenMax)
	}
	if opts.Overflow > OverflowDropHead {
		return fmt.Errorf("%w: overflow policy %d", ErrInvalid, opts.Overflow)
	}
	if opts.MaxPriority > wire.PriorityMax {
		return fmt.Errorf("%w: max priority %d above %d", ErrInvalid, opts.MaxPriority, wire.PriorityMax)
	}
	if opts.MaxPriority != 0 && c.version < wire.VersionSchedule {
		return fmt.Errorf("%w: %w (max priority)", ErrInvalid, c.unsupported())
	}
	d := wire.DeclareQueue{Name: []byte(name), Options: opts.wire()}
	if opts.Passive {
		d.Flags |= wire.QueuePassive
	}
	if opts.NoReplicate {
		d.Flags |= wire.QueueNoReplicate
	}
	return c.roundTrip(ctx, cmdSpec{kind: kindResend}, func(b []byte, id uint64) []byte {
		d.CommandID = id
		return wire.AppendDeclareQueue(b, c.version, &d)
	})
}

// DeclareExchange creates exchange name of the given kind, or checks that
// it exists alike. It blocks until the server answers or ctx ends; errors
// are as for DeclareQueue. The default exchange "" cannot be declared.
func (c *Conn) DeclareExchange(ctx context.Context, name string, kind ExchangeKind, opts ExchangeOptions) error {
	if err := checkName("exchange", name); err != nil {
		return err
	}
	if kind > Topic {
		return fmt.Errorf("%w: exchange kind %d", ErrInvalid, kind)
	}
	d := wire.DeclareExchange{Name: []byte(name), Kind: uint8(kind)}
	if opts.Durable {
		d.Flags |= wire.ExchangeDurable
	}
	if opts.AutoDelete {
		d.Flags |= wire.ExchangeAutoDelete
	}
	if opts.Passive {
		d.Flags |= wire.ExchangePassive
	}
	return c.roundTrip(ctx, cmdSpec{kind: kindResend}, func(b []byte, id uint64) []byte {
		d.CommandID = id
		return wire.AppendDeclareExchange(b, c.version, &d)
	})
}

// Bind routes messages published to exchange with a matching key to queue.
// It blocks until the server answers or ctx ends; it returns an *Error
// not-found if either does not exist. Binding twice is not an error.
func (c *Conn) Bind(ctx context.Context, exchange, queue, key string) error {
	return c.bind(ctx, wire.TypeBind, exchange, queue, key)
}

// Unbind removes a binding made by Bind. It blocks like Bind; a missing
// exchange, queue or binding is an *Error not-found.
func (c *Conn) Unbind(ctx context.Context, exchange, queue, key string) error {
	return c.bind(ctx, wire.TypeUnbind, exchange, queue, key)
}

func (c *Conn) bind(ctx context.Context, t wire.Type, exchange, queue, key string) error {
	if err := checkName("exchange", exchange); err != nil {
		return err
	}
	if err := checkName("queue", queue); err != nil {
		return err
	}
	if len(key) > wire.RoutingKeyLenMax {
		return fmt.Errorf("%w: binding key longer than %d bytes", ErrInvalid, wire.RoutingKeyLenMax)
	}
	d := wire.Bind{Exchange: []byte(exchange), Queue: []byte(queue), Key: []byte(key)}
	return c.roundTrip(ctx, cmdSpec{kind: kindResend}, func(b []byte, id uint64) []byte {
		d.CommandID = id
		return wire.AppendBind(b, c.version, t, &d)
	})
}

// DeleteQueue deletes queue name and the messages in it. It blocks until
// the server answers or ctx ends; it returns an *Error not-found if the
// queue does not exist, precondition-failed if an If* option forbids it.
func (c *Conn) DeleteQueue(ctx context.Context, name string, opts QueueDeleteOptions) error {
	var flags uint16
	if opts.IfUnused {
		flags |= wire.DeleteIfUnused
	}
	if opts.IfEmpty {
		flags |= wire.DeleteIfEmpty
	}
	return c.delete(ctx, wire.DeleteQueue, "queue", name, flags)
}

// DeleteExchange deletes exchange name and its bindings. It blocks like
// DeleteQueue, with the same errors.
func (c *Conn) DeleteExchange(ctx context.Context, name string, opts ExchangeDeleteOptions) error {
	var flags uint16
	if opts.IfUnused {
		flags |= wire.DeleteIfUnused
	}
	return c.delete(ctx, wire.DeleteExchange, "exchange", name, flags)
}

func (c *Conn) delete(ctx context.Context, what uint8, kind, name string, flags uint16) error {
	if err := checkName(kind, name); err != nil {
		return err
	}
	d := wire.Delete{What: what, Flags: flags, Name: []byte(name)}
	return c.roundTrip(ctx, cmdSpec{}, func(b []byte, id uint64) []byte {
		d.CommandID = id
		return wire.AppendDelete(b, c.version, &d)
	})
}

// Purge removes every ready message of queue; acquired messages stay. It
// blocks until the server answers or ctx ends; a missing queue is an
// *Error not-found.
func (c *Conn) Purge(ctx context.Context, queue string) error {
	if err := checkName("queue", queue); err != nil {
		return err
	}
	return c.roundTrip(ctx, cmdSpec{}, func(b []byte, id uint64) []byte {
		return wire.AppendPurge(b, c.version, id, queue)
	})
}
