package client

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"github.com/berthmq/berth/wire"
)

// AckMode is how a consumer settles its messages.
type AckMode uint8

const (
	// AckExplicit keeps each delivered message acquired until the client
	// accepts, releases or rejects it (or the session ends: then it is
	// requeued).
	AckExplicit = AckMode(wire.AckExplicit)
	// AckNone settles messages on delivery: at-most-once.
	AckNone = AckMode(wire.AckNone)
)

// SubscribeOptions are the options of Subscribe.
type SubscribeOptions struct {
	// Credit is the initial credit: how many messages the server may send
	// before it is given more. 0 starts with none (grant it with
	// Consumer.Credit). It is lowered to the server's CreditMax and to
	// 65536, the most a consumer buffers.
	Credit uint32
	// AckMode is AckExplicit (the zero value) or AckNone.
	AckMode AckMode
	// Exclusive asks to be the queue's only consumer.
	Exclusive bool
	// AutoCredit gives credit back as messages are settled (for AckNone: as
	// Next hands them out), like a prefetch count: at most Credit messages
	// are then delivered and unsettled at any time. Credit goes back in
	// batches of a quarter of Credit, or at once when the buffer runs dry.
	AutoCredit bool
}

// Delivery is one delivered message. Its fields are the caller's to keep;
// Payload and Props may share a backing array with other messages of the
// same batch, so slicing beyond their length is not allowed.
type Delivery struct {
	Tag           uint64 // unique and increasing per consumer (across reconnects too), from 1
	DeliveryCount uint32 // earlier deliveries of this message
	Redelivered   bool
	Persistent    bool // published persistent
	Exchange      string
	RoutingKey    string
	Props         []byte
	Payload       []byte

	consumer *Consumer
}

// Consumer receives the messages of one subscription. Its methods are safe
// for concurrent use.
type Consumer struct {
	c *Conn
	// idv is the consumer id on the wire. A SUBSCRIBE sent again on the
	// same connection after a refusal takes a new one (a session never
	// reuses an id), so it is read with ID().
	idv        atomic.Uint32
	queue      string
	ackMode    AckMode
	autoCredit bool
	exclusive  bool
	grantAt    uint32 // AutoCredit: credit owed is sent once it reaches this

	mu struct {
		sync.Mutex
		q         []*Delivery // buffered deliveries; live ones are q[head:]
		head      int
		credit    uint32              // the server's credit as far as we know; never below it
		unsettled map[uint64]struct{} // AutoCredit with AckExplicit: delivered, not yet settled
		grant     uint32              // AutoCredit: credit owed to the server
		cancelled bool                // CANCEL completed: nothing more will arrive
		err       error
		// ended is why the broker ended the consumer (CANCELLED, a Conn
		// without Reconnect), wrapping ErrConsumerEnded; err holds it too.
		ended  error
		waitCh chan struct{}
		// A reconnecting Conn (reconnect.go): subscribed once its first
		// SUBSCRIBE completed, cancelling once Cancel sent CANCEL (it is
		// not subscribed again). The server numbers each subscription's
		// tags from 1; Delivery.Tag adds tagBase, the highest tag of the
		// connections before, so tags never repeat and a settle can tell
		// a stale one. creditGen grows with each SUBSCRIBE sent again: a
		// CREDIT counted in that SUBSCRIBE's credit is not sent.
		subscribed, cancelling bool
		tagBase, maxTag        uint64
		creditGen              uint64
		// retrying: a SUBSCRIBE sent again was refused as unavailable
		// (its group has no master yet, or this broker does not know it
		// yet) or not-found (this broker has not learned the queue yet),
		// and a timer sends it again; a reconnect meanwhile leaves
		// it to the timer. retries counts those refusals in a row since
		// retryStart.
		retrying   bool
		retries    int
		retryStart time.Time
		// queueGone: the broker ended the consumer because its queue
		// was deleted (CANCELLED not-found); a not-found answer to the
		// SUBSCRIBE sent again is then final, not a broker that has not
		// learned the queue yet.
		queueGone bool
	}
}

