package journal

import (
	"cmp"
	"fmt"
	"os"
	"runtime"
	"slices"
	"sync/atomic"
)

// compactLoop reclaims disk space on a goroutine of its own, so neither the
// owner nor the writer ever waits for it. It runs when the writer seals a
// segment or a Free leaves a sealed segment sparse or empty.
func (j *Journal) compactLoop() {
	defer close(j.compDone)
	for {
		select {
		case <-j.stop:
			return
		case <-j.kick:
		}
		for {
			select {
			case <-j.stop:
				return
			default:
			}
			did, err := j.compactOnce()
			if err != nil {
				j.fail(err)
				return
			}
			if !did {
				break
			}
		}
	}
}

// compactSkipNewest is how many of the newest sealed segments a rewrite
// leaves alone.
var compactSkipNewest = 2 // a variable so tests can rewrite the newest segments too

// newestSealedLocked returns the id of the n-th newest sealed segment, or
// 0 when there are fewer. j.mu must be held.
func (j *Journal) newestSealedLocked(n int) uint32 {
	if n <= 0 {
		return ^uint32(0)
	}
	var ids []uint32
	for _, s := range j.mu.segs {
		if s.sealed {
			ids = append(ids, s.id)
		}
	}
	if len(ids) < n {
		return 0
	}
	slices.Sort(ids)
	return ids[len(ids)-n]
}

// recentLocked reports whether segment id counts among the n newest,
// which a rewrite leaves alone: it is among the n newest sealed segments
// still there, and was made at most 2n segments before the active one
// (ids grow with each segment the writer or a rewrite makes). The rank
// alone does not do: once the newer segments had died and gone, an old
// segment kept by a few live records (a group log's epoch records)
// ranked among the newest for good and was never rewritten, its bytes
// staying on disk and its records in the index. The age alone does not
// either: once writing stops, the last segments the writer sealed would
// stay unrewritten for good. j.mu must be held.
func (j *Journal) recentLocked(id uint32, newest uint32, n int) bool {
	if n <= 0 || id < newest {
		return false
	}
	a := j.mu.nextSeg
	if j.mu.active != nil {
		a = j.mu.active.id
	}
	return uint64(id)+2*uint64(n) >= uint64(a)
}

func (j *Journal) fail(err error) {
	j.mu.Lock()
	if j.mu.err == nil {
		j.mu.err = err
		j.log.Error("journal: failed; all further records complete with an error", "err", err)
	}
	j.mu.space.Broadcast()
	j.mu.Unlock()
}

