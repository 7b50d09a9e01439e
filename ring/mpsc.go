package ring

import (
	"context"
	"sync/atomic"
)

// MPSC is a bounded FIFO for any number of producer goroutines and exactly
// one consumer goroutine. Items from one producer come out in the order
// that producer pushed them. Push side (any goroutine): TryPush, Push. Pop
// side (one goroutine): TryPop, PopBatch, PopWait, Ready. Len and Cap are
// safe from any goroutine.
//
// It is Dmitry Vyukov's bounded queue with a single consumer: every slot
// carries a sequence number that says whose turn it is. Slot seq == pos
// means free for the producer that claims pos; seq == pos+1 means filled
// for the consumer at pos. Producers claim positions by CAS on tail, so no
// producer waits for another to claim; the consumer waits only for the
// slot at head to be filled.
type MPSC[T any] struct {
	_ [cacheLinePad]byte
	// head is the next position to pop. Written only by the consumer,
	// after the slots it freed are marked free.
	head atomic.Uint64
	_    [cacheLinePad]byte
	// tail is the next position a producer may claim.
	tail atomic.Uint64
	_    [cacheLinePad]byte

	mask   uint64
	slots  []mpscSlot[T]
	signal *Signal // consumer wakes; may be shared with other rings
	space  *Signal // blocked Push calls wake; private to this ring
}

type mpscSlot[T any] struct {
	// seq publishes value: the producer's store of pos+1 releases it to
	// the consumer, the consumer's store of pos+capacity releases the slot
	// to the producer of the next lap.
	seq   atomic.Uint64
	value T
}

// NewMPSC returns an MPSC ring holding capacity items, rounded up to a
// power of two and to at least 2, with its own consumer Signal. It panics
// if capacity is not in 1..CapacityMax.
func NewMPSC[T any](capacity int) *MPSC[T] {
	return NewMPSCSignal[T](capacity, NewSignal())
}

// NewMPSCSignal is NewMPSC with a consumer Signal shared with other rings,
// so one consumer can park on all of them (see Signal.Wait).
func NewMPSCSignal[T any](capacity int, signal *Signal) *MPSC[T] {
	// With one slot, "filled at lap n" (seq n+1) would read as "free at
	// lap n+1", so a producer could overwrite an unpopped item.
	size := max(roundCapacity(capacity), 2)
	if signal == nil {
		panic("ring: nil signal")
	}
	r := &MPSC[T]{
		mask:   uint64(size - 1),
		slots:  make([]mpscSlot[T], size),
		signal: signal,
		space:  NewSignal(),
	}
	for i := range r.slots {
		r.slots[i].seq.Store(uint64(i))
	}
	return r
}

// TryPush appends v and wakes the consumer if it is parked. It returns
// false, without blocking, when the ring is full. Any goroutine.
func (r *MPSC[T]) TryPush(v T) bool {
	pos := r.tail.Load()
	for {
		slot := &r.slots[pos&r.mask]
		seq := slot.seq.Load()
		switch diff := int64(seq - pos); {
		case diff == 0:
			if r.tail.CompareAndSwap(pos, pos+1) {
				slot.value = v
				slot.seq.Store(pos + 1)
				r.signal.Notify()
				return true
			}
			pos = r.tail.Load()
		case diff < 0:
			// The slot still holds the item from the previous lap.
			return false
		default:
			// Another producer claimed pos since we loaded tail.
			pos = r.tail.Load()
		}
	}
}

// Push appends v, parking while the ring is full, until ctx is done. It
// succeeds without looking at ctx when there is room. Any
// goroutine except event loops (they use TryPush).
func (r *MPSC[T]) Push(ctx context.Context, v T) error {
	if r.TryPush(v) {
		return nil
	}
	return pushSlow(ctx, r.space, func() bool { return r.TryPush(v) }, r.notFull)
}

// WaitRoom parks until the ring has a free slot or ctx is done. A push
// after it may still find the ring full (another producer took the
// slot), so callers loop. Any goroutine except event loops.
func (r *MPSC[T]) WaitRoom(ctx context.Context) error {
	for !r.notFull() {
		if err := r.space.Wait(ctx, r.notFull); err != nil {
			return err
		}
	}
	// The consumer sends one token however many producers wait: pass it
	// on, as pushSlow does.
	r.space.Notify()
	return nil
}

func (r *MPSC[T]) notFull() bool {
	return r.tail.Load()-r.head.Load() <= r.mask
}

// TryPop removes the oldest item. It returns false when the ring is empty
// or when the producer that claimed the oldest position has not finished
// writing it. Consumer only.
func (r *MPSC[T]) TryPop() (T, bool) {
	var zero T
	head := r.head.Load()
	slot := &r.slots[head&r.mask]
	if slot.seq.Load() != head+1 {
		return zero, false
	}
	v := slot.value
	slot.value = zero // the ring must not keep popped pointers alive
	slot.seq.Store(head + r.mask + 1)
	r.head.Store(head + 1)
	r.space.Notify()
	return v, true
}

// PopBatch moves up to len(dst) of the oldest items into dst and returns
// how many it moved. It stops at the first position whose producer has not
// finished writing. Consumer only.
func (r *MPSC[T]) PopBatch(dst []T) int {
	var zero T
	head := r.head.Load()
	n := 0
	for n < len(dst) {
		pos := head + uint64(n)
		slot := &r.slots[pos&r.mask]
		if slot.seq.Load() != pos+1 {
			break
		}
		dst[n] = slot.value
		slot.value = zero
		slot.seq.Store(pos + r.mask + 1)
		n++
	}
	if n == 0 {
		return 0
	}
	r.head.Store(head + uint64(n))
	r.space.Notify()
	return n
}

// PopWait is PopBatch that parks on the ring's Signal while nothing is
// ready. It returns at least one item, or 0 and an error once ctx is done.
// Consumer only.
func (r *MPSC[T]) PopWait(ctx context.Context, dst []T) (int, error) {
	return popWait(ctx, r.signal, dst, r.PopBatch, r.Ready)
}

// Ready reports whether a pop would find an item. It looks at the head
// slot, not at tail, because a claimed but unwritten slot must not count:
// a consumer that trusted tail would spin instead of parking while the
// claiming producer is descheduled. Consumer only.
func (r *MPSC[T]) Ready() bool {
	head := r.head.Load()
	return r.slots[head&r.mask].seq.Load() == head+1
}

// Len reports the number of claimed positions, which may be stale by the
// time it returns. Safe from any goroutine.
func (r *MPSC[T]) Len() int {
	head := r.head.Load()
	tail := r.tail.Load()
	return int(min(tail-head, r.mask+1))
}

// Cap reports the capacity after rounding. Safe from any goroutine.
func (r *MPSC[T]) Cap() int { return int(r.mask + 1) }

// Signal returns the Signal the ring notifies on push.
func (r *MPSC[T]) Signal() *Signal { return r.signal }
