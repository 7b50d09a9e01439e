package shards

import (
	"fmt"
	"io"
	"log/slog"
	"runtime"
	"testing"
	"time"
	"unsafe"
)

// idleQueueStructMax is what a Queue struct may take: one allocation of
// the 160-byte size class.
const idleQueueStructMax = 160

// idleQueueBytesMax bounds the heap a shard holds per idle queue: the
// Queue (160), its slot in its shard's set of queues (9 to 18) and its
// slot in the slice AddQueues returns (8); the name is the caller's.
// With the shard's set a Go map (about 24 bytes a queue at this count)
// the test measures 192.
const idleQueueBytesMax = 188

// TestIdleQueueSize keeps the Queue struct within one 160-byte
// allocation; a field added to it belongs in queueRare or behind another
// pointer made at first use unless every queue needs it.
func TestIdleQueueSize(t *testing.T) {
	if n := unsafe.Sizeof(Queue{}); n > idleQueueStructMax {
		t.Fatalf("a Queue is %d bytes, over %d", n, idleQueueStructMax)
	}
}

// TestIdleQueueBytes adds 100,000 queues with AddQueues and measures the
// live heap they add to the broker: at most idleQueueBytesMax per queue,
// so an idle queue allocates nothing beyond its struct (no levels, no map
// of acquired messages, no options of its own). It also checks that
// AddQueues put each queue on the shard AddQueue would and that every
// shard knows its queues.
func TestIdleQueueBytes(t *testing.T) {
	const n = 100_000
	b := New(Config{Shards: 2, TickInterval: time.Hour, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err := b.Start(); err != nil {
		t.Fatal(err)
	}
	defer b.Stop()
	specs := make([]QueueSpec, n)
	for i := range specs {
		specs[i] = QueueSpec{Name: fmt.Sprintf("idle-%06d", i)}
		if i%10 == 0 {
			specs[i].Options.Durable = true
		}
	}
	before := liveHeap()
	qs, err := b.AddQueues(specs)
	if err != nil {
		t.Fatal(err)
	}
	after := liveHeap()
	per := float64(after-before) / n
	t.Logf("%.0f bytes of heap per idle queue (%d queues)", per, n)
	if per > idleQueueBytesMax {
		t.Errorf("%.0f bytes per idle queue, over %d", per, idleQueueBytesMax)
	}
	for i, q := range qs {
		if q == nil || q.Name != specs[i].Name || q.Shard() != b.ShardFor(q.Name) || *q.Options != specs[i].Options {
			t.Fatalf("queue %d: %+v for %+v", i, q, specs[i])
		}
	}
	if got := len(b.Queues()); got != n {
		t.Fatalf("the shards know %d queues, want %d", got, n)
	}
	runtime.KeepAlive(specs)
	runtime.KeepAlive(qs)
}

// liveHeap is the heap in use after a full collection.
func liveHeap() uint64 {
	var ms runtime.MemStats
	runtime.GC()
	runtime.GC()
	runtime.ReadMemStats(&ms)
	return ms.HeapAlloc
}
