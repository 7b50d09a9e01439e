package client

import (
	"context"
	"errors"
	"sync"
)

// ErrReject, returned by a Consume handler (alone or wrapped), dead-letters
// the message instead of releasing it for redelivery.
var ErrReject = errors.New("client: reject the delivery")

// consumeSettleBatch bounds the settles Consume gathers into one frame.
const consumeSettleBatch = 64

// Consume calls handler for each delivered message, in order, until ctx
// ends, the consumer is cancelled or the connection fails, and returns that
// reason (ctx.Err(), ErrConsumerClosed or the connection's error). For an
// AckExplicit consumer it settles each message by the handler's result:
// nil accepts it, an error wrapping ErrReject rejects it (dead-letter), any
// other error releases it for redelivery. Settles go out asynchronously,
// gathered while messages are buffered, so a handler does not wait a round
// trip per message; a settle the server refuses ends Consume with its
// error. Before it returns, Consume sends what it gathered and waits for
// the server's answers.
func (s *Consumer) Consume(ctx context.Context, handler func(*Delivery) error) error {
	var (
		mu       sync.Mutex
		settleEr error
		inflight sync.WaitGroup
	)
	explicit := s.ackMode != AckNone
	var accept, release, reject []uint64
	flush := func(ctx context.Context) error {
		for _, b := range []struct {
			tags *[]uint64
			fn   func(context.Context, []uint64, func(error)) error
		}{{&accept, s.AcceptAsync}, {&release, s.ReleaseAsync}, {&reject, s.RejectAsync}} {
			if len(*b.tags) == 0 {
				continue
			}
			inflight.Add(1)
			err := b.fn(ctx, *b.tags, func(err error) {
				if err != nil {
					mu.Lock()
					if settleEr == nil {
						settleEr = err
					}
					mu.Unlock()
				}
				inflight.Done()
			})
			if err != nil {
				// Not queued: keep the tags for finish's last flush.
				inflight.Done()
				return err
			}
			*b.tags = (*b.tags)[:0]
		}
		return nil
	}
	finish := func(reason error) error {
		if explicit {
			// The gathered settles still go out: their messages were
			// handled. A fresh bound, since ctx may be what ended.
			fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.c.cfg.CloseTimeout)
			if err := flush(fctx); err != nil && reason == nil {
				reason = err
			}
			cancel()
			inflight.Wait()
		}
		mu.Lock()
		defer mu.Unlock()
		if settleEr != nil {
			return settleEr
		}
		return reason
	}
	for {
		mu.Lock()
		err := settleEr
		mu.Unlock()
		if err != nil {
			return finish(nil)
		}
		if explicit && s.Buffered() == 0 {
			// About to wait for more: send the settles gathered so far.
			if err := flush(ctx); err != nil {
				return finish(err)
			}
		}
		d, err := s.Next(ctx)
		if err != nil {
			return finish(err)
		}
		herr := handler(d)
		if !explicit {
			continue
		}
		switch {
		case herr == nil:
			accept = append(accept, d.Tag)
		case errors.Is(herr, ErrReject):
			reject = append(reject, d.Tag)
		default:
			release = append(release, d.Tag)
		}
		if len(accept)+len(release)+len(reject) >= consumeSettleBatch {
			if err := flush(ctx); err != nil {
				return finish(err)
			}
		}
	}
}
