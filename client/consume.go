package client

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/berthmq/berth/wire"
)

// ErrReject, returned by a Consume handler (alone or wrapped), dead-letters
// the message instead of releasing it for redelivery.
var ErrReject = errors.New("client: reject the delivery")

// consumeSettleBatch bounds the settles Consume gathers into one frame. It
// is far below what a frame of the smallest size holds (wire.FrameSizeMin
// fits over 200 ranges), so a batch is always one command with one answer:
// the answer OnSettled reports is that message's own.
const consumeSettleBatch = 64

// consumeUnavailableGrace is how long Consume waits, after a settle
// answered outcome-unknown (or, from a server before protocol 1.4,
// unavailable) on a reconnecting Conn, for the CANCELLED that
// says the consumer's master was lost (protocol 6.8: the broker answers
// the consumer's open commands first, then ends it). If it comes, the
// refusal is stale: the Conn subscribes the consumer again and its
// messages are delivered again unless the settle took effect. If not,
// the refusal ends Consume as any other. A not-found refusal is judged
// the same way: a settle that crossed the CANCELLED names a consumer
// the broker has forgotten, and so is an unavailable one from a server
// of 1.4 (not taken: a proxying broker that could not reach the lost
// master), as before 1.4.
const consumeUnavailableGrace = time.Second

// unavailableSettle is a settle batch answered outcome-unknown,
// unavailable or not-found, up to tag, that Consume has not yet judged.
type unavailableSettle struct {
	tag uint64
	err error
	at  time.Time
}

// Settle is how Consume settled a message.
type Settle uint8

const (
	SettleAccept  Settle = iota + 1 // the handler returned nil
	SettleRelease                   // the handler returned another error: redelivered
	SettleReject                    // the handler returned ErrReject: dead-lettered
)

func (s Settle) String() string {
	switch s {
	case SettleAccept:
		return "accept"
	case SettleRelease:
		return "release"
	case SettleReject:
		return "reject"
	}
	return "settle(?)"
}

// ConsumeOption is an option of Consume.
type ConsumeOption func(*consumeOptions)

type consumeOptions struct {
	onSettled func(d *Delivery, how Settle, err error)
}

// OnSettled has Consume call fn exactly once for each message whose
// handler returned, on an AckExplicit consumer (AckNone messages need no
// settle and are not reported), before Consume returns. err is the
// outcome of that message's settle:
//   - nil: the server confirmed it (for an accept: the message is gone for
//     good, durably if it was journalled).
//   - an error matching ErrOutcomeUnknown: the settle was sent but the
//     connection ended before the answer, or the server answered that it
//     does not know (an *Error, outcome-unknown: the consumer's master was
//     lost with it in flight); it may or may not have taken effect. If it
//     did not, the message is requeued.
//   - another *Error: the server refused it; the message stays acquired
//     and is requeued when the session ends.
//   - another error (wrapping ErrClosed, or a context's error): the settle
//     was never sent; the message is requeued when the session ends.
//
// fn runs on the connection's reader goroutine for answered settles, under
// the rules of every callback (see the package documentation: it must be
// quick, and a call from it that would wait returns
// ErrCalledFromCallback), and on Consume's goroutine for settles never
// sent. Batches are reported in the order their answers arrive.
func OnSettled(fn func(d *Delivery, how Settle, err error)) ConsumeOption {
	return func(o *consumeOptions) { o.onSettled = fn }
}

// settleBatch gathers the messages of one kind of settle.
type settleBatch struct {
	how  Settle
	fn   func(context.Context, []uint64, func(error)) error
	tags []uint64
	ds   []*Delivery // only with OnSettled
}

