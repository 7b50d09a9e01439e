package ring

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/berthmq/berth/internal/testutil"
)

// testTimeout bounds every wait in these tests, so that a lost wakeup
// fails the test with a message instead of hanging until go test's
// global timeout. It is generous because -race on a shared 2-core
// machine is slow; it is a hang detector, not a speed goal.
const testTimeout = 60 * time.Second

// queue is what both ring kinds offer; the tests run against each.
type queue interface {
	TryPush(uint64) bool
	Push(context.Context, uint64) error
	TryPop() (uint64, bool)
	PopBatch([]uint64) int
	PopWait(context.Context, []uint64) (int, error)
	Ready() bool
	Len() int
	Cap() int
	Signal() *Signal
	spaceSignal() *Signal
}

func (r *SPSC[T]) spaceSignal() *Signal { return r.space }
func (r *MPSC[T]) spaceSignal() *Signal { return r.space }

type kind struct {
	name string
	new  func(capacity int, sig *Signal) queue
}

var kinds = []kind{
	{"spsc", func(c int, s *Signal) queue { return NewSPSCSignal[uint64](c, s) }},
	{"mpsc", func(c int, s *Signal) queue { return NewMPSCSignal[uint64](c, s) }},
}

// scaled returns n, or n/10 under -short, so the default run is the
// thorough one and -short stays quick.
func scaled(n int) int {
	if testing.Short() {
		return n / 10
	}
	return n
}

// waitFor polls cond until it holds or testTimeout passes.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	testutil.WaitUntil(t, testTimeout, what, cond)
}

// finish waits for done, failing the test instead of hanging.
func finish(t *testing.T, what string, done <-chan struct{}) {
	t.Helper()
	select {
	case <-done:
	case <-time.After(testTimeout):
		t.Fatalf("timed out waiting for %s (lost wakeup?)", what)
	}
}

func TestCapacityRounding(t *testing.T) {
	for _, tc := range []struct{ in, want int }{
		{2, 2}, {3, 4}, {5, 8}, {1000, 1024}, {1024, 1024}, {1025, 2048},
	} {
		if got := NewSPSC[int](tc.in).Cap(); got != tc.want {
			t.Errorf("NewSPSC(%d).Cap() = %d, want %d", tc.in, got, tc.want)
		}
		if got := NewMPSC[int](tc.in).Cap(); got != tc.want {
			t.Errorf("NewMPSC(%d).Cap() = %d, want %d", tc.in, got, tc.want)
		}
	}
	// The sequence-number scheme needs two slots to tell laps apart.
	if got := NewSPSC[int](1).Cap(); got != 1 {
		t.Errorf("NewSPSC(1).Cap() = %d, want 1", got)
	}
	if got := NewMPSC[int](1).Cap(); got != 2 {
		t.Errorf("NewMPSC(1).Cap() = %d, want 2", got)
	}
}

func TestConstructorPanics(t *testing.T) {
	mustPanic := func(name string, f func()) {
		t.Helper()
		defer func() {
			if recover() == nil {
				t.Errorf("%s did not panic", name)
			}
		}()
		f()
	}
	for _, c := range []int{0, -1, CapacityMax + 1} {
		mustPanic(fmt.Sprintf("NewSPSC(%d)", c), func() { NewSPSC[int](c) })
		mustPanic(fmt.Sprintf("NewMPSC(%d)", c), func() { NewMPSC[int](c) })
	}
	mustPanic("NewSPSCSignal(nil)", func() { NewSPSCSignal[int](8, nil) })
	mustPanic("NewMPSCSignal(nil)", func() { NewMPSCSignal[int](8, nil) })
}

