package replication

import (
	"context"
	"log/slog"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/berthmq/berth/shards"
)

// TestBusyShardHoldsUpOnlyItsLane: a peer connection's reader hands
// proxied commands to shard 0, whose goroutine is stalled and whose ring
// is full, then to shard 1. Shard 1's commands run while shard 0 is still
// stalled (a reader that parked on shard 0's ring, as it did before the
// lanes, never got to them), and once shard 0 runs again its commands
// run, in the order the reader handed them.
func TestBusyShardHoldsUpOnlyItsLane(t *testing.T) {
	b := shards.New(shards.Config{Shards: 2, Logger: slog.New(slog.DiscardHandler)})
	if err := b.Start(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	l := NewLanes(ctx, b.Shards())
	t.Cleanup(func() { cancel(); l.Wait(); b.Stop() })
	shs := b.Shards()

	// Stall shard 0, then fill its ring.
	stalled, release := make(chan struct{}), make(chan struct{})
	if !shs[0].TryCall(func(*shards.Shard) { close(stalled); <-release }) {
		t.Fatal("shard 0's ring is full at the start")
	}
	<-stalled
	defer func() {
		select {
		case <-release:
		default:
			close(release)
		}
	}()
	filled := 0
	for shs[0].TryCall(func(*shards.Shard) {}) {
		filled++
	}

	var mu sync.Mutex
	var ran0 []int
	ran1 := 0
	done1 := make(chan struct{})
	const each = 100
	reader := make(chan struct{})
	go func() { // the peer connection's reader
		defer close(reader)
		for i := range each {
			l.Push(0, shards.CallCommand(func(*shards.Shard) { mu.Lock(); ran0 = append(ran0, i); mu.Unlock() }))
		}
		for range each {
			l.Push(1, shards.CallCommand(func(*shards.Shard) {
				mu.Lock()
				ran1++
				if ran1 == each {
					close(done1)
				}
				mu.Unlock()
			}))
		}
	}()
	select {
	case <-done1:
	case <-time.After(20 * time.Second):
		t.Fatalf("shard 1's commands did not run while shard 0 (ring full with %d) was stalled", filled)
	}
	mu.Lock()
	if len(ran0) != 0 {
		t.Fatalf("%d of shard 0's commands ran while it was stalled", len(ran0))
	}
	mu.Unlock()
	close(release)
	<-reader
	deadline := time.Now().Add(20 * time.Second)
	for {
		mu.Lock()
		n := len(ran0)
		mu.Unlock()
		if n == each {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d of shard 0's %d commands ran after it was released", n, each)
		}
		time.Sleep(5 * time.Millisecond)
	}
	mu.Lock()
	defer mu.Unlock()
	if !slices.IsSorted(ran0) {
		t.Fatalf("shard 0's commands ran out of order: %v", ran0)
	}
}
