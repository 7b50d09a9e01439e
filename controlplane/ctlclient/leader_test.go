package ctlclient

import (
	"context"
	"net"
	"sync"
	"testing"
	"time"
)

// silentServer accepts connections and never answers: a controller that
// froze (SIGSTOP) with its sockets open.
func silentServer(t *testing.T) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var conns []net.Conn
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		mu.Lock()
		for _, c := range conns {
			c.Close()
		}
		mu.Unlock()
	})
	return ln.Addr().String()
}

// TestCancelledCallKeepsNewLeader: a call waiting on a leader that froze
// is cancelled because the broker learned of a new leader (SetLeader);
// the cancelled call must not forget that new leader on its way out.
// Before, it did, and the broker's next request (the group records that
// name it master) went to a member picked at random, the frozen one
// included, and waited out its whole timeout: 5 s of failover.
func TestCancelledCallKeepsNewLeader(t *testing.T) {
	frozen := silentServer(t)
	next := silentServer(t) // never called here: only its address is learned
	c := NewClient([]string{frozen, next})
	defer c.Close()
	c.SetLeader(frozen)

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- c.Heartbeat(ctx, 1, nil) }()
	// Let the heartbeat reach the frozen member's socket.
	deadline := time.Now().Add(5 * time.Second)
	for {
		c.mu.Lock()
		cc := c.conns[frozen]
		c.mu.Unlock()
		if cc != nil {
			cc.mu.Lock()
			waiting := len(cc.waiters)
			cc.mu.Unlock()
			if waiting > 0 {
				break
			}
		}
		if time.Now().After(deadline) {
			t.Fatal("the heartbeat never reached the frozen member")
		}
		time.Sleep(time.Millisecond)
	}
	c.SetLeader(next)
	cancel()
	select {
	case err := <-done:
		if err == nil {
			t.Fatal("a heartbeat to a member that never answers succeeded")
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the cancelled heartbeat did not return")
	}
	if got := c.Leader(); got != next {
		t.Fatalf("leader after the cancelled call = %q, want the one learned meanwhile, %q", got, next)
	}

	// A failure at the leader still known forgets it.
	ctx2, cancel2 := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel2()
	if err := c.Heartbeat(ctx2, 1, nil); err == nil {
		t.Fatal("a heartbeat to a member that never answers succeeded")
	}
	if got := c.Leader(); got != "" {
		t.Fatalf("leader after a failed call to it = %q, want it forgotten", got)
	}
}
