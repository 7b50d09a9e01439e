package journal

import (
	"errors"
	"fmt"
	"log/slog"
	"math/bits"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"
)

// Pos is the logical position of a record. Positions are assigned at append
// in increasing order starting at 1 and never change, not even when
// compaction moves a record to another segment.
type Pos uint64

// FsyncPolicy says when a record counts as done.
type FsyncPolicy uint8

const (
	// FsyncAlways completes a record after an fsync (fdatasync) covers it.
	FsyncAlways FsyncPolicy = iota
	// FsyncNever completes a record after write(2) returns. UNSAFE: a
	// machine crash or power loss loses completed records, and may damage
	// any unsynced segment, not only the newest (recovery cuts each segment
	// at its first bad record). Nothing is fsynced but on Sync, Close and
	// compaction's own copies. Only for benchmarks that compare like with
	// like, and for data that may be lost.
	FsyncNever
)

// fsyncPolicyNames are the policies' names, as operators give them
// (berthd's -fsync) and String prints them.
var fsyncPolicyNames = [...]string{FsyncAlways: "always", FsyncNever: "never"}

// FsyncPolicyNames lists the policies' names in the order of their values:
// "always", "never". The slice is the caller's.
func FsyncPolicyNames() []string { return slices.Clone(fsyncPolicyNames[:]) }

// ParseFsyncPolicy returns the policy of the given name, "always" or
// "never". Any other name is an error that names it and the policies.
func ParseFsyncPolicy(name string) (FsyncPolicy, error) {
	for p, n := range fsyncPolicyNames {
		if n == name {
			return FsyncPolicy(p), nil
		}
	}
	return 0, fmt.Errorf("journal: fsync policy %q: want %s", name, strings.Join(fsyncPolicyNames[:], " or "))
}

// Valid reports whether p is one of the policies.
func (p FsyncPolicy) Valid() bool { return int(p) < len(fsyncPolicyNames) }

// String returns the policy's name, which ParseFsyncPolicy reads back.
func (p FsyncPolicy) String() string {
	if !p.Valid() {
		return fmt.Sprintf("FsyncPolicy(%d)", uint8(p))
	}
	return fsyncPolicyNames[p]
}

// Completion is called once per record, in append order, on the journal's
// writer goroutine, after the fsync (or the write, under FsyncNever) that
// covers the record, or with a non-nil error if the record is not durable.
// It must not block.
type Completion func(pos Pos, err error)

// Options configure a journal. Zero values take the defaults.
type Options struct {
	Dir string
	// FS is the file system; nil means OSFS. Tests pass a FaultFS.
	FS FS
	// SegmentBytes is the size at which the active segment is sealed.
	SegmentBytes int64
	Fsync        FsyncPolicy
	// PendingBytesMax bounds the bytes appended but not yet handed to the
	// writer. Append parks while the bound is reached. The batch being
	// written is held apart, so up to twice this much is in memory.
	PendingBytesMax int
	Logger          *slog.Logger
	// CompactLiveRatio: sealed segments whose live bytes are below this
	// fraction of SegmentBytes are rewritten into fewer, denser segments.
	CompactLiveRatio float64
	// OnCheckpoint, when set, lets Open recover from the checkpoint the
	// owner wrote last (WriteCheckpoint): it is called with the position
	// the checkpoint covers and the owner's state, before any replay, and
	// replay then sees only records after upto. owner stays valid after
	// the call. An error from it makes Open ignore the checkpoint and
	// replay every record. Without it the checkpoint file is not read.
	OnCheckpoint func(upto Pos, owner []byte) error
}

const (
	segmentBytesDefault    = 64 << 20
	segmentBytesMin        = 4 << 10
	segmentBytesMax        = 1 << 31 // offsets are kept as uint32
	pendingBytesMaxDefault = 16 << 20
	pendingBytesMin        = 64 << 10
	compactRatioDefault    = 0.25
	// batchHistogramBuckets: bucket i counts fsyncs that covered
	// [2^i, 2^(i+1)) records; the last bucket takes the rest.
	batchHistogramBuckets = 20
	// FsyncHistogramBuckets: bucket i counts fsyncs that took
	// [2^i, 2^(i+1)) microseconds (bucket 0 also takes under 1 us); the
	// last bucket takes the rest (from 2^22 us, about 4.2 s).
	FsyncHistogramBuckets = 23
)