// Subscribe starts a consumer on queue and blocks until the server
// confirmed it or ctx ends. It returns an *Error not-found if the queue
// does not exist, not-allowed if it is another session's exclusive queue
// or already has an exclusive consumer. If ctx ends first it returns
// ctx.Err() and the subscription, if the server made it, is cancelled in
// the background. A reconnecting Conn (Config.Reconnect) subscribes again
// while the broker answers unavailable (a replicated queue's group is
// electing a master, or the broker has not learned the new one yet),
// waiting as between reconnect rounds and within the policy's bounds; a
// consumer subscribed again after a reconnect does the same.
func (c *Conn) Subscribe(ctx context.Context, queue string, opts SubscribeOptions) (*Consumer, error) {
	s, err := c.subscribe(ctx, queue, opts)
	p := c.cfg.Reconnect
	if p == nil {
		return s, err
	}
	// A reconnecting Conn tries again while the broker answers
	// unavailable (the queue's group is electing a master, or this broker
	// does not know the new one yet), within the policy's bounds and ctx.
	start := time.Now()
	for n := 1; Code(err) == wire.CodeUnavailable; n++ {
		if (p.MaxAttempts > 0 && n > p.MaxAttempts) || (p.MaxTime > 0 && time.Since(start) > p.MaxTime) {
			break
		}
		t := time.NewTimer(backoff(p, n, rand.Float64()))
		select {
		case <-ctx.Done():
			t.Stop()
			return nil, err
		case <-t.C:
		}
		s, err = c.subscribe(ctx, queue, opts)
	}
	return s, err
}

func (c *Conn) subscribe(ctx context.Context, queue string, opts SubscribeOptions) (*Consumer, error) {
	if err := checkName("queue", queue); err != nil {
		return nil, err
	}
	if opts.AckMode > AckNone {
		return nil, fmt.Errorf("%w: ack mode %d", ErrInvalid, opts.AckMode)
	}
	credit := min(opts.Credit, c.creditMax, consumerBufferMax)
	s := &Consumer{c: c, queue: queue, ackMode: opts.AckMode, autoCredit: opts.AutoCredit, exclusive: opts.Exclusive, grantAt: max(1, credit/4)}
	s.mu.credit = credit
	if opts.AutoCredit && opts.AckMode == AckExplicit {
		s.mu.unsettled = make(map[uint64]struct{}, credit)
	}
	c.mu.Lock()
	if c.mu.err != nil {
		err := c.mu.err
		c.mu.Unlock()
		return nil, err
	}
	if c.mu.nextCons == ^uint32(0) {
		c.mu.Unlock()
		return nil, fmt.Errorf("%w: consumer ids exhausted on this connection", ErrInvalid)
	}
	c.mu.nextCons++
	s.idv.Store(c.mu.nextCons)
	// Registered before SUBSCRIBE goes out: deliveries may precede its
	// completion.
	c.mu.consumers[s.ID()] = s
	c.mu.Unlock()

	d := wire.Subscribe{ConsumerID: s.ID(), Queue: []byte(queue), Credit: credit, AckMode: uint8(opts.AckMode)}
	if opts.Exclusive {
		d.Flags |= wire.SubscribeExclusive
	}
	cl := getCall()
	err := c.commandAs(ctx, cmdSpec{kind: kindSubscribe, cons: s}, func(b []byte, id uint64) []byte {
		d.CommandID = id
		return wire.AppendSubscribe(b, c.version, &d)
	}, s.resubscribed, cl, nil)
	if err != nil {
		putCall(cl)
		c.forget(s.ID())
		return nil, err
	}
	if err := c.wait(ctx, cl); err != nil {
		if ctx.Err() != nil && errors.Is(err, ctx.Err()) {
			go func() {
				cctx, cancel := context.WithTimeout(context.Background(), c.cfg.CloseTimeout)
				defer cancel()
				s.Cancel(cctx)
			}()
			// Not ErrOutcomeUnknown: whether or not the server saw the
			// SUBSCRIBE, the consumer is being undone.
			return nil, ctx.Err()
		}
		c.forget(s.ID())
		return nil, err
	}
	return s, nil
}

