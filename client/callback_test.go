package client

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"strings"
	"testing"
	"time"
)

// TestCallbackWaitReturnsError: a done callback runs on the reader, so a
// call from it that waits for window space, a completion or a delivery
// would wait forever; it returns ErrCalledFromCallback instead. Calls that
// need no wait still work from a callback.
func TestCallbackWaitReturnsError(t *testing.T) {
	s := startServer(t)
	const window = 4
	c := dialTest(t, s.ClientAddr(), Config{Window: window})
	ctx := testCtx(t)
	mustDeclare(t, c, "cb", QueueOptions{})
	sub, err := c.Subscribe(ctx, "cb", SubscribeOptions{Credit: 100, AckMode: AckNone})
	if err != nil {
		t.Fatal(err)
	}
	report := make(chan string, 1)
	cb := func(err error) {
		// Bounded waits, so that a deadlocking client fails the test
		// instead of hanging it.
		wctx, cancel := context.WithTimeout(ctx, 3*time.Second)
		defer cancel()
		queued := 0
		var perr error
		for i := 0; i < 2*window; i++ {
			if perr = c.PublishAsync(wctx, "", "cb", []byte("from callback"), PublishOptions{}, nil); perr != nil {
				break
			}
			queued++
		}
		msg := ""
		if !errors.Is(perr, ErrCalledFromCallback) || queued != window {
			msg += fmt.Sprintf("PublishAsync on a full window: %v after %d queued; ", perr, queued)
		}
		if err := c.Publish(wctx, "", "cb", nil, PublishOptions{}); !errors.Is(err, ErrCalledFromCallback) {
			msg += fmt.Sprintf("Publish: %v; ", err)
		}
		if err := c.DeclareQueue(wctx, "cb2", QueueOptions{}); !errors.Is(err, ErrCalledFromCallback) {
			msg += fmt.Sprintf("DeclareQueue: %v; ", err)
		}
		if err := c.Flush(wctx); !errors.Is(err, ErrCalledFromCallback) {
			msg += fmt.Sprintf("Flush: %v; ", err)
		}
		if _, err := sub.Next(wctx); !errors.Is(err, ErrCalledFromCallback) {
			msg += fmt.Sprintf("Next: %v; ", err)
		}
		// Never blocks: fine from a callback.
		if _, err := sub.Credit(1); err != nil {
			msg += fmt.Sprintf("Credit: %v; ", err)
		}
		report <- msg
	}
	if err := c.PublishAsync(ctx, "", "cb", []byte("first"), PublishOptions{}, cb); err != nil {
		t.Fatal(err)
	}
	select {
	case msg := <-report:
		if msg != "" {
			t.Fatal(msg)
		}
	case <-ctx.Done():
		t.Fatal("callback never reported")
	}
	// What the callback queued goes through once it returned: the first
	// message and the window's worth from the callback.
	if err := c.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 1+window; i++ {
		next(t, sub)
	}
}

// TestCloseFromCallback: Close would wait for the reader running the
// callback; it returns ErrCalledFromCallback and leaves the Conn up.
func TestCloseFromCallback(t *testing.T) {
	s := startServer(t)
	c := dialTest(t, s.ClientAddr())
	ctx := testCtx(t)
	mustDeclare(t, c, "cbclose", QueueOptions{})
	got := make(chan error, 1)
	if err := c.PublishAsync(ctx, "", "cbclose", nil, PublishOptions{}, func(error) { got <- c.Close() }); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-got:
		if !errors.Is(err, ErrCalledFromCallback) {
			t.Fatalf("Close from a callback: %v", err)
		}
	case <-ctx.Done():
		t.Fatal("Close from a callback hung")
	}
	if err := c.Publish(ctx, "", "cbclose", nil, PublishOptions{}); err != nil {
		t.Fatalf("Conn after Close from a callback: %v", err)
	}
}

// TestOtherGoroutinesWaitWhileCallbackRuns: while the reader is inside a
// callback, another goroutine that meets a full window waits as usual; it
// is not taken for the callback.
func TestOtherGoroutinesWaitWhileCallbackRuns(t *testing.T) {
	s := startServer(t)
	const window = 4
	c := dialTest(t, s.ClientAddr(), Config{Window: window})
	ctx := testCtx(t)
	mustDeclare(t, c, "busy", QueueOptions{})
	inside, release := make(chan struct{}), make(chan struct{})
	if err := c.PublishAsync(ctx, "", "busy", nil, PublishOptions{}, func(error) {
		close(inside)
		<-release
	}); err != nil {
		t.Fatal(err)
	}
	<-inside
	// The reader is stuck in the callback, so nothing completes: the
	// window fills and the next publish must wait, not fail.
	for i := 0; i < window; i++ {
		if err := c.PublishAsync(ctx, "", "busy", nil, PublishOptions{}, nil); err != nil {
			close(release)
			t.Fatal(err)
		}
	}
	short, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
	err := c.PublishAsync(short, "", "busy", nil, PublishOptions{}, nil)
	cancel()
	close(release)
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("publish on a full window from another goroutine: %v, want it to wait", err)
	}
	if err := c.Publish(ctx, "", "busy", nil, PublishOptions{}); err != nil {
		t.Fatal(err)
	}
}

// TestErrorHandlerIsACallback: Config.ErrorHandler runs on the reader too,
// and gets ErrCalledFromCallback from a call that would wait.
func TestErrorHandlerIsACallback(t *testing.T) {
	s := startServer(t)
	got := make(chan error, 1)
	var c *Conn
	cfg := Config{ErrorHandler: func(error) {
		wctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		defer cancel()
		select {
		case got <- c.Publish(wctx, "", "eh", nil, PublishOptions{}):
		default:
		}
	}}
	c = dialTest(t, s.ClientAddr(), cfg)
	ctx := testCtx(t)
	mustDeclare(t, c, "eh", QueueOptions{})
	// A DELIVER for a consumer this side does not know goes to the
	// ErrorHandler: fake one by forgetting a live consumer.
	sub, err := c.Subscribe(ctx, "eh", SubscribeOptions{Credit: 1})
	if err != nil {
		t.Fatal(err)
	}
	c.forget(sub.ID())
	if err := c.Publish(ctx, "", "eh", []byte("x"), PublishOptions{}); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-got:
		if !errors.Is(err, ErrCalledFromCallback) {
			t.Fatalf("Publish from ErrorHandler: %v", err)
		}
	case <-ctx.Done():
		t.Fatal("ErrorHandler never ran")
	}
}

// TestReadLoopMark: the stack mark calledFromCallback looks for is the
// reader's function, and an ordinary goroutine does not carry it even
// while a reader is inside a callback.
func TestReadLoopMark(t *testing.T) {
	if name := runtime.FuncForPC(readLoopEntry).Name(); !strings.HasSuffix(name, "client.(*Conn).readLoop") {
		t.Fatalf("mark is %q", name)
	}
	readersInCallbacks.Add(1)
	defer readersInCallbacks.Add(-1)
	if calledFromCallback() {
		t.Fatal("a test goroutine taken for a reader")
	}
}