// TestFullEmptyWrap walks each ring around many laps, checking the edges
// on every lap: empty pops fail, exactly Cap pushes succeed, FIFO holds
// across the wrap, and Len tracks the content.
func TestFullEmptyWrap(t *testing.T) {
	for _, k := range kinds {
		for _, capacity := range []int{1, 4, 8} {
			t.Run(fmt.Sprintf("kind=%s/cap=%d", k.name, capacity), func(t *testing.T) {
				r := k.new(capacity, NewSignal())
				capacity := r.Cap()
				var pushed, popped uint64
				dst := make([]uint64, capacity+3)
				for lap := range 50 {
					if v, ok := r.TryPop(); ok {
						t.Fatalf("lap %d: pop from empty ring gave %d", lap, v)
					}
					if r.Ready() || r.Len() != 0 || r.PopBatch(dst) != 0 {
						t.Fatalf("lap %d: empty ring: Ready=%v Len=%d", lap, r.Ready(), r.Len())
					}
					for i := range capacity {
						if !r.TryPush(pushed) {
							t.Fatalf("lap %d: push %d of %d failed", lap, i, capacity)
						}
						pushed++
					}
					if r.TryPush(999) {
						t.Fatalf("lap %d: push into full ring succeeded", lap)
					}
					if r.Len() != capacity || !r.Ready() {
						t.Fatalf("lap %d: full ring: Len=%d Ready=%v", lap, r.Len(), r.Ready())
					}
					// Pop some singly, refill them, then drain in one batch,
					// so head and tail cross the wrap at different offsets.
					half := (capacity + 1) / 2
					for range half {
						v, ok := r.TryPop()
						if !ok || v != popped {
							t.Fatalf("lap %d: TryPop = %d,%v, want %d", lap, v, ok, popped)
						}
						popped++
					}
					for range half {
						if !r.TryPush(pushed) {
							t.Fatalf("lap %d: refill failed", lap)
						}
						pushed++
					}
					n := r.PopBatch(dst)
					if n != capacity {
						t.Fatalf("lap %d: PopBatch = %d, want %d", lap, n, capacity)
					}
					for _, v := range dst[:n] {
						if v != popped {
							t.Fatalf("lap %d: batch gave %d, want %d", lap, v, popped)
						}
						popped++
					}
				}
			})
		}
	}
}

func TestPopBatchShortDst(t *testing.T) {
	for _, k := range kinds {
		t.Run("kind="+k.name, func(t *testing.T) {
			r := k.new(16, NewSignal())
			for i := range uint64(10) {
				r.TryPush(i)
			}
			dst := make([]uint64, 4)
			var want uint64
			for _, n := range []int{4, 4, 2, 0} {
				if got := r.PopBatch(dst); got != n {
					t.Fatalf("PopBatch = %d, want %d", got, n)
				}
				for _, v := range dst[:n] {
					if v != want {
						t.Fatalf("got %d, want %d", v, want)
					}
					want++
				}
			}
			if n := r.PopBatch(nil); n != 0 {
				t.Fatalf("PopBatch(nil) = %d", n)
			}
			if n, err := r.PopWait(context.Background(), nil); n != 0 || err != nil {
				t.Fatalf("PopWait(nil) = %d, %v; want 0, nil without blocking", n, err)
			}
		})
	}
}

// TestPoppedSlotsZeroed checks the ring drops its references on pop, so
// the garbage collector can free what consumers are done with.
func TestPoppedSlotsZeroed(t *testing.T) {
	newItems := func() []*int {
		items := make([]*int, 8)
		for i := range items {
			items[i] = new(int)
		}
		return items
	}
	t.Run("kind=spsc", func(t *testing.T) {
		r := NewSPSC[*int](8)
		for _, p := range newItems() {
			r.TryPush(p)
		}
		r.TryPop()
		r.PopBatch(make([]*int, 8))
		for i, p := range r.slots {
			if p != nil {
				t.Errorf("slot %d still holds a pointer after pop", i)
			}
		}
	})
	t.Run("kind=mpsc", func(t *testing.T) {
		r := NewMPSC[*int](8)
		for _, p := range newItems() {
			r.TryPush(p)
		}
		r.TryPop()
		r.PopBatch(make([]*int, 8))
		for i := range r.slots {
			if r.slots[i].value != nil {
				t.Errorf("slot %d still holds a pointer after pop", i)
			}
		}
	})
}

// producerShift places the producer id above the per-producer sequence, so
// the consumer can check FIFO per producer from the value alone.
const producerShift = 40

