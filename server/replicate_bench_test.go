package server

import (
	"testing"

	"github.com/berthmq/berth/shards"
	"github.com/berthmq/berth/wire"
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
		var rd wire.Reader
		rd.Reset(data)
		rd.U8()
		rd.Str(wire.NameLenMax)
		ev, ok := decodeEnqueueEvent(&rd, true)
		if !ok {
			b.Fatal("malformed")
		}
		ev.body.Unref()
	}
}
