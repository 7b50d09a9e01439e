package shards

import (
	"slices"
	"testing"

	"github.com/berthmq/berth/wire"
)

// TestConsumerGone drives one shard by hand: a consumer cancelled with
// nothing to settle is forgotten at once, one cancelled holding a
// delivery when that delivery is settled, one whose SUBSCRIBE is refused
// at once, and those of a deleted queue with it; the session hears of
// each (OnConsumerGone) but those of the deleted queue, and not of a
// refusal that leaves the consumer of that id in place.
func TestConsumerGone(t *testing.T) {
	br := New(Config{Shards: 1})
	s := br.shards[0]
	q := NewQueue("q", QueueOptions{}, 0, &s.pool)
	s.queues.add(q)
	var gone []uint32
	sess := &Session{ID: 1, Version: wire.Current, FrameMax: wire.FrameSizeDefault, Out: &discardWriter{},
		OnConsumerGone: func(id uint32) { gone = append(gone, id) }}
	other := &Session{ID: 2, Version: wire.Current, FrameMax: wire.FrameSizeDefault, Out: &discardWriter{}}
	has := func(id uint32) bool { return s.consumers[consumerKey{sess, id}] != nil }
	expect := func(what string, want ...uint32) {
		t.Helper()
		if !slices.Equal(gone, want) {
			t.Fatalf("%s: consumers gone %v, want %v", what, gone, want)
		}
	}

	s.handleCmd(Subscribe{Sess: sess, CmdID: 1, Queue: q, ConsumerID: 1, Credit: 10}.Command())
	s.handleCmd(Cancel{Sess: sess, CmdID: 2, ConsumerID: 1}.Command())
	if has(1) {
		t.Fatal("a consumer cancelled with nothing to settle is still held")
	}
	expect("cancel", 1)

	s.handleCmd(Subscribe{Sess: sess, CmdID: 3, Queue: q, ConsumerID: 2, Credit: 10}.Command())
	s.handleCmd(Publish{Queue: q, Body: NewBody(nil, []byte("q"), nil, []byte("m"), false), Now: 1}.Command())
	s.dispatchDirty()
	s.flush()
	s.handleCmd(Cancel{Sess: sess, CmdID: 4, ConsumerID: 2}.Command())
	if !has(2) {
		t.Fatal("a consumer cancelled holding a delivery is gone before the settle")
	}
	expect("cancel holding a delivery", 1)
	c := Settle{Sess: sess, CmdID: 5, ConsumerID: 2, Kind: SettleAccept, Last: true, NRanges: 1}
	c.Ranges[0] = wire.Range{First: 1, Last: 1}
	s.handleCmd(c.Command())
	if has(2) {
		t.Fatal("a cancelled consumer is held after its last delivery was settled")
	}
	expect("settle of the last delivery", 1, 2)

	s.handleCmd(Subscribe{Sess: other, CmdID: 1, Queue: q, ConsumerID: 1, Credit: 10, Exclusive: true}.Command())
	s.handleCmd(Subscribe{Sess: sess, CmdID: 6, Queue: q, ConsumerID: 3, Credit: 10}.Command())
	if has(3) {
		t.Fatal("a refused SUBSCRIBE left a consumer")
	}
	expect("refused subscribe", 1, 2, 3)

	s.handleCmd(Subscribe{Sess: other, CmdID: 2, Queue: q, ConsumerID: 1, Credit: 10}.Command())
	expect("refusal of an id in use (another session's)", 1, 2, 3)

	r := NewQueue("r", QueueOptions{}, 0, &s.pool)
	s.queues.add(r)
	s.handleCmd(Subscribe{Sess: sess, CmdID: 7, Queue: r, ConsumerID: 4, Credit: 10}.Command())
	s.handleCmd(Subscribe{Sess: sess, CmdID: 8, Queue: r, ConsumerID: 4, Credit: 10}.Command())
	if !has(4) {
		t.Fatal("a second SUBSCRIBE of an id in use removed its consumer")
	}
	expect("refusal of an id in use", 1, 2, 3)
	s.dropQueue(r)
	if has(4) {
		t.Fatal("a deleted queue's consumer is still held")
	}
	expect("queue deleted (the server hears of it from the deletion)", 1, 2, 3)
}
