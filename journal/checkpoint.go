package journal

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"os"
	"slices"
)

// Checkpoints. Recovery without one reads every record of every segment.
// A checkpoint is the journal's index (where each record in it sits, and
// whether it is freed) and the owner's own state, both as of one position
// (upto): recovery loads it, scans only what was written after it (the
// tail of each segment it lists, and whole segments it does not list,
// which compaction or later appends made), and replays only records past
// upto. The owner's state stands for the replay of everything up to upto.
//
// File <dir>/checkpoint, replaced atomically (written as checkpoint.tmp,
// fsynced, renamed, directory fsynced):
//
//	magic "BJC1" | version u32 (2) | upto u64 | nextPos u64 | nextSeg u32 |
//	segments uvarint, then per segment: id uvarint, size uvarint |
//	entries uvarint, then per entry in position order: pos delta uvarint,
//	seg uvarint, off uvarint, size uvarint, flags u8, and for a ref its
//	distance back to its target uvarint |
//	owner bytes | owner length u64 | crc32c of all before u32
//
// (The owner's length comes last so that recovery finds both sections
// without a pass over the entries.)
//
// Integers in the fixed header are little-endian. A checkpoint whose CRC,
// magic or version is wrong, or that lists a segment longer than the file
// on disk, is ignored with a log line, and recovery replays everything.
const (
	checkpointName    = "checkpoint"
	checkpointVersion = 2
	checkpointHeader  = 4 + 4 + 8 + 8 + 4
)

var checkpointMagic = [4]byte{'B', 'J', 'C', '1'}

var errBadCheckpoint = errors.New("journal: bad checkpoint")

