package event

import (
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/berthmq/berth/wire"
)

// Marker starts every event of this format. It differs from the first
// byte of every event of the older format ('E', 'R', 'S', 'B', 'D') and of
// the requests forwarded beside enqueues (replication/forward.go: 'x', 'p').
const Marker byte = 0xBE

// HeaderLen is the size of an event's header: marker, kind, version, flags.
const HeaderLen = 4

// Kind is an event's kind.
type Kind uint8

const (
	KindEnqueue Kind = 1
	KindRemoves Kind = 2
	KindBarrier Kind = 3
	KindDelete  Kind = 4
	// KindRemove is the single remove of the older format ('R'); no
	// event of the new format has it.
	KindRemove Kind = 5
	// KindAcquires records that the group's master handed messages out
	// to consumers (shards.Shard.flushAcquires): a member that becomes
	// master requeues them, flagged redelivered with their delivery count
	// raised, and no others.
	KindAcquires Kind = 6
	// KindReleases records that the master put acquired messages back:
	// a consumer released them, or went with them unsettled, or (flag
	// FlagUnseen) they were never delivered (their acquires event did
	// not commit in time, or their consumer went first).
	KindReleases Kind = 7
	// KindOwn passes a queue's ownership (seed 000: "moving queue
	// ownership"): from the event on, only its owner acquires the queue's
	// messages. It applies only if its Gen is one past the queue's
	// ownership number, so a stale owner's handover is void everywhere
	// alike; with FlagRequeue it also puts back what a lost broker had
	// acquired from the queue ("requeue-of-departed-broker").
	KindOwn Kind = 8
	// KindWant records that a broker's consumers wait for a queue it does
	// not own (FlagWithdraw: they wait no more), so that its owner hands
	// the queue over when its time slice ends.
	KindWant Kind = 9
)

func (k Kind) String() string {
	switch k {
	case KindEnqueue:
		return "enqueue"
	case KindRemoves:
		return "removes"
	case KindBarrier:
		return "barrier"
	case KindDelete:
		return "delete"
	case KindRemove:
		return "remove"
	case KindAcquires:
		return "acquires"
	case KindReleases:
		return "releases"
	case KindOwn:
		return "own"
	case KindWant:
		return "want"
	}
	return fmt.Sprintf("kind(%d)", uint8(k))
}

// The versions this package writes, and the newest it reads, per kind.
const (
	EnqueueVersion  uint8 = 1
	RemovesVersion  uint8 = 1
	BarrierVersion  uint8 = 1
	DeleteVersion   uint8 = 1
	AcquiresVersion uint8 = 1
	ReleasesVersion uint8 = 1
	OwnVersion      uint8 = 1
	WantVersion     uint8 = 1
)

// Acquires flags.
const (
	// FlagWindow: a window u32 follows the messages (Acquires.Window).
	FlagWindow uint8 = 1 << 0

	// FlagStamp: the proposer's Stamp follows (every other part).
	FlagStamp uint8 = 1 << 1

	acquiresFlags = FlagWindow | FlagStamp
)

// Releases flags.
const (
	// FlagUnseen: no consumer saw the released messages, whose delivery
	// counts stay as they were.
	FlagUnseen uint8 = 1 << 0

	releasesFlags = FlagUnseen | FlagStamp
	removesFlags  = FlagStamp
)

// Own flags.
const (
	// FlagRequeue: a broker id u32 follows the owner: every message that
	// broker holds acquired from the queue is put back, redelivered, and
	// the window of its last acquires event counted as delivered.
	FlagRequeue uint8 = 1 << 0

	ownFlags = FlagRequeue | FlagStamp
)

// Want flags.
const (
	// FlagWithdraw: the broker's consumers wait no more.
	FlagWithdraw uint8 = 1 << 0

	wantFlags = FlagWithdraw | FlagStamp
)

// Stamp names the broker that proposed an event of a queue it owns and
// is not its group's master (the master's own events carry none): its
// id, the ownership number it holds the queue under (Own.Gen), and a tag
// of its own by which it knows its event when it applies it. A member
// applies a stamped acquires only if the queue's owner is Broker under
// Gen, and a stamped release or removal only of messages Broker holds
// acquired; so an owner that lost the queue acquires and completes
// nothing under its old ownership (fencing).
type Stamp struct {
	Broker uint32
	Gen    uint64
	Tag    uint64
}