// Errors returned by the journal. I/O errors are wrapped with the
// operation and file.
var (
	ErrClosed    = errors.New("journal: closed")
	ErrFailed    = errors.New("journal: failed after an I/O error, no further records are accepted")
	ErrTooLarge  = errors.New("journal: record too large")
	ErrBadTarget = errors.New("journal: ref target is not a live plain record")
	ErrNotFound  = errors.New("journal: no such live record")
)

// Stats is a snapshot of the journal's counters.
type Stats struct {
	Segments    int
	DiskBytes   int64 // bytes in segment files, pending bytes included
	LiveBytes   int64 // bytes of records that must stay on disk
	LiveRecords int   // records in the index (live, or freed but still on disk)
	Appends     uint64
	Batches     uint64 // batches written, one write(2) each per segment
	Fsyncs      uint64 // fsyncs that covered records
	// RecordsSynced counts records covered by those fsyncs; divided by
	// Fsyncs it gives the mean records per fsync.
	RecordsSynced uint64
	// BatchHistogram[i] counts fsyncs covering [2^i, 2^(i+1)) records.
	BatchHistogram [batchHistogramBuckets]uint64
	// FsyncHistogram[i] counts those fsyncs by how long they took:
	// [2^i, 2^(i+1)) microseconds (see FsyncHistogramBuckets), measured on
	// the writer goroutine around the fsync that ends the batch.
	FsyncHistogram [FsyncHistogramBuckets]uint64
	// FsyncNanos is the total time of those fsyncs.
	FsyncNanos        uint64
	Compactions       uint64 // rewrites of sparse segments
	SegmentsReclaimed uint64 // segment files deleted
	BytesRelocated    uint64
	DroppedBytes      int64 // torn or corrupt bytes truncated by recovery
	// SourcesFinished counts segments that recovery deleted because a
	// rewrite had already copied them when the process stopped.
	SourcesFinished int
	Err             error // non-nil once the journal has failed
}

// RecordsPerFsync is the mean number of records one fsync covered.
func (s Stats) RecordsPerFsync() float64 {
	if s.Fsyncs == 0 {
		return 0
	}
	return float64(s.RecordsSynced) / float64(s.Fsyncs)
}

const (
	flagRef   = 1
	flagFreed = 2
)

// entry locates a record on disk. For a plain record ref is the head of the
// list of refs pointing at it; for a ref, ref is its target and the next
// ref on the target's list is kept in link (index.next). It is 24 bytes,
// a ring slot of the index: every record in the journal costs one.
type entry struct {
	seg  uint32
	off  uint32
	size uint32 // header and data
	// link holds the flags (its top two bits) and, for a ref, how far
	// before it the next ref on its target's list is: pos - next, 0 for
	// none, linkFar when that does not fit (index.farNext holds it).
	link uint32
	ref  Pos
}

const (
	linkFlagShift = 30
	linkDelta     = 1<<linkFlagShift - 1
	linkFar       = linkDelta
)

func (e entry) flags() uint32 { return e.link >> linkFlagShift }

func (e *entry) setFlags(f uint32) { e.link = e.link&linkDelta | f<<linkFlagShift }

type segment struct {
	id      uint32
	size    int64 // bytes placed, header included, pending ones too
	written int64 // bytes handed to write(2)
	live    int64 // bytes of records that must survive
	// positions lists every record placed here, in increasing order; an
	// index entry that points elsewhere marks a dead or moved copy.
	positions  []Pos
	file       File
	sealed     bool // no record will be added and all are durable
	compacting bool // owned by the compactor
	removed    bool // file closed and deleted; guarded by filesMu
}

type pending struct {
	pos  Pos
	done Completion
	err  error
}

type chunk struct {
	seg        *segment
	start, end int   // in batch.buf
	segOff     int64 // offset of start within the segment
}

type batch struct {
	buf    []byte
	chunks []chunk
	comps  []pending
	bytes  int
}

func (b *batch) reset() {
	b.buf = b.buf[:0]
	clear(b.chunks)
	b.chunks = b.chunks[:0]
	clear(b.comps) // drop the callbacks for the collector
	b.comps = b.comps[:0]
	b.bytes = 0
}

