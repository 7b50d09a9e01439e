package shards

import (
	"testing"

	"github.com/berthmq/berth/wire"
)

// TestSettleAfterGroupResetFails: a consumer of a replicated queue holds
// deliveries when its broker applies the group's log again (resetGroup,
// as on a step-down, or when an owner is taken back and wakes). An
// accept of one of them that reaches the shard after the reset fails
// with outcome-unknown: the message went back to the queue. Before, the
// tag was unknown after the reset and the accept completed, as a settle
// of an unknown tag does. A release completes, and so does an accept of
// a tag settled already.
func TestSettleAfterGroupResetFails(t *testing.T) {
	s, q, _ := replicatedShard(t, 0)
	r := &roleReplicator{journalReplicator: journalReplicator{sh: s}, master: true}
	s.broker.SetReplicator(r)
	groupMastered(q.group)(s)
	w := &captureWriter{}
	sess := &Session{ID: 1, Version: wire.Current, FrameMax: wire.FrameSizeDefault, Out: w}
	loop := func() { runPass(s) }
	s.handleCmd(Subscribe{Sess: sess, CmdID: 1, Queue: q, ConsumerID: 1, Credit: 3}.Command())
	for seq := uint64(1); seq <= 3; seq++ {
		s.ApplyEnqueue(q, seq, NewBody(nil, []byte("rq"), nil, []byte{byte('a' + seq)}, true), 0, 0, 0, 0)
	}
	loop()
	if got := len(w.take(t)); got != 3 {
		t.Fatalf("%d deliveries, want 3", got)
	}
	// Reset, and mastered again (re-elected): the settles go the
	// master's way, whose removes this replicator commits at once.
	resetGroup(q.group)(s)
	groupMastered(q.group)(s)
	settle := func(id uint64, kind uint8, tag uint64) {
		st := Settle{Sess: sess, CmdID: id, ConsumerID: 1, Kind: kind, Last: true, NRanges: 1}
		st.Ranges[0] = wire.Range{First: tag, Last: tag}
		s.handleCmd(st.Command())
		loop()
	}
	settle(10, SettleAccept, 1)
	settle(11, SettleReject, 2)
	settle(12, SettleRelease, 3)
	settle(13, SettleAccept, 1) // the same tag again: settled (as void) already
	got := map[uint64]wire.ErrorCode{}
	w.mu.Lock()
	buf := w.buf
	w.mu.Unlock()
	for n := 0; ; {
		h, body, k, err := wire.Next(buf[n:], wire.FrameSizeMax)
		if err != nil {
			t.Fatal(err)
		}
		if k == 0 {
			break
		}
		n += k
		switch h.Type {
		case wire.TypeError:
			var e wire.Error
			if err := wire.DecodeError(body, &e); err != nil {
				t.Fatal(err)
			}
			got[e.CommandID] = e.Code
		case wire.TypeComplete:
			ids, err := wire.DecodeComplete(body)
			if err != nil {
				t.Fatal(err)
			}
			for i := range ids.Len() {
				for id := ids.At(i).First; id <= ids.At(i).Last; id++ {
					got[id] = wire.CodeOK
				}
			}
		}
	}
	want := map[uint64]wire.ErrorCode{10: wire.CodeOutcomeUnknown, 11: wire.CodeOutcomeUnknown, 12: wire.CodeOK, 13: wire.CodeOK}
	for id, code := range want {
		if c, ok := got[id]; !ok || c != code {
			t.Errorf("settle %d: completed %v (%v), want %v", id, c, ok, code)
		}
	}
}

// runPass runs one pass of a shard's loop as its goroutine would, for a
// test that drives the shard: what its ring holds, then dispatch,
// proposals and output.
func runPass(s *Shard) {
	for {
		n := s.in.PopBatch(s.cmds)
		for i := 0; i < n; i++ {
			s.handle(&s.cmds[i])
			s.cmds[i] = Command{}
		}
		if n == 0 {
			break
		}
	}
	s.dispatchDirty()
	s.flushRemoves()
	s.flush()
}