// StampLen is a stamp's encoded size.
const StampLen = 4 + 8 + 8

func appendStamp(dst []byte, st Stamp) []byte {
	dst = binary.BigEndian.AppendUint32(dst, st.Broker)
	dst = binary.BigEndian.AppendUint64(dst, st.Gen)
	return binary.BigEndian.AppendUint64(dst, st.Tag)
}

// readStamp reads a stamp if flags has FlagStamp; a stamp of broker 0
// is malformed (the master's events carry none).
func readStamp(rd *wire.Reader, flags uint8, k Kind, st *Stamp) error {
	*st = Stamp{}
	if flags&FlagStamp == 0 {
		return nil
	}
	st.Broker, st.Gen, st.Tag = rd.U32(), rd.U64(), rd.U64()
	if st.Broker == 0 && rd.Err() == nil {
		return fmt.Errorf("%w: %v stamp of broker 0", ErrMalformed, k)
	}
	return nil
}

func stampFlag(st Stamp) uint8 {
	if st.Broker != 0 {
		return FlagStamp
	}
	return 0
}

// Enqueue flags: which optional parts follow the payload.
const (
	FlagSchedule uint8 = 1 << 0 // priority u8, deliverAt u64
	FlagProducer uint8 = 1 << 1 // producer u64, producerSeq u64

	enqueueFlags = FlagSchedule | FlagProducer
)

// SeqsMax bounds the messages of one Removes or Acquires event
// (shards.RemovesMax must not exceed it).
const SeqsMax = 4096

// The first bytes of the older format's events.
const (
	legacyEnqueue byte = 'E'
	legacyRemove  byte = 'R'
	legacyRemoves byte = 'S'
	legacyBarrier byte = 'B'
	legacyDelete  byte = 'D'
)

// Decoding errors. A decoder's error wraps one of them.
var (
	ErrUnknownKind  = errors.New("event: unknown event kind")
	ErrNewerVersion = errors.New("event: event version newer than this broker reads")
	ErrUnknownFlags = errors.New("event: event flags this broker does not know")
	ErrMalformed    = errors.New("event: malformed event")
	ErrWrongKind    = errors.New("event: event of another kind")
)

// Header is what starts an event: its kind, version and flags. Legacy
// is set for an event of the older format (version and flags 0).
type Header struct {
	Kind    Kind
	Version uint8
	Flags   uint8
	Legacy  bool
}

// ReadHeader reads the header of data, of either format, and checks that
// this package can decode the rest: a known kind, a version not newer
// than it writes, no unknown flag bit. n is the header's size (1 for the
// older format).
func ReadHeader(data []byte) (h Header, n int, err error) {
	if len(data) == 0 {
		return h, 0, fmt.Errorf("%w: empty", ErrMalformed)
	}
	if data[0] != Marker {
		h.Legacy = true
		switch data[0] {
		case legacyEnqueue:
			h.Kind = KindEnqueue
		case legacyRemove:
			h.Kind = KindRemove
		case legacyRemoves:
			h.Kind = KindRemoves
		case legacyBarrier:
			h.Kind = KindBarrier
		case legacyDelete:
			h.Kind = KindDelete
		default:
			return h, 0, fmt.Errorf("%w: first byte %#x", ErrUnknownKind, data[0])
		}
		return h, 1, nil
	}
	if len(data) < HeaderLen {
		return h, 0, fmt.Errorf("%w: %d-byte header", ErrMalformed, len(data))
	}
	h.Kind, h.Version, h.Flags = Kind(data[1]), data[2], data[3]
	var newest, known uint8
	switch h.Kind {
	case KindEnqueue:
		newest, known = EnqueueVersion, enqueueFlags
	case KindRemoves:
		newest, known = RemovesVersion, removesFlags
	case KindBarrier:
		newest = BarrierVersion
	case KindDelete:
		newest = DeleteVersion
	case KindAcquires:
		newest, known = AcquiresVersion, acquiresFlags
	case KindReleases:
		newest, known = ReleasesVersion, releasesFlags
	case KindOwn:
		newest, known = OwnVersion, ownFlags
	case KindWant:
		newest, known = WantVersion, wantFlags
	default:
		return h, 0, fmt.Errorf("%w: %d", ErrUnknownKind, data[1])
	}
	switch {
	case h.Version == 0:
		return h, 0, fmt.Errorf("%w: %v version 0", ErrMalformed, h.Kind)
	case h.Version > newest:
		return h, 0, fmt.Errorf("%w: %v version %d, newest read %d", ErrNewerVersion, h.Kind, h.Version, newest)
	case h.Flags&^known != 0:
		return h, 0, fmt.Errorf("%w: %v flags %#x", ErrUnknownFlags, h.Kind, h.Flags&^known)
	}
	return h, HeaderLen, nil
}

