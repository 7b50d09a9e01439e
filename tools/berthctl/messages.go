package main

// publish, consume and get: messages from the command line, through the
// broker's client port.
//
// Headers (--header k=v) travel in a message's props, which the protocol
// leaves opaque, as one JSON object of strings ({"k":"v"}). consume and
// get show props holding such an object as "headers", and any other props
// as "props_base64".

import (
	"bufio"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/berthmq/berth/client"
	"github.com/berthmq/berth/wire"
)

const (
	// bodyMax bounds what publish reads from standard input for one
	// message, and one line with --lines: no frame carries more.
	bodyMax = wire.FrameSizeMax
	// settleBatchMax bounds the delivery tags of one ACCEPT, RELEASE or
	// REJECT consume sends.
	settleBatchMax = 256
	// prefetchMax is the most credit consume asks for; the client buffers
	// at most this many messages per consumer.
	prefetchMax = 65536
)

// encodeHeaders turns KEY=VALUE pairs into the JSON object carried in
// the props, or nil for none.
func encodeHeaders(kvs []string) ([]byte, error) {
	if len(kvs) == 0 {
		return nil, nil
	}
	m := make(map[string]string, len(kvs))
	for _, kv := range kvs {
		k, v, ok := strings.Cut(kv, "=")
		if !ok || k == "" {
			return nil, usageErrorf("--header %q is not KEY=VALUE", kv)
		}
		if !utf8.ValidString(kv) {
			return nil, usageErrorf("--header %q is not UTF-8", kv)
		}
		if _, dup := m[k]; dup {
			return nil, usageErrorf("--header %q is given twice", k)
		}
		m[k] = v
	}
	b, err := json.Marshal(m) // keys sorted
	if err != nil {
		return nil, fmt.Errorf("headers: %w", err)
	}
	if len(b) > wire.PropsLenMax {
		return nil, usageErrorf("the headers take %d bytes as JSON, more than the %d a message's props hold", len(b), wire.PropsLenMax)
	}
	return b, nil
}

// decodeHeaders reads props written by encodeHeaders (or by anyone else
// who put a JSON object of strings there). Empty props are no headers.
func decodeHeaders(props []byte) (map[string]string, bool) {
	if len(props) == 0 {
		return map[string]string{}, true
	}
	if props[0] != '{' {
		return nil, false
	}
	var m map[string]string
	if err := json.Unmarshal(props, &m); err != nil || m == nil {
		return nil, false
	}
	return m, true
}

// messageSource returns a function that yields the bodies to publish,
// then io.EOF. body is the BODY argument, "-" for standard input.
func messageSource(stdin io.Reader, body string, lines bool, count int64) func() ([]byte, error) {
	if lines {
		var r io.Reader = strings.NewReader(body)
		if body == "-" {
			r = stdin
		}
		sc := bufio.NewScanner(r)
		sc.Buffer(make([]byte, 0, 64<<10), bodyMax)
		line := 0
		return func() ([]byte, error) {
			if sc.Scan() {
				line++
				return sc.Bytes(), nil
			}
			if err := sc.Err(); err != nil {
				if errors.Is(err, bufio.ErrTooLong) {
					return nil, fmt.Errorf("input line %d is longer than %d bytes", line+1, bodyMax)
				}
				return nil, fmt.Errorf("reading input: %w", err)
			}
			return nil, io.EOF
		}
	}
	var msg []byte
	loaded := body != "-"
	if loaded {
		msg = []byte(body)
	}
	var sent int64
	return func() ([]byte, error) {
		if !loaded {
			b, err := io.ReadAll(io.LimitReader(stdin, bodyMax+1))
			if err != nil {
				return nil, fmt.Errorf("reading input: %w", err)
			}
			if len(b) > bodyMax {
				return nil, fmt.Errorf("input is longer than %d bytes, more than a message can hold", bodyMax)
			}
			msg, loaded = b, true
		}
		if sent >= count {
			return nil, io.EOF
		}
		sent++
		return msg, nil
	}
}

