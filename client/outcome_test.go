package client

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/berthmq/berth/wire"
)

// checkNotRefusal fails unless err is a connection-ended error that holds
// no *Error: only a refusal by the broker may be an *Error.
func checkNotRefusal(t *testing.T, what string, err error) {
	t.Helper()
	if !errors.Is(err, ErrClosed) {
		t.Fatalf("%s: %v, want an error wrapping ErrClosed", what, err)
	}
	var se *Error
	if errors.As(err, &se) {
		t.Fatalf("%s: %v holds an *Error (%v): reads as refused by the broker", what, err, se.Code)
	}
}

// waitHandedToWriter waits until every command issued so far was handed to
// the writer goroutine (and so may have reached the server).
func waitHandedToWriter(t *testing.T, c *Conn) {
	t.Helper()
	waitFor(t, "commands handed to the writer", func() bool {
		c.mu.Lock()
		defer c.mu.Unlock()
		return c.mu.sentBelow >= c.mu.win.next
	})
}

// TestInFlightOutcomeUnknown: commands in flight when the server shuts the
// session down (CLOSE with code shutdown) get ErrOutcomeUnknown and no
// *Error; the shutdown code is in Conn.Err only. They used to get an error
// wrapping *Error{shutdown}, which errors.As read as "refused".
func TestInFlightOutcomeUnknown(t *testing.T) {
	s := startServer(t)
	p := startProxy(t, s.ClientAddr())
	c := dialTest(t, p.addr())
	ctx := testCtx(t)
	mustDeclare(t, c, "unk", QueueOptions{})
	p.pauseUp() // what the client sends from now on never reaches the server
	const n = 50
	errs := make(chan error, n)
	for i := 0; i < n; i++ {
		if err := c.PublishAsync(ctx, "", "unk", []byte("x"), PublishOptions{}, func(err error) { errs <- err }); err != nil {
			t.Fatal(err)
		}
	}
	syncErr := make(chan error, 1)
	go func() { syncErr <- c.Publish(ctx, "", "unk", []byte("y"), PublishOptions{}) }()
	waitFor(t, "the sync publish to be out", func() bool {
		c.mu.Lock()
		defer c.mu.Unlock()
		return c.mu.win.next == c.mu.win.tail+n+1
	})
	waitHandedToWriter(t, c)
	s.Close() // sends CLOSE shutdown, which the proxy lets through
	<-c.Done()
	for i := 0; i < n; i++ {
		err := <-errs
		checkNotRefusal(t, "in-flight PublishAsync", err)
		if !errors.Is(err, ErrOutcomeUnknown) {
			t.Fatalf("in-flight PublishAsync: %v, want ErrOutcomeUnknown", err)
		}
	}
	if err := <-syncErr; !errors.Is(err, ErrOutcomeUnknown) {
		t.Fatalf("in-flight Publish: %v, want ErrOutcomeUnknown", err)
	} else {
		checkNotRefusal(t, "in-flight Publish", err)
	}
	// The reason is kept, as the broker's word about the connection.
	var se *Error
	if err := c.Err(); !errors.As(err, &se) || se.Code != wire.CodeShutdown || se.CommandID != 0 {
		t.Fatalf("Err: %v, want an *Error shutdown with command id 0", err)
	}
	// A call after the end was never sent: ErrClosed, not unknown.
	err := c.Publish(ctx, "", "unk", nil, PublishOptions{})
	checkNotRefusal(t, "Publish after the end", err)
	if errors.Is(err, ErrOutcomeUnknown) {
		t.Fatalf("Publish after the end: %v: it was never sent, the outcome is known", err)
	}
	if err := c.DeclareQueue(ctx, "x", QueueOptions{}); Code(err) != wire.CodeOK {
		t.Fatalf("DeclareQueue after the end: %v reads as refused (%v)", err, Code(err))
	}
}