// KindOf is the kind of data, as ReadHeader reads it.
func KindOf(data []byte) (Kind, error) {
	h, _, err := ReadHeader(data)
	return h.Kind, err
}

// IsEnqueue reports whether data starts as an enqueue of either format,
// without checking the rest (group.Config.HandoverHolds).
func IsEnqueue(data []byte) bool {
	return len(data) > 0 && (data[0] == legacyEnqueue || len(data) > 1 && data[0] == Marker && Kind(data[1]) == KindEnqueue)
}

func appendHeader(dst []byte, k Kind, version, flags uint8) []byte {
	return append(dst, Marker, byte(k), version, flags)
}

// body reads data's header, checks that it is of kind want and returns
// a reader over the rest.
func body(data []byte, want Kind, rd *wire.Reader) (Header, error) {
	h, n, err := ReadHeader(data)
	if err != nil {
		return h, err
	}
	if h.Kind != want {
		return h, fmt.Errorf("%w: %v, not %v", ErrWrongKind, h.Kind, want)
	}
	rd.Reset(data[n:])
	return h, nil
}

// done checks that rd read its whole event without error.
func done(rd *wire.Reader, k Kind) error {
	if rd.Err() != nil {
		return fmt.Errorf("%w: %v truncated or out of bounds", ErrMalformed, k)
	}
	if n := rd.Remaining(); n != 0 {
		return fmt.Errorf("%w: %v has %d bytes past its end", ErrMalformed, k, n)
	}
	return nil
}

// Enqueue is a message enqueued to a replicated queue.
type Enqueue struct {
	Queue      []byte
	ExpiresAt  int64 // unix ns; 0: never
	Persistent bool
	Exchange   []byte
	RoutingKey []byte
	Props      []byte
	Payload    []byte
	// Priority and DeliverAt (unix ns) are written when either is set
	// (FlagSchedule).
	Priority  uint8
	DeliverAt int64
	// Producer and ProducerSeq are written when Producer is set
	// (FlagProducer): the publish's deduplication key.
	Producer, ProducerSeq uint64
}

// Size is the length of e's encoding.
func (e *Enqueue) Size() int {
	n := HeaderLen + 2 + len(e.Queue) + 8 + 1 + 2 + len(e.Exchange) + 2 + len(e.RoutingKey) + 4 + len(e.Props) + 4 + len(e.Payload)
	if e.Priority != 0 || e.DeliverAt != 0 {
		n += 9
	}
	if e.Producer != 0 {
		n += 16
	}
	return n
}

// AppendEnqueue appends e's encoding to dst. The caller bounds the
// lengths of its parts (wire.NameLenMax, wire.RoutingKeyLenMax,
// wire.FrameSizeMax).
func AppendEnqueue(dst []byte, e *Enqueue) []byte {
	var flags uint8
	if e.Priority != 0 || e.DeliverAt != 0 {
		flags |= FlagSchedule
	}
	if e.Producer != 0 {
		flags |= FlagProducer
	}
	dst = appendHeader(dst, KindEnqueue, EnqueueVersion, flags)
	dst = wire.AppendStrBytes(dst, e.Queue)
	dst = wire.AppendU64(dst, uint64(e.ExpiresAt))
	dst = wire.AppendBool(dst, e.Persistent)
	dst = wire.AppendStrBytes(dst, e.Exchange)
	dst = wire.AppendStrBytes(dst, e.RoutingKey)
	dst = wire.AppendBytes(dst, e.Props)
	dst = wire.AppendBytes(dst, e.Payload)
	if flags&FlagSchedule != 0 {
		dst = wire.AppendU8(dst, e.Priority)
		dst = wire.AppendU64(dst, uint64(e.DeliverAt))
	}
	if flags&FlagProducer != 0 {
		dst = wire.AppendU64(dst, e.Producer)
		dst = wire.AppendU64(dst, e.ProducerSeq)
	}
	return dst
}

