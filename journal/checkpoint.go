package journal

import (
	"cmp"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"os"
	"runtime"
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

// The index part of a checkpoint is not encoded from the index under the
// lock, which held the owner's appends about 10 ns a record (50 ms for
// five million) and more for the records outside the ring, whose
// positions it had to sort. The journal keeps instead, under its lock,
// the changes made to the index since the last checkpoint (ckLog: the
// records inserted, in position order as appends make them, and the
// positions freed, moved by compaction or dropped), and the index part
// of the last checkpoint written (ckBase). BeginCheckpoint only swaps the
// log for an empty one; EncodeCheckpoint, on the owner's writer
// goroutine, merges the log into the base: what it encodes is the index
// as BeginCheckpoint found it, entry for entry.
//
// Recovery starts the log (its inserts, moves and drops are logged) with
// the loaded checkpoint's index part as the base, or none. A journal
// whose owner takes no checkpoints (Options.OnCheckpoint nil) keeps no
// log; were it to call BeginCheckpoint, that would encode the index
// under the lock, as before, and start one.

// ckLog is the index's changes since the last BeginCheckpoint.
type ckLog struct {
	on bool
	// ins holds the records inserted, encoded as in a checkpoint, while
	// their positions increase; insX those inserted out of order after
	// (recovery, reading a compaction output).
	ins     []byte
	insN    int
	insPrev Pos
	insX    []ckIns
	moves   []ckMove
	frees   []Pos
	dels    []Pos
	// drops: entries of the loaded checkpoint that recovery left out of
	// the index (their segment is gone, or their target).
	drops []Pos
	// full: ins is the whole index, not changes to a base.
	full bool
}

type ckIns struct {
	pos Pos
	e   entry
}

type ckMove struct {
	pos      Pos
	seg, off uint32
}

func (l *ckLog) reset() {
	*l = ckLog{on: l.on, ins: l.ins[:0], insX: l.insX[:0], moves: l.moves[:0], frees: l.frees[:0], dels: l.dels[:0], drops: l.drops[:0]}
}

// ckInsertLocked notes an insert into the index.
func (j *Journal) ckInsertLocked(pos Pos, e entry) {
	l := &j.mu.ckLog
	if !l.on {
		return
	}
	if pos <= l.insPrev {
		l.insX = append(l.insX, ckIns{pos, e})
		return
	}
	l.ins = appendCkEntry(l.ins, pos, l.insPrev, &e)
	l.insPrev = pos
	l.insN++
}

func (j *Journal) ckMoveLocked(pos Pos, seg, off uint32) {
	if l := &j.mu.ckLog; l.on {
		l.moves = append(l.moves, ckMove{pos, seg, off})
	}
}

func (j *Journal) ckFreeLocked(pos Pos) {
	if l := &j.mu.ckLog; l.on {
		l.frees = append(l.frees, pos)
	}
}

func (j *Journal) ckDelLocked(pos Pos) {
	if l := &j.mu.ckLog; l.on {
		l.dels = append(l.dels, pos)
	}
}

func appendCkEntry(buf []byte, pos, prev Pos, e *entry) []byte {
	buf = binary.AppendUvarint(buf, uint64(pos-prev))
	buf = binary.AppendUvarint(buf, uint64(e.seg))
	buf = binary.AppendUvarint(buf, uint64(e.off))
	buf = binary.AppendUvarint(buf, uint64(e.size))
	buf = append(buf, byte(e.flags()))
	if e.flags()&flagRef != 0 {
		buf = binary.AppendUvarint(buf, uint64(pos-e.ref))
	}
	return buf
}

// readCkEntry decodes an entry appendCkEntry encoded. The streams it
// reads are the journal's own (the log, or a base already checked when
// it was loaded).
func readCkEntry(r *ckReader, prev Pos) (Pos, entry) {
	pos := prev + Pos(r.uvarint())
	e := entry{seg: uint32(r.uvarint()), off: uint32(r.uvarint()), size: uint32(r.uvarint())}
	e.setFlags(uint32(r.byte()))
	if e.flags()&flagRef != 0 {
		e.ref = pos - Pos(r.uvarint())
	}
	return pos, e
}

// CheckpointCut is the journal's part of a checkpoint as of one position,
// between BeginCheckpoint and EncodeCheckpoint.
type CheckpointCut struct {
	upto, nextPos Pos
	nextSeg       uint32
	segs          []byte // count and (id, size) pairs, encoded
	log           ckLog
}

// Upto is the last position the checkpoint covers.
func (c *CheckpointCut) Upto() Pos { return c.upto }

// BeginCheckpoint starts a checkpoint covering every record appended so
// far. The caller, the journal's owner, must not append meanwhile; it
// then captures its own state for that position, and on any goroutine
// hands the cut to EncodeCheckpoint, appends its state, and calls
// WriteCheckpoint; it must not begin another checkpoint before that.
//
// It holds the journal's lock for a time that grows with the number of
// segments only.
func (j *Journal) BeginCheckpoint() *CheckpointCut {
	j.mu.Lock()
	defer j.mu.Unlock()
	return j.beginCheckpointLocked()
}

func (j *Journal) beginCheckpointLocked() *CheckpointCut {
	c := &CheckpointCut{upto: j.mu.nextPos - 1, nextPos: j.mu.nextPos, nextSeg: j.mu.nextSeg}
	ids := make([]uint32, 0, len(j.mu.segs))
	for id := range j.mu.segs {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	c.segs = binary.AppendUvarint(c.segs, uint64(len(ids)))
	for _, id := range ids {
		c.segs = binary.AppendUvarint(c.segs, uint64(id))
		c.segs = binary.AppendUvarint(c.segs, uint64(j.mu.segs[id].size))
	}
	spare := j.ckSpare
	j.ckSpare = ckLog{}
	if !j.mu.ckLog.on {
		c.log = j.fullIndexLocked(spare)
	} else {
		c.log = j.mu.ckLog
		spare.on = true
		spare.reset()
		j.mu.ckLog = spare
	}
	j.mu.ckLog.on = true
	return c
}

// fullIndexLocked encodes the whole index as a log that replaces the base.
func (j *Journal) fullIndexLocked(l ckLog) ckLog {
	l.reset()
	l.full = true
	x := &j.mu.index
	old := make([]Pos, 0, len(x.old))
	for pos := range x.old {
		old = append(old, pos)
	}
	slices.Sort(old)
	for _, pos := range old {
		l.ins = appendCkEntry(l.ins, pos, l.insPrev, x.old[pos])
		l.insPrev = pos
		l.insN++
	}
	for i := range x.n {
		if e := &x.ring[(x.head+i)&(len(x.ring)-1)]; e.size != 0 {
			pos := x.base + Pos(i)
			l.ins = appendCkEntry(l.ins, pos, l.insPrev, e)
			l.insPrev = pos
			l.insN++
		}
	}
	return l
}

// ckEntryMax bounds an encoded entry: a position delta and ref distance
// of up to 10 bytes each, segment, offset and size of up to 5, flags 1.
const ckEntryMax = 10 + 5 + 5 + 5 + 1 + 10

// CheckpointBound bounds the bytes EncodeCheckpoint makes of c, so that
// the caller can size its buffer at once (growing one of tens of MiB is
// a copy the scheduler cannot preempt). Same goroutine as
// EncodeCheckpoint.
func (j *Journal) CheckpointBound(c *CheckpointCut) int {
	return checkpointHeader + len(c.segs) + 10 + j.indexBound(c)
}

func (j *Journal) indexBound(c *CheckpointCut) int {
	n := len(c.log.ins) + ckEntryMax*len(c.log.insX)
	if !c.log.full {
		n += len(j.ckBase)
	}
	// A moved entry may take up to 8 more bytes (segment and offset),
	// and an entry after a dropped one a longer delta.
	return n + 8*len(c.log.moves) + 10*(len(c.log.dels)+len(c.log.drops)) + ckEntryMax
}

// EncodeCheckpoint encodes the index part of c, the index as
// BeginCheckpoint found it, in buf (its contents are replaced), and
// returns it for the owner to append its state to. It does not take the
// journal's lock; it is called one at a time, in the order of the cuts,
// and buf must not be the buffer of the previous call (the next one
// reads its index part from there).
func (j *Journal) EncodeCheckpoint(c *CheckpointCut, buf []byte) []byte {
	buf = buf[:0]
	buf = append(buf, checkpointMagic[:]...)
	buf = binary.LittleEndian.AppendUint32(buf, checkpointVersion)
	buf = binary.LittleEndian.AppendUint64(buf, uint64(c.upto))
	buf = binary.LittleEndian.AppendUint64(buf, uint64(c.nextPos))
	buf = binary.LittleEndian.AppendUint32(buf, c.nextSeg)
	buf = append(buf, c.segs...)
	l := &c.log
	base, baseN := j.ckBase, j.ckBaseN
	if l.full {
		base, baseN, j.ckBaseLast = nil, 0, 0
	}
	out := j.ckScratch[:0]
	if b := j.indexBound(c); cap(out) < b {
		out = make([]byte, 0, b)
	}
	n := 0
	firstIns := Pos(0)
	if l.insN > 0 {
		firstIns, _ = readCkEntry(&ckReader{b: l.ins}, 0)
	}
	if len(l.moves)+len(l.frees)+len(l.dels)+len(l.drops)+len(l.insX) == 0 && (l.insN == 0 || firstIns > j.ckBaseLast) {
		// Only appends since the last checkpoint: the base, then them.
		out = appendYielding(out, base)
		n = baseN
		if l.insN > 0 {
			r := &ckReader{b: l.ins}
			pos, e := readCkEntry(r, 0)
			out = appendCkEntry(out, pos, j.ckBaseLast, &e)
			out = appendYielding(out, r.b)
			n += l.insN
			j.ckBaseLast = l.insPrev
		}
	} else {
		out, n = j.mergeIndexLog(out, base, baseN, l)
	}
	j.ckScratch = out
	buf = binary.AppendUvarint(buf, uint64(n))
	start := len(buf)
	buf = appendYielding(buf, out)
	j.ckBase, j.ckBaseN = buf[start:len(buf):len(buf)], n
	j.ckOwnerStart = len(buf)
	l.full = false
	l.reset()
	j.ckSpare = *l
	return buf
}

// The checkpoint writer shares two cores with the shards: a copy of tens
// of MiB (which the scheduler cannot preempt) or a long merge kept a
// shard waiting for a processor for 5 to 8 ms in BenchmarkCheckpointStall.
// It copies in slices and yields between them.
const (
	yieldBytes = 256 << 10
	yieldEvery = 1 << 14 // records
)

func appendYielding(dst, src []byte) []byte {
	dst = slices.Grow(dst, len(src))
	for len(src) > yieldBytes {
		dst = append(dst, src[:yieldBytes]...)
		src = src[yieldBytes:]
		runtime.Gosched()
	}
	return append(dst, src...)
}

// mergeIndexLog applies the changes in l to base, both in position
// order, and appends the result to out.
func (j *Journal) mergeIndexLog(out, base []byte, baseN int, l *ckLog) ([]byte, int) {
	byPos := func(a, b Pos) int { return cmp.Compare(a, b) }
	slices.SortFunc(l.frees, byPos)
	slices.SortFunc(l.dels, byPos)
	slices.SortFunc(l.drops, byPos)
	slices.SortStableFunc(l.moves, func(a, b ckMove) int { return cmp.Compare(a.pos, b.pos) })
	ins := l.insX
	if len(ins) > 0 {
		r := &ckReader{b: l.ins}
		var prev Pos
		for range l.insN {
			pos, e := readCkEntry(r, prev)
			prev = pos
			ins = append(ins, ckIns{pos, e})
		}
		// The later insert of a position wins (recovery may insert a
		// record again once it finds a newer copy).
		slices.SortStableFunc(ins, func(a, b ckIns) int { return cmp.Compare(a.pos, b.pos) })
		l.insX = ins
	}
	br := &ckReader{b: base}
	ir := &ckReader{b: l.ins}
	bLeft, iLeft := baseN, l.insN
	if len(ins) > 0 {
		iLeft = len(ins)
	}
	var bPos, iPos, bPrev, iPrev, prev Pos
	var bE, iE entry
	nextBase := func() bool {
		if bLeft == 0 {
			return false
		}
		bLeft--
		bPos, bE = readCkEntry(br, bPrev)
		bPrev = bPos
		return true
	}
	k := 0
	nextIns := func() bool {
		if iLeft == 0 {
			return false
		}
		iLeft--
		if len(ins) > 0 {
			iPos, iE = ins[k].pos, ins[k].e
			k++
			for iLeft > 0 && ins[k].pos == iPos {
				iPos, iE = ins[k].pos, ins[k].e
				k++
				iLeft--
			}
			return true
		}
		iPos, iE = readCkEntry(ir, iPrev)
		iPrev = iPos
		return true
	}
	haveB, haveI := nextBase(), nextIns()
	var fi, di, dri, mi, n int
	for haveB || haveI {
		var pos Pos
		var e entry
		switch {
		case haveB && (!haveI || bPos < iPos):
			pos, e = bPos, bE
			haveB = nextBase()
			for dri < len(l.drops) && l.drops[dri] < pos {
				dri++
			}
			if dri < len(l.drops) && l.drops[dri] == pos {
				continue
			}
		case haveB && bPos == iPos:
			pos, e = iPos, iE
			haveB, haveI = nextBase(), nextIns()
		default:
			pos, e = iPos, iE
			haveI = nextIns()
		}
		for mi < len(l.moves) && l.moves[mi].pos < pos {
			mi++
		}
		for mi < len(l.moves) && l.moves[mi].pos == pos {
			e.seg, e.off = l.moves[mi].seg, l.moves[mi].off
			mi++
		}
		for fi < len(l.frees) && l.frees[fi] < pos {
			fi++
		}
		if fi < len(l.frees) && l.frees[fi] == pos {
			e.setFlags(e.flags() | flagFreed)
		}
		for di < len(l.dels) && l.dels[di] < pos {
			di++
		}
		if di < len(l.dels) && l.dels[di] == pos {
			continue
		}
		out = appendCkEntry(out, pos, prev, &e)
		prev = pos
		n++
		if n%yieldEvery == 0 {
			runtime.Gosched()
		}
	}
	j.ckBaseLast = prev
	return out, n
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
	body := r.b
	var last Pos
	if first := (&ckReader{b: r.b}).uvarint(); n > 0 && first > 0 && Pos(first) <= ck.upto {
		j.mu.index.reserve(Pos(first), uint64(ck.upto-Pos(first)+1), int(min(n, 1<<40)))
	}
	// Each segment's positions are a run of entries (they come in
	// position order): they share one array, cut with their capacity
	// capped, rather than each growing its own (a tenth of a 10M
	// restart). A segment whose entries come in several runs appends.
	all := make([]Pos, 0, min(n, uint64(len(body)/5+1)))
	var runSeg *segment
	runStart := 0
	endRun := func() {
		if runSeg == nil {
			return
		}
		run := all[runStart:len(all):len(all)]
		if len(runSeg.positions) == 0 {
			runSeg.positions = run
		} else {
			runSeg.positions = append(runSeg.positions, run...)
		}
		runSeg = nil
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
		e := entry{seg: uint32(segID), off: uint32(off), size: uint32(size)}
		e.setFlags(uint32(flags))
		if e.flags()&flagRef != 0 {
			e.ref = pos - Pos(back)
		}
		last = pos
		seg := runSeg
		if seg == nil || seg.id != e.seg {
			seg = j.mu.segs[e.seg]
		}
		if seg == nil {
			gone[pos] = e
			j.mu.ckSuspect = true
			j.mu.ckLog.drops = append(j.mu.ckLog.drops, pos)
			continue
		}
		if e.flags()&flagRef != 0 {
			t := j.mu.index.get(e.ref)
			if t == nil || t.flags()&flagRef != 0 {
				j.mu.ckLog.drops = append(j.mu.ckLog.drops, pos)
				continue // its target went with a removed segment
			}
			j.mu.index.setNext(pos, &e, t.ref)
			t.ref = pos
		}
		j.mu.index.insert(pos, e)
		if seg != runSeg {
			endRun()
			runSeg, runStart = seg, len(all)
		}
		all = append(all, pos)
	}
	endRun()
	if r.err == nil && len(r.b) != 0 {
		return fmt.Errorf("%w: %d bytes after the index", errBadCheckpoint, len(r.b))
	}
	if r.err != nil {
		return r.err
	}
	// The entries are the base of the next checkpoint, and what recovery
	// changes from here on is logged.
	j.ckBase, j.ckBaseN, j.ckBaseLast = body, int(n), last
	j.mu.ckLog.on = true
	return nil
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
	return e != nil && e.flags() == 0
}

// CheckpointSuspect reports whether recovery from a checkpoint found some
// of its records gone from their segments or moved, so that the owner
// should check each record its own checkpoint state names (Contains).
func (j *Journal) CheckpointSuspect() bool {
	j.mu.Lock()
	defer j.mu.Unlock()
	return j.mu.ckSuspect
}