// Journal is a write-ahead journal; see the package documentation for the
// caller's contract.
type Journal struct {
	opts         Options
	fs           FS
	log          *slog.Logger
	segmentBytes int64
	recordMax    int
	pendingMax   int
	compactLive  int64 // live-byte threshold for rewriting a segment
	// indexBytes is the memory of the index (index.publish) and
	// segPosBytes that of the segments' position lists
	// (publishSegmentsLocked), for IndexBytes.
	indexBytes, segPosBytes atomic.Int64

	mu struct {
		sync.Mutex
		work     sync.Cond // writer waits for a batch
		space    sync.Cond // appenders wait for room; Sync waits for durability
		nextPos  Pos
		nextSeg  uint32
		active   *segment
		index    index
		segs     map[uint32]*segment
		fill     *batch // being appended to
		inflight *batch // being written by the writer
		err      error  // first I/O error; sticky
		closing  bool
		idle     bool // writer waits on work
		// ckSuspect: recovery from a checkpoint met copies of records
		// it covers (CheckpointSuspect).
		ckSuspect bool
		// ckLog: the index's changes since the last checkpoint
		// (checkpoint.go).
		ckLog ckLog

		syncWanted bool
		donePos    Pos // every record up to here has been completed
		syncedPos  Pos // every record up to here is durable

		stats Stats
	}

	// filesMu keeps a segment file open while Read uses it.
	filesMu sync.RWMutex

	writerCur *segment // writer's open segment; writer goroutine only
	// ckOwnerStart is where the owner's part of the checkpoint being
	// made starts (EncodeCheckpoint, WriteCheckpoint; the owner's only).
	ckOwnerStart int
	// The index part of the last checkpoint encoded (its entries, their
	// number and last position), a scratch buffer and an emptied log:
	// EncodeCheckpoint's, and BeginCheckpoint's after it (checkpoint.go).
	ckBase     []byte
	ckBaseN    int
	ckBaseLast Pos
	ckScratch  []byte
	ckSpare    ckLog
	kick       chan struct{}
	stop       chan struct{}
	writerDone chan struct{}
	compDone   chan struct{}
}

func segmentName(id uint32) string { return fmt.Sprintf("%016x.seg", id) }

func (j *Journal) path(id uint32) string { return filepath.Join(j.opts.Dir, segmentName(id)) }

// Append adds a plain record and returns its position. The record is live
// until Free(pos). data is copied before Append returns. done is called
// later on the writer goroutine.
func (j *Journal) Append(data []byte, done Completion) Pos {
	return j.add(kindPlain, data, 0, done)
}

// AppendRef adds a record that refers to target, a live plain record. It
// stays on disk exactly as long as target does: a replay never shows it
// without its target, nor the target without it.
func (j *Journal) AppendRef(data []byte, target Pos, done Completion) Pos {
	return j.add(kindRef, data, target, done)
}

func (j *Journal) add(kind uint8, data []byte, target Pos, done Completion) Pos {
	size := recordHeaderSize + len(data)
	j.mu.Lock()
	for j.mu.fill.bytes > 0 && j.mu.fill.bytes+size > j.pendingMax && !j.mu.closing && j.mu.err == nil {
		j.mu.space.Wait()
	}
	if j.mu.closing {
		j.mu.Unlock()
		done(0, ErrClosed)
		return 0
	}
	pos := j.mu.nextPos
	j.mu.nextPos++
	var err error
	var t *entry // the ref's target, looked up once
	switch {
	case j.mu.err != nil:
		err = fmt.Errorf("%w: %w", ErrFailed, j.mu.err)
	case len(data) > j.recordMax:
		err = fmt.Errorf("%w: %d bytes, limit %d", ErrTooLarge, len(data), j.recordMax)
	case kind == kindRef:
		if t = j.mu.index.get(target); t == nil || t.flags() != 0 {
			err = fmt.Errorf("%w: %d", ErrBadTarget, target)
		}
	}
	b := j.mu.fill
	if err != nil {
		b.comps = append(b.comps, pending{pos: pos, done: done, err: err})
		b.bytes += recordHeaderSize
		j.wakeWriterLocked()
		j.mu.Unlock()
		return pos
	}
	seg := j.mu.active
	if seg.size+int64(size) > j.segmentBytes && seg.size > segmentHeaderSize {
		seg = j.rollLocked(pos)
	}
	off := seg.size
	start := len(b.buf)
	b.buf = appendRecord(b.buf, kind, pos, target, data)
	if n := len(b.chunks); n > 0 && b.chunks[n-1].seg == seg {
		b.chunks[n-1].end = len(b.buf)
	} else {
		b.chunks = append(b.chunks, chunk{seg: seg, start: start, end: len(b.buf), segOff: off})
	}
	seg.size += int64(size)
	seg.live += int64(size)
	c := cap(seg.positions)
	seg.positions = append(seg.positions, pos)
	if cap(seg.positions) != c {
		j.publishSegmentsLocked()
	}
	e := entry{seg: seg.id, off: uint32(off), size: uint32(size)}
	if kind == kindRef {
		// t is still valid: nothing has changed the index since the
		// lookup, and it is updated before the insert may move it.
		e.setFlags(flagRef)
		e.ref = target
		j.mu.index.setNext(pos, &e, t.ref)
		t.ref = pos
	}
	j.mu.index.insert(pos, e)
	j.ckInsertLocked(pos, e)
	b.comps = append(b.comps, pending{pos: pos, done: done})
	b.bytes += size
	j.mu.stats.Appends++
	j.wakeWriterLocked()
	j.mu.Unlock()
	return pos
}