// runTransfer pushes perProducer items from each of producers goroutines
// and checks that each comes out exactly once and in its producer's order.
// Producers alternate between TryPush and Push, so both the lock-free
// path and the park path carry load.
func runTransfer(t *testing.T, r queue, producers, perProducer int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()

	errs := make(chan error, producers)
	for p := range producers {
		go func() {
			for i := range perProducer {
				v := uint64(p)<<producerShift | uint64(i)
				if i%2 == 0 {
					if err := r.Push(ctx, v); err != nil {
						errs <- err
						return
					}
					continue
				}
				for !r.TryPush(v) {
					if ctx.Err() != nil {
						errs <- ctx.Err()
						return
					}
					runtime.Gosched()
				}
			}
			errs <- nil
		}()
	}

	next := make([]uint64, producers)
	buf := make([]uint64, 64)
	for got := 0; got < producers*perProducer; {
		n, err := r.PopWait(ctx, buf)
		if err != nil {
			t.Fatalf("PopWait after %d of %d items: %v", got, producers*perProducer, err)
		}
		for _, v := range buf[:n] {
			p, seq := v>>producerShift, v&(1<<producerShift-1)
			if p >= uint64(producers) {
				t.Fatalf("item %#x from unknown producer", v)
			}
			if seq != next[p] {
				t.Fatalf("producer %d: got seq %d, want %d", p, seq, next[p])
			}
			next[p]++
		}
		got += n
	}
	for range producers {
		if err := <-errs; err != nil {
			t.Fatalf("producer: %v", err)
		}
	}
	if v, ok := r.TryPop(); ok {
		t.Fatalf("extra item %#x after all were received", v)
	}
}

func TestTransferSPSC(t *testing.T) {
	for _, capacity := range []int{8, 1024} {
		t.Run(fmt.Sprintf("cap=%d", capacity), func(t *testing.T) {
			runTransfer(t, NewSPSC[uint64](capacity), 1, scaled(1_000_000))
		})
	}
}

func TestTransferMPSC(t *testing.T) {
	for _, capacity := range []int{8, 1024} {
		t.Run(fmt.Sprintf("cap=%d", capacity), func(t *testing.T) {
			runTransfer(t, NewMPSC[uint64](capacity), 4, scaled(250_000))
		})
	}
}

// TestParkThenWake parks the consumer for certain before the push, then
// checks the push alone wakes it.
func TestParkThenWake(t *testing.T) {
	for _, k := range kinds {
		t.Run("kind="+k.name, func(t *testing.T) {
			r := k.new(8, NewSignal())
			got := make(chan uint64, 1)
			go func() {
				buf := make([]uint64, 1)
				if n, err := r.PopWait(context.Background(), buf); err == nil && n == 1 {
					got <- buf[0]
				}
				close(got)
			}()
			waitFor(t, "consumer to park", func() bool { return r.Signal().Waiters() == 1 })
			if !r.TryPush(42) {
				t.Fatal("push failed")
			}
			select {
			case v := <-got:
				if v != 42 {
					t.Fatalf("got %d, want 42", v)
				}
			case <-time.After(testTimeout):
				t.Fatal("parked consumer was not woken by push")
			}
		})
	}
}

// TestPingPongStress makes both sides park on almost every item: each
// sends one item and waits for the reply. A single lost wakeup stalls the
// exchange, and the timeout turns that into a failure.
func TestPingPongStress(t *testing.T) {
	rounds := scaled(20_000)
	for _, k := range kinds {
		t.Run("kind="+k.name, func(t *testing.T) {
			ping, pong := k.new(2, NewSignal()), k.new(2, NewSignal())
			ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
			defer cancel()
			echoErr := make(chan error, 1)
			go func() {
				buf := make([]uint64, 1)
				for range rounds {
					if _, err := ping.PopWait(ctx, buf); err != nil {
						echoErr <- err
						return
					}
					if err := pong.Push(ctx, buf[0]+1); err != nil {
						echoErr <- err
						return
					}
				}
				echoErr <- nil
			}()
			buf := make([]uint64, 1)
			for i := range uint64(rounds) {
				if !ping.TryPush(i) {
					t.Fatalf("round %d: ping full", i)
				}
				if _, err := pong.PopWait(ctx, buf); err != nil {
					t.Fatalf("round %d of %d: %v (lost wakeup?)", i, rounds, err)
				}
				if buf[0] != i+1 {
					t.Fatalf("round %d: reply %d", i, buf[0])
				}
			}
			if err := <-echoErr; err != nil {
				t.Fatalf("echo: %v", err)
			}
		})
	}
}

