package journal

import (
	"bytes"
	"encoding/binary"
	"math/rand/v2"
	"testing"
)

// TestCheckpointIndexMatchesFull checks the index part EncodeCheckpoint
// merges from the last checkpoint and the log against the index encoded
// whole at the same cut, through random appends, refs and frees with
// small segments (so compaction moves and drops records meanwhile), and
// across restarts from the checkpoints written (so the loaded one is the
// base and recovery's changes are logged). It fails if the log misses
// any kind of change.
func TestCheckpointIndexMatchesFull(t *testing.T) {
	dir := t.TempDir()
	rng := rand.New(rand.NewPCG(5, 5))
	var live []Pos
	nop := func(Pos, error) {}
	for round := 0; round < 4; round++ {
		loaded := false
		j, err := Open(Options{Dir: dir, SegmentBytes: 4096, Fsync: FsyncNever, Logger: quietLogger(),
			OnCheckpoint: func(Pos, []byte) error { loaded = true; return nil }}, func(Pos, Pos, []byte) error { return nil })
		if err != nil {
			t.Fatal(err)
		}
		if round > 0 && !loaded {
			t.Fatalf("round %d: the checkpoint was not loaded", round)
		}
		live = live[:0]
		j.mu.Lock()
		for pos, e := range j.mu.index.all() {
			if e.flags() == 0 {
				live = append(live, pos)
			}
		}
		j.mu.Unlock()
		var buf [2][]byte
		for ck := 0; ck < 6; ck++ {
			for i := 0; i < 400; i++ {
				switch r := rng.IntN(10); {
				case r < 5 || len(live) == 0:
					live = append(live, j.Append(bytes.Repeat([]byte{byte(i)}, 20+rng.IntN(100)), nop))
				case r < 7:
					j.AppendRef([]byte{1}, live[rng.IntN(len(live))], nop)
				default:
					k := rng.IntN(len(live))
					j.Free(live[k])
					live[k] = live[len(live)-1]
					live = live[:len(live)-1]
				}
			}
			if err := j.Sync(); err != nil {
				t.Fatal(err)
			}
			j.mu.Lock()
			full := j.fullIndexLocked(ckLog{})
			c := j.beginCheckpointLocked()
			j.mu.Unlock()
			b := j.EncodeCheckpoint(c, buf[ck%2])
			want := binary.AppendUvarint(nil, uint64(full.insN))
			want = append(want, full.ins...)
			got := b[checkpointHeader+len(c.segs) : j.ckOwnerStart]
			if !bytes.Equal(got, want) {
				t.Fatalf("round %d checkpoint %d: the merged index part (%d bytes) differs from the index encoded whole (%d bytes)", round, ck, len(got), len(want))
			}
			if err := j.WriteCheckpoint(b); err != nil {
				t.Fatal(err)
			}
			buf[ck%2] = b
		}
		if err := j.Close(); err != nil {
			t.Fatal(err)
		}
	}
}