func (j *Journal) wakeWriterLocked() {
	if j.mu.idle {
		j.mu.idle = false
		j.mu.work.Signal()
	}
}

// rollLocked starts a new active segment. Its header goes into the batch so
// the writer creates the file when it reaches it.
func (j *Journal) rollLocked(basePos Pos) *segment {
	seg := &segment{id: j.mu.nextSeg, size: segmentHeaderSize}
	j.mu.nextSeg++
	j.mu.segs[seg.id] = seg
	j.mu.active = seg
	b := j.mu.fill
	start := len(b.buf)
	b.buf = appendSegmentHeader(b.buf, basePos)
	b.chunks = append(b.chunks, chunk{seg: seg, start: start, end: len(b.buf), segOff: 0})
	return seg
}

// Free marks a plain record dead and, with it, every ref to it. The bytes
// are reclaimed by compaction. Freeing an unknown position, a ref, or a
// record twice does nothing.
func (j *Journal) Free(pos Pos) {
	j.mu.Lock()
	e := j.mu.index.get(pos)
	if e == nil || e.flags() != 0 {
		j.mu.Unlock()
		return
	}
	e.setFlags(e.flags() | flagFreed)
	j.ckFreeLocked(pos)
	seg := j.mu.segs[e.seg]
	before := seg.live
	seg.live -= int64(e.size)
	for r := e.ref; r != 0; {
		re := j.mu.index.get(r)
		if re == nil {
			break
		}
		if re.seg == e.seg {
			seg.live -= int64(re.size)
		}
		r = j.mu.index.next(r, re)
	}
	// Wake the compactor when this free may have made work for it: the
	// segment emptied, turned sparse, or gathered enough dead bytes to be
	// worth a rewrite. Kicking on every free would have it rescan for
	// nothing.
	deadBefore, deadAfter := seg.size-before, seg.size-seg.live
	kick := seg.sealed && !seg.compacting && (seg.live == 0 ||
		(before >= j.compactLive && seg.live < j.compactLive) ||
		(seg.live < j.compactLive && deadBefore < j.compactLive && deadAfter >= j.compactLive))
	j.mu.Unlock()
	if kick {
		j.kickCompactor()
	}
}

func (j *Journal) kickCompactor() {
	select {
	case j.kick <- struct{}{}:
	default:
	}
}

// countedLocked says whether a record's bytes must survive: a plain record
// until freed, a ref while its target is on disk. A ref whose freed target
// sits in the same file does not count: one unlink removes both, and
// counting it would keep the file alive forever.
func (j *Journal) countedLocked(e entry) bool {
	if e.flags()&flagRef == 0 {
		return e.flags()&flagFreed == 0
	}
	t := j.mu.index.get(e.ref)
	return t != nil && !(t.flags()&flagFreed != 0 && t.seg == e.seg)
}

// Read appends the data of the record at pos to dst. The record must be in
// the index (not freed, or a ref whose target is on disk). It is safe from
// any goroutine; one that is not the owner may find the record freed
// meanwhile (ErrNotFound).
func (j *Journal) Read(pos Pos, dst []byte) ([]byte, error) { return j.ReadAhead(pos, nil, dst) }

