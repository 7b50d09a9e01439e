package client

import (
	"context"
	crand "crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"slices"
	"sync"
	"time"

	"github.com/berthmq/berth/wire"
)

// ReconnectPolicy is how a Conn dials again when its connection breaks
// (Config.Reconnect). The zero value is usable.
type ReconnectPolicy struct {
	// DelayMin is the wait after the first round of dials fails (the first
	// round starts at once); it doubles after each failed round up to
	// DelayMax. Each wait is drawn uniformly from [d/2, d] so that many
	// clients of a dead broker do not dial in step. Defaults 50 ms and
	// 2 s.
	DelayMin, DelayMax time.Duration
	// MaxAttempts bounds the rounds (each dials every known address once);
	// 0 sets no bound by count.
	MaxAttempts int
	// MaxTime bounds the time from the break to giving up; 0 sets none,
	// unless MaxAttempts is 0 too: then it is 30 s, so that a Conn always
	// gives up in the end.
	MaxTime time.Duration
	// OnEvent, if set, is told when the connection breaks, when a new one
	// is up, and when the Conn gives up. It runs on the Conn's reconnect
	// goroutine, which does nothing else meanwhile: it must not wait for
	// the Conn (a Publish from it would wait for the reconnect it holds
	// up); hand such work to another goroutine.
	OnEvent func(Event)
	// NoProducerID sends publishes without a producer id. Resent
	// publishes may then be enqueued twice (at-least-once), as with a
	// broker that speaks protocol 1.1 or older.
	NoProducerID bool
	// ResubscribeNotFound is how long a consumer subscribed again after a
	// reconnect keeps trying when the new broker answers not-found: a
	// cluster broker learns a queue declared through another broker
	// within one pass of its wiring sync (tens of milliseconds on a small
	// cluster), so a client that fails over just after a declare can ask
	// before it knows. Default 5 s, and never past MaxTime; negative: the
	// consumer ends at the first not-found.
	ResubscribeNotFound time.Duration
}

const (
	reconnectDelayMinDefault   = 50 * time.Millisecond
	reconnectDelayMaxDefault   = 2 * time.Second
	reconnectTimeDefault       = 30 * time.Second
	resubscribeNotFoundDefault = 5 * time.Second
)

func (p *ReconnectPolicy) withDefaults() (ReconnectPolicy, error) {
	q := *p
	if q.DelayMin < 0 || q.DelayMax < 0 || q.MaxAttempts < 0 || q.MaxTime < 0 {
		return q, fmt.Errorf("%w: negative reconnect bound", ErrInvalid)
	}
	if q.DelayMin == 0 {
		q.DelayMin = reconnectDelayMinDefault
	}
	if q.DelayMax == 0 {
		q.DelayMax = max(reconnectDelayMaxDefault, q.DelayMin)
	}
	if q.DelayMax < q.DelayMin {
		return q, fmt.Errorf("%w: reconnect DelayMax %v below DelayMin %v", ErrInvalid, q.DelayMax, q.DelayMin)
	}
	if q.MaxAttempts == 0 && q.MaxTime == 0 {
		q.MaxTime = reconnectTimeDefault
	}
	if q.ResubscribeNotFound == 0 {
		q.ResubscribeNotFound = resubscribeNotFoundDefault
	}
	return q, nil
}

// backoff is the wait after failed round n (from 1): DelayMin doubled n-1
// times, capped at DelayMax, then scaled into [d/2, d] by u in [0, 1).
func backoff(p *ReconnectPolicy, n int, u float64) time.Duration {
	d := p.DelayMin
	for i := 1; i < n && d < p.DelayMax; i++ {
		d *= 2
	}
	d = min(d, p.DelayMax)
	return d/2 + time.Duration(u*float64(d-d/2))
}

// EventKind is what happened to a reconnecting Conn's connection.
type EventKind uint8

const (
	// EventDisconnected: the connection broke (Err says why); the Conn
	// dials again. Commands wait meanwhile.
	EventDisconnected EventKind = iota + 1
	// EventReconnected: a new connection to Addr is up, logged in, its
	// consumers resubscribed and its unanswered commands resent.
	EventReconnected
	// EventGaveUp: the policy's bounds ran out (Err is the last dial's
	// failure) or Close was called; right after it the Conn ends as a
	// Conn without Reconnect ends when its connection fails.
	EventGaveUp
)