// TestUnsentCommandsAreNotUnknown: when the connection dies while the
// writer is stuck on a full socket, the commands it had taken get
// ErrOutcomeUnknown and those still queued behind it plain ErrClosed: the
// latter were never sent, so they surely did not happen.
func TestUnsentCommandsAreNotUnknown(t *testing.T) {
	s := startServer(t)
	p := startProxy(t, s.ClientAddr())
	c := dialTest(t, p.addr())
	ctx := testCtx(t)
	mustDeclare(t, c, "unsent", QueueOptions{})
	p.pauseUp()
	var mu sync.Mutex
	var results []error
	done := func(err error) {
		mu.Lock()
		results = append(results, err)
		mu.Unlock()
	}
	payload := make([]byte, 60<<10)
	issued := 0
	for {
		// Loopback socket buffers hold megabytes; once they and the
		// write buffer are full, PublishAsync blocks.
		short, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
		err := c.PublishAsync(short, "", "unsent", payload, PublishOptions{}, done)
		cancel()
		if errors.Is(err, context.DeadlineExceeded) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		if issued++; issued > 2000 {
			t.Fatal("the writer never blocked")
		}
	}
	p.kill()
	<-c.Done()
	mu.Lock()
	defer mu.Unlock()
	if len(results) != issued {
		t.Fatalf("%d results for %d publishes at Done", len(results), issued)
	}
	var unknown, unsent int
	for _, err := range results {
		checkNotRefusal(t, "publish", err)
		if errors.Is(err, ErrOutcomeUnknown) {
			unknown++
		} else {
			unsent++
		}
	}
	if unknown == 0 || unsent == 0 {
		t.Fatalf("%d unknown, %d unsent of %d; want some of each", unknown, unsent, issued)
	}
}

// TestDoneAfterCallbacks: when Done is closed, every callback of the
// commands in flight has run. It used to close before they ran.
func TestDoneAfterCallbacks(t *testing.T) {
	s := startServer(t)
	p := startProxy(t, s.ClientAddr())
	c := dialTest(t, p.addr())
	ctx := testCtx(t)
	mustDeclare(t, c, "donecb", QueueOptions{})
	p.pause() // answers held: everything stays in flight
	const n = 100
	var ran atomic.Int64
	for i := 0; i < n; i++ {
		if err := c.PublishAsync(ctx, "", "donecb", []byte("x"), PublishOptions{}, func(error) {
			time.Sleep(200 * time.Microsecond)
			ran.Add(1)
		}); err != nil {
			t.Fatal(err)
		}
	}
	p.kill()
	<-c.Done()
	if got := ran.Load(); got != n {
		t.Fatalf("Done closed with %d of %d callbacks run", got, n)
	}
}

// TestNextAfterConnectionEnds: an AckExplicit consumer's buffered
// deliveries can no longer be settled once the connection ended (the
// server requeues them), so Next returns the error instead of them; an
// AckNone consumer's were settled on delivery and are still handed out.
func TestNextAfterConnectionEnds(t *testing.T) {
	s := startServer(t)
	p := startProxy(t, s.ClientAddr())
	c := dialTest(t, p.addr())
	ctx := testCtx(t)
	mustDeclare(t, c, "expl", QueueOptions{})
	mustDeclare(t, c, "none", QueueOptions{})
	const n = 5
	for i := 0; i < n; i++ {
		for _, q := range []string{"expl", "none"} {
			if err := c.Publish(ctx, "", q, []byte{byte(i)}, PublishOptions{}); err != nil {
				t.Fatal(err)
			}
		}
	}
	expl, err := c.Subscribe(ctx, "expl", SubscribeOptions{Credit: n})
	if err != nil {
		t.Fatal(err)
	}
	none, err := c.Subscribe(ctx, "none", SubscribeOptions{Credit: n, AckMode: AckNone})
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, "deliveries buffered", func() bool { return expl.Buffered() == n && none.Buffered() == n })
	p.kill()
	<-c.Done()
	if d, err := expl.Next(ctx); err == nil {
		t.Fatalf("AckExplicit Next after the connection ended returned tag %d, which can no longer be settled", d.Tag)
	} else {
		checkNotRefusal(t, "AckExplicit Next", err)
	}
	if b := expl.Buffered(); b != 0 {
		t.Fatalf("AckExplicit consumer still buffers %d", b)
	}
	for i := 0; i < n; i++ {
		d, err := none.Next(ctx)
		if err != nil || d.Payload[0] != byte(i) {
			t.Fatalf("AckNone Next %d after the end: %v %v", i, d, err)
		}
	}
	if _, err := none.Next(ctx); !errors.Is(err, ErrClosed) {
		t.Fatalf("AckNone Next past the buffer: %v", err)
	}
	// The explicit ones are back in the queue for the next session.
	c2 := dialTest(t, s.ClientAddr())
	sub, err := c2.Subscribe(ctx, "expl", SubscribeOptions{Credit: n})
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < n; i++ {
		if d := next(t, sub); d.Payload[0] != byte(i) || !d.Redelivered {
			t.Fatalf("requeued %d: payload %d redelivered %v", i, d.Payload[0], d.Redelivered)
		}
	}
}