// resubscribed records the outcome of a SUBSCRIBE: on success the
// consumer is subscribed again after a reconnect; a SUBSCRIBE sent again
// that the new server refuses ends the consumer with its error.
func (s *Consumer) resubscribed(err error) {
	s.mu.Lock()
	again := s.mu.subscribed
	if err == nil {
		s.mu.subscribed = true
		s.mu.retrying, s.mu.retries, s.mu.queueGone = false, 0, false
	}
	var wait time.Duration
	if err != nil && again && !s.mu.cancelling {
		wait = s.retryWaitLocked(err)
	}
	s.mu.Unlock()
	if wait > 0 {
		time.AfterFunc(wait, s.subscribeAgain)
		return
	}
	if err != nil && again {
		s.c.forget(s.ID())
		s.fail(err)
	}
}

// retryWaitLocked is how long to wait before subscribing again after a
// SUBSCRIBE sent again was refused with err, or 0 not to: only a
// reconnecting Conn tries again, only after unavailable (the broker
// reconnected to does not know the group's new master yet) or, for
// ResubscribeNotFound, not-found (it has not learned the queue yet), and
// within the policy's bounds. s.mu is held.
func (s *Consumer) retryWaitLocked(err error) time.Duration {
	p := s.c.cfg.Reconnect
	if p == nil {
		return 0
	}
	code := Code(err)
	if code != wire.CodeUnavailable && (code != wire.CodeNotFound || p.ResubscribeNotFound < 0 || s.mu.queueGone) {
		return 0
	}
	if s.mu.retries == 0 {
		s.mu.retryStart = time.Now()
	}
	s.mu.retries++
	since := time.Since(s.mu.retryStart)
	if (p.MaxAttempts > 0 && s.mu.retries > p.MaxAttempts) || (p.MaxTime > 0 && since > p.MaxTime) ||
		(code == wire.CodeNotFound && since > p.ResubscribeNotFound) {
		return 0
	}
	s.mu.retrying = true
	return backoff(p, s.mu.retries, rand.Float64())
}

// subscribeAgain sends s's SUBSCRIBE again after an unavailable refusal,
// on whatever connection the Conn has by then.
func (s *Consumer) subscribeAgain() {
	s.mu.Lock()
	ok := s.mu.retrying && !s.mu.cancelling && !s.mu.cancelled
	s.mu.Unlock()
	if !ok {
		return
	}
	c := s.c
	ctx, cancel := context.WithTimeout(context.Background(), max(c.cfg.Reconnect.MaxTime, reconnectTimeDefault))
	defer cancel()
	// A new consumer id: the refused one may count as used in the
	// session (ids are never reused in one).
	c.mu.Lock()
	err := c.mu.err
	if err == nil && c.mu.nextCons == ^uint32(0) {
		err = fmt.Errorf("%w: consumer ids exhausted on this connection", ErrInvalid)
	}
	if err == nil {
		delete(c.mu.consumers, s.ID())
		c.mu.nextCons++
		s.idv.Store(c.mu.nextCons)
		c.mu.consumers[s.ID()] = s
	}
	c.mu.Unlock()
	if err == nil {
		err = c.commandAs(ctx, cmdSpec{kind: kindSubscribe, cons: s}, func(b []byte, id uint64) []byte {
			return s.appendSubscribe(b, c.version, id)
		}, s.resubscribed, nil, nil)
	}
	if err != nil {
		s.mu.Lock()
		s.mu.retrying = false
		s.mu.Unlock()
		c.forget(s.ID())
		s.fail(err)
	}
}

// resubscribe reports whether a reconnect subscribes s again: it was
// subscribed and is not being cancelled.
func (s *Consumer) resubscribe() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.mu.subscribed && !s.mu.cancelling && !s.mu.cancelled && !s.mu.retrying
}

// appendSubscribe encodes the SUBSCRIBE that (re)creates s on a new
// connection, with the credit the server owes s now. c.mu is held.
func (s *Consumer) appendSubscribe(b []byte, v wire.Version, id uint64) []byte {
	s.mu.Lock()
	s.mu.creditGen++
	credit := s.mu.credit
	s.mu.Unlock()
	d := wire.Subscribe{CommandID: id, ConsumerID: s.ID(), Queue: []byte(s.queue), Credit: credit, AckMode: uint8(s.ackMode)}
	if s.exclusive {
		d.Flags |= wire.SubscribeExclusive
	}
	return wire.AppendSubscribe(b, v, &d)
}