// pubTally counts publish outcomes as their completions arrive.
type pubTally struct {
	mu       sync.Mutex
	ok       int64
	refused  int64 // the broker answered with an error
	unknown  int64 // sent, but the connection ended before the answer
	firstIdx int64 // 1-based number of the first message that failed
	firstErr error
}

func (t *pubTally) done(idx int64) func(error) {
	return func(err error) {
		t.mu.Lock()
		defer t.mu.Unlock()
		switch {
		case err == nil:
			t.ok++
			return
		case client.Code(err) != wire.CodeOK:
			t.refused++
		default:
			t.unknown++
		}
		if t.firstErr == nil || idx < t.firstIdx {
			t.firstIdx, t.firstErr = idx, err
		}
	}
}

func (t *pubTally) failed() bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.firstErr != nil
}

// report is publish's outcome: nil only when every message was sent and
// its completion arrived. flushErr is why the wait for the completions
// ended early, stopErr why sending stopped early.
func (t *pubTally) report(sent int64, target string, timeout time.Duration, flushErr, stopErr error) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	missing := sent - t.ok - t.refused - t.unknown
	if t.firstErr == nil && missing == 0 && flushErr == nil && stopErr == nil {
		return nil
	}
	if sent == 0 && t.firstErr == nil && flushErr == nil {
		// Nothing went out: say why alone, not "0 of 0 messages".
		return fmt.Errorf("nothing published to %s: %w", target, stopErr)
	}
	var b strings.Builder
	fmt.Fprintf(&b, "%d of %d messages sent to %s published", t.ok, sent, target)
	if t.refused > 0 {
		fmt.Fprintf(&b, "; %d refused by the broker", t.refused)
	}
	if t.unknown > 0 {
		fmt.Fprintf(&b, "; %d with unknown outcome (the connection ended before their answer)", t.unknown)
	}
	if missing > 0 {
		fmt.Fprintf(&b, "; %d unanswered within %v, outcome unknown", missing, timeout)
		if flushErr != nil {
			fmt.Fprintf(&b, " (%v)", flushErr)
		}
	}
	if t.firstErr != nil {
		fmt.Fprintf(&b, "; the first failure, message %d: %v", t.firstIdx, t.firstErr)
	}
	if stopErr != nil {
		fmt.Fprintf(&b, "; sending stopped: %v", stopErr)
	}
	return errors.New(b.String())
}

