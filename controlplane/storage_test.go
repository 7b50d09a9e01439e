package controlplane

import (
	"testing"

	pb "go.etcd.io/raft/v3/raftpb"
	"google.golang.org/protobuf/proto"
)

func testEntries(from, to, term uint64) []*pb.Entry {
	var out []*pb.Entry
	for i := from; i <= to; i++ {
		out = append(out, &pb.Entry{Index: proto.Uint64(i), Term: proto.Uint64(term), Data: []byte{byte(i)}})
	}
	return out
}

// TestStorageOverwriteAndSnapshotSurviveReopen: a new leader's entries
// replace an uncommitted tail, and a received snapshot replaces the whole
// log, on disk as in memory: a reopened log holds neither the replaced tail
// nor entries the snapshot discarded.
func TestStorageOverwriteAndSnapshotSurviveReopen(t *testing.T) {
	dir := t.TempDir()
	s, err := openStorage(dir, []uint64{1, 2, 3}, quietLogger())
	if err != nil {
		t.Fatal(err)
	}
	hs := &pb.HardState{Term: proto.Uint64(2), Vote: proto.Uint64(1), Commit: proto.Uint64(4)}
	if err := s.save(nil, testEntries(2, 10, 1), nil, true); err != nil {
		t.Fatal(err)
	}
	// A new leader at term 2 overwrites from 5; 7..10 must go.
	if err := s.save(hs, testEntries(5, 6, 2), nil, true); err != nil {
		t.Fatal(err)
	}
	// Plain appends after that need no deletion and keep everything.
	if err := s.save(nil, testEntries(7, 8, 2), nil, true); err != nil {
		t.Fatal(err)
	}
	s.close()

	s, err = openStorage(dir, nil, quietLogger())
	if err != nil {
		t.Fatal(err)
	}
	if last, _ := s.LastIndex(); last != 8 {
		t.Fatalf("last index %d after reopen, want 8", last)
	}
	for i, want := range map[uint64]uint64{4: 1, 5: 2, 6: 2, 7: 2, 8: 2} {
		if term, err := s.Term(i); err != nil || term != want {
			t.Fatalf("term of %d: %d %v, want %d", i, term, err, want)
		}
	}
	// A snapshot at 6 from the leader replaces the log, 7 and 8 included
	// (raft's MemoryStorage drops them too); the entries after it arrive
	// in the same Ready.
	snap := &pb.Snapshot{Data: compressSnapshot(NewState().Encode()), Metadata: &pb.SnapshotMetadata{
		Index: proto.Uint64(6), Term: proto.Uint64(3), ConfState: &pb.ConfState{Voters: []uint64{1, 2, 3}}}}
	if err := s.save(nil, testEntries(7, 7, 3), snap, true); err != nil {
		t.Fatal(err)
	}
	s.close()

	s, err = openStorage(dir, nil, quietLogger())
	if err != nil {
		t.Fatal(err)
	}
	defer s.close()
	first, _ := s.FirstIndex()
	last, _ := s.LastIndex()
	if first != 7 || last != 7 {
		t.Fatalf("log [%d, %d] after the snapshot, want [7, 7]", first, last)
	}
	if term, err := s.Term(7); err != nil || term != 3 {
		t.Fatalf("term of 7: %d %v, want 3", term, err)
	}
}
