package shards

import (
	"fmt"
	"testing"

	"github.com/valyala/bytebufferpool"
)

// An outBatch (session.go) is pooled whole, its frame buffer with it, so
// a write batch costs one sync.Pool Get and Put. These benchmarks measure
// that against taking the frame buffer from bytebufferpool instead (the
// outBatch still pooled for its vectors): the same appends of 40-byte
// frame heads, then the release. Run with
//
//	go test ./shards -run '^$' -bench OutBatchBuffer -benchmem
func BenchmarkOutBatchBuffer(b *testing.B) {
	head := make([]byte, 40)
	for _, batch := range []int{1, 16, 256} {
		b.Run(fmt.Sprintf("pooled-outBatch/batch=%d", batch), func(b *testing.B) {
			b.ReportAllocs()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					ob := getOutBatch()
					for range batch {
						ob.Buf = append(ob.Buf, head...)
					}
					ob.release()
				}
			})
		})
		b.Run(fmt.Sprintf("bytebufferpool/batch=%d", batch), func(b *testing.B) {
			b.ReportAllocs()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					ob := getOutBatch()
					bb := bytebufferpool.Get()
					for range batch {
						bb.B = append(bb.B, head...)
					}
					ob.Buf = bb.B
					ob.Buf = nil
					bytebufferpool.Put(bb)
					ob.release()
				}
			})
		})
	}
}
