package replication

import (
	"testing"

	"github.com/berthmq/berth/replication/event"
	"github.com/berthmq/berth/shards"
)

// BenchmarkDecodeEnqueueEvent decodes a replicated enqueue as apply does
// (a view of the event, the queue name first), for a message with a
// producer id and a 256-byte payload.
func BenchmarkDecodeEnqueueEvent(b *testing.B) {
	body := shards.NewBody([]byte("amq.direct"), []byte("orders.eu"), []byte("ct=json"), make([]byte, 256), true)
	data := appendEnqueueEvent(nil, "orders", body, 1e18, 7, 42)
	b.SetBytes(int64(len(data)))
	b.ReportAllocs()
	for b.Loop() {
		var enq event.Enqueue
		if err := enq.Decode(data); err != nil {
			b.Fatal(err)
		}
		enqueueEventOf(&enq, true).body.Unref()
	}
}