// Decode decodes data, an enqueue of either format, into e, whose byte
// slices then alias data. It allocates nothing.
func (e *Enqueue) Decode(data []byte) error {
	var rd wire.Reader
	var h Header
	if len(data) >= HeaderLen && data[0] == Marker && Kind(data[1]) == KindEnqueue && data[2] == EnqueueVersion && data[3]&^enqueueFlags == 0 {
		// The hot path (every replicated message): what ReadHeader
		// would find, without its calls.
		h = Header{Kind: KindEnqueue, Version: EnqueueVersion, Flags: data[3]}
		rd.Reset(data[HeaderLen:])
	} else {
		var err error
		if h, err = body(data, KindEnqueue, &rd); err != nil {
			return err
		}
	}
	e.Queue = rd.Str(wire.NameLenMax)
	e.ExpiresAt = int64(rd.U64())
	e.Persistent = rd.Bool()
	e.Exchange = rd.Str(wire.NameLenMax)
	e.RoutingKey = rd.Str(wire.RoutingKeyLenMax)
	e.Props = rd.Bytes(wire.FrameSizeMax)
	e.Payload = rd.Bytes(wire.FrameSizeMax)
	flags := h.Flags
	if h.Legacy {
		// The older format's trailers, told apart by what remains.
		switch rd.Remaining() {
		case 9:
			flags = FlagSchedule
		case 16:
			flags = FlagProducer
		case 25:
			flags = FlagSchedule | FlagProducer
		}
	}
	e.Priority, e.DeliverAt, e.Producer, e.ProducerSeq = 0, 0, 0, 0
	if flags&FlagSchedule != 0 {
		e.Priority, e.DeliverAt = rd.U8(), int64(rd.U64())
	}
	if flags&FlagProducer != 0 {
		e.Producer, e.ProducerSeq = rd.U64(), rd.U64()
	}
	if err := done(&rd, KindEnqueue); err != nil {
		return err
	}
	// A flag is set exactly when its part is not zero (AppendEnqueue), so
	// that an event has one encoding.
	if !h.Legacy && (flags&FlagSchedule != 0 && e.Priority == 0 && e.DeliverAt == 0 || flags&FlagProducer != 0 && e.Producer == 0) {
		return fmt.Errorf("%w: enqueue flags %#x with a part of zeros", ErrMalformed, flags)
	}
	return nil
}

// AppendRemoves appends the encoding of the removal of seqs (at most
// SeqsMax) from queue to dst, by st's broker (none: the master).
func AppendRemoves(dst []byte, queue string, seqs []uint64, st Stamp) []byte {
	dst = appendSeqs(appendHeader(dst, KindRemoves, RemovesVersion, stampFlag(st)), queue, seqs)
	if st.Broker != 0 {
		dst = appendStamp(dst, st)
	}
	return dst
}

// appendSeqs appends a queue name and a list of messages, the body of a
// Removes, an Acquires and a Releases.
func appendSeqs(dst []byte, queue string, seqs []uint64) []byte {
	dst = wire.AppendStr(dst, queue)
	dst = binary.BigEndian.AppendUint32(dst, uint32(len(seqs)))
	for _, seq := range seqs {
		dst = binary.BigEndian.AppendUint64(dst, seq)
	}
	return dst
}

