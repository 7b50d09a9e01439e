package server_test

import (
	"context"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/berthmq/berth/client"
	"github.com/berthmq/berth/journal"
	"github.com/berthmq/berth/server"
	"github.com/berthmq/berth/wire"
)

// TestShutdownTakesNoNewWork holds a shutdown in its drain phase with a
// journal write that blocks, and checks what the broker does meanwhile:
// a new session's HELLO gets CLOSE(shutdown) instead of a WELCOME, and a
// publish on an open session gets ERROR(shutdown) saying it was not taken.
// The publish taken before the shutdown still completes once the write
// goes through, and the session then ends with CLOSE(shutdown). Before,
// new sessions were welcomed and their publishes never completed.
func TestShutdownTakesNoNewWork(t *testing.T) {
	ffs := journal.NewFaultFS(nil)
	var armed atomic.Bool
	gate := make(chan struct{})
	ffs.SetRule(func(op journal.Op, name string, n int) error {
		if armed.Load() && op == journal.OpWrite {
			<-gate
		}
		return nil
	})
	s := startServer(t, func(c *server.Config) { c.JournalFS = ffs })
	var opened atomic.Bool
	open := func() {
		if opened.CompareAndSwap(false, true) {
			close(gate)
		}
	}
	t.Cleanup(open) // runs before the server's Close, should the test stop early
	c := dial(t, s)
	ctx := ctxT(t)
	if err := c.DeclareQueue(ctx, "d", client.QueueOptions{Durable: true}); err != nil {
		t.Fatal(err)
	}
	armed.Store(true)
	taken := make(chan error, 1)
	if err := c.PublishAsync(ctx, "", "d", []byte("taken"), client.PublishOptions{Persistent: true}, func(err error) { taken <- err }); err != nil {
		t.Fatal(err)
	}
	fctx, fcancel := context.WithTimeout(ctx, 200*time.Millisecond)
	err := c.Flush(fctx)
	fcancel()
	if err == nil {
		t.Fatal("the publish completed with its journal write blocked")
	}
	closed := make(chan error, 1)
	go func() { closed <- s.Close() }()

	// A new session is refused once the shutdown has begun.
	refused := false
	for deadline := time.Now().Add(10 * time.Second); !refused && time.Now().Before(deadline); {
		nc := rawConn(t, s)
		// A session welcomed before the shutdown began stays open until
		// Close ends it, after the blocked write: read it for a moment
		// only, then try again.
		_ = nc.SetReadDeadline(time.Now().Add(500 * time.Millisecond))
		if _, err := nc.Write(wire.AppendHello(nil, []wire.Version{wire.Current}, "late", "none", nil, 0, 0)); err != nil {
			t.Fatal(err)
		}
		types, _ := readFrames(t, nc)
		switch {
		case len(types) == 1 && types[0] == wire.TypeClose:
			refused = true
		case len(types) > 0 && types[0] == wire.TypeWelcome:
			time.Sleep(5 * time.Millisecond) // the shutdown has not reached the drain yet
		default:
			t.Fatalf("HELLO during shutdown got %v", types)
		}
		nc.Close()
	}
	if !refused {
		t.Fatal("new sessions were still welcomed 10 s into the shutdown")
	}

	// A command on an open session is refused with a reason.
	pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	err = c.Publish(pctx, "", "d", []byte("late"), client.PublishOptions{Persistent: true})
	cancel()
	if client.Code(err) != wire.CodeShutdown || !strings.Contains(err.Error(), "not taken") {
		t.Fatalf("publish during shutdown: %v, want a shutdown error saying it was not taken", err)
	}

	open()
	select {
	case err := <-taken:
		if err != nil {
			t.Fatalf("the publish taken before the shutdown: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the publish taken before the shutdown never completed")
	}
	select {
	case <-c.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("the session did not end")
	}
	if client.Code(c.Err()) != wire.CodeShutdown {
		t.Fatalf("session ended with %v, want CLOSE(shutdown)", c.Err())
	}
	if err := <-closed; err != nil {
		t.Fatal(err)
	}
}
