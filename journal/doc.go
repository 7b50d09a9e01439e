// Package journal is Berth's write-ahead journal: one per shard, made of
// segment files of checksummed records, with group commit on a goroutine
// of its own, completion callbacks, crash recovery and compaction. It knows
// nothing about brokers.
//
// # The caller's contract
//
//  1. One goroutine, the owner (a shard), calls Append, AppendRef, Free,
//     Read and Sync. Stats may be called from anywhere, and so may Read
//     (it takes the journal's locks, as the compactor does): a record the
//     owner frees meanwhile reads as ErrNotFound. Close is called once, by
//     the owner, after its last Append.
//
//  2. Open replays every record still on disk before it returns, on the
//     caller's goroutine, in increasing position order. The data slice
//     passed to replay is valid only during that call. A ref is replayed
//     after its target and never without it. Records are replayed whether
//     or not the owner freed them before the restart: frees are not
//     journaled, so the owner decides from the refs it sees (a message
//     with a dequeue ref is dead) and calls Free again after Open.
//     With Options.OnCheckpoint and a checkpoint on disk (item 10), only
//     the records after the checkpoint's position are replayed.
//
//  3. Append and AppendRef copy data before they return; the caller may
//     reuse it at once. They return the record's position, assigned in
//     increasing order from 1, and never fail directly: every outcome,
//     good or bad, arrives through the record's Completion.
//
//  4. Completions run on the journal's writer goroutine, exactly once per
//     record, in append order. With FsyncAlways a nil error means an
//     fdatasync that started after the record was written has returned.
//     With FsyncNever (unsafe) it means write(2) returned. A completion
//     must not block and must not call back into the journal's Append or
//     Sync, or the writer stalls; handing the result to the owner through
//     a bounded queue is the intended use. After Close, Append calls done
//     synchronously with ErrClosed.
//
//  5. Append parks the owner while PendingBytesMax bytes wait to be
//     written. That is the journal's backpressure; the owner should stop
//     taking new work from its producers while it is parked.
//
//  6. A plain record is live until Free(pos). A ref (AppendRef) belongs to
//     its target: it is on disk exactly as long as the target is, so after
//     a crash a dequeue is never lost while its enqueue is still there.
//     AppendRef to a position that is not a live plain record completes
//     with ErrBadTarget. Free is called for plain records only, typically
//     once the dequeue ref of the message has completed.
//
//  7. Read returns a copy of a record that has not been freed, appended to
//     dst. It may block on disk I/O, so the owner should use it for paging,
//     not on a latency-critical path.
//
//  8. An I/O error fails the journal for good. Every record of the batch
//     whose write or fsync failed completes with that error, and every
//     later record completes with ErrFailed; success is never reported for
//     bytes written after a failed fsync, because Linux may have dropped
//     the dirty pages. An errored record's outcome is unknown: it may or
//     may not be replayed after a restart. The journal never panics or
//     exits; the owner reports the errors and carries on, and a restart
//     (Open) recovers what is on disk.
//
//  9. Sync waits until everything appended so far is durable (forcing an
//     fsync under FsyncNever). Close writes, syncs and completes whatever
//     is pending, then stops the journal's goroutines.
//
//  10. Checkpoints (checkpoint.go): the owner, between appends, calls
//     BeginCheckpoint, which cuts the index as of every record appended
//     so far (it swaps the log of the index's changes since the last
//     checkpoint for an empty one), and captures its own state for that
//     position; then, on any goroutine, one at a time, EncodeCheckpoint
//     merges the log into the last checkpoint's index part, the owner
//     appends its state, and WriteCheckpoint syncs the journal and
//     replaces <dir>/checkpoint atomically. Open then loads the index from it, reads only the
//     bytes written after it (segment tails, and whole segments it does
//     not list, such as compaction outputs), replays only records past
//     its position, and gives the owner its state (OnCheckpoint). A
//     checkpoint that is missing, torn, corrupt, of another version or
//     that names a segment longer than its file is ignored with a log
//     line: everything is replayed.
//
// # Recovery
//
// Each segment is read in order and every record's CRC32C is checked. A
// segment is cut at its first torn or bad record: the rest of that segment
// is truncated and the bytes dropped are logged and reported in
// Stats.DroppedBytes. A bad record in the middle of a segment therefore
// drops the records after it in that segment; the other segments are kept.
// Normal segments are written strictly one after another (a segment is
// fsynced before its successor gets a byte), so damage from a crash can
// only be at the end of the newest one.
//
// # Compaction
//
// A goroutine of its own deletes sealed segments holding nothing that must
// survive, and rewrites the surviving records of sparse segments (live
// bytes below CompactLiveRatio of SegmentBytes) into a new segment under a
// temporary name. Once that copy is durable it is renamed into place, the
// index moves to it, and the sources are deleted. Copies keep their
// positions: if a crash leaves both a source and its finished copy,
// recovery replays the position once and deletes the source.
package journal