// decodeSeqs decodes data, an event of kind k whose body is a queue name
// and a list of messages: queue aliases data, the seqs are appended to
// seqs[:0]; flags are the header's. An Acquires' window, if its flag is
// set, is read into window (which may be nil otherwise), and a stamp, if
// its flag is set, into st.
func decodeSeqs(data []byte, k Kind, seqs []uint64, window *uint32, st *Stamp) (queue []byte, _ []uint64, flags uint8, err error) {
	var rd wire.Reader
	h, err := body(data, k, &rd)
	if err != nil {
		return nil, seqs, 0, err
	}
	queue = rd.Str(wire.NameLenMax)
	n := rd.Count(8)
	if n > SeqsMax {
		return nil, seqs, 0, fmt.Errorf("%w: %v of %d messages, over %d", ErrMalformed, k, n, SeqsMax)
	}
	seqs = seqs[:0]
	for range n {
		seqs = append(seqs, rd.U64())
	}
	if k == KindAcquires && h.Flags&FlagWindow != 0 {
		if *window = rd.U32(); *window == 0 && !h.Legacy && rd.Err() == nil {
			// One encoding per event: a zero window has no part.
			return nil, seqs, 0, fmt.Errorf("%w: acquires window flag with a window of 0", ErrMalformed)
		}
	}
	if err := readStamp(&rd, h.Flags, k, st); err != nil {
		return nil, seqs, 0, err
	}
	return queue, seqs, h.Flags, done(&rd, k)
}

// Removes records that messages of a queue, by their enqueues' log
// indexes, left it: settled, expired, purged. Stamp is the proposing
// owner's, if not the master.
type Removes struct {
	Queue []byte
	Seqs  []uint64
	Stamp Stamp
}

// Decode decodes data, a removes of either format, into r: r.Queue
// aliases data, and the seqs are appended to r.Seqs[:0].
func (r *Removes) Decode(data []byte) (err error) {
	r.Queue, r.Seqs, _, err = decodeSeqs(data, KindRemoves, r.Seqs, nil, &r.Stamp)
	return err
}

// Acquires records that the queue's owner handed messages of a queue, by
// their enqueues' log indexes, out to consumers. Window is how many more
// deliveries the owner may send, once the event committed, before the
// next one commits (shards/acquire.go): a new owner treats that many
// of the messages it inherits ready as maybe delivered. Stamp is the
// owner's, if not the master.
type Acquires struct {
	Queue  []byte
	Seqs   []uint64
	Window uint32
	Stamp  Stamp
}

// AppendAcquires appends the encoding of the acquisition of seqs (at
// most SeqsMax; none is allowed) from queue, with window, by st's broker
// (none: the master), to dst.
func AppendAcquires(dst []byte, queue string, seqs []uint64, window uint32, st Stamp) []byte {
	var flags uint8
	if window != 0 {
		flags = FlagWindow
	}
	dst = appendSeqs(appendHeader(dst, KindAcquires, AcquiresVersion, flags|stampFlag(st)), queue, seqs)
	if window != 0 {
		dst = binary.BigEndian.AppendUint32(dst, window)
	}
	if st.Broker != 0 {
		dst = appendStamp(dst, st)
	}
	return dst
}

// Decode decodes data, an acquires, into a: a.Queue aliases data, and
// the seqs are appended to a.Seqs[:0].
func (a *Acquires) Decode(data []byte) (err error) {
	a.Window = 0
	a.Queue, a.Seqs, _, err = decodeSeqs(data, KindAcquires, a.Seqs, &a.Window, &a.Stamp)
	return err
}

// Releases records that the broker holding acquired messages of a queue,
// by their enqueues' log indexes, put them back; Unseen if no consumer
// saw them. Stamp is that broker's, if not the master.
type Releases struct {
	Queue  []byte
	Seqs   []uint64
	Unseen bool
	Stamp  Stamp
}

// AppendReleases appends the encoding of the release of seqs (at most
// SeqsMax) of queue, by st's broker (none: the master), to dst.
func AppendReleases(dst []byte, queue string, seqs []uint64, unseen bool, st Stamp) []byte {
	var flags uint8
	if unseen {
		flags = FlagUnseen
	}
	dst = appendSeqs(appendHeader(dst, KindReleases, ReleasesVersion, flags|stampFlag(st)), queue, seqs)
	if st.Broker != 0 {
		dst = appendStamp(dst, st)
	}
	return dst
}

// Decode decodes data, a releases, into r: r.Queue aliases data, and the
// seqs are appended to r.Seqs[:0].
func (r *Releases) Decode(data []byte) error {
	var flags uint8
	var err error
	r.Queue, r.Seqs, flags, err = decodeSeqs(data, KindReleases, r.Seqs, nil, &r.Stamp)
	r.Unseen = flags&FlagUnseen != 0
	return err
}