// Consume calls handler for each delivered message, in order, until ctx
// ends, the consumer is cancelled, the broker ends it or the connection
// fails, and returns that reason (ctx.Err(), ErrConsumerClosed, an error
// wrapping ErrConsumerEnded, or the connection's error). For an
// AckExplicit consumer it settles each message by the handler's result:
// nil accepts it, an error wrapping ErrReject rejects it (dead-letter), any
// other error releases it for redelivery. Settles go out asynchronously,
// gathered while messages are buffered, so a handler does not wait a round
// trip per message; a settle that fails (refused by the server, or lost
// with the connection) ends Consume with its error, and OnSettled tells
// which settles the server confirmed. Two exceptions on a reconnecting
// Conn, where the consumer goes on: a settle made stale by a reconnect
// (ErrStaleDelivery), and one answered outcome-unknown (unavailable, from
// a server before protocol 1.4) because the broker
// lost the consumer's master (the CANCELLED that follows within
// consumeUnavailableGrace, 1 s, makes the Conn subscribe again; the
// settle's outcome is unknown, and its message comes back if it did not
// take effect), or as not-found because it crossed that CANCELLED.
// Before it returns, Consume sends what it gathered and waits for the
// server's answers.
func (s *Consumer) Consume(ctx context.Context, handler func(*Delivery) error, opts ...ConsumeOption) error {
	var o consumeOptions
	for _, opt := range opts {
		opt(&o)
	}
	var (
		mu       sync.Mutex
		settleEr error
		unavail  []unavailableSettle // see consumeUnavailableGrace
		inflight sync.WaitGroup
	)
	reconnecting := s.c.cfg.Reconnect != nil
	// judge drops the unavailable refusals of a subscription that ended
	// since, and makes one older than the grace (or any, if final) the
	// error that ends Consume. mu is held.
	judge := func(final bool) {
		if len(unavail) == 0 {
			return
		}
		s.mu.Lock()
		base := s.mu.tagBase
		s.mu.Unlock()
		keep := unavail[:0]
		for _, u := range unavail {
			switch {
			case u.tag <= base:
				// Stale: CANCELLED came, and the consumer subscribes again.
			case final || time.Since(u.at) > consumeUnavailableGrace:
				if settleEr == nil {
					settleEr = u.err
				}
			default:
				keep = append(keep, u)
			}
		}
		unavail = keep
	}
	explicit := s.ackMode != AckNone
	batches := [3]settleBatch{
		{how: SettleAccept, fn: s.AcceptAsync},
		{how: SettleRelease, fn: s.ReleaseAsync},
		{how: SettleReject, fn: s.RejectAsync},
	}
	gathered := 0
	flush := func(ctx context.Context) error {
		for i := range batches {
			b := &batches[i]
			if len(b.tags) == 0 {
				continue
			}
			ds, how := b.ds, b.how
			last := b.tags[len(b.tags)-1] // tags grow in delivery order
			inflight.Add(1)
			err := b.fn(ctx, b.tags, func(err error) {
				// A stale settle (the connection broke, a reconnecting
				// Conn goes on) is no reason to stop: the broker requeued
				// those messages.
				if err != nil && !errors.Is(err, ErrStaleDelivery) {
					mu.Lock()
					if code := Code(err); reconnecting && (code == wire.CodeOutcomeUnknown || code == wire.CodeUnavailable || code == wire.CodeNotFound) {
						unavail = append(unavail, unavailableSettle{tag: last, err: err, at: time.Now()})
					} else if settleEr == nil {
						settleEr = err
					}
					mu.Unlock()
				}
				if o.onSettled != nil {
					for _, d := range ds {
						o.onSettled(d, how, err)
					}
				}
				inflight.Done()
			})
			if errors.Is(err, ErrStaleDelivery) {
				if o.onSettled != nil {
					for _, d := range ds {
						o.onSettled(d, how, err)
					}
				}
				inflight.Done()
				gathered -= len(b.tags)
				b.tags, b.ds = b.tags[:0], nil
				continue
			}
			if err != nil {
				// Not queued: keep the tags for finish's last flush.
				inflight.Done()
				return err
			}
			gathered -= len(b.tags)
			b.tags = b.tags[:0]
			b.ds = nil // now the callback's
		}
		return nil
	}
	finish := func(reason error) error {
		if explicit {
			// The gathered settles still go out: their messages were
			// handled. A fresh bound, since ctx may be what ended.
			fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.c.cfg.CloseTimeout)
			if err := flush(fctx); err != nil {
				if reason == nil {
					reason = err
				}
				// What flush could not queue was never sent.
				for i := range batches {
					b := &batches[i]
					if o.onSettled != nil {
						for _, d := range b.ds {
							o.onSettled(d, b.how, err)
						}
					}
					b.tags, b.ds = b.tags[:0], nil
				}
			}
			cancel()
			inflight.Wait()
		}
		mu.Lock()
		defer mu.Unlock()
		judge(true)
		if settleEr != nil {
			return settleEr
		}
		return reason
	}
	for {
		mu.Lock()
		judge(false)
		err := settleEr
		waiting := len(unavail) > 0
		mu.Unlock()
		if err != nil {
			return finish(nil)
		}
		if explicit && gathered > 0 && s.Buffered() == 0 {
			// About to wait for more: send the settles gathered so far.
			if err := flush(ctx); err != nil {
				return finish(err)
			}
		}
		nctx, ncancel := ctx, context.CancelFunc(nil)
		if waiting {
			// Wake to judge the refusals even if nothing comes.
			nctx, ncancel = context.WithTimeout(ctx, consumeUnavailableGrace/4)
		}
		d, err := s.Next(nctx)
		if ncancel != nil {
			ncancel()
			if err != nil && ctx.Err() == nil && errors.Is(err, context.DeadlineExceeded) {
				continue
			}
		}
		if err != nil {
			return finish(err)
		}
		herr := handler(d)
		if !explicit {
			continue
		}
		b := &batches[0]
		switch {
		case herr == nil:
		case errors.Is(herr, ErrReject):
			b = &batches[2]
		default:
			b = &batches[1]
		}
		b.tags = append(b.tags, d.Tag)
		if o.onSettled != nil {
			b.ds = append(b.ds, d)
		}
		gathered++
		if gathered >= consumeSettleBatch {
			if err := flush(ctx); err != nil {
				return finish(err)
			}
		}
	}
}