func (k EventKind) String() string {
	switch k {
	case EventDisconnected:
		return "disconnected"
	case EventReconnected:
		return "reconnected"
	case EventGaveUp:
		return "gave-up"
	}
	return "event(?)"
}

// Event is one report to ReconnectPolicy.OnEvent.
type Event struct {
	Kind EventKind
	// Addr is the address that broke (EventDisconnected) or that the new
	// connection went to (EventReconnected).
	Addr string
	Err  error
	// Rounds is how many rounds of dials it took (EventReconnected,
	// EventGaveUp), and Down how long the Conn was without a connection.
	Rounds int
	Down   time.Duration
	// Resent is how many commands the new connection sent again
	// (EventReconnected): those whose first answer was lost or never
	// sent. A resent publish is what a broker without producer ids may
	// enqueue twice.
	Resent int
}

// newProducerID draws a producer id: random, so that two Conns (of any
// process) do not share one, and never 0.
func newProducerID() uint64 {
	var b [8]byte
	for {
		if _, err := crand.Read(b[:]); err != nil {
			return rand.Uint64() | 1
		}
		if id := binary.BigEndian.Uint64(b[:]); id != 0 {
			return id
		}
	}
}

// ProducerID is the producer id this Conn's publishes carry, or 0 when
// they carry none (no Reconnect, NoProducerID, or a server older than
// protocol 1.2). Sequence numbers are the publishes' command ids, which a
// reconnecting Conn keeps across its connections.
func (c *Conn) ProducerID() uint64 { return c.producer }

// breakLinkLocked takes l down and starts the reconnect goroutine. c.mu
// is held. Commands stay in the window; settles built for l's deliveries
// are refused from now on (gen).
func (c *Conn) breakLinkLocked(l *link, cause error) {
	c.mu.link = nil
	c.mu.gen++
	close(l.broken)
	l.nc.Close()
	c.wakeLocked()
	c.wg.Add(1)
	go c.reconnectLoop(l, cause)
}

// reconnectLoop dials again until a connection is up or the policy gives
// up. It runs on a goroutine of its own, one at a time.
func (c *Conn) reconnectLoop(old *link, cause error) {
	defer c.wg.Done()
	// The old link's goroutines finish first: what its reader still
	// completes is not resent, and no delivery of it arrives after the
	// consumers are reset.
	old.wg.Wait()
	c.mu.Lock()
	for _, s := range c.mu.consumers {
		s.suspend()
	}
	c.mu.Unlock()
	p := c.cfg.Reconnect
	start := time.Now()
	c.emit(Event{Kind: EventDisconnected, Addr: old.addr, Err: cause})
	lastErr := cause
	rounds := 0
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		select {
		case <-c.stop:
			cancel()
		case <-ctx.Done():
		}
	}()
loop:
	for {
		rounds++
		for _, a := range c.dialOrder(old.addr) {
			if ctx.Err() != nil {
				break loop
			}
			t, leftover, err := c.redial(ctx, a)
			if err != nil {
				lastErr = fmt.Errorf("%s: %w", a, err)
				continue
			}
			if resent, ok := c.install(t, leftover); ok {
				c.emit(Event{Kind: EventReconnected, Addr: a, Rounds: rounds, Down: time.Since(start), Resent: resent})
				return
			}
			t.nc.Close()
			break loop
		}
		if p.MaxAttempts > 0 && rounds >= p.MaxAttempts {
			break
		}
		d := backoff(p, rounds, rand.Float64())
		if p.MaxTime > 0 && time.Since(start)+d > p.MaxTime {
			break
		}
		timer := time.NewTimer(d)
		select {
		case <-timer.C:
		case <-ctx.Done():
			timer.Stop()
			break loop
		}
	}
	if ctx.Err() != nil {
		lastErr = errors.New("Close was called")
	}
	// Told before the Conn ends: after Done no callback runs.
	c.emit(Event{Kind: EventGaveUp, Err: lastErr, Rounds: rounds, Down: time.Since(start)})
	c.mu.Lock()
	if c.mu.err == nil {
		c.failForGood(nil, fmt.Errorf("%w after %d rounds: %w", ErrGaveUp, rounds, lastErr))
	} else {
		c.mu.Unlock()
	}
}