// Window is a caller's read-ahead buffer for ReadAhead: one read of up
// to WindowBytes of a segment, from which the records that follow are
// served without another read. A Window belongs to one goroutine.
type Window struct {
	seg  uint32
	off  int64
	data []byte
}

// WindowBytes is the size of one read-ahead read.
const WindowBytes = 256 << 10

// ReadAhead is Read through w (nil: none): a record the window holds is
// copied from it, and one it does not is read with the bytes after it,
// up to WindowBytes, into the window. A reader going through records in
// position order, as delivery of a backlog does, makes one read(2) per
// window rather than one per record. Segments never change once
// written, so a window never serves stale bytes, and each record is
// checked as Read checks it.
func (j *Journal) ReadAhead(pos Pos, w *Window, dst []byte) ([]byte, error) {
	for {
		j.mu.Lock()
		e := j.mu.index.get(pos)
		if e == nil || e.flags()&flagFreed != 0 {
			j.mu.Unlock()
			return dst, fmt.Errorf("%w: %d", ErrNotFound, pos)
		}
		seg := j.mu.segs[e.seg]
		off, size := int64(e.off), int(e.size)
		if off+int64(size) > seg.written {
			out, err := j.readPendingLocked(seg, off, size, pos, dst)
			j.mu.Unlock()
			return out, err
		}
		file, written := seg.file, seg.written
		j.mu.Unlock()

		if w != nil && w.data != nil && w.seg == seg.id && off >= w.off && off+int64(size) <= w.off+int64(len(w.data)) {
			return readWindow(w.data[off-w.off:off-w.off+int64(size)], pos, dst)
		}
		j.filesMu.RLock()
		if seg.removed {
			j.filesMu.RUnlock()
			j.mu.Lock()
			again := j.mu.index.get(pos)
			gone := again != nil && again.seg == seg.id
			j.mu.Unlock()
			if gone {
				// Left behind in a deleted segment: dead.
				return dst, fmt.Errorf("%w: %d", ErrNotFound, pos)
			}
			continue // moved by compaction meanwhile
		}
		start := len(dst)
		if w != nil {
			n := max(int64(size), min(WindowBytes, written-off))
			if int64(cap(w.data)) < n {
				w.data = make([]byte, max(n, WindowBytes))
			}
			w.data = w.data[:n]
			_, err := file.ReadAt(w.data, off)
			j.filesMu.RUnlock()
			if err != nil {
				w.data = nil
				return dst, fmt.Errorf("journal: read %d from %s: %w", pos, segmentName(seg.id), err)
			}
			w.seg, w.off = seg.id, off
			return readWindow(w.data[:size], pos, dst)
		}
		dst = growBytes(dst, size)
		rec := dst[start:]
		_, err := file.ReadAt(rec, off)
		j.filesMu.RUnlock()
		if err != nil {
			return dst[:start], fmt.Errorf("journal: read %d from %s: %w", pos, segmentName(seg.id), err)
		}
		return finishRead(dst, start, pos)
	}
}

// readWindow checks the record rec, in a read-ahead window, and appends
// its data to dst: one copy.
func readWindow(rec []byte, pos Pos, dst []byte) ([]byte, error) {
	if err := verifyRead(rec, pos); err != nil {
		return dst, err
	}
	return append(dst, rec[recordHeaderSize:]...), nil
}

// verifyRead checks that rec, read back for pos, is that record whole.
func verifyRead(rec []byte, pos Pos) error {
	rh, err := parseHeader(rec, len(rec)-recordHeaderSize)
	if err == nil && rh.pos != pos {
		err = fmt.Errorf("%w: found position %d", errBadRecord, rh.pos)
	}
	if err == nil {
		err = checkRecord(rec)
	}
	if err != nil {
		return fmt.Errorf("journal: read %d: %w", pos, err)
	}
	return nil
}

func finishRead(dst []byte, start int, pos Pos) ([]byte, error) {
	rec := dst[start:]
	if err := verifyRead(rec, pos); err != nil {
		return dst[:start], err
	}
	n := copy(rec, rec[recordHeaderSize:])
	return dst[:start+n], nil
}

