package ring

import (
	"context"
	"fmt"
	"math/bits"
	"runtime"
)

// CapacityMax bounds the slots of one ring, so that a bad configuration
// value fails at construction instead of exhausting memory.
const CapacityMax = 1 << 24

// cacheLinePad separates fields written by different goroutines. It is
// two 64-byte lines because x86 prefetches lines in adjacent pairs, which
// would otherwise keep false sharing alive across a single line of padding.
const cacheLinePad = 128

// pushSpinMax is how many times a blocked Push yields before it parks. A
// consumer that is running frees space within a few yields; spinning any
// longer only burns a core that, on a small machine, the consumer needs.
const pushSpinMax = 4

// popSpinMax is how many times PopWait yields before it parks. A
// producer that is running often pushes within a yield or two, and a park
// and wake costs far more than a yield.
const popSpinMax = 2

// roundCapacity returns capacity rounded up to a power of two. A capacity
// outside 1..CapacityMax is a programmer error.
func roundCapacity(capacity int) int {
	if capacity <= 0 || capacity > CapacityMax {
		panic(fmt.Sprintf("ring: capacity %d outside 1..%d", capacity, CapacityMax))
	}
	return 1 << bits.Len(uint(capacity-1))
}

// pushSlow is the full-ring path of Push shared by both ring kinds. try
// attempts the push; notFull reports (via atomic loads of what the consumer
// publishes) whether a slot may be free, so the park re-check cannot miss
// the consumer's Notify on space.
func pushSlow(ctx context.Context, space *Signal, try, notFull func() bool) error {
	for range pushSpinMax {
		if ctx.Err() != nil {
			return fmt.Errorf("ring: push: %w", ctx.Err())
		}
		runtime.Gosched()
		if try() {
			return nil
		}
	}
	for {
		if err := space.Wait(ctx, notFull); err != nil {
			return fmt.Errorf("ring: push: %w", ctx.Err())
		}
		if try() {
			// The consumer sends one token however many slots it freed
			// and however many producers wait; pass it on so the next
			// parked producer gets its turn.
			space.Notify()
			return nil
		}
		if ctx.Err() != nil {
			return fmt.Errorf("ring: push: %w", ctx.Err())
		}
	}
}

// popWait is PopWait shared by both ring kinds.
func popWait[T any](ctx context.Context, signal *Signal, dst []T, popBatch func([]T) int, ready func() bool) (int, error) {
	if len(dst) == 0 {
		return 0, nil
	}
	for {
		if n := popBatch(dst); n > 0 {
			return n, nil
		}
		for range popSpinMax {
			runtime.Gosched()
			if n := popBatch(dst); n > 0 {
				return n, nil
			}
		}
		if err := signal.Wait(ctx, ready); err != nil {
			return 0, err
		}
	}
}