// BeginCheckpoint starts a checkpoint in buf (its contents are replaced)
// and returns it with the position it covers: every record appended so
// far. The caller, the journal's owner, must not append meanwhile; it
// then appends its own state for that position to the returned slice and
// hands the result to WriteCheckpoint.
//
// It holds the journal's lock while it encodes the index, about 10 ns a
// record.
func (j *Journal) BeginCheckpoint(buf []byte) ([]byte, Pos) {
	buf = buf[:0]
	j.mu.Lock()
	defer j.mu.Unlock()
	upto := j.mu.nextPos - 1
	buf = append(buf, checkpointMagic[:]...)
	buf = binary.LittleEndian.AppendUint32(buf, checkpointVersion)
	buf = binary.LittleEndian.AppendUint64(buf, uint64(upto))
	buf = binary.LittleEndian.AppendUint64(buf, uint64(j.mu.nextPos))
	buf = binary.LittleEndian.AppendUint32(buf, j.mu.nextSeg)
	ids := make([]uint32, 0, len(j.mu.segs))
	for id := range j.mu.segs {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	buf = binary.AppendUvarint(buf, uint64(len(ids)))
	for _, id := range ids {
		buf = binary.AppendUvarint(buf, uint64(id))
		buf = binary.AppendUvarint(buf, uint64(j.mu.segs[id].size))
	}
	x := &j.mu.index
	buf = binary.AppendUvarint(buf, uint64(x.len()))
	old := make([]Pos, 0, len(x.old))
	for pos := range x.old {
		old = append(old, pos)
	}
	slices.Sort(old)
	var prev Pos
	put := func(pos Pos, e *entry) {
		buf = binary.AppendUvarint(buf, uint64(pos-prev))
		prev = pos
		buf = binary.AppendUvarint(buf, uint64(e.seg))
		buf = binary.AppendUvarint(buf, uint64(e.off))
		buf = binary.AppendUvarint(buf, uint64(e.size))
		buf = append(buf, byte(e.flags))
		if e.flags&flagRef != 0 {
			buf = binary.AppendUvarint(buf, uint64(pos-e.ref))
		}
	}
	for _, pos := range old {
		put(pos, x.old[pos])
	}
	for i := range x.n {
		if e := &x.ring[(x.head+i)&(len(x.ring)-1)]; e.size != 0 {
			put(x.base+Pos(i), e)
		}
	}
	j.ckOwnerStart = len(buf)
	return buf, upto
}

// WriteCheckpoint makes every record the checkpoint covers durable, then
// writes it in place of the last one. The owner may append meanwhile; it
// must not begin another checkpoint until this returns. buf gets its CRC
// appended.
func (j *Journal) WriteCheckpoint(buf []byte) error {
	if err := j.Sync(); err != nil {
		return err
	}
	if j.ckOwnerStart < checkpointHeader || j.ckOwnerStart > len(buf) {
		return errors.New("journal: WriteCheckpoint without BeginCheckpoint")
	}
	buf = binary.LittleEndian.AppendUint64(buf, uint64(len(buf)-j.ckOwnerStart))
	buf = binary.LittleEndian.AppendUint32(buf, crc32.Checksum(buf, castagnoli))
	final := j.opts.Dir + "/" + checkpointName
	tmp := final + ".tmp"
	f, err := j.fs.OpenFile(tmp, os.O_RDWR|os.O_CREATE|os.O_TRUNC|os.O_APPEND, 0o644)
	if err != nil {
		return fmt.Errorf("journal: checkpoint create: %w", err)
	}
	for rest := buf; len(rest) > 0; {
		n, err := f.Write(rest[:min(len(rest), 4<<20)])
		if err != nil {
			f.Close()
			return fmt.Errorf("journal: checkpoint write: %w", err)
		}
		rest = rest[n:]
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return fmt.Errorf("journal: checkpoint fsync: %w", err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("journal: checkpoint close: %w", err)
	}
	if err := j.fs.Rename(tmp, final); err != nil {
		return fmt.Errorf("journal: checkpoint rename: %w", err)
	}
	if err := j.fs.SyncDir(j.opts.Dir); err != nil {
		return fmt.Errorf("journal: checkpoint sync dir: %w", err)
	}
	return nil
}

// ckpt is a checkpoint read at recovery.
type ckpt struct {
	upto, nextPos Pos
	nextSeg       uint32
	segs          map[uint32]int64 // id -> size covered
	entries       []byte           // the encoded entries, count first
	owner         []byte
}

type ckReader struct {
	b   []byte
	err error
}

func (r *ckReader) uvarint() uint64 {
	if r.err != nil {
		return 0
	}
	v, n := binary.Uvarint(r.b)
	if n <= 0 {
		r.err = fmt.Errorf("%w: truncated", errBadCheckpoint)
		return 0
	}
	r.b = r.b[n:]
	return v
}

func (r *ckReader) byte() byte {
	if r.err != nil {
		return 0
	}
	if len(r.b) == 0 {
		r.err = fmt.Errorf("%w: truncated", errBadCheckpoint)
		return 0
	}
	c := r.b[0]
	r.b = r.b[1:]
	return c
}

// readCheckpoint reads and checks the checkpoint file; (nil, nil) when
// there is none. sizes holds the segment files' sizes on disk.
func (j *Journal) readCheckpoint(sizes map[uint32]int64) (*ckpt, error) {
	f, err := j.fs.OpenFile(j.opts.Dir+"/"+checkpointName, os.O_RDONLY, 0)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil, nil
		}
		return nil, err
	}
	defer f.Close()
	size, err := f.Size()
	if err != nil {
		return nil, err
	}
	// Each record the checkpoint names takes at most 30 bytes in it and
	// at least 28 in a segment, so it is never much longer than the
	// segments together: a longer file is not read into memory.
	var segBytes int64
	for _, sz := range sizes {
		segBytes += sz
	}
	if size < checkpointHeader+4 || size > 2*segBytes+64<<20 {
		return nil, fmt.Errorf("%w: %d bytes for %d bytes of segments", errBadCheckpoint, size, segBytes)
	}
	b := make([]byte, size)
	if _, err := f.ReadAt(b, 0); err != nil && !errors.Is(err, io.EOF) {
		return nil, err
	}
	body := b[:len(b)-4]
	if crc32.Checksum(body, castagnoli) != binary.LittleEndian.Uint32(b[len(b)-4:]) {
		return nil, fmt.Errorf("%w: crc mismatch", errBadCheckpoint)
	}
	if [4]byte(body[:4]) != checkpointMagic {
		return nil, fmt.Errorf("%w: bad magic", errBadCheckpoint)
	}
	if v := binary.LittleEndian.Uint32(body[4:]); v != checkpointVersion {
		return nil, fmt.Errorf("%w: version %d, this build reads %d", errBadCheckpoint, v, checkpointVersion)
	}
	ck := &ckpt{
		upto:    Pos(binary.LittleEndian.Uint64(body[8:])),
		nextPos: Pos(binary.LittleEndian.Uint64(body[16:])),
		nextSeg: binary.LittleEndian.Uint32(body[24:]),
		segs:    map[uint32]int64{},
	}
	r := &ckReader{b: body[checkpointHeader:]}
	nsegs := r.uvarint()
	for i := uint64(0); i < nsegs && r.err == nil; i++ {
		id, sz := uint32(r.uvarint()), int64(r.uvarint())
		ck.segs[id] = sz
		if have, ok := sizes[id]; ok && have < sz {
			return nil, fmt.Errorf("%w: segment %s has %d bytes, the checkpoint covers %d", errBadCheckpoint, segmentName(id), have, sz)
		}
	}
	if r.err != nil {
		return nil, r.err
	}
	if len(r.b) < 8 {
		return nil, fmt.Errorf("%w: truncated", errBadCheckpoint)
	}
	olen := binary.LittleEndian.Uint64(r.b[len(r.b)-8:])
	rest := r.b[:len(r.b)-8]
	if olen > uint64(len(rest)) {
		return nil, fmt.Errorf("%w: owner section of %d bytes, %d left", errBadCheckpoint, olen, len(rest))
	}
	ck.entries = rest[:uint64(len(rest))-olen]
	ck.owner = rest[uint64(len(rest))-olen:]
	if ck.upto >= ck.nextPos {
		return nil, fmt.Errorf("%w: covers %d, next position %d", errBadCheckpoint, ck.upto, ck.nextPos)
	}
	return ck, nil
}

