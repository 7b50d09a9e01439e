package shards

import (
	"testing"
	"unsafe"

	"github.com/berthmq/berth/wire"
)

// commandBytes is a Command's size: every slot of every shard's ring is
// one. It was 152 bytes while one struct carried every op's fields side
// by side.
const commandBytes = 136

// TestCommandSize pins the size of a ring slot, so that a change that
// grows every one of them is seen.
func TestCommandSize(t *testing.T) {
	if n := unsafe.Sizeof(Command{}); n != commandBytes {
		t.Fatalf("a Command is %d bytes, want %d: every slot of every shard's ring changes with it; if that is meant, say so and change commandBytes", n, commandBytes)
	}
}

// TestCommandViews builds each op's Command from values that set every
// field, none alike, and reads them back through the op's view: an op's
// Command method and its view agree on the layout of args, and no field
// of one op lands on another's.
func TestCommandViews(t *testing.T) {
	sess, q, body, fan := &Session{ID: 1}, &Queue{Name: "q"}, &Body{}, &Fanout{}
	const max64 = ^uint64(0)

	p := Publish{Sess: sess, CmdID: 2, Queue: q, Body: body, Fanout: fan, Now: 3, TTLNanos: -4, Producer: max64}
	pc := p.Command()
	if got := pc.publish(); got != p {
		t.Errorf("publish: %+v, want %+v", got, p)
	}
	sub := Subscribe{Sess: sess, CmdID: 5, Queue: q, ConsumerID: 6, Credit: 1<<32 - 1, AckMode: 255, Exclusive: true}
	sc := sub.Command()
	if got := sc.subscribe(); got != sub {
		t.Errorf("subscribe: %+v, want %+v", got, sub)
	}
	sub.Exclusive, sub.AckMode, sub.Credit = false, wire.AckNone, 1
	sc = sub.Command()
	if got := sc.subscribe(); got != sub {
		t.Errorf("subscribe: %+v, want %+v", got, sub)
	}
	cn := Cancel{Sess: sess, CmdID: 7, ConsumerID: 8}
	cc := cn.Command()
	if got := cc.cancel(); got != cn {
		t.Errorf("cancel: %+v, want %+v", got, cn)
	}
	cr := Credit{Sess: sess, ConsumerID: 9, Credit: 1<<32 - 1}
	crc := cr.Command()
	if got := crc.credit(); got != cr {
		t.Errorf("credit: %+v, want %+v", got, cr)
	}
	st := Settle{Sess: sess, CmdID: 10, ConsumerID: 11, Kind: SettleReject, Last: true, NRanges: RangesInline}
	for i := range st.Ranges {
		st.Ranges[i] = wire.Range{First: uint64(100 + 2*i), Last: max64 - uint64(i)}
	}
	stc := st.Command()
	if got := stc.settle(); got != st {
		t.Errorf("settle: %+v, want %+v", got, st)
	}
	if !stc.Completes() {
		t.Error("the last part of a settle does not complete")
	}
	st.Last = false
	stc = st.Command()
	if got := stc.settle(); got != st {
		t.Errorf("settle: %+v, want %+v", got, st)
	}
	if stc.Completes() {
		t.Error("a part of a settle before its last completes")
	}
	e := replEnqueue{queue: q, seq: 12, body: body, expiresAt: -13, producer: 14, producerSeq: max64, logPos: 15}
	ec := e.command()
	if got := ec.replEnqueue(); got != e {
		t.Errorf("replEnqueue: %+v, want %+v", got, e)
	}
	if ec.now != 0 {
		t.Errorf("replEnqueue carries time %d", ec.now)
	}
	d := deadLettered{queue: q, seq: 16, journalPos: 17}
	dc := d.command()
	if got := dc.deadLettered(); got != d {
		t.Errorf("deadLettered: %+v, want %+v", got, d)
	}
	rd := replDoneCommand(max64)
	if got := rd.replDoneTag(); got != max64 {
		t.Errorf("replDone: tag %d, want %d", got, max64)
	}

	for _, c := range []struct {
		name      string
		c         Command
		completes bool
	}{
		{"publish", pc, true}, {"publish of a dead letter", Publish{Queue: q, Body: body}.Command(), false},
		{"subscribe", sc, true}, {"cancel", cc, true}, {"cancel without a command", Cancel{Sess: sess, ConsumerID: 1}.Command(), false},
		{"credit", crc, false}, {"resume", Resume{Sess: sess}.Command(), false},
		{"tick", tickCommand(1), false}, {"call", CallCommand(func(*Shard) {}), false},
	} {
		if got := c.c.Completes(); got != c.completes {
			t.Errorf("%s: Completes %v, want %v", c.name, got, c.completes)
		}
	}
}

// TestReplEnqueueKeepsClock: a committed enqueue pushed onto the ring
// (TryApplyEnqueue) carries no time, so the shard's clock stays where it
// was, whatever the producer's sequence number.
func TestReplEnqueueKeepsClock(t *testing.T) {
	br := New(Config{Shards: 1})
	s := br.shards[0]
	q := NewQueue("q", QueueOptions{}, 0, &s.pool)
	s.queues.add(q)
	before := s.now
	s.handleCmd(replEnqueue{queue: q, seq: 1, body: NewBody(nil, []byte("q"), nil, []byte("m"), false), producer: 7, producerSeq: 1 << 62}.command())
	if q.Depth() != 1 {
		t.Fatalf("depth %d after the enqueue, want 1", q.Depth())
	}
	if s.now != before {
		t.Fatalf("the shard's clock moved from %d to %d on an enqueue that carries no time", before, s.now)
	}
}

// handleCmd runs c on s, as the shard's loop does with what it pops, for
// the tests that drive a shard by hand.
func (s *Shard) handleCmd(c Command) { s.handle(&c) }
