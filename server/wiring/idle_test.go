package wiring

import (
	"fmt"
	"io"
	"log/slog"
	"runtime"
	"testing"
	"time"

	"github.com/berthmq/berth/shards"
)

// idleQueueBytesMax bounds the live heap an idle queue costs a broker:
// its shard's Queue (160 bytes) and set slot (9-18) and its share of the
// routing's table of queues (queueTable, about 30), its name aside: 202
// at 100,000 queues.
// Issue 14 aims at 512 bytes of RSS a queue, and with the Go collector
// letting the heap grow past the live heap by GOGC percent before it
// collects, that needs the live heap well under it. With the table a
// pmap of 40-byte entries this measures 241.
const idleQueueBytesMax = 220

// TestIdleQueueBytes declares 100,000 non-durable queues through the
// wiring, one at a time as clients do, and measures the live heap they
// add: at most idleQueueBytesMax per queue. (A declare copies the path
// to its key in the table; the copies it replaces are garbage, and not
// counted after a collection.)
func TestIdleQueueBytes(t *testing.T) {
	const n = 100_000
	b := shards.New(shards.Config{Shards: 2, TickInterval: time.Hour, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	w := New(Config{Broker: b, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err := b.Start(); err != nil {
		t.Fatal(err)
	}
	defer b.Stop()
	if err := w.Restore(); err != nil {
		t.Fatal(err)
	}
	names := make([]string, n)
	for i := range names {
		names[i] = fmt.Sprintf("idle-%06d", i)
	}
	before := liveHeap()
	for _, name := range names {
		if _, err := w.DeclareQueue(name, shards.QueueOptions{}, false, nil); err != nil {
			t.Fatal(err)
		}
	}
	after := liveHeap()
	per := float64(after-before) / n
	t.Logf("%.0f bytes of heap per idle queue (%d queues, names aside)", per, n)
	if per > idleQueueBytesMax {
		t.Errorf("%.0f bytes per idle queue, over %d", per, idleQueueBytesMax)
	}
	if w.Routing().Len() != n {
		t.Fatalf("%d queues routable, want %d", w.Routing().Len(), n)
	}
	runtime.KeepAlive(names)
}

// liveHeap is the heap in use after a full collection.
func liveHeap() uint64 {
	var ms runtime.MemStats
	runtime.GC()
	runtime.GC()
	runtime.ReadMemStats(&ms)
	return ms.HeapAlloc
}