func publishCmd(fs *flag.FlagSet) func(context.Context, *env, []string) error {
	exchange := fs.String("exchange", "", "publish to exchange `EX` instead of to a queue")
	key := fs.String("key", "", "routing `KEY` for --exchange")
	persistent := fs.Bool("persistent", false, "persistent messages: on a durable queue, journalled, and completed only once durable")
	ttl := fs.Duration("ttl", 0, "per-message TTL (whole milliseconds); 0 = none")
	priority := fs.Uint("priority", 0, "message priority `P` (0 to 255) for a queue declared with --max-priority")
	delay := fs.Duration("delay", 0, "deliver no earlier than this long after sending; 0 = at once")
	deliverAt := fs.String("deliver-at", "", "deliver no earlier than `TIME` (RFC 3339, e.g. 2026-12-01T08:00:00Z)")
	lines := fs.Bool("lines", false, "send each line of the body as a message of its own")
	count := fs.Int64("count", 1, "send the message `N` times")
	rate := fs.Float64("rate", 0, "send at most `R` messages per second; 0 = as fast as the broker completes them")
	var headers []string
	fs.Func("header", "message header `KEY=VALUE`; repeat for more (carried in the props as a JSON object)", func(s string) error {
		headers = append(headers, s)
		return nil
	})
	return func(ctx context.Context, e *env, args []string) error {
		set := map[string]bool{}
		fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
		var exch, rkey, target, body string
		if set["exchange"] {
			if *exchange == "" {
				return usageErrorf("--exchange needs a name; to publish to a queue, name the queue instead")
			}
			if len(args) != 1 {
				return usageErrorf("publish --exchange EX takes one argument, the BODY (or - for standard input), got %d", len(args))
			}
			exch, rkey, body = *exchange, *key, args[0]
			target = fmt.Sprintf("exchange %s with key %q", exch, rkey)
		} else {
			if set["key"] {
				return usageErrorf("--key goes with --exchange; to publish to a queue, name it")
			}
			if len(args) != 2 {
				return usageErrorf("publish takes QUEUE and BODY (or - for standard input), got %d arguments", len(args))
			}
			if args[0] == "" {
				return usageErrorf("the queue name is empty")
			}
			rkey, body, target = args[0], args[1], "queue "+args[0]
		}
		if *count < 1 {
			return usageErrorf("--count must be at least 1, got %d", *count)
		}
		if *lines && set["count"] {
			return usageErrorf("--count and --lines do not combine: with --lines each line is sent once")
		}
		if *rate < 0 || math.IsNaN(*rate) || math.IsInf(*rate, 0) {
			return usageErrorf("--rate must be a positive number of messages per second (0: no limit), got %v", *rate)
		}
		if *ttl < 0 {
			return usageErrorf("--ttl must not be negative, got %v", *ttl)
		}
		if *priority > 255 {
			return usageErrorf("--priority must be 0 to 255, got %d", *priority)
		}
		if *delay < 0 {
			return usageErrorf("--delay must not be negative, got %v", *delay)
		}
		var at time.Time
		if *deliverAt != "" {
			if set["delay"] {
				return usageErrorf("--delay and --deliver-at do not combine: give one")
			}
			var err error
			if at, err = time.Parse(time.RFC3339Nano, *deliverAt); err != nil {
				return usageErrorf("--deliver-at must be an RFC 3339 time such as 2026-12-01T08:00:00Z, got %q", *deliverAt)
			}
		}
		props, err := encodeHeaders(headers)
		if err != nil {
			return err
		}
		opts := client.PublishOptions{Persistent: *persistent, TTL: *ttl, Props: props,
			Priority: uint8(*priority), Delay: *delay, DeliverAt: at}
		next := messageSource(e.stdin, body, *lines, *count)

		var tally pubTally
		var sent int64
		var stopErr, flushErr error
		err = withBroker(ctx, e, func(c *client.Conn) error {
			var start time.Time
			for {
				msg, err := next()
				if err == io.EOF {
					break
				}
				if err != nil {
					stopErr = err
					break
				}
				if *rate > 0 {
					if sent == 0 {
						start = time.Now()
					} else if d := time.Until(start.Add(time.Duration(float64(sent) / *rate * float64(time.Second)))); d > 0 {
						t := time.NewTimer(d)
						select {
						case <-t.C:
						case <-ctx.Done():
							t.Stop()
						}
					}
				}
				if ctx.Err() != nil {
					stopErr = errors.New("interrupted")
					break
				}
				if tally.failed() {
					break // one failed: send no more
				}
				pctx, cancel := context.WithTimeout(ctx, e.timeout)
				err = c.PublishAsync(pctx, exch, rkey, msg, opts, tally.done(sent+1))
				cancel()
				if err != nil {
					if errors.Is(err, context.DeadlineExceeded) {
						err = fmt.Errorf("the window of uncompleted publishes stayed full for %v", e.timeout)
					}
					stopErr = fmt.Errorf("message %d not sent: %w", sent+1, err)
					break
				}
				sent++
			}
			// A publish counts as done only once its completion came.
			fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), e.timeout)
			defer cancel()
			flushErr = c.Flush(fctx)
			return nil
		})
		if err != nil && sent == 0 {
			return err // no session, or it failed before anything was sent
		}
		if rerr := tally.report(sent, target, e.timeout, flushErr, stopErr); rerr != nil {
			return rerr
		}
		if err != nil {
			return err
		}
		ok := sent
		fields := map[string]any{"published": ok}
		if exch != "" {
			fields["exchange"], fields["key"] = exch, rkey
		} else {
			fields["queue"] = rkey
		}
		noun := "messages"
		if ok == 1 {
			noun = "message"
		}
		return done(e, "publish", fields, fmt.Sprintf("%d %s published to %s", ok, noun, target))
	}
}

