package ring

import (
	"context"
	"fmt"
	"sync/atomic"
)

// Signal parks goroutines that wait for a condition and lets other
// goroutines wake them without ever blocking. See the package doc for the
// protocol that rules out lost wakeups.
//
// The zero value is not usable; create one with NewSignal. A Signal may be
// shared by several rings so that one consumer can sleep on all of them.
type Signal struct {
	// waiters counts goroutines between announcing sleep and leaving Wait.
	// Notify reads it on every call, Wait writes it only when parking, so
	// the line stays shared-clean while nobody sleeps; the padding keeps
	// neighbouring hot fields from invalidating it.
	_       [cacheLinePad]byte
	waiters atomic.Int32
	_       [cacheLinePad]byte
	// wake holds at most one token. A token may outlive the sleep it was
	// meant for; the waiter then returns early once, which Wait's contract
	// allows (callers always re-check their condition).
	wake chan struct{}
	// parks counts Waits that blocked, for idle metrics and benchmarks.
	// Written only on the park path, where it is cheap next to the park.
	parks atomic.Uint64
}

// NewSignal returns a Signal with nobody waiting.
func NewSignal() *Signal {
	return &Signal{wake: make(chan struct{}, 1)}
}

// Notify wakes a goroutine parked in Wait, if any. It never blocks and,
// when nobody is parked, costs one atomic load. Safe from any goroutine.
//
// The caller must publish the state change the waiter checks (for a ring:
// the pushed item) with an atomic store before calling Notify.
func (s *Signal) Notify() {
	if s.waiters.Load() == 0 {
		return
	}
	select {
	case s.wake <- struct{}{}:
	default:
		// A token is already pending; one is enough to get a waiter
		// running, and a woken waiter re-checks its condition.
	}
}

// Wait parks until Notify is called or ctx is done, unless ready reports
// true once the wait has been announced; in that case it returns nil at
// once. It may return nil without the condition holding (a stale token), so
// callers loop. Intended for one goroutine per Signal (the consumer);
// several concurrent waiters are allowed but each Notify wakes only one.
//
// ready must read, with atomic loads, the state that notifiers publish
// before they call Notify. It must not block and does not escape.
func (s *Signal) Wait(ctx context.Context, ready func() bool) error {
	// Announce before the re-check: with sequentially consistent atomics
	// either the notifier sees waiters > 0 (and sends a token) or this
	// re-check sees the published state. Both cannot miss.
	s.waiters.Add(1)
	if ready() {
		s.waiters.Add(-1)
		return nil
	}
	s.parks.Add(1)
	done := ctx.Done()
	if done == nil {
		// A context that is never done (Background) needs no select,
		// which makes the park as cheap as a plain channel receive.
		<-s.wake
		s.waiters.Add(-1)
		return nil
	}
	select {
	case <-s.wake:
		s.waiters.Add(-1)
		return nil
	case <-done:
		s.waiters.Add(-1)
		return fmt.Errorf("ring: wait: %w", ctx.Err())
	}
}

// Parks reports how many Waits have blocked since the Signal was created.
// Safe from any goroutine.
func (s *Signal) Parks() uint64 {
	return s.parks.Load()
}

// Waiters reports how many goroutines are inside Wait. It is a snapshot for
// tests and metrics, not for synchronisation.
func (s *Signal) Waiters() int {
	return int(s.waiters.Load())
}