// TestContextEndsAfterSend: a call whose context ends after its command
// went out cannot know the outcome and says so; one whose context ends
// while it waits for window space sent nothing and returns ctx's error
// alone.
func TestContextEndsAfterSend(t *testing.T) {
	s := startServer(t)
	p := startProxy(t, s.ClientAddr())
	const window = 4
	c := dialTest(t, p.addr(), Config{Window: window})
	ctx := testCtx(t)
	mustDeclare(t, c, "ctxsent", QueueOptions{})
	p.pause()
	short, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	err := c.Publish(short, "", "ctxsent", []byte("x"), PublishOptions{})
	cancel()
	if !errors.Is(err, context.DeadlineExceeded) || !errors.Is(err, ErrOutcomeUnknown) {
		t.Fatalf("Publish whose answer is held: %v, want DeadlineExceeded and ErrOutcomeUnknown", err)
	}
	for i := 1; i < window; i++ {
		if err := c.PublishAsync(ctx, "", "ctxsent", []byte("x"), PublishOptions{}, nil); err != nil {
			t.Fatal(err)
		}
	}
	short, cancel = context.WithTimeout(ctx, 50*time.Millisecond)
	err = c.Publish(short, "", "ctxsent", []byte("y"), PublishOptions{})
	cancel()
	if !errors.Is(err, context.DeadlineExceeded) || errors.Is(err, ErrOutcomeUnknown) {
		t.Fatalf("Publish on a full window: %v, want DeadlineExceeded alone", err)
	}
	p.unpause()
	if err := c.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	// The first publish did happen; the one refused a window slot did not.
	sub, err := c.Subscribe(ctx, "ctxsent", SubscribeOptions{Credit: 10, AckMode: AckNone})
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < window; i++ {
		if d := next(t, sub); string(d.Payload) != "x" {
			t.Fatalf("message %d: %q", i, d.Payload)
		}
	}
	short, cancel = context.WithTimeout(ctx, 100*time.Millisecond)
	defer cancel()
	if d, err := sub.Next(short); err == nil {
		t.Fatalf("unexpected message %q", d.Payload)
	}
}

// TestSubscribeContextEnds: a Subscribe whose context ends before the
// answer undoes the subscription itself, so its result is known: ctx's
// error, not ErrOutcomeUnknown, and no consumer is left on the server.
func TestSubscribeContextEnds(t *testing.T) {
	s := startServer(t)
	p := startProxy(t, s.ClientAddr())
	c := dialTest(t, p.addr())
	ctx := testCtx(t)
	mustDeclare(t, c, "subctx", QueueOptions{})
	p.pause()
	short, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	_, err := c.Subscribe(short, "subctx", SubscribeOptions{Credit: 1})
	cancel()
	if !errors.Is(err, context.DeadlineExceeded) || errors.Is(err, ErrOutcomeUnknown) {
		t.Fatalf("Subscribe: %v, want DeadlineExceeded alone", err)
	}
	p.unpause()
	waitFor(t, "the subscription to be undone", func() bool {
		for _, q := range s.Broker().Queues() {
			if q.Name == "subctx" {
				return q.Consumers == 0
			}
		}
		return false
	})
}