// Own passes Queue's ownership to Owner (0: the group's master, whoever
// it is) as the queue's ownership number Gen, which must be one past the
// queue's (the event has no effect otherwise). Requeue, if not 0, is a
// broker whose acquisitions of the queue go back (the broker was lost).
// Stamp is the proposing owner's, if not the master.
type Own struct {
	Queue   []byte
	Gen     uint64
	Owner   uint32
	Requeue uint32
	Stamp   Stamp
}

// AppendOwn appends o's encoding to dst.
func AppendOwn(dst []byte, o *Own) []byte {
	var flags uint8
	if o.Requeue != 0 {
		flags = FlagRequeue
	}
	dst = appendHeader(dst, KindOwn, OwnVersion, flags|stampFlag(o.Stamp))
	dst = wire.AppendStr(dst, string(o.Queue))
	dst = binary.BigEndian.AppendUint64(dst, o.Gen)
	dst = binary.BigEndian.AppendUint32(dst, o.Owner)
	if o.Requeue != 0 {
		dst = binary.BigEndian.AppendUint32(dst, o.Requeue)
	}
	if o.Stamp.Broker != 0 {
		dst = appendStamp(dst, o.Stamp)
	}
	return dst
}

// Decode decodes data, an own, into o: o.Queue aliases data.
func (o *Own) Decode(data []byte) error {
	var rd wire.Reader
	h, err := body(data, KindOwn, &rd)
	if err != nil {
		return err
	}
	o.Queue = rd.Str(wire.NameLenMax)
	o.Gen, o.Owner, o.Requeue = rd.U64(), rd.U32(), 0
	if h.Flags&FlagRequeue != 0 {
		if o.Requeue = rd.U32(); o.Requeue == 0 && rd.Err() == nil {
			return fmt.Errorf("%w: own requeue flag with broker 0", ErrMalformed)
		}
	}
	if err := readStamp(&rd, h.Flags, KindOwn, &o.Stamp); err != nil {
		return err
	}
	if o.Gen == 0 && rd.Err() == nil {
		return fmt.Errorf("%w: own of ownership number 0", ErrMalformed)
	}
	return done(&rd, KindOwn)
}

// Want records that Broker's consumers wait for Queue (Withdraw: no
// more). Stamp, if any, is Broker's, for its tag.
type Want struct {
	Queue    []byte
	Broker   uint32
	Withdraw bool
	Stamp    Stamp
}

// AppendWant appends w's encoding to dst.
func AppendWant(dst []byte, w *Want) []byte {
	var flags uint8
	if w.Withdraw {
		flags = FlagWithdraw
	}
	dst = appendHeader(dst, KindWant, WantVersion, flags|stampFlag(w.Stamp))
	dst = wire.AppendStr(dst, string(w.Queue))
	dst = binary.BigEndian.AppendUint32(dst, w.Broker)
	if w.Stamp.Broker != 0 {
		dst = appendStamp(dst, w.Stamp)
	}
	return dst
}

// Decode decodes data, a want, into w: w.Queue aliases data.
func (w *Want) Decode(data []byte) error {
	var rd wire.Reader
	h, err := body(data, KindWant, &rd)
	if err != nil {
		return err
	}
	w.Queue = rd.Str(wire.NameLenMax)
	w.Broker = rd.U32()
	w.Withdraw = h.Flags&FlagWithdraw != 0
	if w.Broker == 0 && rd.Err() == nil {
		return fmt.Errorf("%w: want of broker 0", ErrMalformed)
	}
	if err := readStamp(&rd, h.Flags, KindWant, &w.Stamp); err != nil {
		return err
	}
	if w.Stamp.Broker != 0 && w.Stamp.Broker != w.Broker {
		return fmt.Errorf("%w: want of broker %d stamped by %d", ErrMalformed, w.Broker, w.Stamp.Broker)
	}
	return done(&rd, KindWant)
}

// Remove is the single remove of the older format, which only logs
// written before Removes hold.
type Remove struct {
	Queue []byte
	Seq   uint64
}