// ackModes are the values of --ack.
var ackModes = []string{"accept", "release", "reject", "none"}

func checkAck(s string) error {
	for _, m := range ackModes {
		if s == m {
			return nil
		}
	}
	return usageErrorf("--ack must be one of %s, got %q", strings.Join(ackModes, ", "), s)
}

// deliveryJSON is one message as consume --json and get --json print it,
// one object per line.
type deliveryJSON struct {
	Queue         string            `json:"queue"`
	Exchange      string            `json:"exchange"`
	RoutingKey    string            `json:"routing_key"`
	Tag           uint64            `json:"tag"`
	DeliveryCount uint32            `json:"delivery_count"`
	Redelivered   bool              `json:"redelivered"`
	Persistent    bool              `json:"persistent"`
	Headers       map[string]string `json:"headers"`
	PropsBase64   string            `json:"props_base64,omitempty"`
	Body          *string           `json:"body,omitempty"`
	BodyBase64    string            `json:"body_base64,omitempty"`
}

func toJSON(queue string, d *client.Delivery) deliveryJSON {
	j := deliveryJSON{Queue: queue, Exchange: d.Exchange, RoutingKey: d.RoutingKey, Tag: d.Tag,
		DeliveryCount: d.DeliveryCount, Redelivered: d.Redelivered, Persistent: d.Persistent}
	if h, ok := decodeHeaders(d.Props); ok {
		j.Headers = h
	} else {
		j.Headers = map[string]string{}
		j.PropsBase64 = base64.StdEncoding.EncodeToString(d.Props)
	}
	if utf8.Valid(d.Payload) {
		s := string(d.Payload)
		j.Body = &s
	} else {
		j.BodyBase64 = base64.StdEncoding.EncodeToString(d.Payload)
	}
	return j
}

// printer writes deliveries: each body and a newline, or with --json one
// object per line.
type printer struct {
	w     *bufio.Writer
	enc   *json.Encoder
	queue string
}

func newPrinter(e *env, queue string) *printer {
	p := &printer{w: bufio.NewWriter(e.stdout), queue: queue}
	if e.json {
		p.enc = json.NewEncoder(p.w)
		p.enc.SetEscapeHTML(false)
	}
	return p
}

func (p *printer) print(d *client.Delivery) error {
	if p.enc != nil {
		if err := p.enc.Encode(toJSON(p.queue, d)); err != nil {
			return fmt.Errorf("output: %w", err)
		}
		return nil
	}
	p.w.Write(d.Payload)
	if err := p.w.WriteByte('\n'); err != nil {
		return fmt.Errorf("output: %w", err)
	}
	return nil
}

func (p *printer) flush() error {
	if err := p.w.Flush(); err != nil {
		return fmt.Errorf("output: %w", err)
	}
	return nil
}

// settler sends settles without waiting for each; the first refusal or
// lost answer is kept, and Conn.Flush waits for all of them.
type settler struct {
	sub     *client.Consumer
	timeout time.Duration
	mu      sync.Mutex
	err     error
}

func (s *settler) failed() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.err
}

func (s *settler) send(ctx context.Context, how string, tags []uint64) error {
	fn := s.sub.AcceptAsync
	switch how {
	case "release":
		fn = s.sub.ReleaseAsync
	case "reject":
		fn = s.sub.RejectAsync
	}
	for len(tags) > 0 {
		chunk := tags[:min(len(tags), settleBatchMax)]
		n := len(chunk)
		tctx, cancel := context.WithTimeout(ctx, s.timeout)
		err := fn(tctx, chunk, func(err error) {
			if err == nil {
				return
			}
			s.mu.Lock()
			if s.err == nil {
				s.err = fmt.Errorf("%s of %d messages: %w", how, n, err)
			}
			s.mu.Unlock()
		})
		cancel()
		if err != nil {
			return fmt.Errorf("%s of %d messages not sent: %w", how, n, err)
		}
		tags = tags[n:]
	}
	return nil
}

