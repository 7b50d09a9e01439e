package client

import (
	"context"
	"fmt"
	"time"

	"github.com/berthmq/berth/wire"
)

// PublishOptions are per-message options.
type PublishOptions struct {
	// Persistent asks for the message to be journalled when it lands on a
	// durable queue; its publish then completes only once it is durable.
	Persistent bool
	// TTL expires the message if it is not consumed in time; 0 = none.
	// Rounded up to whole milliseconds.
	TTL time.Duration
	// Props are opaque application properties handed to consumers
	// unchanged; at most wire.PropsLenMax bytes.
	Props []byte
	// Priority orders the message on a queue declared with MaxPriority:
	// higher first, FIFO within a priority, a priority above the queue's
	// maximum counting as the maximum. Other queues ignore it.
	Priority uint8
	// DeliverAt holds the message back: no consumer gets it before then
	// (to the millisecond, rounded up). Its TTL, if any, runs from then.
	// The zero time, or a time already past, delivers at once.
	DeliverAt time.Time
	// Delay is DeliverAt as a span from the call: the later of the two
	// applies.
	Delay time.Duration
}

// WithPriority returns o with Priority set, for a one-line publish:
// c.Publish(ctx, "", "q", body, client.PublishOptions{}.WithPriority(5)).
func (o PublishOptions) WithPriority(p uint8) PublishOptions { o.Priority = p; return o }

// WithDeliverAt returns o with DeliverAt set.
func (o PublishOptions) WithDeliverAt(t time.Time) PublishOptions { o.DeliverAt = t; return o }

// WithDelay returns o with Delay set.
func (o PublishOptions) WithDelay(d time.Duration) PublishOptions { o.Delay = d; return o }

// deliverAtMs is the wire's deliver_at_ms for o, 0 for at once.
func (o *PublishOptions) deliverAtMs() uint64 {
	at := o.DeliverAt
	if o.Delay > 0 {
		if d := time.Now().Add(o.Delay); d.After(at) {
			at = d
		}
	}
	if at.IsZero() {
		return 0
	}
	ms := at.UnixMilli()
	if at.Sub(time.UnixMilli(ms)) > 0 {
		ms++ // round up: never before the time asked for
	}
	if ms <= 0 {
		return 0
	}
	return uint64(ms)
}

// unsupported is the error for a 1.2 feature on an older session.
func (c *Conn) unsupported() error {
	return fmt.Errorf("priorities and deliver-at times need protocol %v; the server speaks %v", wire.VersionSchedule, c.version)
}

// durationMs converts d to wire milliseconds, rounding a positive
// sub-millisecond duration up so it is not read as "none".
func durationMs(d time.Duration) uint64 {
	if d <= 0 {
		return 0
	}
	return uint64((d + time.Millisecond - 1) / time.Millisecond)
}

// Publish sends one message to exchange ("" is the default exchange, where
// key names the queue) and blocks until the server completed it, or until
// ctx ends. It returns nil once the message is enqueued on every queue it
// routes to (durable, if Persistent and the queue is durable), or was
// dropped because it routed nowhere; an *Error (not-found, resource-limit,
// store, ...) if the server refused it. If ctx ends while it waits for
// window space it returns ctx.Err() and the message is not sent; if ctx
// ends after the message was queued, an error wrapping both ctx.Err() and
// ErrOutcomeUnknown: the message may still be published. See the package
// documentation for the outcome of each error.
//
// payload and opts.Props are copied before Publish queues the message.
func (c *Conn) Publish(ctx context.Context, exchange, key string, payload []byte, opts PublishOptions) error {
	cl := getCall()
	if err := c.publish(ctx, exchange, key, payload, &opts, nil, cl); err != nil {
		putCall(cl)
		return err
	}
	return c.wait(ctx, cl)
}

// PublishAsync queues one message and returns without waiting for the
// server. It blocks only while the connection's window of uncompleted
// commands (or its write buffer) is full, until ctx ends; then it returns
// ctx.Err() and the message is not sent. On any other error the message is
// not sent and done is not called.
//
// payload and opts.Props are copied into the outgoing frame before
// PublishAsync returns, so the caller may reuse them at once.
//
// done, if not nil, is called exactly once with the result Publish would
// return (see the package documentation for what each result means). It
// runs on the connection's reader goroutine (or on whichever goroutine
// notices the connection fail), in completion order, before Done is
// closed. It must be quick: while it runs nothing else of this Conn
// completes. A call from it that would wait (Publish, PublishAsync on a
// full window, Flush, the declares, Close, ...) returns
// ErrCalledFromCallback instead of deadlocking. Messages may complete out
// of order when they go to different queues.
//
// With a done that does not capture per-message state, PublishAsync does
// not allocate in steady state.
func (c *Conn) PublishAsync(ctx context.Context, exchange, key string, payload []byte, opts PublishOptions, done func(error)) error {
	return c.publish(ctx, exchange, key, payload, &opts, done, nil)
}