// Decode decodes data, an older-format remove, into r.
func (r *Remove) Decode(data []byte) error {
	var rd wire.Reader
	if _, err := body(data, KindRemove, &rd); err != nil {
		return err
	}
	r.Queue = rd.Str(wire.NameLenMax)
	r.Seq = rd.U64()
	return done(&rd, KindRemove)
}

// Barrier marks the end of a settle: it changes no queue.
type Barrier struct{}

// AppendBarrier appends a barrier's encoding to dst.
func AppendBarrier(dst []byte) []byte {
	return appendHeader(dst, KindBarrier, BarrierVersion, 0)
}

// Decode checks that data is a barrier of either format.
func (b *Barrier) Decode(data []byte) error {
	var rd wire.Reader
	if _, err := body(data, KindBarrier, &rd); err != nil {
		return err
	}
	return done(&rd, KindBarrier)
}

// Delete tells that the master dropped a queue.
type Delete struct {
	Queue []byte
}

// AppendDelete appends the encoding of queue's deletion to dst.
func AppendDelete(dst []byte, queue string) []byte {
	dst = appendHeader(dst, KindDelete, DeleteVersion, 0)
	return wire.AppendStr(dst, queue)
}

// Decode decodes data, a delete of either format, into d.
func (d *Delete) Decode(data []byte) error {
	var rd wire.Reader
	if _, err := body(data, KindDelete, &rd); err != nil {
		return err
	}
	d.Queue = rd.Str(wire.NameLenMax)
	return done(&rd, KindDelete)
}

// Event is any one decoded event, for callers that take every kind (Decode).
type Event struct {
	Header   Header
	Enqueue  Enqueue
	Removes  Removes
	Remove   Remove
	Delete   Delete
	Acquires Acquires
	Releases Releases
	Own      Own
	Want     Want
}

// Decode decodes data, an event of any kind and either format, into ev:
// ev.Header says which of its fields holds it.
func Decode(data []byte, ev *Event) error {
	h, _, err := ReadHeader(data)
	if err != nil {
		return err
	}
	ev.Header = h
	switch h.Kind {
	case KindEnqueue:
		return ev.Enqueue.Decode(data)
	case KindRemoves:
		return ev.Removes.Decode(data)
	case KindRemove:
		return ev.Remove.Decode(data)
	case KindBarrier:
		var b Barrier
		return b.Decode(data)
	case KindDelete:
		return ev.Delete.Decode(data)
	case KindAcquires:
		return ev.Acquires.Decode(data)
	case KindReleases:
		return ev.Releases.Decode(data)
	case KindOwn:
		return ev.Own.Decode(data)
	case KindWant:
		return ev.Want.Decode(data)
	}
	return fmt.Errorf("%w: %v", ErrUnknownKind, h.Kind)
}

// Append appends ev's encoding, in the new format, to dst: the inverse of
// Decode for an event of the new format. A KindRemove is written as a
// Removes of one message.
func Append(dst []byte, ev *Event) []byte {
	switch ev.Header.Kind {
	case KindEnqueue:
		return AppendEnqueue(dst, &ev.Enqueue)
	case KindRemoves:
		return AppendRemoves(dst, string(ev.Removes.Queue), ev.Removes.Seqs, ev.Removes.Stamp)
	case KindRemove:
		return AppendRemoves(dst, string(ev.Remove.Queue), []uint64{ev.Remove.Seq}, Stamp{})
	case KindBarrier:
		return AppendBarrier(dst)
	case KindDelete:
		return AppendDelete(dst, string(ev.Delete.Queue))
	case KindAcquires:
		return AppendAcquires(dst, string(ev.Acquires.Queue), ev.Acquires.Seqs, ev.Acquires.Window, ev.Acquires.Stamp)
	case KindReleases:
		return AppendReleases(dst, string(ev.Releases.Queue), ev.Releases.Seqs, ev.Releases.Unseen, ev.Releases.Stamp)
	case KindOwn:
		return AppendOwn(dst, &ev.Own)
	case KindWant:
		return AppendWant(dst, &ev.Want)
	}
	panic(fmt.Sprintf("event: Append of %v", ev.Header.Kind))
}
