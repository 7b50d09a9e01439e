package server

import (
	"fmt"
	"testing"
	"time"

	"github.com/berthmq/berth/wire"
)

// answer reads frames until command id's COMPLETE or ERROR and returns
// the ERROR's code, or CodeOK.
func (rs *rawSession) answer(id uint64) wire.ErrorCode {
	rs.t.Helper()
	for {
		h, body := rs.read()
		switch h.Type {
		case wire.TypeComplete:
			rl, err := wire.DecodeComplete(body)
			if err != nil {
				rs.t.Fatal(err)
			}
			for i := 0; i < rl.Len(); i++ {
				if r := rl.At(i); r.First <= id && id <= r.Last {
					return wire.CodeOK
				}
			}
		case wire.TypeError:
			var e wire.Error
			if err := wire.DecodeError(body, &e); err != nil {
				rs.t.Fatal(err)
			}
			if e.CommandID == id {
				return e.Code
			}
		}
	}
}

// records is what the server holds for cs's consumers: its consumer and
// queue maps, the runs of used ids, and the index entries, read on cs's
// owner.
func records(t *testing.T, s *Server, cs *connState) string {
	t.Helper()
	got := make(chan string, 1)
	if err := cs.t.runOwned(func() {
		s.queueConsumers.mu.Lock()
		indexed := 0
		for _, refs := range s.queueConsumers.byQueue {
			for ref := range refs {
				if ref.cs == cs {
					indexed++
				}
			}
		}
		s.queueConsumers.mu.Unlock()
		consumers, served, runs := cs.ss.Counts()
		got <- fmt.Sprintf("consumers %d, queueOf %d, indexed %d, id runs %d", consumers, served, indexed, runs)
	}); err != nil {
		t.Fatal(err)
	}
	return <-got
}

// TestConsumerRecordsForgotten: a session that retries a SUBSCRIBE its
// shard refuses (another session's exclusive consumer), and one that
// subscribes and cancels over and over (a reply queue per request), keep
// no record per consumer once each is gone: the server's maps, the
// consumers-by-queue index and the used ids (one run for upward ids) stay
// small. Before, every one stayed until the session ended.
func TestConsumerRecordsForgotten(t *testing.T) {
	s := startOneShard(t)
	owner := rawDial(t, s, wire.Current)
	cmd := uint64(0)
	next := func() uint64 { cmd++; return cmd }
	for _, q := range []string{"held", "replies"} {
		id := next()
		owner.write(wire.AppendDeclareQueue(nil, wire.Current, &wire.DeclareQueue{CommandID: id, Name: []byte(q)}))
		if c := owner.answer(id); c != wire.CodeOK {
			t.Fatalf("declare %s: %v", q, c)
		}
	}
	id := next()
	owner.write(wire.AppendSubscribe(nil, wire.Current, &wire.Subscribe{CommandID: id, ConsumerID: 1, Queue: []byte("held"), Flags: wire.SubscribeExclusive}))
	if c := owner.answer(id); c != wire.CodeOK {
		t.Fatalf("exclusive subscribe: %v", c)
	}

	const n = 300
	other := rawDial(t, s, wire.Current)
	cs := connOfSession(s, other)
	if cs == nil {
		t.Fatal("no state for the second connection")
	}
	cid := uint32(0)
	for range n {
		cid++
		id := next()
		other.write(wire.AppendSubscribe(nil, wire.Current, &wire.Subscribe{CommandID: id, ConsumerID: cid, Queue: []byte("held")}))
		if c := other.answer(id); c != wire.CodeNotAllowed {
			t.Fatalf("subscribe beside an exclusive consumer: %v, want not-allowed", c)
		}
		cid++
		id = next()
		other.write(wire.AppendSubscribe(nil, wire.Current, &wire.Subscribe{CommandID: id, ConsumerID: cid, Queue: []byte("replies"), Credit: 10}))
		if c := other.answer(id); c != wire.CodeOK {
			t.Fatalf("subscribe: %v", c)
		}
		id = next()
		other.write(wire.AppendCancel(nil, wire.Current, id, cid))
		if c := other.answer(id); c != wire.CodeOK {
			t.Fatalf("cancel: %v", c)
		}
	}
	want := "consumers 0, queueOf 0, indexed 0, id runs 1"
	deadline := time.Now().Add(10 * time.Second)
	for {
		got := records(t, s, cs)
		if got == want {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after %d refused subscribes and %d subscribe-cancel cycles: %s, want %s", n, n, got, want)
		}
		time.Sleep(10 * time.Millisecond)
	}
	// A used id is still refused, and a consumer cancelled with nothing
	// to settle is gone.
	id = next()
	other.write(wire.AppendSubscribe(nil, wire.Current, &wire.Subscribe{CommandID: id, ConsumerID: 2, Queue: []byte("replies")}))
	if c := other.answer(id); c != wire.CodeInvalid {
		t.Fatalf("subscribe with a used id: %v, want invalid", c)
	}
	id = next()
	other.write(wire.AppendCancel(nil, wire.Current, id, 2))
	if c := other.answer(id); c != wire.CodeNotFound {
		t.Fatalf("cancel of a consumer cancelled before: %v, want not-found", c)
	}
}

// connOfSession is the server's state of rs's connection, found by its
// local address.
func connOfSession(s *Server, rs *rawSession) *connState {
	s.conns.Lock()
	defer s.conns.Unlock()
	for c := range s.conns.set {
		if c.t.RemoteAddr().String() == rs.nc.LocalAddr().String() {
			return c
		}
	}
	return nil
}
