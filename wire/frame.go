// Package wire holds Berth's frame format and the codecs for the client and
// peer protocols. It does no I/O.
//
// Every frame starts with a fixed 12-byte header:
//
//	offset size field
//	0      2    magic   0xB3 0x27
//	2      1    major   protocol major version
//	3      1    minor   protocol minor version
//	4      1    type    frame type (see the Type constants)
//	5      1    flags   type-specific flags
//	6      2    channel reserved for multiplexing; 0 today
//	8      4    length  body length in bytes, not counting the header
//
// Integers are big-endian. Strings are a uint16 length then UTF-8 bytes;
// byte fields are a uint32 length then the bytes.
//
// Decoders never allocate: the values they return alias the buffer they
// were given, and stay valid only as long as that buffer does.
package wire

import (
	"encoding/binary"
	"errors"
	"fmt"
)

const (
	// HeaderSize is the size of the fixed frame header.
	HeaderSize = 12

	Magic0 = 0xB3
	Magic1 = 0x27

	// VersionMajor and VersionMinor are the newest protocol version this
	// build speaks. A peer that speaks an older minor version is served in
	// that version; frames of a higher minor version are skipped by size.
	// 1.1 added the AUTH frame (SCRAM exchanges in the handshake); 1.2
	// the producer id of PUBLISH (PublishProducer), a message's priority
	// and deliver-at time in PUBLISH and a queue's max_priority in
	// DECLARE_QUEUE; 1.3 the CANCELLED frame (the broker ends a consumer
	// and keeps the session); 1.4 the error code outcome-unknown
	// (CodeOutcomeUnknown), where older sessions get unavailable.
	VersionMajor = 1
	VersionMinor = 4

	// FrameSizeMin is the smallest maximum frame size a peer may negotiate.
	FrameSizeMin = 4 << 10
	// FrameSizeDefault is the default negotiated maximum frame size
	// (header plus body).
	FrameSizeDefault = 1 << 20
	// FrameSizeMax is the largest maximum frame size a peer may negotiate.
	FrameSizeMax = 64 << 20
)

// Version is a protocol version: major in the high byte, minor in the low.
type Version uint16

// MakeVersion builds a Version.
func MakeVersion(major, minor uint8) Version { return Version(uint16(major)<<8 | uint16(minor)) }

// Major returns the major version.
func (v Version) Major() uint8 { return uint8(v >> 8) }

// Minor returns the minor version.
func (v Version) Minor() uint8 { return uint8(v) }

func (v Version) String() string { return fmt.Sprintf("%d.%d", v.Major(), v.Minor()) }

// Current is the newest version this build speaks.
var Current = MakeVersion(VersionMajor, VersionMinor)

// Protocol versions with a meaning of their own.
var (
	// Version10 is the first protocol version.
	Version10 = MakeVersion(1, 0)
	// VersionAuth (1.1) is the first version with the AUTH frame: a
	// session must negotiate it, or a later one, to use a mechanism that
	// needs more than HELLO (SCRAM-SHA-256).
	VersionAuth = MakeVersion(1, 1)
	// VersionProducer (1.2) is the first version in which a PUBLISH may
	// carry a producer id (the PublishProducer flag), which lets the broker
	// drop a retried message it already enqueued.
	VersionProducer = MakeVersion(1, 2)
	// VersionSchedule (1.2, the same version) is the first version whose
	// PUBLISH messages may carry a priority and a deliver-at time (flags
	// MsgPriority and MsgDeliverAt) and whose DECLARE_QUEUE carries
	// max_priority.
	VersionSchedule = MakeVersion(1, 2)
	// VersionCancelled (1.3) is the first version with the CANCELLED
	// frame: the broker tells the client that it ended one consumer (its
	// master was lost, for a proxied consumer) and keeps the session. A
	// session of an older version has its connection closed instead.
	VersionCancelled = MakeVersion(1, 3)
	// VersionOutcome (1.4) is the first version with the error code
	// outcome-unknown (CodeOutcomeUnknown): a command the broker lost
	// track of (its queue's master was lost with it in flight) may or may
	// not have been carried out. An older session gets unavailable for it,
	// with the same text (ErrorCode.For).
	VersionOutcome = MakeVersion(1, 4)
)

// Header is a decoded frame header.
type Header struct {
	Version Version
	Type    Type
	Flags   uint8
	Channel uint16
	Length  uint32 // body length
}

// Errors returned by the decoders. They all start with "wire: ".
var (
	ErrShort        = errors.New("wire: short buffer")
	ErrMagic        = errors.New("wire: bad magic")
	ErrFrameTooBig  = errors.New("wire: frame exceeds negotiated maximum size")
	ErrMajorVersion = errors.New("wire: unsupported major version")
	ErrMalformed    = errors.New("wire: malformed frame body")
	ErrUnknownType  = errors.New("wire: unknown frame type")
	ErrTooMany      = errors.New("wire: too many items in frame")
)

// PutHeader writes h into b[:HeaderSize]. b must be at least HeaderSize long.
func PutHeader(b []byte, h Header) {
	_ = b[HeaderSize-1]
	b[0] = Magic0
	b[1] = Magic1
	b[2] = h.Version.Major()
	b[3] = h.Version.Minor()
	b[4] = byte(h.Type)
	b[5] = h.Flags
	binary.BigEndian.PutUint16(b[6:], h.Channel)
	binary.BigEndian.PutUint32(b[8:], h.Length)
}

// AppendHeader appends h to b.
func AppendHeader(b []byte, h Header) []byte {
	var tmp [HeaderSize]byte
	PutHeader(tmp[:], h)
	return append(b, tmp[:]...)
}

// ReadHeader decodes the header at the start of b. maxFrame bounds the total
// frame size (header plus body); a larger length is rejected before anything
// is allocated. It returns ErrShort if b holds less than a header.
func ReadHeader(b []byte, maxFrame uint32) (Header, error) {
	if len(b) < HeaderSize {
		return Header{}, ErrShort
	}
	if b[0] != Magic0 || b[1] != Magic1 {
		return Header{}, ErrMagic
	}
	h := Header{
		Version: MakeVersion(b[2], b[3]),
		Type:    Type(b[4]),
		Flags:   b[5],
		Channel: binary.BigEndian.Uint16(b[6:]),
		Length:  binary.BigEndian.Uint32(b[8:]),
	}
	if uint64(h.Length)+HeaderSize > uint64(maxFrame) {
		return h, ErrFrameTooBig
	}
	return h, nil
}

// Type is a frame type. Client protocol types are below 0x80; peer
// (broker-to-broker and controller) types are 0x80 and above.
type Type uint8

// Next splits the first complete frame off buf. It returns the header, the
// body (aliasing buf) and the total number of bytes the frame takes. If buf
// does not yet hold a whole frame, n is 0 and err is nil: read more. A
// header error (bad magic, oversize length, unknown major version) is
// returned at once, so a caller never waits for a body it will refuse.
func Next(buf []byte, maxFrame uint32) (h Header, body []byte, n int, err error) {
	if len(buf) < HeaderSize {
		return Header{}, nil, 0, nil
	}
	h, err = ReadHeader(buf, maxFrame)
	if err != nil {
		return h, nil, 0, err
	}
	if h.Version.Major() != VersionMajor {
		return h, nil, 0, ErrMajorVersion
	}
	total := HeaderSize + int(h.Length)
	if len(buf) < total {
		return h, nil, 0, nil
	}
	return h, buf[HeaderSize:total:total], total, nil
}
