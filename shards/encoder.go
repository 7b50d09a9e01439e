package shards

import "github.com/berthmq/berth/wire"

// Encoder writes what the shards send one session in that session's client
// protocol: that commands completed, that a command failed, and the
// deliveries to one of its consumers. It is all the shards know of a
// protocol. A Session with no Encoder gets Berth's native wire format
// (NativeEncoder); a second protocol (AMQP 0-9-1) plugs in with an Encoder
// of its own and leaves the shards as they are.
//
// What one shard produces for a session in one cycle goes out as one
// write (one writev), in this order: the completions (AppendCompletes),
// the errors in the order the commands failed (AppendError, called as each
// fails), then, consumer by consumer, the frames of its deliveries
// (AppendDeliveries, as many calls as it takes). A write never ends inside
// a frame, nor inside the frames of one delivery, so nothing written by
// another shard comes between them on the connection (AMQP wants a
// message's method, header and body frames together); writes from
// different shards come in no particular order.
//
// Goroutines: the methods run on shard goroutines, several at once for a
// session whose commands and consumers are on several shards. An Encoder
// must be safe for that; the simplest reads only what was set before the
// session was handed to the shards. One that maps consumer ids to
// something of its protocol (an AMQP channel and consumer tag) which
// changes as consumers come and go must guard the map (a lock, or a copy
// behind an atomic pointer). The methods must not block, and must not keep
// b, f, ranges, ds or the bodies after they return (what AddPayload puts
// into a batch, the batch keeps until its write is done).
type Encoder interface {
	// AppendCompletes appends to b what tells the client that the
	// commands whose ids are in ranges completed, and returns the grown
	// buffer. ranges is not empty; each range has First <= Last, no id is
	// in two ranges, and the ranges come in the order the commands
	// completed (wire.AddID), mostly ascending. There is no bound on how
	// many ranges come at once: the encoder splits them into as many
	// frames as its protocol needs.
	AppendCompletes(b []byte, ranges []wire.Range) []byte

	// AppendError appends to b what tells the client that command id
	// failed, with code and a text for people, and returns the grown
	// buffer. Codes are the native ones: the encoder maps them to its
	// protocol's, and to what the session's version knows
	// (wire.ErrorCode.For). text may be long; the encoder truncates it to
	// what its protocol allows.
	AppendError(b []byte, id uint64, code wire.ErrorCode, text string) []byte

	// AppendDeliveries writes into f the frames that hand the first n of
	// ds to the session's consumer with id consumer, and returns n.
	//
	// ds is not empty and comes in the order the consumer must see the
	// deliveries (ascending tags). Each of the first n is written whole,
	// and nothing of the others: the shard passes the rest in later
	// calls, perhaps into a new batch. Returning 0, having written
	// nothing, says that ds[0] does not fit in the room the batch has
	// left; the shard then sends the batch and calls again with an empty
	// one. Into an empty batch (f.PayloadRoom() == PayloadsMax) an
	// encoder must write at least one delivery, or the shard panics: a
	// message whose payload would need more entries than PayloadsMax
	// must have some of it copied into f.Buf. The shard calls only while
	// the batch has room for at least 16 payloads (deliverRoomMin), so
	// that deliveries are not cut into short frames for want of room.
	//
	// frameMax is the session's negotiated frame size in bytes, headers
	// included: the frames keep to it. A protocol that can split a
	// message's payload over frames (AMQP's body frames) does so; the
	// native format, which cannot, puts a message larger than frameMax
	// alone in one frame.
	//
	// The payloads need not be copied: Frames.AddPayload puts a slice of
	// one into the write as a vector entry of its own, and the shard
	// holds a reference to every body of the first n until the write is
	// done. The bodies are read-only.
	AppendDeliveries(f *Frames, consumer uint32, ds []Delivery, frameMax int) int
}

// Delivery is one message on its way to a consumer, as an Encoder sees it.
type Delivery struct {
	// Tag names the delivery when the consumer settles it; it is unique
	// per consumer and ascends.
	Tag uint64
	// DeliveryCount is how often the message was delivered before.
	DeliveryCount uint32
	// Flags are the native flags of a delivered message:
	// wire.MsgRedelivered (the message was delivered before:
	// DeliveryCount > 0, which for a replicated queue counts what its
	// earlier masters handed out) and wire.MsgPersistent (Body.Persistent).
	Flags uint8
	// Body is the message: Exchange, RoutingKey, Props and Payload, and
	// Persistent and Priority, which a protocol that sends them in
	// a header of its own (AMQP's delivery mode and priority) needs.
	Body *Body
}