func (c *Conn) publish(ctx context.Context, exchange, key string, payload []byte, opts *PublishOptions, fn func(error), cl *call) error {
	if len(exchange) > wire.NameLenMax {
		return fmt.Errorf("%w: exchange name longer than %d bytes", ErrInvalid, wire.NameLenMax)
	}
	if len(key) > wire.RoutingKeyLenMax {
		return fmt.Errorf("%w: routing key longer than %d bytes", ErrInvalid, wire.RoutingKeyLenMax)
	}
	if len(opts.Props) > wire.PropsLenMax {
		return fmt.Errorf("%w: props longer than %d bytes", ErrInvalid, wire.PropsLenMax)
	}
	var flags uint8
	if opts.Persistent {
		flags |= wire.MsgPersistent
	}
	deliverAt := opts.deliverAtMs()
	if opts.Priority != 0 {
		flags |= wire.MsgPriority
	}
	if deliverAt != 0 {
		flags |= wire.MsgDeliverAt
	}
	// The whole message must fit in a PUBLISH frame of its own.
	msgLen := wire.PublishMessageOverhead + len(key) + len(opts.Props) + len(payload)
	if flags&(wire.MsgPriority|wire.MsgDeliverAt) != 0 {
		if c.version < wire.VersionSchedule {
			return fmt.Errorf("%w: %w", ErrInvalid, c.unsupported())
		}
		msgLen += wire.PublishExtensionBytes
	}
	if need := wire.HeaderSize + 8 + wire.PublishProducerOverhead + 2 + len(exchange) + 2 + msgLen; need > int(c.frameMax) {
		return c.tooLarge(need, len(payload))
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	if cl != nil && calledFromCallback() {
		return ErrCalledFromCallback
	}
	ttl := durationMs(opts.TTL)

	c.mu.Lock()
	if err := c.reserveLocked(ctx, true); err != nil {
		c.mu.Unlock()
		return err
	}
	id := c.mu.win.addPublish(fn, cl)
	if c.cfg.Reconnect != nil {
		// Kept in the slot (whose buffer is reused) to be sent again if
		// the connection breaks before the answer.
		sl := c.mu.win.at(id)
		sl.kind, sl.exchange = kindPublish, exchange
		sl.msg = wire.AppendPublishMessageAt(sl.msg[:0], flags, ttl, opts.Priority, deliverAt, key, opts.Props, payload)
		c.appendPublishLocked(id, exchange, sl.msg)
		c.kickLocked()
		c.mu.Unlock()
		return nil
	}
	// Join the open PUBLISH frame when it is for the same exchange and has
	// room; ids stay consecutive because any other frame seals it.
	if c.mu.pubStart < 0 || c.mu.pubExchange != exchange || c.mu.pubNext != id || c.mu.pubCount >= wire.BatchMax ||
		len(c.mu.out)-c.mu.pubStart+msgLen > int(c.frameMax) {
		c.startPublishLocked(id, exchange)
	}
	c.mu.out = wire.AppendPublishMessageAt(c.mu.out, flags, ttl, opts.Priority, deliverAt, key, opts.Props, payload)
	c.mu.pubCount++
	c.mu.pubNext = id + 1
	c.kickLocked()
	c.mu.Unlock()
	return nil
}

// tooLarge is ErrTooLarge for a message of payload bytes whose PUBLISH
// needs a frame of need bytes, naming both sizes and what set the limit:
// the server, when it lowered what this client asked for, else this
// client's Config.MaxFrameSize.
func (c *Conn) tooLarge(need, payload int) error {
	limit := fmt.Sprintf("this client's Config.MaxFrameSize (the server allows %d or more)", c.frameMax)
	if asked := c.cfg.MaxFrameSize; c.frameMax < asked {
		limit = fmt.Sprintf("the server's limit (berthd -frame-size-max; this client asked for %d)", asked)
	}
	return fmt.Errorf("%w: the message (payload %d bytes) needs a frame of %d bytes; the negotiated maximum is %d bytes, %s",
		ErrTooLarge, payload, need, c.frameMax, limit)
}