// suspend resets s after its connection broke, before the next one:
// an AckExplicit consumer drops what it buffered (the server requeues
// it), the credit those messages, and under AutoCredit every unsettled
// one, had used is owed again, and later tags start above every tag so
// far. c.mu is held.
func (s *Consumer) suspend() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ackMode == AckExplicit {
		dropped := len(s.mu.q) - s.mu.head
		clear(s.mu.q)
		s.mu.q = s.mu.q[:0]
		s.mu.head = 0
		if s.mu.unsettled != nil {
			dropped = len(s.mu.unsettled)
			clear(s.mu.unsettled)
		}
		s.mu.credit += uint32(dropped)
		s.mu.credit = min(s.mu.credit, s.c.creditMax, consumerBufferMax)
	}
	s.mu.tagBase = s.mu.maxTag
}

func (c *Conn) forget(id uint32) {
	c.mu.Lock()
	delete(c.mu.consumers, id)
	c.mu.Unlock()
}

// Err is why the consumer ended: the connection's error, or one wrapping
// ErrConsumerEnded and the broker's *Error when the broker ended it
// (protocol 1.3 CANCELLED) and the Conn does not reconnect. It is nil
// while the consumer lives, and after Cancel.
func (s *Consumer) Err() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.mu.err
}

// consumerEnded handles a CANCELLED for consumer id, on the reader
// goroutine. A reconnecting Conn subscribes the consumer again as after a
// reconnect: what it buffered and what was delivered and not settled is
// dropped (the broker requeues it), its later tags start above every tag
// so far, and unavailable refusals are retried with the policy's
// backoff. Otherwise the consumer ends with se. A CANCELLED for a consumer
// not subscribed (its SUBSCRIBE failed, or it is being cancelled or
// subscribed again) is ignored.
func (c *Conn) consumerEnded(id uint32, se *Error) {
	c.mu.Lock()
	s := c.mu.consumers[id]
	if s == nil {
		c.mu.Unlock()
		return
	}
	s.mu.Lock()
	live := s.mu.subscribed && !s.mu.cancelling && !s.mu.cancelled && !s.mu.retrying
	again := live && c.cfg.Reconnect != nil
	if again {
		s.mu.retrying, s.mu.retries = true, 0
		// Deleted: the SUBSCRIBE sent again finds out whether the
		// queue is back, and a not-found then ends the consumer at once.
		s.mu.queueGone = se.Code == wire.CodeNotFound
	}
	if s.mu.cancelling && !s.mu.cancelled && s.mu.ended == nil {
		// The CANCEL crossed it: that CANCEL fails, and Cancel reports
		// success, the consumer being gone either way.
		s.mu.ended = fmt.Errorf("%w: %w", ErrConsumerEnded, se)
	}
	s.mu.Unlock()
	if !live {
		c.mu.Unlock()
		return
	}
	if again {
		s.suspend()
		c.mu.Unlock()
		// Off the reader: the SUBSCRIBE may wait for room in the window,
		// which only the reader makes.
		go s.subscribeAgain()
		return
	}
	delete(c.mu.consumers, id)
	c.mu.Unlock()
	err := fmt.Errorf("%w: %w", ErrConsumerEnded, se)
	s.mu.Lock()
	s.mu.ended = err
	s.mu.Unlock()
	s.fail(err)
}

// ID is the consumer id on the wire.
func (s *Consumer) ID() uint32 { return s.idv.Load() }

// Queue is the queue this consumer reads.
func (s *Consumer) Queue() string { return s.queue }

// Buffered is how many delivered messages wait for Next.
func (s *Consumer) Buffered() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.mu.q) - s.mu.head
}

