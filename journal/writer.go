package journal

import (
	"fmt"
	"os"
	"time"
)

// writeLoop is the group-commit goroutine. It takes everything appended
// since its last turn as one batch, writes it, fsyncs once and completes
// the records in order. While it writes and syncs, appends pile up in the
// other batch, so batches grow with load and a lone append goes out at
// once.
func (j *Journal) writeLoop() {
	defer close(j.writerDone)
	for {
		j.mu.Lock()
		for len(j.mu.fill.comps) == 0 && !j.mu.syncWanted && !j.mu.closing {
			j.mu.idle = true
			j.mu.work.Wait()
		}
		j.mu.idle = false
		if len(j.mu.fill.comps) == 0 && !j.mu.syncWanted && j.mu.closing {
			j.mu.Unlock()
			return
		}
		done := j.mu.inflight
		done.reset()
		b := j.mu.fill
		j.mu.fill = done
		j.mu.inflight = b
		forceSync := j.mu.syncWanted
		j.mu.syncWanted = false
		failed := j.mu.err
		j.mu.space.Broadcast()
		j.mu.Unlock()

		var err error
		synced := false
		var took time.Duration // the batch's closing fsync
		if failed != nil {
			err = fmt.Errorf("%w: %w", ErrFailed, failed)
		} else {
			synced, took, err = j.writeBatch(b, forceSync)
		}

		ok := 0
		if err == nil {
			for i := range b.comps {
				if b.comps[i].err == nil {
					ok++
				}
			}
		}
		// Counters and the sticky error are set before any completion runs,
		// so a completed record is always reflected in Stats.
		j.mu.Lock()
		if err != nil && j.mu.err == nil {
			j.mu.err = err
			j.log.Error("journal: failed; all further records complete with an error", "err", err)
		}
		if err == nil && len(b.chunks) > 0 {
			j.mu.stats.Batches++
		}
		if synced && ok > 0 {
			j.mu.stats.Fsyncs++
			j.mu.stats.RecordsSynced += uint64(ok)
			j.mu.stats.BatchHistogram[batchBucket(ok)]++
			j.mu.stats.FsyncHistogram[fsyncBucket(took)]++
			j.mu.stats.FsyncNanos += uint64(took)
		}
		j.mu.Unlock()

		var last Pos
		for i := range b.comps {
			p := &b.comps[i]
			last = p.pos
			cerr := p.err
			if cerr == nil {
				cerr = err
			}
			p.done(p.pos, cerr)
		}

		j.mu.Lock()
		if last != 0 {
			j.mu.donePos = last
		}
		if synced {
			j.mu.syncedPos = j.mu.donePos
		}
		j.mu.space.Broadcast()
		j.mu.Unlock()
	}
}

// writeBatch writes b's chunks in order and syncs them. A segment is
// synced and sealed before the first byte goes to its successor, so a crash
// never leaves a later segment ahead of a torn earlier one. It reports
// whether the batch ended with an fsync, and how long that fsync took.
func (j *Journal) writeBatch(b *batch, forceSync bool) (bool, time.Duration, error) {
	for _, c := range b.chunks {
		if c.seg != j.writerCur {
			if err := j.switchSegment(c.seg); err != nil {
				return false, 0, err
			}
		}
		n, err := c.seg.file.Write(b.buf[c.start:c.end])
		j.mu.Lock()
		c.seg.written += int64(n)
		j.mu.Unlock()
		if err == nil && n < c.end-c.start {
			err = fmt.Errorf("short write %d of %d", n, c.end-c.start)
		}
		if err != nil {
			return false, 0, fmt.Errorf("journal: write %s: %w", segmentName(c.seg.id), err)
		}
	}
	if j.opts.Fsync == FsyncNever && !forceSync {
		return false, 0, nil
	}
	var took time.Duration
	if cur := j.writerCur; cur != nil {
		start := time.Now()
		if err := cur.file.Sync(); err != nil {
			return false, 0, fmt.Errorf("journal: fsync %s: %w", segmentName(cur.id), err)
		}
		took = time.Since(start)
	}
	return true, took, nil
}

// switchSegment seals the writer's current segment and creates next.
func (j *Journal) switchSegment(next *segment) error {
	// Under FsyncNever nothing is promised past write(2), so sealing does
	// not stop the writer for an fsync of the whole segment either (it
	// showed as a latency spike at every seal).
	syncs := j.opts.Fsync != FsyncNever
	if cur := j.writerCur; cur != nil {
		if syncs {
			if err := cur.file.Sync(); err != nil {
				return fmt.Errorf("journal: fsync %s: %w", segmentName(cur.id), err)
			}
		}
		j.mu.Lock()
		cur.sealed = true
		j.mu.Unlock()
		j.kickCompactor()
	}
	if next.file == nil {
		f, err := j.fs.OpenFile(j.path(next.id), os.O_RDWR|os.O_CREATE|os.O_EXCL|os.O_APPEND, 0o644)
		if err != nil {
			return fmt.Errorf("journal: create %s: %w", segmentName(next.id), err)
		}
		// The directory entry must be durable before any record in the
		// file is reported durable.
		if syncs {
			if err := j.fs.SyncDir(j.opts.Dir); err != nil {
				f.Close()
				return fmt.Errorf("journal: sync dir %s: %w", j.opts.Dir, err)
			}
		}
		j.mu.Lock()
		next.file = f
		j.mu.Unlock()
	}
	j.writerCur = next
	return nil
}
