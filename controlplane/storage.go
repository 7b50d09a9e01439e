package controlplane

import (
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"os"

	"github.com/cockroachdb/pebble/v2"
	"go.etcd.io/raft/v3"
	pb "go.etcd.io/raft/v3/raftpb"
	"google.golang.org/protobuf/proto"
)

// diskStorage is raft.Storage over pebble. Pebble holds the durable copy;
// the embedded MemoryStorage holds every entry since the last compaction
// (at most SnapshotEntries plus SnapshotTrailing entries) and serves raft's
// reads, so raft never waits on the disk for a read.
//
// Keys: "h" the HardState, "s" the latest snapshot (metadata and the
// compressed state), "e"+big-endian index for each entry.
//
// Only the raft goroutine writes; MemoryStorage has its own lock for raft's
// reads.
type diskStorage struct {
	*raft.MemoryStorage
	db *pebble.DB
	// last is the index of the last entry on disk (or of the snapshot when
	// there is none after it). Only the goroutine that saves touches it.
	last uint64
}

var (
	keyHardState = []byte("h")
	keySnapshot  = []byte("s")
)

func entryKey(i uint64) []byte {
	k := make([]byte, 9)
	k[0] = 'e'
	binary.BigEndian.PutUint64(k[1:], i)
	return k
}

type pebbleLogger struct{ l *slog.Logger }

func (p pebbleLogger) Infof(string, ...any) {}
func (p pebbleLogger) Errorf(format string, args ...any) {
	p.l.Error("controlplane: pebble: " + fmt.Sprintf(format, args...))
}
func (p pebbleLogger) Fatalf(format string, args ...any) {
	p.l.Error("controlplane: pebble fatal: " + fmt.Sprintf(format, args...))
	os.Exit(1)
}

// openStorage opens or creates the log in dir. A new log starts from a
// bootstrap snapshot at index 1, term 1 holding the voters and an empty
// state, which is etcd raft's recommended way to bootstrap: every member
// then shares entry 1 without ever appending a configuration change.
func openStorage(dir string, voters []uint64, logger *slog.Logger) (*diskStorage, error) {
	db, err := pebble.Open(dir, &pebble.Options{Logger: pebbleLogger{logger}})
	if err != nil {
		return nil, fmt.Errorf("controlplane: open log: %w", err)
	}
	s := &diskStorage{MemoryStorage: raft.NewMemoryStorage(), db: db}
	if err := s.load(voters); err != nil {
		db.Close()
		return nil, err
	}
	return s, nil
}

func (s *diskStorage) get(key []byte, m proto.Message) (bool, error) {
	v, closer, err := s.db.Get(key)
	if errors.Is(err, pebble.ErrNotFound) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("controlplane: read log: %w", err)
	}
	defer closer.Close()
	if err := proto.Unmarshal(v, m); err != nil {
		return false, fmt.Errorf("controlplane: corrupt log record %q: %w", key[:1], err)
	}
	return true, nil
}

func (s *diskStorage) load(voters []uint64) error {
	snap := &pb.Snapshot{}
	found, err := s.get(keySnapshot, snap)
	if err != nil {
		return err
	}
	if !found {
		snap = &pb.Snapshot{
			Data: compressSnapshot(NewState().Encode()),
			Metadata: &pb.SnapshotMetadata{
				Index:     proto.Uint64(1),
				Term:      proto.Uint64(1),
				ConfState: &pb.ConfState{Voters: voters},
			},
		}
		raw, err := proto.Marshal(snap)
		if err != nil {
			return fmt.Errorf("controlplane: encode bootstrap snapshot: %w", err)
		}
		if err := s.db.Set(keySnapshot, raw, pebble.Sync); err != nil {
			return fmt.Errorf("controlplane: write bootstrap snapshot: %w", err)
		}
	}
	if err := s.MemoryStorage.ApplySnapshot(snap); err != nil {
		return fmt.Errorf("controlplane: load snapshot: %w", err)
	}
	hs := &pb.HardState{}
	if found, err := s.get(keyHardState, hs); err != nil {
		return err
	} else if found {
		if err := s.MemoryStorage.SetHardState(hs); err != nil {
			return err
		}
	}
	first := snap.GetMetadata().GetIndex() + 1
	it, err := s.db.NewIter(&pebble.IterOptions{LowerBound: entryKey(first), UpperBound: entryKey(^uint64(0))})
	if err != nil {
		return fmt.Errorf("controlplane: read log: %w", err)
	}
	defer it.Close()
	const chunk = 4096
	batch := make([]*pb.Entry, 0, chunk)
	next := first
	for it.First(); it.Valid(); it.Next() {
		e := &pb.Entry{}
		if err := proto.Unmarshal(it.Value(), e); err != nil {
			return fmt.Errorf("controlplane: corrupt log entry: %w", err)
		}
		if e.GetIndex() != next {
			return fmt.Errorf("controlplane: log has a gap: want index %d, found %d", next, e.GetIndex())
		}
		next++
		batch = append(batch, e)
		if len(batch) == chunk {
			if err := s.MemoryStorage.Append(batch); err != nil {
				return err
			}
			batch = make([]*pb.Entry, 0, chunk)
		}
	}
	if err := it.Error(); err != nil {
		return fmt.Errorf("controlplane: read log: %w", err)
	}
	s.last = next - 1
	return s.MemoryStorage.Append(batch)
}