// compactOnce does one step of work: delete the segments that hold nothing
// that must survive, or else rewrite the live records of sparse segments
// into one new segment. It reports whether it did anything.
func (j *Journal) compactOnce() (bool, error) {
	j.mu.Lock()
	if j.mu.err != nil {
		j.mu.Unlock()
		return false, nil
	}
	var dead, sparse []*segment
	for _, s := range j.mu.segs {
		if !s.sealed || s.compacting {
			continue
		}
		if s.live == 0 {
			dead = append(dead, s)
		} else if s.live < j.compactLive {
			sparse = append(sparse, s)
		}
	}
	// The newest sealed segments are left alone: in a queue that is being
	// consumed their records die within moments, and rewriting them would
	// only copy records (mostly dequeue refs waiting for older segments to
	// go) again and again.
	slices.SortFunc(sparse, func(a, b *segment) int { return cmp.Compare(a.id, b.id) })
	if newest := j.newestSealedLocked(compactSkipNewest); len(sparse) > 0 {
		keep := sparse[:0]
		for _, s := range sparse {
			if !j.recentLocked(s.id, newest, compactSkipNewest) {
				keep = append(keep, s)
			}
		}
		sparse = keep
	}
	if len(dead) > 0 {
		// No record in a dead segment is needed by another segment: a ref
		// to a record still on disk keeps its own segment alive, so these
		// files may go in any order.
		for _, s := range dead {
			s.compacting = true
		}
		j.mu.Unlock()
		return true, j.removeSegments(dead)
	}
	slices.SortFunc(sparse, func(a, b *segment) int { return cmp.Compare(a.id, b.id) })
	var sel []*segment
	var live, deadBytes int64
	for _, s := range sparse {
		if live+s.live > j.segmentBytes-segmentHeaderSize {
			break
		}
		sel = append(sel, s)
		live += s.live
		deadBytes += s.size - s.live
	}
	// Rewriting only pays once it frees a real amount of disk; this also
	// keeps a fresh, dense output from being rewritten again and again.
	if deadBytes < j.compactLive || len(sel) == 0 {
		j.mu.Unlock()
		return false, nil
	}
	for _, s := range sel {
		s.compacting = true
	}
	type move struct {
		pos    Pos
		src    *segment
		srcOff int64
		size   int
		newOff int64
	}
	var moves []move
	for _, s := range sel {
		for i, pos := range s.positions {
			if i%lockSliceItems == lockSliceItems-1 {
				j.yieldLocked()
			}
			e := j.mu.index.get(pos)
			if e == nil || e.seg != s.id || !j.mustCopyLocked(*e) {
				continue
			}
			moves = append(moves, move{pos: pos, src: s, srcOff: int64(e.off), size: int(e.size)})
		}
	}
	out := &segment{id: j.mu.nextSeg, compacting: true}
	j.mu.nextSeg++
	j.mu.Unlock()

	slices.SortFunc(moves, func(a, b move) int { return cmp.Compare(a.pos, b.pos) })

	// The copy is written under a temporary name and renamed once durable:
	// recovery deletes a leftover temporary file, and treats a complete
	// output next to its sources as a finished rewrite.
	final := j.path(out.id)
	tmp := final + ".tmp"
	f, err := j.fs.OpenFile(tmp, os.O_RDWR|os.O_CREATE|os.O_TRUNC|os.O_APPEND, 0o644)
	if err != nil {
		return true, fmt.Errorf("journal: compaction create %s: %w", tmp, err)
	}
	const flushBytes = 1 << 20
	buf := appendSegmentHeader(make([]byte, 0, flushBytes+RecordBytesMax/64), 0)
	off := int64(0)
	flush := func() error {
		n, err := f.Write(buf)
		off += int64(n)
		buf = buf[:0]
		if err != nil {
			return fmt.Errorf("journal: compaction write %s: %w", tmp, err)
		}
		return nil
	}
	for i := range moves {
		m := &moves[i]
		m.newOff = off + int64(len(buf))
		start := len(buf)
		buf = growBytes(buf, m.size)
		if _, err := m.src.file.ReadAt(buf[start:], m.srcOff); err != nil {
			f.Close()
			return true, fmt.Errorf("journal: compaction read %s: %w", segmentName(m.src.id), err)
		}
		// Check the data again after the read: a copy must never turn a
		// bad record into one with a fresh, valid place.
		if err := checkRecord(buf[start:]); err != nil {
			f.Close()
			return true, fmt.Errorf("journal: compaction read %s+%d: %w", segmentName(m.src.id), m.srcOff, err)
		}
		if len(buf) >= flushBytes {
			if err := flush(); err != nil {
				f.Close()
				return true, err
			}
		}
	}
	if err := flush(); err != nil {
		f.Close()
		return true, err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return true, fmt.Errorf("journal: compaction fsync %s: %w", tmp, err)
	}
	if err := j.fs.Rename(tmp, final); err != nil {
		f.Close()
		return true, fmt.Errorf("journal: compaction rename %s: %w", tmp, err)
	}
	if err := j.fs.SyncDir(j.opts.Dir); err != nil {
		f.Close()
		return true, fmt.Errorf("journal: compaction sync dir: %w", err)
	}

	j.mu.Lock()
	out.file = f
	out.size = off
	out.written = off
	out.positions = make([]Pos, 0, len(moves))
	// Whether a ref counts depends on where its target is, so decide what
	// counted before any record moves and what counts after all have.
	moved := make([]bool, len(moves))
	wasCounted := make([]bool, len(moves))
	for i, m := range moves {
		out.positions = append(out.positions, m.pos)
		e := j.mu.index.get(m.pos)
		if e == nil || e.seg != m.src.id || int64(e.off) != m.srcOff {
			continue
		}
		moved[i] = true
		wasCounted[i] = j.countedLocked(*e)
	}
	for i, m := range moves {
		if moved[i] {
			e := j.mu.index.get(m.pos)
			e.seg = out.id
			e.off = uint32(m.newOff)
			j.ckMoveLocked(m.pos, e.seg, e.off)
		}
	}
	for i, m := range moves {
		if !moved[i] {
			continue
		}
		if wasCounted[i] {
			m.src.live -= int64(m.size)
		}
		if j.countedLocked(*j.mu.index.get(m.pos)) {
			out.live += int64(m.size)
		}
	}
	out.sealed = true
	out.compacting = false
	j.mu.segs[out.id] = out
	j.publishSegmentsLocked()
	j.mu.stats.Compactions++
	j.mu.stats.BytesRelocated += uint64(off)
	j.mu.Unlock()
	j.log.Debug("journal: compacted", "sources", len(sel), "output", segmentName(out.id), "records", len(moves), "bytes", off)
	return true, j.removeSegments(sel)
}

