package journal

import (
	"cmp"
	"container/heap"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"
)

const (
	// recoveryBufferBytesMax bounds the read buffers of all segments
	// merged at once during recovery.
	recoveryBufferBytesMax = 32 << 20
	recoveryBufferMin      = 16 << 10
	recoveryBufferMax      = 1 << 20
	// recoveryProgressBytes: a progress line is logged per this much data.
	recoveryProgressBytes = 256 << 20
)

// Open recovers the journal in opts.Dir (creating it if needed) and calls
// replay for every record still on disk, in position order. ref is 0 for a
// plain record, else the target of a ref; data is valid only during the
// call. A ref is replayed only after its target, and never without it. An
// error from replay aborts Open.
//
// Every record's CRC is checked. Each segment is read up to its first bad
// or torn record and truncated there; the bytes dropped are logged and
// counted in Stats().DroppedBytes.
func Open(opts Options, replay func(pos Pos, ref Pos, data []byte) error) (*Journal, error) {
	if opts.Dir == "" {
		return nil, errors.New("journal: Options.Dir is empty")
	}
	if opts.FS == nil {
		opts.FS = OSFS{}
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	if opts.SegmentBytes == 0 {
		opts.SegmentBytes = segmentBytesDefault
	}
	if opts.SegmentBytes < segmentBytesMin || opts.SegmentBytes > segmentBytesMax {
		return nil, fmt.Errorf("journal: SegmentBytes %d outside [%d, %d]", opts.SegmentBytes, segmentBytesMin, segmentBytesMax)
	}
	if opts.PendingBytesMax == 0 {
		opts.PendingBytesMax = pendingBytesMaxDefault
	}
	if opts.PendingBytesMax < pendingBytesMin {
		return nil, fmt.Errorf("journal: PendingBytesMax %d below %d", opts.PendingBytesMax, pendingBytesMin)
	}
	if opts.CompactLiveRatio == 0 {
		opts.CompactLiveRatio = compactRatioDefault
	}
	if opts.CompactLiveRatio < 0 || opts.CompactLiveRatio > 1 {
		return nil, fmt.Errorf("journal: CompactLiveRatio %v outside (0, 1]", opts.CompactLiveRatio)
	}
	if !opts.Fsync.Valid() {
		return nil, fmt.Errorf("journal: unknown fsync policy %d", uint8(opts.Fsync))
	}
	if replay == nil {
		replay = func(Pos, Pos, []byte) error { return nil }
	}
	j := &Journal{
		opts:         opts,
		fs:           opts.FS,
		log:          opts.Logger,
		segmentBytes: opts.SegmentBytes,
		recordMax:    min(RecordBytesMax, int(opts.SegmentBytes)-segmentHeaderSize-recordHeaderSize),
		pendingMax:   opts.PendingBytesMax,
		compactLive:  int64(opts.CompactLiveRatio * float64(opts.SegmentBytes)),
		kick:         make(chan struct{}, 1),
		stop:         make(chan struct{}),
		writerDone:   make(chan struct{}),
		compDone:     make(chan struct{}),
	}
	j.mu.work.L = &j.mu.Mutex
	j.mu.space.L = &j.mu.Mutex
	j.mu.index = newIndex(&j.indexBytes)
	j.mu.segs = make(map[uint32]*segment)
	j.mu.fill = &batch{}
	j.mu.inflight = &batch{}
	if err := j.fs.MkdirAll(opts.Dir, 0o755); err != nil {
		return nil, fmt.Errorf("journal: mkdir %s: %w", opts.Dir, err)
	}
	if err := j.recover(replay); err != nil {
		for _, s := range j.mu.segs {
			if s.file != nil {
				s.file.Close()
			}
		}
		return nil, err
	}
	j.writerCur = j.mu.active
	j.mu.Lock()
	j.publishSegmentsLocked()
	j.mu.Unlock()
	go j.writeLoop()
	go j.compactLoop()
	j.kickCompactor()
	return j, nil
}

// segReader walks one segment's records in file order during recovery.
type segReader struct {
	seg      *segment
	fileSize int64
	off      int64 // file offset of the next record
	buf      []byte
	bufOff   int64 // file offset of buf[0]
	bufCap   int

	// The current record.
	rh     recordHeader
	rec    []byte
	recOff int64
	prev   Pos

	cutAt  int64 // -1, or where a torn or bad record starts
	reason error
}

// window returns the n bytes at file offset off, reading as needed.
func (r *segReader) window(file File, off int64, n int) ([]byte, error) {
	if off >= r.bufOff && off+int64(n) <= r.bufOff+int64(len(r.buf)) {
		s := off - r.bufOff
		return r.buf[s : s+int64(n)], nil
	}
	if off+int64(n) > r.fileSize {
		return nil, io.ErrUnexpectedEOF
	}
	want := max(n, r.bufCap)
	want = int(min(int64(want), r.fileSize-off))
	if cap(r.buf) < want {
		r.buf = make([]byte, want)
	}
	r.buf = r.buf[:want]
	if _, err := file.ReadAt(r.buf, off); err != nil && !(errors.Is(err, io.EOF) && want > 0) {
		r.buf = r.buf[:0]
		return nil, err
	}
	r.bufOff = off
	return r.buf[:n], nil
}

// next loads the next record; false at the end or at a bad record (then
// cutAt is set). A hard read error is returned.
func (r *segReader) next(recordMax int) (bool, error) {
	if r.off == r.fileSize || r.cutAt >= 0 {
		return false, nil
	}
	file := r.seg.file
	h, err := r.window(file, r.off, recordHeaderSize)
	if err != nil {
		return r.cut(err)
	}
	rh, err := parseHeader(h, recordMax)
	if err != nil {
		return r.cut(err)
	}
	if rh.pos <= r.prev {
		return r.cut(fmt.Errorf("%w: position %d after %d", errBadRecord, rh.pos, r.prev))
	}
	rec, err := r.window(file, r.off, recordHeaderSize+int(rh.length))
	if err != nil {
		return r.cut(err)
	}
	if err := checkRecord(rec); err != nil {
		return r.cut(err)
	}
	r.rh, r.rec, r.recOff, r.prev = rh, rec, r.off, rh.pos
	r.off += int64(len(rec))
	return true, nil
}

func (r *segReader) cut(err error) (bool, error) {
	if !errors.Is(err, errBadRecord) && !errors.Is(err, io.ErrUnexpectedEOF) && !errors.Is(err, io.EOF) {
		return false, fmt.Errorf("journal: read %s: %w", segmentName(r.seg.id), err)
	}
	r.cutAt = r.off
	r.reason = err
	return false, nil
}

type readerHeap []*segReader

func (h readerHeap) Len() int { return len(h) }
func (h readerHeap) Less(a, b int) bool {
	if h[a].rh.pos != h[b].rh.pos {
		return h[a].rh.pos < h[b].rh.pos
	}
	// Of two copies, the newer segment's comes first and is kept.
	return h[a].seg.id > h[b].seg.id
}
func (h readerHeap) Swap(a, b int) { h[a], h[b] = h[b], h[a] }
func (h *readerHeap) Push(x any)   { *h = append(*h, x.(*segReader)) }
func (h *readerHeap) Pop() any {
	old := *h
	x := old[len(old)-1]
	*h = old[:len(old)-1]
	return x
}

func (j *Journal) recover(replay func(pos Pos, ref Pos, data []byte) error) error {
	started := time.Now()
	names, err := j.fs.ReadDir(j.opts.Dir)
	if err != nil {
		return fmt.Errorf("journal: read dir %s: %w", j.opts.Dir, err)
	}
	var ids []uint32
	hasCk := false
	for _, name := range names {
		hasCk = hasCk || name == checkpointName
		if strings.HasSuffix(name, ".seg.tmp") {
			// An unfinished compaction output; its sources are intact.
			if err := j.fs.Remove(j.opts.Dir + "/" + name); err != nil {
				return fmt.Errorf("journal: remove %s: %w", name, err)
			}
			continue
		}
		base, ok := strings.CutSuffix(name, ".seg")
		if !ok {
			continue
		}
		id, err := strconv.ParseUint(base, 16, 32)
		if err != nil || segmentName(uint32(id)) != name {
			continue
		}
		ids = append(ids, uint32(id))
	}
	slices.Sort(ids)

	var basePosMax Pos
	var dropped, total int64
	var present []*segment
	sizes := map[uint32]int64{}
	for _, id := range ids {
		f, err := j.fs.OpenFile(j.path(id), os.O_RDWR|os.O_APPEND, 0)
		if err != nil {
			return fmt.Errorf("journal: open %s: %w", segmentName(id), err)
		}
		size, err := f.Size()
		if err != nil {
			f.Close()
			return fmt.Errorf("journal: stat %s: %w", segmentName(id), err)
		}
		var hdr [segmentHeaderSize]byte
		var basePos Pos
		if size >= segmentHeaderSize {
			if _, err := f.ReadAt(hdr[:], 0); err != nil {
				f.Close()
				return fmt.Errorf("journal: read %s: %w", segmentName(id), err)
			}
			basePos, err = parseSegmentHeader(hdr[:])
		}
		if size < segmentHeaderSize || err != nil {
			// A segment whose creation was cut short holds no record.
			f.Close()
			j.log.Warn("journal: removing segment with a torn or bad header", "segment", segmentName(id), "bytes", size)
			if err := j.fs.Remove(j.path(id)); err != nil {
				return fmt.Errorf("journal: remove %s: %w", segmentName(id), err)
			}
			dropped += size
			continue
		}
		basePosMax = max(basePosMax, basePos)
		seg := &segment{id: id, size: size, written: size, file: f, sealed: true}
		j.mu.segs[id] = seg
		present = append(present, seg)
		sizes[id] = size
	}
	j.mu.index = newIndex(&j.indexBytes)
	// An owner that takes checkpoints has what recovery puts in the
	// index logged for its first one (checkpoint.go).
	j.mu.ckLog = ckLog{on: j.opts.OnCheckpoint != nil}

	// A checkpoint stands for the records up to its position: only what
	// was written after it is read.
	var ck *ckpt
	gone := map[Pos]entry{}
	if j.opts.OnCheckpoint != nil && hasCk {
		var err error
		ck, err = j.readCheckpoint(sizes)
		if err == nil && ck != nil {
			err = j.loadCheckpointIndex(ck, gone)
			if err == nil {
				err = j.opts.OnCheckpoint(ck.upto, ck.owner)
			}
		}
		if err != nil {
			j.log.Warn("journal: ignoring the checkpoint, replaying every record", "dir", j.opts.Dir, "err", err)
			j.removeCheckpoint()
			ck = nil
			j.mu.ckSuspect = false
			j.mu.ckLog = ckLog{on: true}
			j.ckBase, j.ckBaseN, j.ckBaseLast = nil, 0, 0
			j.mu.index = newIndex(&j.indexBytes)
			clear(gone)
			for _, s := range present {
				s.positions = nil
			}
		}
	}
	if j.opts.OnCheckpoint == nil && hasCk {
		// An owner that does not read checkpoints does not write them
		// either: one left here would go stale as this run appends.
		j.removeCheckpoint()
	}
	var readers []*segReader
	for _, seg := range present {
		from := int64(segmentHeaderSize)
		if ck != nil {
			if sz, ok := ck.segs[seg.id]; ok {
				from = max(sz, segmentHeaderSize)
			}
		}
		if from >= seg.size {
			continue
		}
		readers = append(readers, &segReader{seg: seg, fileSize: seg.size, off: from, bufOff: -1, cutAt: -1, prev: 0})
		total += seg.size - from
	}
	bufCap := recoveryBufferMax
	if len(readers) > 0 {
		bufCap = min(recoveryBufferMax, max(recoveryBufferMin, recoveryBufferBytesMax/len(readers)))
	}
	h := make(readerHeap, 0, len(readers))
	for _, r := range readers {
		r.bufCap = bufCap
		ok, err := r.next(j.recordMax)
		if err != nil {
			return err
		}
		if ok {
			h = append(h, r)
		}
	}
	heap.Init(&h)

	var maxPos, lastPos Pos
	doomed := make(map[uint32]*segment)
	copiedBy := make(map[uint32]uint32) // doomed source -> its rewrite
	var lastSeg uint32
	var records, replayed int64
	var scanned, nextProgress int64 = 0, recoveryProgressBytes
	for len(h) > 0 {
		r := h[0]
		rh, rec, seg := r.rh, r.rec, r.seg
		seg.positions = append(seg.positions, rh.pos)
		records++
		scanned += int64(len(rec))
		maxPos = max(maxPos, rh.pos)
		switch {
		case ck != nil && rh.pos <= ck.upto && rh.pos != lastPos:
			// A copy, made by a compaction that ran after the
			// checkpoint, of a record the checkpoint covers: the index
			// learns where it is now; the owner's state has it already.
			j.mu.ckSuspect = true
			if e := j.mu.index.get(rh.pos); e != nil {
				if e.seg != seg.id {
					if src := j.mu.segs[e.seg]; src != nil {
						doomed[src.id] = src
						copiedBy[src.id] = seg.id
					}
					e.seg, e.off = seg.id, uint32(r.recOff)
					j.ckMoveLocked(rh.pos, e.seg, e.off)
				}
				break
			}
			e := entry{seg: seg.id, off: uint32(r.recOff), size: uint32(len(rec))}
			if g, ok := gone[rh.pos]; ok {
				e.setFlags(g.flags() &^ flagRef)
			}
			if rh.kind == kindRef {
				t := j.mu.index.get(rh.ref)
				if t == nil || t.flags()&flagRef != 0 {
					break
				}
				e.setFlags(flagRef)
				e.ref = rh.ref
				j.mu.index.setNext(rh.pos, &e, t.ref)
				t.ref = rh.pos
			}
			j.mu.index.insert(rh.pos, e)
			j.ckInsertLocked(rh.pos, e)
		case rh.pos == lastPos:
			// A second copy means a rewrite finished (its output was
			// renamed into place) but its sources were not all deleted:
			// this older segment is such a source. Finish the job, unless
			// the output itself turns out damaged.
			doomed[seg.id] = seg
			copiedBy[seg.id] = lastSeg
		case rh.kind == kindRef:
			t := j.mu.index.get(rh.ref)
			if t == nil || t.flags()&flagRef != 0 {
				// Its target is gone from disk; so is the ref, logically.
				break
			}
			e := entry{seg: seg.id, off: uint32(r.recOff), size: uint32(len(rec)), ref: rh.ref}
			e.setFlags(flagRef)
			j.mu.index.setNext(rh.pos, &e, t.ref)
			t.ref = rh.pos // before the insert, which may move t
			j.mu.index.insert(rh.pos, e)
			j.ckInsertLocked(rh.pos, e)
			seg.live += int64(len(rec))
			if err := replay(rh.pos, rh.ref, rec[recordHeaderSize:]); err != nil {
				return fmt.Errorf("journal: replay %d: %w", rh.pos, err)
			}
			replayed++
		default:
			e := entry{seg: seg.id, off: uint32(r.recOff), size: uint32(len(rec))}
			j.mu.index.insert(rh.pos, e)
			j.ckInsertLocked(rh.pos, e)
			seg.live += int64(len(rec))
			if err := replay(rh.pos, 0, rec[recordHeaderSize:]); err != nil {
				return fmt.Errorf("journal: replay %d: %w", rh.pos, err)
			}
			replayed++
		}
		lastPos, lastSeg = rh.pos, seg.id
		if scanned >= nextProgress {
			nextProgress += recoveryProgressBytes
			j.log.Info("journal: recovery progress", "dir", j.opts.Dir, "bytes", scanned, "of", total, "records", records, "elapsed", time.Since(started))
		}
		ok, err := r.next(j.recordMax)
		if err != nil {
			return err
		}
		if ok {
			heap.Fix(&h, 0)
		} else {
			heap.Pop(&h)
			r.buf = nil
		}
	}

	for _, r := range readers {
		if r.cutAt < 0 {
			continue
		}
		n := r.fileSize - r.cutAt
		dropped += n
		j.log.Warn("journal: truncating torn or corrupt records", "segment", segmentName(r.seg.id), "offset", r.cutAt, "bytes_dropped", n, "reason", r.reason)
		if err := r.seg.file.Truncate(r.cutAt); err != nil {
			return fmt.Errorf("journal: truncate %s: %w", segmentName(r.seg.id), err)
		}
		if err := r.seg.file.Sync(); err != nil {
			return fmt.Errorf("journal: fsync %s: %w", segmentName(r.seg.id), err)
		}
		r.seg.size, r.seg.written = r.cutAt, r.cutAt
	}
	cut := make(map[uint32]bool)
	for _, r := range readers {
		cut[r.seg.id] = r.cutAt >= 0
	}
	if len(doomed) > 0 {
		segs := make([]*segment, 0, len(doomed))
		for id, s := range doomed {
			if cut[copiedBy[id]] {
				j.log.Error("journal: keeping a compaction source: its rewrite is damaged", "source", segmentName(id), "rewrite", segmentName(copiedBy[id]))
				continue
			}
			segs = append(segs, s)
		}
		slices.SortFunc(segs, func(a, b *segment) int { return cmp.Compare(a.id, b.id) })
		if len(segs) > 0 {
			j.log.Info("journal: finishing an interrupted compaction", "sources", len(segs))
			j.mu.stats.SourcesFinished = len(segs)
			if err := j.removeSegments(segs); err != nil {
				return err
			}
		}
	}

	if ck != nil {
		j.relinkLive()
		maxPos = max(maxPos, ck.nextPos-1)
	}
	j.mu.nextPos = max(maxPos+1, basePosMax, 1)
	// Everything recovered is on disk already: a Sync before the next
	// Append has nothing to wait for.
	j.mu.donePos = j.mu.nextPos - 1
	j.mu.syncedPos = j.mu.nextPos - 1
	j.mu.nextSeg = 0
	if len(ids) > 0 {
		j.mu.nextSeg = ids[len(ids)-1] + 1
	}
	if ck != nil {
		j.mu.nextSeg = max(j.mu.nextSeg, ck.nextSeg)
	}
	// Keep appending to the newest segment if it has room: it holds the
	// highest positions, so it stays sorted.
	var newest *segment
	for _, s := range j.mu.segs {
		if newest == nil || s.id > newest.id {
			newest = s
		}
	}
	if newest != nil && newest.size < j.segmentBytes {
		newest.sealed = false
		j.mu.active = newest
	} else if err := j.createActive(); err != nil {
		return err
	}
	j.mu.stats.DroppedBytes = dropped
	j.log.Info("journal: recovered", "dir", j.opts.Dir, "from_checkpoint", ck != nil, "segments", len(j.mu.segs), "records", records, "replayed", replayed,
		"bytes_dropped", dropped, "next_pos", j.mu.nextPos, "elapsed", time.Since(started))
	return nil
}

// createActive makes a fresh, durable, empty active segment.
func (j *Journal) createActive() error {
	seg := &segment{id: j.mu.nextSeg, size: segmentHeaderSize, written: segmentHeaderSize}
	j.mu.nextSeg++
	f, err := j.fs.OpenFile(j.path(seg.id), os.O_RDWR|os.O_CREATE|os.O_EXCL|os.O_APPEND, 0o644)
	if err != nil {
		return fmt.Errorf("journal: create %s: %w", segmentName(seg.id), err)
	}
	seg.file = f
	j.mu.segs[seg.id] = seg
	if _, err := f.Write(appendSegmentHeader(nil, j.mu.nextPos)); err != nil {
		return fmt.Errorf("journal: write %s: %w", segmentName(seg.id), err)
	}
	if err := f.Sync(); err != nil {
		return fmt.Errorf("journal: fsync %s: %w", segmentName(seg.id), err)
	}
	if err := j.fs.SyncDir(j.opts.Dir); err != nil {
		return fmt.Errorf("journal: sync dir %s: %w", j.opts.Dir, err)
	}
	j.mu.active = seg
	return nil
}
