package groups

import (
	"context"
	"testing"
	"time"
)

// TestCallRetriesOnLeaderMove: a request to the controller that is
// waiting on a leader that froze is ended when this broker's controller
// member sees a new leader, and sent again at once, rather than waiting
// out callTimeout (5 s) against the frozen one.
func TestCallRetriesOnLeaderMove(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	m := &Manager{ctx: ctx, moved: make(chan struct{})}
	started := make(chan int, callMovedTries+1)
	result := make(chan error, 1)
	go func() {
		try := 0
		result <- m.call(func(ctx context.Context) error {
			try++
			started <- try
			if try == 2 {
				return nil // the new leader answers
			}
			<-ctx.Done() // the frozen leader never does
			return ctx.Err()
		})
	}()
	if try := <-started; try != 1 {
		t.Fatalf("first attempt numbered %d", try)
	}
	m.ControllerLeaderMoved()
	select {
	case try := <-started:
		if try != 2 {
			t.Fatalf("attempt after the move numbered %d", try)
		}
	case <-time.After(2 * time.Second):
		t.Fatal("the call was not sent again within 2 s of the leader's move")
	}
	if err := <-result; err != nil {
		t.Fatalf("call: %v", err)
	}

	// Without a move, a failed attempt is not repeated.
	tries := 0
	err := m.call(func(ctx context.Context) error { tries++; return context.DeadlineExceeded })
	if err == nil || tries != 1 {
		t.Fatalf("call without a move: err %v after %d attempts, want the error after 1", err, tries)
	}
}