func (c *Conn) emit(e Event) {
	if c.cfg.Reconnect.OnEvent != nil {
		c.cfg.Reconnect.OnEvent(e)
	}
}

// dialOrder is every address known: those the last WELCOME listed, then
// those given to Dial, each once, with the one that broke last.
func (c *Conn) dialOrder(broke string) []string {
	c.mu.Lock()
	all := slices.Concat(c.mu.addrs, c.seeds)
	c.mu.Unlock()
	out := make([]string, 0, len(all))
	for _, a := range all {
		if a != broke && !slices.Contains(out, a) {
			out = append(out, a)
		}
	}
	return append(out, broke)
}

// redial connects to addr and runs the handshake, offering only the
// version this Conn negotiated first and asking for the same frame size,
// so that what is in the window still fits. It returns the handshake's
// Conn, whose fields install adopts.
func (c *Conn) redial(ctx context.Context, addr string) (*Conn, []byte, error) {
	d := net.Dialer{Timeout: c.cfg.DialTimeout}
	nc, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, nil, err
	}
	cfg := c.cfg
	cfg.MaxFrameSize = c.frameMax
	if cfg.TLS != nil {
		if nc, err = clientTLS(ctx, cfg, nc, addr); err != nil {
			return nil, nil, err
		}
	}
	t := &Conn{nc: nc, cfg: cfg, addr: addr, start: c.start, offer: []wire.Version{c.version}}
	leftover, err := t.handshake(ctx)
	if err == nil && (t.frameMax != c.frameMax || t.creditMax < c.creditMax || t.windowMaxFromServer < uint32(c.mu.win.max)) {
		err = fmt.Errorf("%w: server limits (frame %d, credit %d, window %d) below this Conn's (%d, %d, %d)",
			ErrProtocol, t.frameMax, t.creditMax, t.windowMaxFromServer, c.frameMax, c.creditMax, c.mu.win.max)
	}
	if err != nil {
		nc.Close()
		return nil, nil, err
	}
	return t, leftover, nil
}

// install makes t's connection the Conn's, re-encodes every command
// still out for it, resubscribes the consumers and starts the goroutines.
// It reports false, doing nothing, when the Conn is closing.
func (c *Conn) install(t *Conn, leftover []byte) (resent int, ok bool) {
	c.mu.Lock()
	if c.mu.closing || c.mu.err != nil {
		c.mu.Unlock()
		return 0, false
	}
	l := &link{nc: t.nc, addr: t.addr, broken: make(chan struct{}), heartbeat: t.heartbeat}
	c.mu.addr, c.mu.serverName, c.mu.heartbeat = t.addr, t.serverName, t.heartbeat
	if len(t.addrs) > 0 {
		c.mu.addrs = t.addrs
	}
	fired, lost, resent := c.rebuildLocked()
	c.mu.link = l
	c.mu.readerExited = false
	c.mu.firing += len(fired)
	c.mu.kicked = false
	c.kickLocked()
	c.startLink(l, leftover)
	c.wakeLocked()
	c.mu.Unlock()
	for _, s := range lost {
		s.fail(fmt.Errorf("%w: no room in the window to subscribe again", ErrConnectionLost))
	}
	for _, cp := range fired {
		cp.fire()
	}
	c.fired(len(fired))
	return resent, true
}