// Next returns the next delivered message, blocking until one arrives or
// ctx ends. After Cancel it returns what was delivered before, then
// ErrConsumerClosed. Messages of an AckExplicit consumer must be settled
// (Accept, Release, Reject); unsettled ones are requeued when the session
// ends.
//
// Once the connection has ended, Next of an AckExplicit consumer returns
// an error wrapping ErrClosed at once and drops what was buffered: those
// messages can no longer be settled, and the server requeues them for a
// consumer on a new connection, which gets them marked Redelivered, so
// handling them here would only do the work twice. An AckNone consumer's
// messages were settled when they were sent, so they are the program's:
// Next hands out the buffered ones first, then returns the error.
//
// Called from a callback with nothing buffered, where waiting would
// deadlock, it returns ErrCalledFromCallback.
func (s *Consumer) Next(ctx context.Context) (*Delivery, error) {
	s.mu.Lock()
	for {
		if s.mu.head < len(s.mu.q) {
			d := s.mu.q[s.mu.head]
			s.mu.q[s.mu.head] = nil
			s.mu.head++
			if s.mu.head == len(s.mu.q) {
				s.mu.q = s.mu.q[:0]
				s.mu.head = 0
			}
			var n uint32
			if s.autoCredit && s.ackMode == AckNone {
				s.mu.grant++
				n = s.takeGrantLocked()
			}
			gen := s.mu.creditGen
			s.mu.Unlock()
			s.sendCredit(n, gen)
			return d, nil
		}
		if s.mu.err != nil {
			err := s.mu.err
			s.mu.Unlock()
			return nil, err
		}
		if s.mu.cancelled {
			s.mu.Unlock()
			return nil, ErrConsumerClosed
		}
		// About to wait with nothing buffered: credit still owed must go
		// out now or the server may have nothing to send.
		n := s.takeGrantLocked()
		if n > 0 {
			gen := s.mu.creditGen
			s.mu.Unlock()
			s.sendCredit(n, gen)
			s.mu.Lock()
			continue
		}
		if s.mu.waitCh == nil {
			s.mu.waitCh = make(chan struct{})
		}
		ch := s.mu.waitCh
		s.mu.Unlock()
		if calledFromCallback() {
			return nil, ErrCalledFromCallback
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
		s.mu.Lock()
	}
}

// takeGrantLocked returns the owed credit to send now, if it is time:
// once it reached grantAt, or when nothing is buffered. s.mu must be held.
func (s *Consumer) takeGrantLocked() uint32 {
	g := s.mu.grant
	if g == 0 || (g < s.grantAt && s.mu.head < len(s.mu.q)) {
		return 0
	}
	s.mu.grant = 0
	return s.addCreditLocked(g)
}

// addCreditLocked raises our view of the server's credit by up to n,
// keeping it within CreditMax and keeping credit plus buffered messages
// within consumerBufferMax, and returns how much was added.
func (s *Consumer) addCreditLocked(n uint32) uint32 {
	buffered := uint64(len(s.mu.q) - s.mu.head)
	limit := min(uint64(s.c.creditMax), consumerBufferMax-min(buffered, consumerBufferMax))
	room := uint64(0)
	if limit > uint64(s.mu.credit) {
		room = limit - uint64(s.mu.credit)
	}
	add := uint32(min(uint64(n), room))
	s.mu.credit += add
	return add
}

// sendCredit sends a CREDIT of n, added to s.mu.credit while creditGen
// was gen; if a SUBSCRIBE sent again since carried it, it is not sent.
func (s *Consumer) sendCredit(n uint32, gen uint64) {
	if n == 0 {
		return
	}
	s.c.control(func(b []byte) []byte { return s.appendCredit(b, n, gen) })
}

// appendCredit is sendCredit's frame; c.mu is held.
func (s *Consumer) appendCredit(b []byte, n uint32, gen uint64) []byte {
	s.mu.Lock()
	stale := s.mu.creditGen != gen
	s.mu.Unlock()
	if stale {
		return b
	}
	return wire.AppendCredit(b, s.c.version, s.ID(), n)
}

// Credit lets the server send n more messages. It does not block and has
// no completion. The grant is lowered so the consumer never holds more
// than CreditMax credit, nor more than 65536 credit plus buffered
// messages; it returns how much was granted.
func (s *Consumer) Credit(n uint32) (uint32, error) {
	s.mu.Lock()
	if s.mu.err != nil {
		err := s.mu.err
		s.mu.Unlock()
		return 0, err
	}
	if s.mu.cancelled {
		s.mu.Unlock()
		return 0, ErrConsumerClosed
	}
	add := s.addCreditLocked(n)
	gen := s.mu.creditGen
	s.mu.Unlock()
	if add > 0 {
		if err := s.c.control(func(b []byte) []byte { return s.appendCredit(b, add, gen) }); err != nil {
			return 0, err
		}
	}
	return add, nil
}

// Cancel stops deliveries and blocks until the server confirmed it or ctx
// ends. Messages delivered before stay acquired and may still be settled;
// Next hands out those already buffered. Cancelling twice is a no-op.
func (s *Consumer) Cancel(ctx context.Context) error {
	s.mu.Lock()
	done := s.mu.cancelled || s.mu.ended != nil
	s.mu.Unlock()
	if done {
		return nil
	}
	c := s.c
	s.mu.Lock()
	s.mu.cancelling = true
	s.mu.Unlock()
	err := c.roundTrip(ctx, cmdSpec{kind: kindCancel}, func(b []byte, id uint64) []byte {
		return wire.AppendCancel(b, c.version, id, s.ID())
	})
	if err != nil {
		s.mu.Lock()
		ended := s.mu.ended != nil
		if !ended && !errors.Is(err, ErrOutcomeUnknown) {
			s.mu.cancelling = false // never sent
		}
		s.mu.Unlock()
		if ended {
			return nil // the broker ended it meanwhile
		}
		return err
	}
	c.forget(s.ID())
	s.mu.Lock()
	s.mu.cancelled = true
	s.wakeLocked()
	s.mu.Unlock()
	return nil
}

func (s *Consumer) wakeLocked() {
	if s.mu.waitCh != nil {
		close(s.mu.waitCh)
		s.mu.waitCh = nil
	}
}

// fail records that the connection ended. An AckExplicit consumer drops
// its buffered deliveries: they cannot be settled any more and the server
// requeues them (see Next).
func (s *Consumer) fail(err error) {
	s.mu.Lock()
	if s.mu.err == nil {
		s.mu.err = err
	}
	if s.ackMode == AckExplicit {
		clear(s.mu.q)
		s.mu.q = s.mu.q[:0]
		s.mu.head = 0
	}
	s.wakeLocked()
	s.mu.Unlock()
}

// push hands a batch of deliveries to the consumer. A batch beyond the
// credit we gave is a server bug and ends the connection.
func (s *Consumer) push(ds []Delivery) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.mu.err != nil && s.ackMode == AckExplicit {
		// The connection ended while the reader still had this batch:
		// it is requeued like the buffer that fail dropped.
		return nil
	}
	if uint64(len(ds)) > uint64(s.mu.credit) {
		return fmt.Errorf("consumer %d got %d messages with %d credit", s.ID(), len(ds), s.mu.credit)
	}
	s.mu.credit -= uint32(len(ds))
	if base := s.mu.tagBase; base > 0 {
		for i := range ds {
			ds[i].Tag += base
		}
	}
	if n := len(ds); n > 0 {
		s.mu.maxTag = max(s.mu.maxTag, ds[n-1].Tag)
	}
	if s.mu.head > 0 && len(s.mu.q)+len(ds) > cap(s.mu.q) {
		n := copy(s.mu.q, s.mu.q[s.mu.head:])
		clear(s.mu.q[n:])
		s.mu.q = s.mu.q[:n]
		s.mu.head = 0
	}
	for i := range ds {
		s.mu.q = append(s.mu.q, &ds[i])
		if s.mu.unsettled != nil {
			s.mu.unsettled[ds[i].Tag] = struct{}{}
		}
	}
	s.wakeLocked()
	return nil
}

