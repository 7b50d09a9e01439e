package controlplane

import (
	"fmt"
	"testing"

	"github.com/valyala/bytebufferpool"
)

// The reply buffers of batched reads (readbatch.go) come from a sync.Pool
// of *[]byte. These benchmarks measure that pattern against
// bytebufferpool's Get/Put for the same work: take a buffer, append a batch
// of 64-byte replies, hand the bytes on, return the buffer. Run with
//
//	go test ./controlplane -run '^$' -bench ReplyBuffer -benchmem
func BenchmarkReplyBuffer(b *testing.B) {
	reply := make([]byte, 64)
	var sink byte
	for _, batch := range []int{1, 16, 256} {
		b.Run(fmt.Sprintf("sync.Pool/batch=%d", batch), func(b *testing.B) {
			b.ReportAllocs()
			b.RunParallel(func(pb *testing.PB) {
				var s byte
				for pb.Next() {
					bp := replyPool.Get().(*[]byte)
					out := (*bp)[:0]
					for range batch {
						out = append(out, reply...)
					}
					s ^= out[len(out)-1]
					if cap(out) <= replyBufMax {
						*bp = out[:0]
						replyPool.Put(bp)
					}
				}
				sink ^= s
			})
		})
		b.Run(fmt.Sprintf("bytebufferpool/batch=%d", batch), func(b *testing.B) {
			b.ReportAllocs()
			b.RunParallel(func(pb *testing.PB) {
				var s byte
				for pb.Next() {
					bb := bytebufferpool.Get()
					for range batch {
						bb.B = append(bb.B, reply...)
					}
					s ^= bb.B[len(bb.B)-1]
					bytebufferpool.Put(bb)
				}
				sink ^= s
			})
		})
	}
	_ = sink
}
