package wire

// Forwarding frames, on the peer port: a broker that takes a publish for a
// replicated queue whose group another broker masters sends the group
// event to that master, which proposes it and answers with the outcome.
// A forwarding connection starts with a TypeForwardHello from the
// forwarding broker; then that broker sends TypeForward frames and the
// master answers each with a TypeForwardResult carrying the same id, in
// any order. Like the rest of this package, nothing here does I/O and
// decoders alias the buffer they are given.

import "encoding/binary"

const (
	// TypeForwardHello opens a forwarding connection: the sender's broker
	// id (uint32) and the highest protocol version it speaks (uint16).
	TypeForwardHello Type = 0xC2
	// TypeForward carries one group event to the group's master: id
	// uint64 (the sender's, unique on the connection), group uint32, then
	// the event's bytes to the end of the frame.
	TypeForward Type = 0xC3
	// TypeForwardResult answers a TypeForward: id uint64, code uint16 (a
	// client error code; 0 when the event committed), text (str16).
	TypeForwardResult Type = 0xC4
)

// forwardPrefix is the size of a TypeForward body before the event.
const forwardPrefix = 12

// ForwardTextMax bounds a TypeForwardResult's text.
const ForwardTextMax = 1024

// AppendForwardHello appends a whole TypeForwardHello frame.
func AppendForwardHello(dst []byte, broker uint32, version Version) []byte {
	dst = AppendHeader(dst, Header{Version: Current, Type: TypeForwardHello, Length: 6})
	dst = binary.BigEndian.AppendUint32(dst, broker)
	return binary.BigEndian.AppendUint16(dst, uint16(version))
}

// DecodeForwardHello decodes a TypeForwardHello body.
func DecodeForwardHello(body []byte) (broker uint32, version Version, err error) {
	return DecodeGroupHello(body) // the same layout
}

// AppendForward appends a whole TypeForward frame carrying event.
func AppendForward(dst []byte, id uint64, group uint32, event []byte) []byte {
	dst = AppendHeader(dst, Header{Version: Current, Type: TypeForward, Length: uint32(forwardPrefix + len(event))})
	dst = binary.BigEndian.AppendUint64(dst, id)
	dst = binary.BigEndian.AppendUint32(dst, group)
	return append(dst, event...)
}

// ForwardSize is the size of a whole TypeForward frame carrying an event
// of n bytes.
func ForwardSize(n int) int { return HeaderSize + forwardPrefix + n }

// DecodeForward decodes a TypeForward body; event aliases body.
func DecodeForward(body []byte) (id uint64, group uint32, event []byte, err error) {
	if len(body) <= forwardPrefix {
		return 0, 0, nil, ErrMalformed
	}
	return binary.BigEndian.Uint64(body), binary.BigEndian.Uint32(body[8:]), body[forwardPrefix:], nil
}

// AppendForwardResult appends a whole TypeForwardResult frame. A text
// longer than ForwardTextMax is cut.
func AppendForwardResult(dst []byte, id uint64, code ErrorCode, text string) []byte {
	if len(text) > ForwardTextMax {
		text = text[:ForwardTextMax]
	}
	dst = AppendHeader(dst, Header{Version: Current, Type: TypeForwardResult, Length: uint32(8 + 2 + 2 + len(text))})
	dst = binary.BigEndian.AppendUint64(dst, id)
	dst = binary.BigEndian.AppendUint16(dst, uint16(code))
	return AppendStr(dst, text)
}

// DecodeForwardResult decodes a TypeForwardResult body; text aliases body.
func DecodeForwardResult(body []byte) (id uint64, code ErrorCode, text []byte, err error) {
	var r Reader
	r.Reset(body)
	id = r.U64()
	code = ErrorCode(r.U16())
	text = r.Str(ForwardTextMax)
	if err := r.Done(); err != nil {
		return 0, 0, nil, err
	}
	return id, code, text, nil
}