// deliverScratch locates one message's strings in the batch's string block.
type deliverScratch struct{ ex0, ex1, key0, key1 int }

// deliver copies a DELIVER batch out of the read buffer: one block for
// payloads and props, one string for exchanges and keys (repeated ones are
// shared), one slab of Delivery structs.
func (c *Conn) deliver(body []byte) error {
	if err := wire.DecodeDeliver(body, &c.dec); err != nil {
		return fmt.Errorf("DELIVER: %w", err)
	}
	c.mu.Lock()
	s := c.mu.consumers[c.dec.ConsumerID]
	c.mu.Unlock()
	if s == nil {
		if c.cfg.ErrorHandler != nil {
			c.handleError(fmt.Errorf("%w: %d deliveries for unknown consumer %d ignored", ErrProtocol, c.dec.Count, c.dec.ConsumerID))
		}
		return nil
	}
	msgs := c.msgs[:0]
	var m wire.DeliverMessage
	nbytes := 0
	for c.dec.Next(&m) {
		msgs = append(msgs, m)
		nbytes += len(m.Props) + len(m.Payload)
	}
	c.msgs = msgs
	pos := append(c.pos[:0], make([]deliverScratch, len(msgs))...)
	c.pos = pos
	strs := c.strs[:0]
	for i := range msgs {
		if i > 0 && bytes.Equal(msgs[i].Exchange, msgs[i-1].Exchange) {
			pos[i].ex0, pos[i].ex1 = pos[i-1].ex0, pos[i-1].ex1
		} else {
			pos[i].ex0 = len(strs)
			strs = append(strs, msgs[i].Exchange...)
			pos[i].ex1 = len(strs)
		}
		if i > 0 && bytes.Equal(msgs[i].RoutingKey, msgs[i-1].RoutingKey) {
			pos[i].key0, pos[i].key1 = pos[i-1].key0, pos[i-1].key1
		} else {
			pos[i].key0 = len(strs)
			strs = append(strs, msgs[i].RoutingKey...)
			pos[i].key1 = len(strs)
		}
	}
	str := string(strs)
	c.strs = strs[:0]
	block := make([]byte, nbytes)
	slab := make([]Delivery, len(msgs))
	off := 0
	for i := range msgs {
		m := &msgs[i]
		d := &slab[i]
		d.Tag = m.Tag
		d.DeliveryCount = m.DeliveryCount
		d.Redelivered = m.Flags&wire.MsgRedelivered != 0
		d.Persistent = m.Flags&wire.MsgPersistent != 0
		d.Exchange = str[pos[i].ex0:pos[i].ex1]
		d.RoutingKey = str[pos[i].key0:pos[i].key1]
		if len(m.Props) > 0 {
			d.Props = block[off : off+len(m.Props) : off+len(m.Props)]
			off += copy(d.Props, m.Props)
		}
		d.Payload = block[off : off+len(m.Payload) : off+len(m.Payload)]
		off += copy(d.Payload, m.Payload)
		d.consumer = s
		*m = wire.DeliverMessage{}
	}
	return s.push(slab)
}