// rebuildLocked replaces the frames waiting for the writer (those of the
// broken connection) with every command still out, in id order under its
// own id: publishes and idempotent commands again, subscribes afresh;
// cancels are done (the consumer is not resubscribed) and other commands
// fail. Then each consumer that was subscribed gets a new SUBSCRIBE. It
// returns the completions to fire, consumers that found no room, and how
// many commands it sent again. c.mu is held.
func (c *Conn) rebuildLocked() (fired []completion, lost []*Consumer, resent int) {
	c.mu.out = c.mu.out[:0]
	c.mu.pubStart, c.mu.pubCount = -1, 0
	w := &c.mu.win
	notSent := fmt.Errorf("%w: %w", ErrConnectionLost, c.callErrOr())
	var pending []*Consumer // SUBSCRIBEs sent again from the window
	for _, id := range w.outIDs(nil) {
		sl := w.lookup(id)
		var err error
		switch sl.kind {
		case kindPublish:
			c.appendPublishLocked(id, sl.exchange, sl.msg)
			sl.resent = sl.resent || id < c.mu.sentBelow
			resent++
			continue
		case kindResend:
			c.sealPublishLocked()
			c.mu.out = sl.build(c.mu.out, id)
			sl.resent = sl.resent || id < c.mu.sentBelow
			resent++
			continue
		case kindSubscribe:
			c.sealPublishLocked()
			c.mu.out = sl.cons.appendSubscribe(c.mu.out, c.version, id)
			resent++
			pending = append(pending, sl.cons)
			continue
		case kindCancel:
			err = nil
		case kindSettle:
			err = ErrStaleDelivery
		default:
			err = notSent
		}
		if err != nil && id < c.mu.sentBelow {
			err = fmt.Errorf("%w: %w", ErrOutcomeUnknown, err)
		}
		s, _ := w.take(id)
		if cp, ok := resolve(s, err); ok {
			fired = append(fired, cp)
		}
	}
	cons := make([]*Consumer, 0, len(c.mu.consumers))
	for _, s := range c.mu.consumers {
		// One whose SUBSCRIBE was out at the break (itself sent again
		// after an earlier break) was just sent again above: a second
		// would reuse its id.
		if s.resubscribe() && !slices.Contains(pending, s) {
			cons = append(cons, s)
		}
	}
	slices.SortFunc(cons, func(a, b *Consumer) int { return int(a.ID()) - int(b.ID()) })
	for _, s := range cons {
		if !w.hasRoom() {
			delete(c.mu.consumers, s.ID())
			lost = append(lost, s)
			continue
		}
		id := w.add(s.resubscribed, nil, nil)
		sl := w.at(id)
		sl.kind, sl.cons = kindSubscribe, s
		c.sealPublishLocked()
		c.mu.out = s.appendSubscribe(c.mu.out, c.version, id)
	}
	c.sealPublishLocked()
	return fired, lost, resent
}

// callErrOr is the connection's last word for commands that cannot go
// on: ErrClosed while no better reason is known.
func (c *Conn) callErrOr() error {
	if c.mu.callErr != nil {
		return c.mu.callErr
	}
	return ErrClosed
}

// appendPublishLocked adds an encoded message (AppendPublishMessage) with
// command id id to the open PUBLISH frame, or starts a new one when the
// frame is for another exchange, the ids are not consecutive, or it is
// full. c.mu is held.
func (c *Conn) appendPublishLocked(id uint64, exchange string, msg []byte) {
	if c.mu.pubStart < 0 || c.mu.pubExchange != exchange || c.mu.pubNext != id || c.mu.pubCount >= wire.BatchMax ||
		len(c.mu.out)-c.mu.pubStart+len(msg) > int(c.frameMax) {
		c.startPublishLocked(id, exchange)
	}
	c.mu.out = append(c.mu.out, msg...)
	c.mu.pubCount++
	c.mu.pubNext = id + 1
}

// startPublishLocked seals the open PUBLISH frame and opens one whose
// first message has id id. c.mu is held.
func (c *Conn) startPublishLocked(id uint64, exchange string) {
	c.sealPublishLocked()
	var start int
	if c.producer != 0 {
		c.mu.out, start = wire.AppendPublishStartProducer(c.mu.out, c.version, id, c.producer, exchange, 0)
	} else {
		c.mu.out, start = wire.AppendPublishStart(c.mu.out, c.version, id, exchange, 0)
	}
	c.mu.pubStart = start
	c.mu.pubCountOff = len(c.mu.out) - 2
	c.mu.pubExchange = exchange
	c.mu.pubNext = id
}

// linkWG is embedded in link: the reconnect goroutine waits for a broken
// link's goroutines.
type linkWG = sync.WaitGroup

// resendableLocked reports whether command id is out and would be sent
// again on a new connection. c.mu is held.
func (c *Conn) resendableLocked(id uint64) bool {
	if c.cfg.Reconnect == nil {
		return false
	}
	sl := c.mu.win.lookup(id)
	return sl != nil && (sl.kind == kindPublish || sl.kind == kindResend || sl.kind == kindSubscribe)
}
