package ring

import (
	"context"
	"sync/atomic"
)

// SPSC is a bounded FIFO for exactly one producer goroutine and one
// consumer goroutine. Push side: TryPush, Push. Pop side: TryPop,
// PopBatch, PopWait, Ready. Len and Cap are safe from any goroutine.
//
// Slot values are plain memory; they are published by the atomic store of
// tail (producer) and released by the atomic store of head (consumer).
type SPSC[T any] struct {
	_ [cacheLinePad]byte
	// head is the next position to pop. Written only by the consumer.
	head atomic.Uint64
	// tailCache is the consumer's last view of tail, so that a pop
	// touches the producer's line only when the cache says empty.
	tailCache uint64
	_         [cacheLinePad]byte
	// tail is the next position to push. Written only by the producer.
	tail atomic.Uint64
	// headCache is the producer's last view of head.
	headCache uint64
	_         [cacheLinePad]byte

	mask   uint64
	slots  []T
	signal *Signal // consumer wakes; may be shared with other rings
	space  *Signal // blocked Push calls wake; private to this ring
}

// NewSPSC returns an SPSC ring holding capacity items, rounded up to a
// power of two, with its own consumer Signal. It panics if capacity is not
// in 1..CapacityMax.
func NewSPSC[T any](capacity int) *SPSC[T] {
	return NewSPSCSignal[T](capacity, NewSignal())
}

// NewSPSCSignal is NewSPSC with a consumer Signal shared with other rings,
// so one consumer can park on all of them (see Signal.Wait).
func NewSPSCSignal[T any](capacity int, signal *Signal) *SPSC[T] {
	size := roundCapacity(capacity)
	if signal == nil {
		panic("ring: nil signal")
	}
	return &SPSC[T]{
		mask:   uint64(size - 1),
		slots:  make([]T, size),
		signal: signal,
		space:  NewSignal(),
	}
}

// TryPush appends v and wakes the consumer if it is parked. It returns
// false, without blocking, when the ring is full. Producer only.
func (r *SPSC[T]) TryPush(v T) bool {
	tail := r.tail.Load()
	if tail-r.headCache > r.mask {
		r.headCache = r.head.Load()
		if tail-r.headCache > r.mask {
			return false
		}
	}
	r.slots[tail&r.mask] = v
	r.tail.Store(tail + 1)
	r.signal.Notify()
	return true
}

// Push appends v, parking while the ring is full, until ctx is done. It
// succeeds without looking at ctx when there is room.
// Producer only; never call it from an event loop (use TryPush there).
func (r *SPSC[T]) Push(ctx context.Context, v T) error {
	if r.TryPush(v) {
		return nil
	}
	return pushSlow(ctx, r.space, func() bool { return r.TryPush(v) }, r.notFull)
}

func (r *SPSC[T]) notFull() bool {
	return r.tail.Load()-r.head.Load() <= r.mask
}

// TryPop removes the oldest item. It returns false when the ring is empty.
// Consumer only.
func (r *SPSC[T]) TryPop() (T, bool) {
	var zero T
	head := r.head.Load()
	if head == r.tailCache {
		r.tailCache = r.tail.Load()
		if head == r.tailCache {
			return zero, false
		}
	}
	slot := &r.slots[head&r.mask]
	v := *slot
	*slot = zero // the ring must not keep popped pointers alive
	r.head.Store(head + 1)
	r.space.Notify()
	return v, true
}

// PopBatch moves up to len(dst) of the oldest items into dst and returns
// how many it moved, publishing all the freed slots with one store.
// Consumer only.
func (r *SPSC[T]) PopBatch(dst []T) int {
	head := r.head.Load()
	avail := r.tailCache - head
	if avail < uint64(len(dst)) {
		r.tailCache = r.tail.Load()
		avail = r.tailCache - head
	}
	n := min(avail, uint64(len(dst)))
	if n == 0 {
		return 0
	}
	var zero T
	for i := range n {
		slot := &r.slots[(head+i)&r.mask]
		dst[i] = *slot
		*slot = zero
	}
	r.head.Store(head + n)
	r.space.Notify()
	return int(n)
}

// PopWait is PopBatch that parks on the ring's Signal while the ring is
// empty. It returns at least one item, or 0 and an error once ctx is done.
// Consumer only. With a shared Signal, prefer a loop over all rings and
// Signal.Wait (see the package doc).
func (r *SPSC[T]) PopWait(ctx context.Context, dst []T) (int, error) {
	return popWait(ctx, r.signal, dst, r.PopBatch, r.Ready)
}

// Ready reports whether a pop would find an item. Use it as, or inside,
// the ready function given to Signal.Wait. Consumer only.
func (r *SPSC[T]) Ready() bool {
	return r.tail.Load() != r.head.Load()
}

// Len reports the number of items, which may be stale by the time it
// returns. Safe from any goroutine.
func (r *SPSC[T]) Len() int {
	// head first: tail only grows, so tail >= head, but both may move
	// between the loads, hence the clamp to capacity.
	head := r.head.Load()
	tail := r.tail.Load()
	return int(min(tail-head, r.mask+1))
}

// Cap reports the capacity after rounding. Safe from any goroutine.
func (r *SPSC[T]) Cap() int { return int(r.mask + 1) }

// Signal returns the Signal the ring notifies on push.
func (r *SPSC[T]) Signal() *Signal { return r.signal }