// Accept settles the message for good and blocks until the server
// completed it (its dequeue is durable) or ctx ends. Settling a message
// twice, or one of an AckNone consumer, is accepted and ignored.
func (d *Delivery) Accept(ctx context.Context) error {
	return d.consumer.settle(ctx, wire.TypeAccept, []uint64{d.Tag}, nil, true)
}

// Release puts the message back at its old place in the queue; it blocks
// like Accept.
func (d *Delivery) Release(ctx context.Context) error {
	return d.consumer.settle(ctx, wire.TypeRelease, []uint64{d.Tag}, nil, true)
}

// Reject dead-letters the message (or discards it when its queue has no
// dead-letter exchange); it blocks like Accept.
func (d *Delivery) Reject(ctx context.Context) error {
	return d.consumer.settle(ctx, wire.TypeReject, []uint64{d.Tag}, nil, true)
}

// Accept settles the messages with the given tags (any order; duplicates
// are fine) and blocks until the server completed it or ctx ends. Tags
// already settled or unknown to the server are ignored by it. It returns
// ErrNoTags for an empty list, or the first error of the server.
func (s *Consumer) Accept(ctx context.Context, tags ...uint64) error {
	return s.settle(ctx, wire.TypeAccept, tags, nil, true)
}

// Release is Accept for RELEASE: the messages go back to their places.
func (s *Consumer) Release(ctx context.Context, tags ...uint64) error {
	return s.settle(ctx, wire.TypeRelease, tags, nil, true)
}

// Reject is Accept for REJECT: the messages are dead-lettered or dropped.
func (s *Consumer) Reject(ctx context.Context, tags ...uint64) error {
	return s.settle(ctx, wire.TypeReject, tags, nil, true)
}

// AcceptAsync queues an ACCEPT of tags and returns without waiting for the
// server; it blocks only while the connection's window is full, until ctx
// ends. tags is read before it returns. done, if not nil, gets the result
// exactly once, under the same rules as PublishAsync's done.
func (s *Consumer) AcceptAsync(ctx context.Context, tags []uint64, done func(error)) error {
	return s.settle(ctx, wire.TypeAccept, tags, done, false)
}

