package shards

import (
	"testing"

	"github.com/berthmq/berth/wire"
)

// BenchmarkQueueKinds drives one shard by hand as
// BenchmarkShardPublishDeliverAccept does (publish a batch, dispatch,
// write the DELIVER, accept, credit), on a plain queue, on a priority
// queue whose messages spread over all 11 levels, and on a plain queue
// whose messages are all delayed (each is promoted by the next dispatch,
// so the delay heap is exercised, not the clock). It compares their cost
// per message and shows that none allocates per message.
//
//	go test ./shards -run '^$' -bench QueueKinds -benchmem
func BenchmarkQueueKinds(b *testing.B) {
	for _, kind := range []string{"plain", "priority", "delayed"} {
		for _, batch := range []int{1, 64} {
			b.Run("kind="+kind+"/batch="+itoa(batch), func(b *testing.B) {
				benchQueueKind(b, kind, batch)
			})
		}
	}
}

func benchQueueKind(b *testing.B, kind string, batch int) {
	br := New(Config{Shards: 1})
	s := br.shards[0]
	var opts QueueOptions
	if kind == "priority" {
		opts.MaxPriority = PriorityMax
	}
	q := NewQueue("q", opts, 0, &s.pool)
	s.queues.add(q)
	w := &discardWriter{}
	sess := &Session{ID: 1, Version: wire.Current, FrameMax: wire.FrameSizeDefault, Out: w}
	s.handleCmd(Subscribe{Sess: sess, CmdID: 1, Queue: q, ConsumerID: 1, Credit: 1 << 16}.Command())
	payload := make([]byte, 128)
	var nextID uint64 = 2
	var delivered, accepted uint64
	n := 0
	step := func(k int) {
		for i := 0; i < k; i++ {
			body := NewBody(nil, []byte("q"), nil, payload, false)
			switch kind {
			case "priority":
				body.Priority = uint8(n % (PriorityMax + 1))
			case "delayed":
				// Due at once for the shard's clock, but later than the
				// command's Now: the message goes through the delay heap.
				body.DeliverAt = 2
			}
			n++
			cmd := Publish{Sess: sess, CmdID: nextID, Queue: q, Body: body, Now: 1}.Command()
			nextID++
			s.handle(&cmd)
		}
		s.markDirty(q)
		s.dispatchDirty()
		s.flush()
		delivered += uint64(k)
		cmd := Settle{Kind: SettleAccept, Sess: sess, CmdID: nextID, ConsumerID: 1, NRanges: 1, Last: true}
		cmd.Ranges[0] = wire.Range{First: accepted + 1, Last: delivered}
		nextID++
		s.handleCmd(cmd.Command())
		accepted = delivered
		s.handleCmd(Credit{Sess: sess, ConsumerID: 1, Credit: uint32(k)}.Command())
		s.flush()
	}
	for i := 0; i < 1000; i++ { // warm the pools and maps
		step(batch)
	}
	b.ReportAllocs()
	b.SetBytes(int64(len(payload)))
	b.ResetTimer()
	for i := 0; i < b.N; i += batch {
		step(batch)
	}
	b.StopTimer()
	s.stopTimers()
	if q.Depth() != 0 || q.Counters().Acked != accepted {
		b.Fatalf("depth %d acked %d accepted %d", q.Depth(), q.Counters().Acked, accepted)
	}
}
