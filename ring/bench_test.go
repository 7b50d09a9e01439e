package ring

import (
	"context"
	"fmt"
	"runtime"
	"sync"
	"testing"
)

// benchCapacity is the ring and channel size in the transfer benchmarks,
// the order of a shard's inbound ring.
const benchCapacity = 1024

// benchBatch is the consumer's PopBatch scratch size.
const benchBatch = 64

// split gives producer p its share of n items.
func split(n, producers, p int) int {
	share := n / producers
	if p == 0 {
		share += n % producers
	}
	return share
}

// BenchmarkTransfer moves b.N items from producers goroutines to one
// consumer. impl=ring is SPSC for one producer and MPSC for four; its
// producers use Push (parks when full, like a channel send) and its
// consumer PopWait. impl=chan is a buffered channel of the same capacity.
// batch=1 makes the ring consumer take one item per call, as a channel
// receive does.
func BenchmarkTransfer(b *testing.B) {
	for _, producers := range []int{1, 4} {
		for _, batch := range []int{1, benchBatch} {
			b.Run(fmt.Sprintf("impl=ring/producers=%d/batch=%d", producers, batch), func(b *testing.B) {
				var r interface {
					Push(context.Context, uint64) error
					PopWait(context.Context, []uint64) (int, error)
				}
				if producers == 1 {
					r = NewSPSC[uint64](benchCapacity)
				} else {
					r = NewMPSC[uint64](benchCapacity)
				}
				benchRing(b, producers, batch, r.Push, r.PopWait)
			})
		}
		b.Run(fmt.Sprintf("impl=chan/producers=%d/batch=1", producers), func(b *testing.B) {
			benchChan(b, producers)
		})
	}
}

func benchRing(b *testing.B, producers, batch int,
	push func(context.Context, uint64) error,
	popWait func(context.Context, []uint64) (int, error),
) {
	b.ReportAllocs()
	ctx := context.Background()
	var wg sync.WaitGroup
	wg.Add(producers)
	b.ResetTimer()
	for p := range producers {
		go func() {
			defer wg.Done()
			for i := range split(b.N, producers, p) {
				if err := push(ctx, uint64(i)); err != nil {
					panic(err) // background ctx: cannot happen
				}
			}
		}()
	}
	buf := make([]uint64, batch)
	var sum uint64
	for got := 0; got < b.N; {
		n, err := popWait(ctx, buf)
		if err != nil {
			b.Fatal(err)
		}
		for _, v := range buf[:n] {
			sum += v
		}
		got += n
	}
	wg.Wait()
	sink = sum
}

func benchChan(b *testing.B, producers int) {
	b.ReportAllocs()
	ch := make(chan uint64, benchCapacity)
	var wg sync.WaitGroup
	wg.Add(producers)
	b.ResetTimer()
	for p := range producers {
		go func() {
			defer wg.Done()
			for i := range split(b.N, producers, p) {
				ch <- uint64(i)
			}
		}()
	}
	var sum uint64
	for range b.N {
		sum += <-ch
	}
	wg.Wait()
	sink = sum
}

var sink uint64

// BenchmarkPingPong sends one item at a time and waits for its echo, so
// both sides find their ring empty and park on every op: it measures the
// cost of a park and a wake, the price of an idle shard.
func BenchmarkPingPong(b *testing.B) {
	b.Run("impl=ring", func(b *testing.B) {
		b.ReportAllocs()
		ctx := context.Background()
		ping, pong := NewSPSC[uint64](1), NewSPSC[uint64](1)
		defer func() {
			parks := ping.Signal().Parks() + pong.Signal().Parks()
			b.ReportMetric(float64(parks)/float64(b.N), "parks/op")
		}()
		done := make(chan struct{})
		go func() {
			defer close(done)
			buf := make([]uint64, 1)
			for range b.N {
				if _, err := ping.PopWait(ctx, buf); err != nil {
					panic(err)
				}
				for !pong.TryPush(buf[0]) {
					panic("ring: pong full")
				}
			}
		}()
		buf := make([]uint64, 1)
		for i := range uint64(b.N) {
			if !ping.TryPush(i) {
				b.Fatal("ping full")
			}
			if _, err := pong.PopWait(ctx, buf); err != nil {
				b.Fatal(err)
			}
		}
		<-done
	})
	b.Run("impl=chan", func(b *testing.B) {
		b.ReportAllocs()
		ping, pong := make(chan uint64, 1), make(chan uint64, 1)
		done := make(chan struct{})
		go func() {
			defer close(done)
			for range b.N {
				pong <- <-ping
			}
		}()
		for i := range uint64(b.N) {
			ping <- i
			<-pong
		}
		<-done
	})
}

// BenchmarkWake pushes each item only once the consumer has drained the
// previous one and parked, so every op pays one full park and wake
// (parks/op near 1); the producer's wait for the park, including the
// consumer's spin before it, is part of the op. Channels cannot report that a
// receiver is parked, so the channel baseline for this cost is
// BenchmarkPingPong/impl=chan, whose receives park on an empty channel.
func BenchmarkWake(b *testing.B) {
	b.Run("impl=ring", func(b *testing.B) {
		b.ReportAllocs()
		ctx := context.Background()
		r := NewSPSC[uint64](benchCapacity)
		done := make(chan struct{})
		go func() {
			defer close(done)
			buf := make([]uint64, benchBatch)
			for got := 0; got < b.N; {
				n, err := r.PopWait(ctx, buf)
				if err != nil {
					panic(err)
				}
				got += n
			}
		}()
		sig := r.Signal()
		for i := range uint64(b.N) {
			// The consumer parks once per item only after it has drained
			// the previous one, so the park count says it is ready.
			for sig.Parks() <= i || sig.Waiters() == 0 {
				runtime.Gosched()
			}
			if !r.TryPush(i) {
				b.Fatal("ring full")
			}
		}
		<-done
		b.ReportMetric(float64(r.Signal().Parks())/float64(b.N), "parks/op")
	})
}

// BenchmarkPushPop is one goroutine pushing and popping, with nobody
// parked: the bare cost of the fast path and proof it does not allocate.
func BenchmarkPushPop(b *testing.B) {
	b.Run("impl=ring/kind=spsc", func(b *testing.B) {
		b.ReportAllocs()
		r := NewSPSC[uint64](benchCapacity)
		for i := range uint64(b.N) {
			r.TryPush(i)
			v, _ := r.TryPop()
			sink += v
		}
	})
	b.Run("impl=ring/kind=mpsc", func(b *testing.B) {
		b.ReportAllocs()
		r := NewMPSC[uint64](benchCapacity)
		for i := range uint64(b.N) {
			r.TryPush(i)
			v, _ := r.TryPop()
			sink += v
		}
	})
	b.Run("impl=chan", func(b *testing.B) {
		b.ReportAllocs()
		ch := make(chan uint64, benchCapacity)
		for i := range uint64(b.N) {
			ch <- i
			sink += <-ch
		}
	})
}