// removeCheckpoint deletes a checkpoint that recovery did not use, so
// that it cannot be taken for a current one later, when the segments it
// names have changed.
func (j *Journal) removeCheckpoint() {
	path := j.opts.Dir + "/" + checkpointName
	if err := j.fs.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		j.log.Warn("journal: could not remove an unused checkpoint", "path", path, "err", err)
	}
}

// loadCheckpointIndex fills the index from ck. Entries in segments that
// are gone (compaction removed them after the checkpoint) go to gone
// instead: a copy of one found in a newer segment takes its flags.
func (j *Journal) loadCheckpointIndex(ck *ckpt, gone map[Pos]entry) error {
	r := &ckReader{b: ck.entries}
	n := r.uvarint()
	if first := (&ckReader{b: r.b}).uvarint(); n > 0 && first > 0 && Pos(first) <= ck.upto {
		j.mu.index.reserve(Pos(first), uint64(ck.upto-Pos(first)+1), int(min(n, 1<<40)))
	}
	var pos Pos
	for i := uint64(0); i < n && r.err == nil; i++ {
		delta := r.uvarint()
		pos += Pos(delta)
		segID, off, size, flags := r.uvarint(), r.uvarint(), r.uvarint(), r.byte()
		var back uint64
		if flags&flagRef != 0 {
			back = r.uvarint()
		}
		if r.err != nil {
			break
		}
		if delta == 0 || pos > ck.upto || segID > 1<<32-1 || off > 1<<32-1 || size < recordHeaderSize || size > 1<<32-1 ||
			flags&^(flagRef|flagFreed) != 0 || flags&flagRef != 0 && (back == 0 || back >= uint64(pos)) {
			return fmt.Errorf("%w: entry at %d", errBadCheckpoint, pos)
		}
		e := entry{seg: uint32(segID), off: uint32(off), size: uint32(size), flags: uint32(flags)}
		if e.flags&flagRef != 0 {
			e.ref = pos - Pos(back)
		}
		seg := j.mu.segs[e.seg]
		if seg == nil {
			gone[pos] = e
			j.mu.ckSuspect = true
			continue
		}
		if e.flags&flagRef != 0 {
			t := j.mu.index.get(e.ref)
			if t == nil || t.flags&flagRef != 0 {
				continue // its target went with a removed segment
			}
			e.next = t.ref
			t.ref = pos
		}
		j.mu.index.insert(pos, e)
		seg.positions = append(seg.positions, pos)
	}
	if r.err == nil && len(r.b) != 0 {
		return fmt.Errorf("%w: %d bytes after the index", errBadCheckpoint, len(r.b))
	}
	return r.err
}

// relinkLive recomputes every segment's live bytes from the index.
func (j *Journal) relinkLive() {
	for _, s := range j.mu.segs {
		s.live = 0
	}
	// Records of one segment sit together: look it up once per run.
	var s *segment
	for _, e := range j.mu.index.all() {
		if !j.countedLocked(*e) {
			continue
		}
		if s == nil || s.id != e.seg {
			if s = j.mu.segs[e.seg]; s == nil {
				continue
			}
		}
		s.live += int64(e.size)
	}
}

// Contains reports whether pos is a live plain record (in the index and
// not freed). After recovery from a checkpoint, the owner checks the
// records its checkpoint named with it when CheckpointSuspect says some
// may have gone.
func (j *Journal) Contains(pos Pos) bool {
	j.mu.Lock()
	defer j.mu.Unlock()
	e := j.mu.index.get(pos)
	return e != nil && e.flags == 0
}

// CheckpointSuspect reports whether recovery from a checkpoint found some
// of its records gone from their segments or moved, so that the owner
// should check each record its own checkpoint state names (Contains).
func (j *Journal) CheckpointSuspect() bool {
	j.mu.Lock()
	defer j.mu.Unlock()
	return j.mu.ckSuspect
}