// ReleaseAsync is AcceptAsync for RELEASE.
func (s *Consumer) ReleaseAsync(ctx context.Context, tags []uint64, done func(error)) error {
	return s.settle(ctx, wire.TypeRelease, tags, done, false)
}

// RejectAsync is AcceptAsync for REJECT.
func (s *Consumer) RejectAsync(ctx context.Context, tags []uint64, done func(error)) error {
	return s.settle(ctx, wire.TypeReject, tags, done, false)
}

func (s *Consumer) settle(ctx context.Context, t wire.Type, tags []uint64, done func(error), wait bool) error {
	if len(tags) == 0 {
		return ErrNoTags
	}
	c := s.c
	if wait && calledFromCallback() {
		return ErrCalledFromCallback
	}
	// The generation first, then the tag base: a break in between moves
	// both, and the command is then refused as stale (commandAs).
	// The consumer id with them: one the broker ended (CANCELLED) and a
	// reconnecting Conn subscribed again under a new id reads its tag
	// base first, so old tags go to the old id and are refused.
	c.mu.Lock()
	gen := c.mu.gen
	cid := s.ID()
	c.mu.Unlock()
	s.mu.Lock()
	base := s.mu.tagBase
	ended := s.mu.ended
	s.mu.Unlock()
	if ended != nil {
		return fmt.Errorf("settle: %w", ended)
	}
	if base > 0 {
		// Server tags of this subscription; tags of connections before
		// are dropped: their messages were requeued.
		live := make([]uint64, 0, len(tags))
		for _, t := range tags {
			if t > base {
				live = append(live, t-base)
			}
		}
		if len(live) == 0 {
			return ErrStaleDelivery
		}
		tags = live
	}
	spec := cmdSpec{kind: kindSettle, gen: gen}
	ranges := buildRanges(nil, tags)
	per := rangesPerFrame(c.frameMax)
	chunks := (len(ranges) + per - 1) / per
	var cl *call
	if wait {
		cl = getCall()
	}
	var grp *group
	if chunks > 1 {
		grp = &group{remaining: chunks, fn: done, call: cl}
		// Until every part is queued (or the group resolved for the parts
		// never sent), done may fire from here: Done must wait.
		c.mu.Lock()
		c.mu.submitting++
		c.mu.Unlock()
	}
	endSubmit := func() {
		if grp != nil {
			c.mu.Lock()
			c.mu.submitting--
			c.closeDoneLocked()
			c.mu.Unlock()
		}
	}
	for i := 0; i < chunks; i++ {
		part := ranges[i*per : min(len(ranges), (i+1)*per)]
		build := func(b []byte, id uint64) []byte {
			return wire.AppendSettle(b, c.version, t, id, cid, part)
		}
		var err error
		if grp != nil {
			err = c.commandAs(ctx, spec, build, nil, nil, grp)
		} else {
			err = c.commandAs(ctx, spec, build, done, cl, nil)
		}
		if err != nil {
			if i == 0 {
				endSubmit()
				if cl != nil {
					putCall(cl)
				}
				return err
			}
			// Some parts are out: the group ends when they do, carrying
			// this error for the parts never sent.
			c.mu.Lock()
			grp.remaining -= chunks - i - 1
			cp, fire := resolve(slot{grp: grp}, err)
			c.mu.Unlock()
			if fire {
				cp.fire()
			}
			endSubmit()
			return c.waitIf(ctx, cl)
		}
	}
	endSubmit()
	s.settled(tags, base)
	return c.waitIf(ctx, cl)
}

func (c *Conn) waitIf(ctx context.Context, cl *call) error {
	if cl == nil {
		return nil
	}
	return c.wait(ctx, cl)
}

// settled returns credit for tags (server tags, base below the
// consumer's) under AutoCredit.
func (s *Consumer) settled(tags []uint64, base uint64) {
	if !s.autoCredit || s.ackMode != AckExplicit {
		return
	}
	s.mu.Lock()
	for _, t := range tags {
		if _, ok := s.mu.unsettled[t+base]; ok {
			delete(s.mu.unsettled, t+base)
			s.mu.grant++
		}
	}
	n := s.takeGrantLocked()
	gen := s.mu.creditGen
	s.mu.Unlock()
	s.sendCredit(n, gen)
}