// consumeOpts are what consume and get share.
type consumeOpts struct {
	queue    string
	count    int64 // 0: no limit
	ack      string
	wait     time.Duration // 0: wait forever for the next message
	prefetch int
}

// consumeMessages subscribes to o.queue, prints each message and settles
// it by o.ack, and returns how many it printed. It ends after o.count
// messages, when nothing arrived for o.wait, or when ctx ends (an
// interrupt: a normal end). It never lets the broker send more than
// o.count messages, so a consume of N leaves every other message as it
// was.
//
// Accepts and rejects go out in batches once the messages are printed.
// Releases are held until the end: released at once, a message would come
// straight back to this consumer. Before it returns, the consumer is
// cancelled, what it was sent but did not print is released (with ack
// none, printed: the broker already forgot it), and every settle's answer
// is awaited.
func consumeMessages(ctx context.Context, e *env, c *client.Conn, o consumeOpts) (int64, error) {
	mode := client.AckExplicit
	if o.ack == "none" {
		mode = client.AckNone
	}
	credit := int64(min(uint32(o.prefetch), c.CreditMax()))
	if o.count > 0 {
		credit = min(credit, o.count)
	}
	sctx, cancel := context.WithTimeout(ctx, e.timeout)
	sub, err := c.Subscribe(sctx, o.queue, client.SubscribeOptions{Credit: uint32(credit), AckMode: mode})
	cancel()
	if err != nil {
		return 0, fmt.Errorf("subscribe to %s: %w", o.queue, err)
	}
	out := newPrinter(e, o.queue)
	st := &settler{sub: sub, timeout: e.timeout}
	granted, owed := credit, int64(0)
	grantAt := max(1, credit/4)
	var pending, held []uint64 // to accept or reject; to release at the end
	var n int64
	var loopErr error
	sendPending := func() error {
		if len(pending) == 0 {
			return nil
		}
		// Printed before settled: a message is never gone unseen.
		if err := out.flush(); err != nil {
			return err
		}
		err := st.send(ctx, o.ack, pending)
		pending = pending[:0]
		return err
	}
	for o.count == 0 || n < o.count {
		if err := st.failed(); err != nil {
			loopErr = err
			break
		}
		if sub.Buffered() == 0 {
			// About to wait: show what was printed, settle what was handled.
			if err := out.flush(); err != nil {
				loopErr = err
				break
			}
			if err := sendPending(); err != nil {
				loopErr = err
				break
			}
		}
		nctx, ncancel := ctx, context.CancelFunc(func() {})
		if o.wait > 0 {
			nctx, ncancel = context.WithTimeout(ctx, o.wait)
		}
		d, err := sub.Next(nctx)
		ncancel()
		if err != nil {
			if ctx.Err() != nil || (o.wait > 0 && errors.Is(err, context.DeadlineExceeded)) {
				break // interrupted, or idle for --wait: the end
			}
			loopErr = fmt.Errorf("receive: %w", err)
			break
		}
		n++
		if err := out.print(d); err != nil {
			loopErr = err
			break
		}
		switch o.ack {
		case "accept", "reject":
			pending = append(pending, d.Tag)
			if len(pending) >= settleBatchMax {
				if err := sendPending(); err != nil {
					loopErr = err
				}
			}
		case "release":
			held = append(held, d.Tag)
		}
		if loopErr != nil {
			break
		}
		// Credit back for what was handled, never past --count in all.
		owed++
		if (o.count == 0 || granted < o.count) && (owed >= grantAt || sub.Buffered() == 0) {
			g := owed
			if o.count > 0 {
				g = min(g, o.count-granted)
			}
			added, err := sub.Credit(uint32(g))
			if err != nil {
				loopErr = fmt.Errorf("credit: %w", err)
				break
			}
			granted += int64(added)
			owed = 0
		}
	}

	// The end: no more deliveries, then settle everything, then wait.
	fctx, fcancel := context.WithTimeout(context.WithoutCancel(ctx), e.timeout)
	defer fcancel()
	errs := []error{loopErr}
	if err := sub.Cancel(fctx); err != nil {
		errs = append(errs, fmt.Errorf("cancel: %w", err))
	} else {
		// Delivered after the last message printed; bounded by the
		// buffer, which only shrinks once cancelled.
		for sub.Buffered() > 0 {
			d, err := sub.Next(fctx)
			if err != nil {
				break
			}
			if mode == client.AckNone {
				n++
				if err := out.print(d); err != nil {
					errs = append(errs, err)
					break
				}
				continue
			}
			held = append(held, d.Tag)
		}
	}
	errs = append(errs, out.flush())
	if mode == client.AckExplicit {
		if len(pending) > 0 {
			errs = append(errs, st.send(fctx, o.ack, pending))
		}
		if len(held) > 0 {
			errs = append(errs, st.send(fctx, "release", held))
		}
		if err := c.Flush(fctx); err != nil {
			errs = append(errs, fmt.Errorf("waiting for the broker to confirm the settles: %w", err))
		}
		errs = append(errs, st.failed())
	}
	return n, errors.Join(errs...)
}

