/*
Package ring provides the bounded, lock-free queues that carry work between
Berth's goroutines, and the park/wake Signal that lets an idle consumer
sleep instead of spinning.

SPSC has one producer and one consumer. MPSC has many producers and one
consumer; every producer's items come out in the order it pushed them. Both
hold a fixed number of slots (a power of two, at most CapacityMax) and never
allocate after construction. A popped slot is zeroed at once, so a ring
never keeps a popped pointer alive. Each method's documentation says which
goroutine may call it.

# Usage

The consumer (a shard goroutine) owns the pop side of one or more rings
that share one Signal:

	sig := ring.NewSignal()
	fromLoops := ring.NewMPSCSignal[Cmd](4096, sig)
	fromJournal := ring.NewSPSCSignal[Done](1024, sig)

Producers call TryPush. It publishes the item and then calls Notify on
the ring's Signal, which costs one atomic load while the consumer is
running. A goroutine that may block calls Push(ctx, v) instead: after a
few yields it parks until the consumer frees a slot or ctx is done. An
event loop never blocks, so it calls only TryPush, and on false it applies
backpressure (it withholds credit or stops reading the socket).

The consumer's loop is:

 1. Drain every ring with PopBatch into a scratch slice of a fixed size,
    and handle what came out. The batch amortises the atomics and the
    cache-line transfers over many items.
 2. If any ring produced an item, go back to step 1.
 3. Otherwise call sig.Wait(ctx, ready), where ready reports whether any
    of the rings is Ready. Wait parks only if ready is still false after
    the consumer has announced that it sleeps.
 4. When Wait returns nil, go back to step 1, even if nothing was pushed:
    a wakeup may be stale. When it returns an error, ctx is done; stop.

In code:

	for {
		n := fromLoops.PopBatch(cmds)
		m := fromJournal.PopBatch(dones)
		handle(cmds[:n], dones[:m])
		if n > 0 || m > 0 {
			continue
		}
		ready := func() bool { return fromLoops.Ready() || fromJournal.Ready() }
		if err := sig.Wait(ctx, ready); err != nil {
			return err
		}
	}

A consumer fed by a single ring can call PopWait, which runs steps 1 to 4
for that ring alone.

# Why no wakeup is lost

Wait and Notify form a Dekker-style handshake over two atomic variables:
the ring's published position and the Signal's waiter count. Go's atomics
are sequentially consistent, so all of these loads and stores fall into one
total order.

 1. The producer stores the item's position (tail, or the slot's sequence
    number), then loads the waiter count.
 2. The consumer increments the waiter count, then loads the positions
    (ready) before it blocks on the Signal's channel.
 3. Whichever of the two stores comes first in the total order, the other
    side's load comes after it. So either the producer sees a waiter and
    sends a token, or the consumer's re-check sees the item and does not
    block.
 4. The channel has one slot and Notify sends without blocking. A token
    sent while one is pending is dropped; the pending one already wakes
    the consumer, which drains all rings before it sleeps again. A token
    sent after the consumer has seen the item and left stays pending; the
    next Wait then returns at once, once, and the loop re-checks.

Push parks on a second, private Signal per ring, with the roles swapped:
the consumer publishes head and then notifies; the producer announces
itself and re-checks head before it blocks. The consumer sends one token
however many producers wait, so a producer that wins a slot after a wakeup
notifies again to pass the turn on.

# Rules

 1. Exactly one goroutine pops from a ring over its lifetime, or the pops
    are serialised by a happens-before edge (for example, handing the ring
    to a new consumer over a channel).
 2. For SPSC, the same holds for pushes.
 3. A ready function given to Wait reads only through the rings' Ready
    methods or other atomic loads; it must not block.
 4. Notify never blocks, so it may be called from an event loop. Push
    may block, so it must not be.
*/
package ring