// TestSharedSignal feeds one consumer from several rings that notify one
// Signal, using the loop from the package doc.
func TestSharedSignal(t *testing.T) {
	const spscRings = 3
	perProducer := scaled(100_000)
	sig := NewSignal()
	var spscs [spscRings]*SPSC[uint64]
	for i := range spscs {
		spscs[i] = NewSPSCSignal[uint64](16, sig)
	}
	mpsc := NewMPSCSignal[uint64](16, sig)
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()

	// Producers 0..2 own one SPSC each; producers 3 and 4 share the MPSC.
	var wg sync.WaitGroup
	push := func(p int, r interface {
		Push(context.Context, uint64) error
	}) {
		defer wg.Done()
		for i := range perProducer {
			if err := r.Push(ctx, uint64(p)<<producerShift|uint64(i)); err != nil {
				t.Errorf("producer %d: %v", p, err)
				return
			}
		}
	}
	wg.Add(spscRings + 2)
	for i, r := range spscs {
		go push(i, r)
	}
	go push(spscRings, mpsc)
	go push(spscRings+1, mpsc)

	const producers = spscRings + 2
	next := make([]int, producers)
	total := 0
	buf := make([]uint64, 32)
	check := func(items []uint64) {
		for _, v := range items {
			p, seq := v>>producerShift, int(v&(1<<producerShift-1))
			if seq != next[p] {
				t.Fatalf("producer %d: got seq %d, want %d", p, seq, next[p])
			}
			next[p]++
		}
		total += len(items)
	}
	ready := func() bool {
		for _, r := range spscs {
			if r.Ready() {
				return true
			}
		}
		return mpsc.Ready()
	}
	for total < producers*perProducer {
		popped := 0
		for _, r := range spscs {
			n := r.PopBatch(buf)
			check(buf[:n])
			popped += n
		}
		n := mpsc.PopBatch(buf)
		check(buf[:n])
		popped += n
		if popped > 0 {
			continue
		}
		if err := sig.Wait(ctx, ready); err != nil {
			t.Fatalf("after %d of %d items: %v", total, producers*perProducer, err)
		}
	}
	wg.Wait()
}

func TestPushCancel(t *testing.T) {
	for _, k := range kinds {
		t.Run("kind="+k.name, func(t *testing.T) {
			r := k.new(2, NewSignal())
			r.TryPush(1)
			r.TryPush(2)

			cancelled, cancel := context.WithCancel(context.Background())
			cancel()
			if err := r.Push(cancelled, 3); !errors.Is(err, context.Canceled) {
				t.Fatalf("Push with cancelled ctx on full ring = %v", err)
			}

			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan error, 1)
			go func() { done <- r.Push(ctx, 3) }()
			waitFor(t, "producer to park", func() bool { return r.spaceSignal().Waiters() == 1 })
			cancel()
			var err error
			finish(t, "cancelled Push to return", func() <-chan struct{} {
				c := make(chan struct{})
				go func() { err = <-done; close(c) }()
				return c
			}())
			if !errors.Is(err, context.Canceled) || !strings.HasPrefix(err.Error(), "ring: ") {
				t.Fatalf("Push after cancel = %v, want ring-prefixed context.Canceled", err)
			}

			short, cancelShort := context.WithTimeout(context.Background(), 10*time.Millisecond)
			defer cancelShort()
			if err := r.Push(short, 3); !errors.Is(err, context.DeadlineExceeded) {
				t.Fatalf("Push past deadline = %v", err)
			}
			// A failed Push must not have stored anything.
			if r.Len() != 2 {
				t.Fatalf("Len = %d after failed pushes, want 2", r.Len())
			}
		})
	}
}

