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
	return append(AppendForwardHead(dst, id, group, len(event)), event...)
}

// AppendForwardHead appends the head of a TypeForward frame whose event,
// of n bytes, the caller appends next.
func AppendForwardHead(dst []byte, id uint64, group uint32, n int) []byte {
	dst = AppendHeader(dst, Header{Version: Current, Type: TypeForward, Length: uint32(forwardPrefix + n)})
	dst = binary.BigEndian.AppendUint64(dst, id)
	return binary.BigEndian.AppendUint32(dst, group)
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

// Consumer proxying, on the same forwarding connection: a broker whose
// client subscribes to a replicated queue that another broker masters
// opens a proxy session on the master and passes it the client's
// consumer commands as they are; the master runs them on a session of
// its own and sends back, as they are, the client frames its shards write
// for that session (DELIVER, COMPLETE, ERROR), which the proxying broker
// writes to its client.
const (
	// TypeProxyCommand carries one client frame (SUBSCRIBE, CREDIT,
	// ACCEPT, RELEASE, REJECT or CANCEL) of a proxied session: session
	// uint64 (the proxying broker's id for it), the client's version
	// uint16 and maximum frame size uint32, then the whole client frame.
	// The first command of a session opens it on the master.
	TypeProxyCommand Type = 0xC5
	// TypeProxyOutput carries client frames the master wrote for a
	// proxied session: session uint64, then whole client frames.
	TypeProxyOutput Type = 0xC6
	// TypeProxyClose ends a proxied session (its client went away): session
	// uint64. What its consumers held is released on the master.
	TypeProxyClose Type = 0xC7
)

const proxyCommandPrefix = 14

// AppendProxyCommand appends a whole TypeProxyCommand frame carrying the
// client frame (header and body).
func AppendProxyCommand(dst []byte, session uint64, version Version, frameMax uint32, frame []byte) []byte {
	dst = AppendHeader(dst, Header{Version: Current, Type: TypeProxyCommand, Length: uint32(proxyCommandPrefix + len(frame))})
	dst = binary.BigEndian.AppendUint64(dst, session)
	dst = binary.BigEndian.AppendUint16(dst, uint16(version))
	dst = binary.BigEndian.AppendUint32(dst, frameMax)
	return append(dst, frame...)
}

// DecodeProxyCommand decodes a TypeProxyCommand body; frame aliases body
// and holds a whole client frame.
func DecodeProxyCommand(body []byte) (session uint64, version Version, frameMax uint32, frame []byte, err error) {
	if len(body) < proxyCommandPrefix+HeaderSize {
		return 0, 0, 0, nil, ErrMalformed
	}
	return binary.BigEndian.Uint64(body), Version(binary.BigEndian.Uint16(body[8:])), binary.BigEndian.Uint32(body[10:]), body[proxyCommandPrefix:], nil
}

// AppendProxyOutputHeader appends a TypeProxyOutput frame's header and
// session for n bytes of client frames, which the caller appends after it.
func AppendProxyOutputHeader(dst []byte, session uint64, n int) []byte {
	dst = AppendHeader(dst, Header{Version: Current, Type: TypeProxyOutput, Length: uint32(8 + n)})
	return binary.BigEndian.AppendUint64(dst, session)
}

// DecodeProxyOutput decodes a TypeProxyOutput body; frames aliases body.
func DecodeProxyOutput(body []byte) (session uint64, frames []byte, err error) {
	if len(body) < 8 {
		return 0, nil, ErrMalformed
	}
	return binary.BigEndian.Uint64(body), body[8:], nil
}

// AppendProxyClose appends a whole TypeProxyClose frame.
func AppendProxyClose(dst []byte, session uint64) []byte {
	dst = AppendHeader(dst, Header{Version: Current, Type: TypeProxyClose, Length: 8})
	return binary.BigEndian.AppendUint64(dst, session)
}

// DecodeProxyClose decodes a TypeProxyClose body.
func DecodeProxyClose(body []byte) (session uint64, err error) {
	if len(body) != 8 {
		return 0, ErrMalformed
	}
	return binary.BigEndian.Uint64(body), nil
}