func (j *Journal) readPendingLocked(seg *segment, off int64, size int, pos Pos, dst []byte) ([]byte, error) {
	for _, b := range [2]*batch{j.mu.inflight, j.mu.fill} {
		for _, c := range b.chunks {
			if c.seg == seg && off >= c.segOff && off+int64(size) <= c.segOff+int64(c.end-c.start) {
				s := c.start + int(off-c.segOff)
				start := len(dst)
				dst = append(dst, b.buf[s:s+size]...)
				return finishRead(dst, start, pos)
			}
		}
	}
	return dst, fmt.Errorf("journal: pending record at %s+%d not found", segmentName(seg.id), off)
}

func growBytes(b []byte, n int) []byte {
	if cap(b)-len(b) >= n {
		return b[:len(b)+n]
	}
	nb := make([]byte, len(b)+n, 2*cap(b)+n)
	copy(nb, b)
	return nb
}

// Sync waits until every record appended so far is durable, forcing an
// fsync under FsyncNever. It returns the journal's error if it failed.
func (j *Journal) Sync() error {
	j.mu.Lock()
	defer j.mu.Unlock()
	target := j.mu.nextPos - 1
	j.mu.syncWanted = true
	j.mu.idle = false
	j.mu.work.Signal()
	for j.mu.err == nil && !(j.mu.donePos >= target && j.mu.syncedPos >= target) {
		if j.mu.closing && j.writerExited() {
			return ErrClosed
		}
		j.mu.space.Wait()
	}
	return j.mu.err
}

func (j *Journal) writerExited() bool {
	select {
	case <-j.writerDone:
		return true
	default:
		return false
	}
}

// Close writes and syncs what is pending, completes it, stops the
// goroutines and closes the files. It returns the error that failed the
// journal, if any.
func (j *Journal) Close() error {
	j.mu.Lock()
	if j.mu.closing {
		j.mu.Unlock()
		return ErrClosed
	}
	j.mu.closing = true
	j.mu.syncWanted = true
	j.mu.idle = false
	j.mu.work.Signal()
	j.mu.space.Broadcast()
	j.mu.Unlock()
	<-j.writerDone
	close(j.stop)
	<-j.compDone

	j.mu.Lock()
	defer j.mu.Unlock()
	j.mu.space.Broadcast()
	for _, seg := range j.mu.segs {
		if seg.file != nil {
			seg.file.Close()
			seg.file = nil
		}
	}
	return j.mu.err
}

// IndexBytes is the memory the journal's in-memory index takes: its
// ring of slots (24 bytes each, a power of two of them), the entries
// that spilled to its map, and each segment's list of the positions
// placed in it (8 bytes a record, as the lists' arrays grew). Safe from
// any goroutine: two atomic loads. It is kept as the index and the lists
// change size (the arrays grow by doubling, so that is seldom).
func (j *Journal) IndexBytes() int64 { return j.indexBytes.Load() + j.segPosBytes.Load() }

// publishSegmentsLocked sums the segments' position lists for
// IndexBytes; j.mu must be held. It runs when a list's array grows and
// when segments come or go.
func (j *Journal) publishSegmentsLocked() {
	var n int64
	for _, s := range j.mu.segs {
		n += int64(cap(s.positions)) * int64(unsafe.Sizeof(Pos(0)))
	}
	j.segPosBytes.Store(n)
}

// Stats returns a snapshot of the counters.
// Err is the I/O error the journal failed on (then it refuses records),
// or nil.
func (j *Journal) Err() error {
	j.mu.Lock()
	defer j.mu.Unlock()
	return j.mu.err
}

func (j *Journal) Stats() Stats {
	j.mu.Lock()
	defer j.mu.Unlock()
	s := j.mu.stats
	s.Segments = len(j.mu.segs)
	s.LiveRecords = j.mu.index.len()
	for _, seg := range j.mu.segs {
		s.DiskBytes += seg.size
		s.LiveBytes += seg.live
	}
	s.Err = j.mu.err
	return s
}

// fsyncBucket is the FsyncHistogram bucket of an fsync that took d.
func fsyncBucket(d time.Duration) int {
	b := bits.Len64(uint64(max(d, 0)/time.Microsecond)) - 1
	return min(max(b, 0), FsyncHistogramBuckets-1)
}

func batchBucket(n int) int {
	b := bits.Len(uint(n)) - 1
	if b < 0 {
		b = 0
	}
	if b >= batchHistogramBuckets {
		b = batchHistogramBuckets - 1
	}
	return b
}