func consumeCmd(fs *flag.FlagSet) func(context.Context, *env, []string) error {
	count := fs.Int64("count", 0, "stop after `N` messages; 0 = until interrupted (or --wait)")
	ack := fs.String("ack", "accept", "how each printed message is settled: accept (taken off the queue), release (back to the queue at its place, marked redelivered; held until the end so each is printed once), reject (dead-lettered, or dropped without a dead-letter exchange) or none (taken off the queue when sent: at-most-once)")
	wait := fs.Duration("wait", 0, "stop once no message arrived for this long; 0 = wait for messages until interrupted")
	prefetch := fs.Int("prefetch", 100, "messages the broker may send ahead of those printed")
	return func(ctx context.Context, e *env, args []string) error {
		queue, err := oneName("QUEUE", args)
		if err != nil {
			return err
		}
		if err := checkAck(*ack); err != nil {
			return err
		}
		if *count < 0 {
			return usageErrorf("--count must not be negative, got %d", *count)
		}
		if *wait < 0 {
			return usageErrorf("--wait must not be negative, got %v", *wait)
		}
		if *prefetch < 1 || *prefetch > prefetchMax {
			return usageErrorf("--prefetch must be in 1..%d, got %d", prefetchMax, *prefetch)
		}
		o := consumeOpts{queue: queue, count: *count, ack: *ack, wait: *wait, prefetch: *prefetch}
		return withBroker(ctx, e, func(c *client.Conn) error {
			_, err := consumeMessages(ctx, e, c, o)
			return err
		})
	}
}

func getCmd(fs *flag.FlagSet) func(context.Context, *env, []string) error {
	ack := fs.String("ack", "release", "what becomes of the message: release (the default: back to the queue at its place, marked redelivered, its delivery count one up; a queue with --max-deliveries dead-letters it at the limit), accept (taken off the queue), reject (dead-lettered, or dropped) or none (taken off the queue)")
	wait := fs.Duration("wait", time.Second, "how long to wait for a message before reporting the queue empty")
	return func(ctx context.Context, e *env, args []string) error {
		queue, err := oneName("QUEUE", args)
		if err != nil {
			return err
		}
		if err := checkAck(*ack); err != nil {
			return err
		}
		if *wait <= 0 {
			return usageErrorf("--wait must be positive, got %v", *wait)
		}
		o := consumeOpts{queue: queue, count: 1, ack: *ack, wait: *wait, prefetch: 1}
		return withBroker(ctx, e, func(c *client.Conn) error {
			n, err := consumeMessages(ctx, e, c, o)
			if err == nil && n == 0 {
				if ctx.Err() != nil {
					return errors.New("interrupted")
				}
				return fmt.Errorf("queue %s: no message ready within %v", queue, *wait)
			}
			return err
		})
	}
}