// writeLog adds a snapshot (may be empty) and entries to b. A received
// snapshot replaces the whole log. Appended entries replace any entries at
// and after their first index; a range deletion is written only then, when
// a new leader overwrites an uncommitted tail. Written on every append, the
// deletions piled up in pebble's memtable, whose flush then spent seconds
// fragmenting them while every write stalled.
func (s *diskStorage) writeLog(b *pebble.Batch, snap *pb.Snapshot, ents []*pb.Entry, buf []byte) ([]byte, error) {
	if !raft.IsEmptySnap(snap) {
		raw, err := proto.Marshal(snap)
		if err != nil {
			return buf, fmt.Errorf("controlplane: encode snapshot: %w", err)
		}
		b.Set(keySnapshot, raw, nil)
		b.DeleteRange(entryKey(0), entryKey(s.last+1), nil)
		s.last = snap.GetMetadata().GetIndex()
	}
	if len(ents) == 0 {
		return buf, nil
	}
	for _, e := range ents {
		var err error
		buf, err = proto.MarshalOptions{}.MarshalAppend(buf[:0], e)
		if err != nil {
			return buf, fmt.Errorf("controlplane: encode entry: %w", err)
		}
		b.Set(entryKey(e.GetIndex()), buf, nil)
	}
	end := ents[len(ents)-1].GetIndex()
	if end < s.last {
		b.DeleteRange(entryKey(end+1), entryKey(s.last+1), nil)
	}
	s.last = end
	return buf, nil
}

// save persists one Ready's snapshot, entries and hard state with a single
// pebble batch and at most one fsync, then publishes them to the memory
// cache. mustSync is raft's Ready.MustSync: a Ready that only moves the
// commit index needs no fsync, since a lost commit index is recovered from
// the leader.
func (s *diskStorage) save(hs *pb.HardState, ents []*pb.Entry, snap *pb.Snapshot, mustSync bool) error {
	if raft.IsEmptySnap(snap) && len(ents) == 0 && raft.IsEmptyHardState(hs) {
		return nil // a Ready with nothing durable costs no fsync
	}
	b := s.db.NewBatch()
	defer b.Close()
	if _, err := s.writeLog(b, snap, ents, nil); err != nil {
		return err
	}
	if !raft.IsEmptyHardState(hs) {
		raw, err := proto.Marshal(hs)
		if err != nil {
			return fmt.Errorf("controlplane: encode hard state: %w", err)
		}
		b.Set(keyHardState, raw, nil)
	}
	opts := pebble.NoSync
	if mustSync || !raft.IsEmptySnap(snap) {
		opts = pebble.Sync
	}
	if err := b.Commit(opts); err != nil {
		return fmt.Errorf("controlplane: write log: %w", err)
	}
	if !raft.IsEmptySnap(snap) {
		if err := s.MemoryStorage.ApplySnapshot(snap); err != nil && !errors.Is(err, raft.ErrSnapOutOfDate) {
			return err
		}
	}
	if !raft.IsEmptyHardState(hs) {
		if err := s.MemoryStorage.SetHardState(hs); err != nil {
			return err
		}
	}
	return s.MemoryStorage.Append(ents)
}

// compact records a snapshot of the state at index and drops log entries up
// to compactTo (at most index), keeping a trailing window so that a follower
// a little behind catches up from the log rather than a snapshot.
func (s *diskStorage) compact(index, compactTo uint64, cs *pb.ConfState, data []byte) error {
	snap, err := s.MemoryStorage.CreateSnapshot(index, cs, data)
	if err != nil {
		if errors.Is(err, raft.ErrSnapOutOfDate) {
			return nil
		}
		return fmt.Errorf("controlplane: create snapshot: %w", err)
	}
	raw, err := proto.Marshal(snap)
	if err != nil {
		return fmt.Errorf("controlplane: encode snapshot: %w", err)
	}
	b := s.db.NewBatch()
	defer b.Close()
	b.Set(keySnapshot, raw, nil)
	b.DeleteRange(entryKey(0), entryKey(compactTo+1), nil)
	if err := b.Commit(pebble.Sync); err != nil {
		return fmt.Errorf("controlplane: write snapshot: %w", err)
	}
	if err := s.MemoryStorage.Compact(compactTo); err != nil && !errors.Is(err, raft.ErrCompacted) {
		return fmt.Errorf("controlplane: compact log: %w", err)
	}
	return nil
}

func (s *diskStorage) close() error { return s.db.Close() }
