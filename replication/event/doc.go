// Package event is the codec of the group log's events: what a replicated
// queue's master proposes to its replication group and every member
// applies in log order (replication/replicate.go). It does no I/O.
//
// # Format
//
// Every event starts with a four-byte header:
//
//	marker u8  = Marker (0xBE), which no event of the older format starts with
//	kind u8    = KindEnqueue, KindRemoves, KindBarrier or KindDelete
//	version u8 = the kind's version, 1 for each kind today
//	flags u8   = which optional parts of the kind follow
//
// then the kind's fields, big-endian, strings as u16 length and bytes,
// byte fields as u32 length and bytes:
//
//	Enqueue v1: queue str16, expiresAt u64, persistent u8, exchange str16,
//	            routingKey str16, props bytes, payload bytes;
//	            then priority u8, deliverAt u64 if FlagSchedule;
//	            then producer u64, producerSeq u64 if FlagProducer.
//	Removes v1: queue str16, n u32, n x seq u64 (n at most SeqsMax).
//	Barrier v1: nothing.
//	Delete v1:  queue str16.
//
// An event ends where its last part ends: a byte left over is malformed.
// A flag is set exactly when its part is not zero (a priority or a
// deliver-at time; a producer id), so an event has one encoding.
// No part is told apart by how many bytes remain.
//
// # The older format
//
// Group journals written before this package hold events whose first
// byte is their kind ('E' enqueue, 'R' a single remove, 'S' removes, 'B'
// barrier, 'D' delete), with no version and no flags; an enqueue's
// optional parts were told apart by the bytes left after its payload (9:
// priority and deliverAt, 16: producer and seq, 25: both). The decoders
// read both formats, so such journals replay unchanged; the encoders
// write only the new one. KindRemove, the single remove, exists only in
// the older format: logs since use Removes.
//
// # What a reader does with what it does not know
//
// The wire protocol skips frames of a higher minor version by their size
// (issue 29): a broker that does not understand an optional frame loses
// nothing by passing over it. A committed group-log event is different:
// every member must apply every event, in order, or its queues differ
// from the others' in silence. So a decoder never skips. An unknown
// marker or kind (ErrUnknownKind), a version of a known kind newer than
// this package writes (ErrNewerVersion), a flag bit it does not know
// (ErrUnknownFlags) and a malformed body (ErrMalformed) are all errors,
// and a member that meets one in a committed entry stops serving the
// group and says so (replication/groups: it leaves the SyncStateSet); it
// never applies the events after it. A new optional part therefore
// needs a new flag bit or version that only a cluster whose every member
// reads it may write: the cluster version decides when masters start
// writing it.
//
// # Ownership
//
// Decode methods alias the event: the byte slices of the struct they
// fill point into data, which the caller keeps unchanged as long as it
// uses them (the group log keeps a committed event's data so). They
// allocate nothing, except Removes.Decode, which appends to the caller's
// Seqs.
package event
