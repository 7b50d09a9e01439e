package shards

import (
	"testing"
	"time"

	"github.com/berthmq/berth/wire"
)

// discardWriter stands in for a connection: it drops the bytes and
// finishes the write at once.
type discardWriter struct{ writes, bytes int }

func (w *discardWriter) WriteAsync(bufs [][]byte, done func()) error {
	w.writes++
	for _, b := range bufs {
		w.bytes += len(b)
	}
	done()
	return nil
}

// BenchmarkShardPublishDeliverAccept drives one shard by hand through the
// steady state of a queue: publish, dispatch to a consumer with credit,
// write the DELIVER, and accept in batches of 64. It measures the shard's
// own cost per message and proves it allocates nothing. The ttl cases
// give every message an hour's TTL, so each publish and dispatch also
// looks after the queue's entry in the shard's expiry index.
//
//	go test ./shards -run '^$' -bench ShardPublishDeliverAccept -benchmem
func BenchmarkShardPublishDeliverAccept(b *testing.B) {
	for _, c := range []struct {
		name  string
		batch int
		ttl   int64
	}{{"batch=1", 1, 0}, {"batch=64", 64, 0}, {"ttl/batch=1", 1, 3600e9}, {"ttl/batch=64", 64, 3600e9}} {
		b.Run(c.name, func(b *testing.B) { benchPublishDeliverAccept(b, c.batch, c.ttl, nil) })
	}
}

// BenchmarkSessionEncoder is BenchmarkShardPublishDeliverAccept for a
// session with no Encoder, whose frames the shard writes by direct calls
// of the native encoder, and for one with an explicit NativeEncoder,
// called through the interface: the same bytes, so the difference is the
// cost of the interface calls (one per frame, not per message).
//
//	go test ./shards -run '^$' -bench SessionEncoder -benchmem
func BenchmarkSessionEncoder(b *testing.B) {
	for _, enc := range []struct {
		name string
		enc  Encoder
	}{{"default", nil}, {"interface", NativeEncoder{Version: wire.Current}}} {
		for _, batch := range []int{1, 64} {
			b.Run("encoder="+enc.name+"/batch="+itoa(batch), func(b *testing.B) { benchPublishDeliverAccept(b, batch, 0, enc.enc) })
		}
	}
}

// benchPublishDeliverAccept runs BenchmarkShardPublishDeliverAccept's
// steady state in publishes of batch messages with a TTL of ttl
// nanoseconds (0: none), for a session with Encoder enc.
func benchPublishDeliverAccept(b *testing.B, batch int, ttl int64, enc Encoder) {
	br := New(Config{Shards: 1})
	s := br.shards[0]
	q := NewQueue("q", QueueOptions{}, 0, &s.pool)
	s.queues.add(q)
	w := &discardWriter{}
	// OutMax as the server sets it by default: the cap is checked on
	// every delivery.
	sess := &Session{ID: 1, Version: wire.Current, FrameMax: wire.FrameSizeDefault, Out: w, OutMax: 4 << 20, Encoder: enc}
	s.handleCmd(Subscribe{Sess: sess, CmdID: 1, Queue: q, ConsumerID: 1, Credit: 1 << 16}.Command())
	payload := make([]byte, 128)
	// The shard's clock starts at the wall clock: a TTL runs from
	// there, not from a made-up time.
	now := time.Now().UnixNano()
	var nextID uint64 = 2
	var delivered, accepted uint64
	step := func(n int) {
		for i := 0; i < n; i++ {
			body := NewBody(nil, []byte("q"), nil, payload, false)
			cmd := Publish{Sess: sess, CmdID: nextID, Queue: q, Body: body, Now: now, TTLNanos: ttl}.Command()
			nextID++
			s.handle(&cmd)
		}
		s.dispatchDirty()
		s.flush()
		delivered += uint64(n)
		cmd := Settle{Kind: SettleAccept, Sess: sess, CmdID: nextID, ConsumerID: 1, NRanges: 1, Last: true}
		cmd.Ranges[0] = wire.Range{First: accepted + 1, Last: delivered}
		nextID++
		s.handleCmd(cmd.Command())
		accepted = delivered
		s.handleCmd(Credit{Sess: sess, ConsumerID: 1, Credit: uint32(n)}.Command())
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
	if q.Depth() != 0 || q.Counters().Acked != accepted {
		b.Fatalf("depth %d acked %d accepted %d", q.Depth(), q.Counters().Acked, accepted)
	}
}

func itoa(n int) string {
	if n == 0 {
		return "0"
	}
	var b [20]byte
	i := len(b)
	for n > 0 {
		i--
		b[i] = byte('0' + n%10)
		n /= 10
	}
	return string(b[i:])
}
