package shards

import (
	"slices"
	"testing"

	"github.com/berthmq/berth/wire"
)

// refusingReplicator refuses the next refuse removal proposals with
// code, and records the ones it takes.
type refusingReplicator struct {
	journalReplicator
	refuse int
	code   wire.ErrorCode
	taken  [][]uint64
}

func (r *refusingReplicator) ProposeRemoves(_ *Queue, seqs []uint64, done func(error)) error {
	if r.refuse > 0 {
		r.refuse--
		return Errorf(r.code, "refused by the test")
	}
	r.taken = append(r.taken, slices.Clone(seqs))
	if done != nil {
		done(nil)
	}
	return nil
}

// TestRefusedRemovesProposedAgain: removals the group does not take for
// now (unavailable: too few replicas in sync) stay pending and are
// proposed again at the next flush, in order and split into events of at
// most RemovesMax; removals refused because this broker is not master
// are dropped (it applies the log again when it steps down). Before,
// every refused removal was dropped: the master had removed the
// messages, the followers kept them, and the copies differed until the
// master stepped down.
func TestRefusedRemovesProposedAgain(t *testing.T) {
	s, q, _ := replicatedShard(t, 0)
	r := &refusingReplicator{journalReplicator: journalReplicator{sh: s}, refuse: 3, code: wire.CodeUnavailable}
	s.broker.SetReplicator(r)
	const n = RemovesMax + 10
	for seq := uint64(1); seq <= n; seq++ {
		s.noteRemoved(q, seq) // proposes (refused) once at RemovesMax
	}
	s.flushRemoves()
	s.flushRemoves()
	if len(r.taken) != 0 || len(q.rare.removing) != n || len(s.removing) != 1 {
		t.Fatalf("while refused: %d proposals taken, %d removals pending, %d queues listed", len(r.taken), len(q.rare.removing), len(s.removing))
	}
	s.flushRemoves()
	if len(r.taken) != 2 || len(r.taken[0]) != RemovesMax || len(r.taken[1]) != 10 {
		t.Fatalf("taken %d proposals, want 2 of %d and 10", len(r.taken), RemovesMax)
	}
	var all []uint64
	for _, p := range r.taken {
		all = append(all, p...)
	}
	for i, seq := range all {
		if seq != uint64(i+1) {
			t.Fatalf("removal %d proposed as seq %d", i, seq)
		}
	}
	if len(q.rare.removing) != 0 || len(s.removing) != 0 || q.rare.removeRefused {
		t.Fatalf("after: %d pending, %d queues listed, refused %v", len(q.rare.removing), len(s.removing), q.rare.removeRefused)
	}

	// Not the master: dropped at once.
	r.refuse, r.code, r.taken = 1, wire.CodeNotAllowed, nil
	s.noteRemoved(q, n+1)
	s.flushRemoves()
	s.flushRemoves()
	if len(r.taken) != 0 || len(q.rare.removing) != 0 || len(s.removing) != 0 {
		t.Fatalf("not master: %d proposals taken, %d pending, %d queues listed", len(r.taken), len(q.rare.removing), len(s.removing))
	}
}