func TestPopWaitCancel(t *testing.T) {
	for _, k := range kinds {
		t.Run("kind="+k.name, func(t *testing.T) {
			r := k.new(4, NewSignal())
			ctx, cancel := context.WithCancel(context.Background())
			type result struct {
				n   int
				err error
			}
			done := make(chan result, 1)
			go func() {
				n, err := r.PopWait(ctx, make([]uint64, 4))
				done <- result{n, err}
			}()
			waitFor(t, "consumer to park", func() bool { return r.Signal().Waiters() == 1 })
			cancel()
			select {
			case res := <-done:
				if res.n != 0 || !errors.Is(res.err, context.Canceled) || !strings.HasPrefix(res.err.Error(), "ring: ") {
					t.Fatalf("PopWait after cancel = %d, %v", res.n, res.err)
				}
			case <-time.After(testTimeout):
				t.Fatal("PopWait ignored cancellation")
			}
			if r.Signal().Waiters() != 0 {
				t.Fatalf("Waiters = %d after PopWait returned", r.Signal().Waiters())
			}
		})
	}
}

// TestBlockedProducersAllProceed parks several producers on a full ring,
// then frees every slot with one PopBatch, which sends a single token. The
// producers must pass the token along so that all of them get a slot while
// the consumer pops nothing more.
func TestBlockedProducersAllProceed(t *testing.T) {
	const producers = 4
	r := NewMPSC[uint64](producers)
	for i := range uint64(producers) {
		r.TryPush(100 + i)
	}
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	errs := make(chan error, producers)
	for p := range uint64(producers) {
		go func() { errs <- r.Push(ctx, p) }()
	}
	waitFor(t, "producers to park", func() bool { return r.space.Waiters() == producers })
	buf := make([]uint64, producers)
	if n := r.PopBatch(buf); n != producers {
		t.Fatalf("PopBatch = %d, want %d", n, producers)
	}
	for range producers {
		select {
		case err := <-errs:
			if err != nil {
				t.Fatal(err)
			}
		case <-time.After(testTimeout):
			t.Fatalf("a producer stayed parked with %d free slots", r.Cap()-r.Len())
		}
	}
	if r.Len() != producers {
		t.Fatalf("Len = %d, want %d", r.Len(), producers)
	}
}

// TestNotifyNeverBlocks notifies a Signal whose waiter never receives: the
// token slot fills and further notifies must drop, not block.
func TestNotifyNeverBlocks(t *testing.T) {
	s := NewSignal()
	s.waiters.Add(1) // a waiter that has announced itself but not received
	done := make(chan struct{})
	go func() {
		for range 1000 {
			s.Notify()
		}
		close(done)
	}()
	finish(t, "Notify with a full token slot", done)
	if len(s.wake) != 1 {
		t.Fatalf("pending tokens = %d, want 1", len(s.wake))
	}
}

func TestNoAllocs(t *testing.T) {
	ctx := context.Background()
	for _, k := range kinds {
		t.Run("kind="+k.name, func(t *testing.T) {
			r := k.new(64, NewSignal())
			buf := make([]uint64, 8)
			allocs := testing.AllocsPerRun(1000, func() {
				r.TryPush(1)
				_ = r.Push(ctx, 2)
				r.TryPush(3)
				r.TryPop()
				r.PopBatch(buf[:1])
				_, _ = r.PopWait(ctx, buf) // takes item 3, so never parks
			})
			if allocs != 0 {
				t.Fatalf("%v allocs per push/pop round, want 0", allocs)
			}
		})
	}
}

// TestMPSCWaitRoom: WaitRoom on a full ring parks until the consumer
// frees a slot, returns at once while there is room, and gives up when
// its context ends.
func TestMPSCWaitRoom(t *testing.T) {
	r := NewMPSC[int](2)
	for r.TryPush(0) {
	}
	short, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	if err := r.WaitRoom(short); err == nil {
		t.Fatal("WaitRoom on a full ring returned without room, before its context ended")
	}
	done := make(chan error, 1)
	go func() { done <- r.WaitRoom(context.Background()) }()
	select {
	case err := <-done:
		t.Fatalf("WaitRoom returned (%v) while the ring was full", err)
	case <-time.After(20 * time.Millisecond):
	}
	if _, ok := r.TryPop(); !ok {
		t.Fatal("nothing to pop")
	}
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(testTimeout):
		t.Fatal("WaitRoom did not return after a slot was freed")
	}
	if !r.TryPush(1) {
		t.Fatal("no room after WaitRoom returned, with no other producer")
	}
}
