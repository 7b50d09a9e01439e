package wire

import "testing"

func publishFrame(count, size int) []byte {
	payload := make([]byte, size)
	b, s := AppendPublishStart(nil, Current, 1, "", count)
	for i := 0; i < count; i++ {
		b = AppendPublishMessage(b, MsgPersistent, 0, "queue-1", nil, payload)
	}
	EndFrame(b, s, 0)
	return b
}

func BenchmarkDecodePublish(b *testing.B) {
	for _, batch := range []int{1, 64} {
		frame := publishFrame(batch, 128)
		b.Run("batch="+itoa(batch), func(b *testing.B) {
			b.ReportAllocs()
			b.SetBytes(int64(len(frame)))
			var p Publish
			var m PublishMessage
			for i := 0; i < b.N; i++ {
				_, body, _, err := Next(frame, FrameSizeDefault)
				if err != nil {
					b.Fatal(err)
				}
				if err := DecodePublish(body, &p); err != nil {
					b.Fatal(err)
				}
				for p.Next(&m) {
				}
			}
		})
	}
}

func BenchmarkDecodeDeliver(b *testing.B) {
	for _, batch := range []int{1, 64} {
		payload := make([]byte, 128)
		frame, s := AppendDeliverStart(nil, Current, 1, batch)
		for i := 0; i < batch; i++ {
			frame = AppendDeliverMessageHead(frame, uint64(i), 0, 0, nil, []byte("queue-1"), nil, len(payload))
			frame = append(frame, payload...)
		}
		EndFrame(frame, s, 0)
		b.Run("batch="+itoa(batch), func(b *testing.B) {
			b.ReportAllocs()
			b.SetBytes(int64(len(frame)))
			var d Deliver
			var m DeliverMessage
			for i := 0; i < b.N; i++ {
				_, body, _, err := Next(frame, FrameSizeDefault)
				if err != nil {
					b.Fatal(err)
				}
				if err := DecodeDeliver(body, &d); err != nil {
					b.Fatal(err)
				}
				for d.Next(&m) {
				}
			}
		})
	}
}

func BenchmarkDecodeAccept(b *testing.B) {
	frame := AppendSettle(nil, Current, TypeAccept, 1, 1, []Range{{1, 64}, {70, 80}})
	b.ReportAllocs()
	var s Settle
	for i := 0; i < b.N; i++ {
		_, body, _, err := Next(frame, FrameSizeDefault)
		if err != nil {
			b.Fatal(err)
		}
		if err := DecodeSettle(body, &s); err != nil {
			b.Fatal(err)
		}
		for j := 0; j < s.Tags.Len(); j++ {
			_ = s.Tags.At(j)
		}
	}
}

func BenchmarkEncodePublish(b *testing.B) {
	payload := make([]byte, 128)
	buf := make([]byte, 0, 64<<10)
	b.ReportAllocs()
	for i := 0; i < b.N; i++ {
		buf, s := AppendPublishStart(buf[:0], Current, 1, "", 64)
		for j := 0; j < 64; j++ {
			buf = AppendPublishMessage(buf, 0, 0, "queue-1", nil, payload)
		}
		EndFrame(buf, s, 0)
	}
}