// removeSegments deletes the files durably, then forgets the records that
// were only in them, and with each plain record the refs to it.
func (j *Journal) removeSegments(segs []*segment) error {
	j.filesMu.Lock()
	for _, s := range segs {
		if s.file != nil {
			s.file.Close()
		}
		s.removed = true
	}
	j.filesMu.Unlock()
	for _, s := range segs {
		if err := j.fs.Remove(j.path(s.id)); err != nil {
			return fmt.Errorf("journal: remove %s: %w", segmentName(s.id), err)
		}
	}
	// Until the removals are durable the records may come back after a
	// crash, so refs to them must stay.
	if err := j.fs.SyncDir(j.opts.Dir); err != nil {
		return fmt.Errorf("journal: sync dir after remove: %w", err)
	}
	j.mu.Lock()
	for _, s := range segs {
		for i, pos := range s.positions {
			if i%lockSliceItems == lockSliceItems-1 {
				j.yieldLocked()
			}
			if e := j.mu.index.get(pos); e != nil && e.seg == s.id {
				j.dropLocked(pos, *e)
			}
		}
		delete(j.mu.segs, s.id)
		j.mu.stats.SegmentsReclaimed++
	}
	j.publishSegmentsLocked()
	j.mu.Unlock()
	return nil
}

// mustCopyLocked: a plain record is copied while live. A ref is copied
// while its target is on disk at all, even when the target is freed and
// shares its file: the lock is let go while records are picked, so the
// target may be picked live and freed before the ref is looked at, and
// the ref must then follow it.
func (j *Journal) mustCopyLocked(e entry) bool {
	if e.flags()&flagRef == 0 {
		return e.flags()&flagFreed == 0
	}
	return j.mu.index.get(e.ref) != nil
}

// compactYieldHook, when set by a test, runs each time the compactor lets
// go of the lock.
var compactYieldHook atomic.Pointer[func()]

// lockSliceItems bounds the index entries the compactor visits per hold
// of j.mu, so a big segment never stalls the owner or the writer.
var lockSliceItems = 4096

// yieldLocked lets the owner and the writer in. Records that still point at
// a segment being forgotten are dead ones (live ones were moved first),
// and nothing the others do can bring them back to life.
func (j *Journal) yieldLocked() {
	j.mu.Unlock()
	if hook := compactYieldHook.Load(); hook != nil {
		(*hook)()
	}
	runtime.Gosched() // sync.Mutex is not fair; give a waiter the chance
	j.mu.Lock()
}

// dropLocked forgets a record that is gone from disk. Refs to a plain
// record die with it. e is a copy: del clears the slot it came from.
func (j *Journal) dropLocked(pos Pos, e entry) {
	j.mu.index.del(pos)
	j.ckDelLocked(pos)
	if e.flags()&flagRef != 0 {
		return
	}
	for r := e.ref; r != 0; {
		rp := j.mu.index.get(r)
		if rp == nil || rp.flags()&flagRef == 0 || rp.ref != pos {
			break
		}
		re, next := *rp, j.mu.index.next(r, rp) // del clears both
		j.mu.index.del(r)
		j.ckDelLocked(r)
		// A ref in the target's own file stopped counting at Free.
		if rs := j.mu.segs[re.seg]; rs != nil && re.seg != e.seg {
			rs.live -= int64(re.size)
		}
		r = next
	}
}