// Frames is the part of one write batch an Encoder fills: a buffer of
// frame bytes, and payloads that stay out of it as entries of their own in
// the write vector, for a zero-copy writev. The write sends Buf's bytes up
// to the first payload, that payload, Buf's bytes up to the next payload,
// and so on, then the rest of Buf.
//
// A batch is the shard goroutine's until it is written; its vector is
// bounded by IovecsMax, of which each payload takes two entries (itself
// and the bytes of Buf before it): PayloadRoom tells how many more fit.
type Frames struct {
	// Buf holds the batch's bytes so far. An Encoder appends to it (wire's
	// Append helpers fit) and may change bytes it appended during the same
	// call, such as the length in a frame's header; it must not change or
	// drop bytes that were there before the call.
	Buf []byte

	cuts []int    // offsets in Buf where a payload goes, ascending
	pays [][]byte // the payloads, one for each cut
}

// PayloadsMax is how many payloads an empty batch has room for: two
// vector entries each, and one left for the bytes after the last one.
const PayloadsMax = (IovecsMax - 1) / 2

// PayloadRoom is how many more payloads AddPayload may put into the batch.
func (f *Frames) PayloadRoom() int { return PayloadsMax - len(f.cuts) }

// AddPayload puts p into the write after the bytes of Buf so far, as a
// vector entry of its own: its bytes are not copied, so they must stay
// unchanged until the write is done (a delivery's Body.Payload, or part
// of it). An empty p adds no bytes but still counts against the room.
// Adding more than PayloadRoom allows is a programmer error, and panics.
func (f *Frames) AddPayload(p []byte) {
	if len(f.cuts) >= PayloadsMax {
		panic("shards: a payload added to a write batch with no room for it")
	}
	f.cuts = append(f.cuts, len(f.Buf))
	f.pays = append(f.pays, p)
}

// NativeEncoder is the Encoder of Berth's own wire format (package wire)
// in protocol version Version: COMPLETE, ERROR and DELIVER frames. A
// Session whose Encoder is nil gets it in the session's Version, by direct
// calls rather than through the interface (Session.appendDeliveries).
type NativeEncoder struct {
	Version wire.Version
}

// AppendCompletes appends as many COMPLETE frames as ranges needs.
func (e NativeEncoder) AppendCompletes(b []byte, ranges []wire.Range) []byte {
	return wire.AppendCompletes(b, e.Version, ranges)
}

// AppendError appends an ERROR frame.
func (e NativeEncoder) AppendError(b []byte, id uint64, code wire.ErrorCode, text string) []byte {
	return wire.AppendError(b, e.Version, id, code, text)
}

// AppendDeliveries writes one DELIVER frame of as many of ds as fit in
// frameMax (at least one: a message larger than frameMax goes alone), in
// wire.BatchMax and in the batch's room for payloads. The payloads stay
// out of the buffer, one vector entry each.
func (e NativeEncoder) AppendDeliveries(f *Frames, consumer uint32, ds []Delivery, frameMax int) int {
	room := f.PayloadRoom()
	n, size := 0, wire.HeaderSize+4+2 // the header, the consumer id and the count
	for n < len(ds) && n < wire.BatchMax && n < room {
		b := ds[n].Body
		m := wire.DeliverMessageOverhead + len(b.Exchange) + len(b.RoutingKey) + len(b.Props) + len(b.Payload)
		if n > 0 && size+m > frameMax {
			break
		}
		size += m
		n++
	}
	if n == 0 {
		return 0
	}
	var start int
	f.Buf, start = wire.AppendDeliverStart(f.Buf, e.Version, consumer, n)
	extra := 0
	for i := range ds[:n] {
		d := &ds[i]
		b := d.Body
		f.Buf = wire.AppendDeliverMessageHead(f.Buf, d.Tag, d.DeliveryCount, d.Flags, b.Exchange, b.RoutingKey, b.Props, len(b.Payload))
		f.AddPayload(b.Payload)
		extra += len(b.Payload)
	}
	wire.EndFrame(f.Buf, start, extra)
	return n
}

// appendCompletes, appendError and appendDeliveries encode in the
// session's protocol: through its Encoder, or, with none, by direct calls
// of NativeEncoder, so that the default path makes no interface call.

func (s *Session) appendCompletes(b []byte, ranges []wire.Range) []byte {
	if s.Encoder == nil {
		return NativeEncoder{s.Version}.AppendCompletes(b, ranges)
	}
	return s.Encoder.AppendCompletes(b, ranges)
}

func (s *Session) appendError(b []byte, id uint64, code wire.ErrorCode, text string) []byte {
	if s.Encoder == nil {
		return NativeEncoder{s.Version}.AppendError(b, id, code, text)
	}
	return s.Encoder.AppendError(b, id, code, text)
}

func (s *Session) appendDeliveries(f *Frames, consumer uint32, ds []Delivery) int {
	if s.Encoder == nil {
		return NativeEncoder{s.Version}.AppendDeliveries(f, consumer, ds, int(s.FrameMax))
	}
	return s.Encoder.AppendDeliveries(f, consumer, ds, int(s.FrameMax))
}
