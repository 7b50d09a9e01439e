package wire

import "encoding/binary"

// Limits on variable-length fields. They bound what a decoder accepts, so a
// length field can never make a reader walk or allocate past them.
const (
	NameLenMax       = 255  // queue, exchange, client and consumer names
	RoutingKeyLenMax = 1024 // routing and binding keys
	TextLenMax       = 4096 // error and close texts
	AddrsMax         = 64   // addresses in WELCOME
	VersionsMax      = 16   // versions offered in HELLO
	RangesMax        = 4096 // ranges in COMPLETE, ACCEPT, RELEASE, REJECT
	BatchMax         = 4096 // messages in one PUBLISH or DELIVER
	PropsLenMax      = 64 << 10
)

// Reader is a cursor over a frame body. The first error sticks: after it,
// every read returns zero values and Err reports it. Slices it returns alias
// the body.
type Reader struct {
	b   []byte
	off int
	err error
}

// NewReader returns a reader over body.
func NewReader(body []byte) *Reader { return &Reader{b: body} }

// Reset points the reader at body.
func (r *Reader) Reset(body []byte) { r.b, r.off, r.err = body, 0, nil }

// Err returns the first error met, if any.
func (r *Reader) Err() error { return r.err }

// Remaining is the number of unread bytes.
func (r *Reader) Remaining() int { return len(r.b) - r.off }

// Done returns the sticky error, or ErrMalformed if bytes are left over.
func (r *Reader) Done() error {
	if r.err == nil && r.off != len(r.b) {
		r.err = ErrMalformed
	}
	return r.err
}

func (r *Reader) fail() { r.err = ErrMalformed }

func (r *Reader) need(n int) bool {
	if r.err != nil {
		return false
	}
	if n < 0 || len(r.b)-r.off < n {
		r.fail()
		return false
	}
	return true
}

func (r *Reader) U8() uint8 {
	if !r.need(1) {
		return 0
	}
	v := r.b[r.off]
	r.off++
	return v
}

func (r *Reader) U16() uint16 {
	if !r.need(2) {
		return 0
	}
	v := binary.BigEndian.Uint16(r.b[r.off:])
	r.off += 2
	return v
}

func (r *Reader) U32() uint32 {
	if !r.need(4) {
		return 0
	}
	v := binary.BigEndian.Uint32(r.b[r.off:])
	r.off += 4
	return v
}

func (r *Reader) U64() uint64 {
	if !r.need(8) {
		return 0
	}
	v := binary.BigEndian.Uint64(r.b[r.off:])
	r.off += 8
	return v
}

// Bool reads a byte that must be 0 (false) or 1 (true); any other value is
// malformed.
func (r *Reader) Bool() bool {
	v := r.U8()
	if v > 1 {
		r.fail()
		return false
	}
	return v == 1
}

// Count reads a uint32 count of items that are each at least minSize bytes
// long (at least 1). A count the unread bytes cannot hold is malformed, so
// a caller may allocate count items without trusting the sender.
func (r *Reader) Count(minSize int) int {
	n := r.U32()
	if r.err != nil {
		return 0
	}
	if minSize < 1 {
		minSize = 1
	}
	if uint64(n)*uint64(minSize) > uint64(r.Remaining()) {
		r.fail()
		return 0
	}
	return int(n)
}

// Str reads a uint16-length-prefixed string of at most max bytes.
func (r *Reader) Str(max int) []byte {
	n := int(r.U16())
	if r.err != nil {
		return nil
	}
	if n > max {
		r.fail()
		return nil
	}
	if !r.need(n) {
		return nil
	}
	v := r.b[r.off : r.off+n : r.off+n]
	r.off += n
	return v
}

// Bytes reads a uint32-length-prefixed byte field of at most max bytes.
func (r *Reader) Bytes(max int) []byte {
	n := r.U32()
	if r.err != nil {
		return nil
	}
	if uint64(n) > uint64(max) {
		r.fail()
		return nil
	}
	if !r.need(int(n)) {
		return nil
	}
	v := r.b[r.off : r.off+int(n) : r.off+int(n)]
	r.off += int(n)
	return v
}

// Skip advances n bytes.
func (r *Reader) Skip(n int) {
	if r.need(n) {
		r.off += n
	}
}

// Append helpers. They never fail; callers bound their inputs.

func AppendU8(b []byte, v uint8) []byte   { return append(b, v) }
func AppendU16(b []byte, v uint16) []byte { return binary.BigEndian.AppendUint16(b, v) }
func AppendU32(b []byte, v uint32) []byte { return binary.BigEndian.AppendUint32(b, v) }
func AppendU64(b []byte, v uint64) []byte { return binary.BigEndian.AppendUint64(b, v) }

// AppendBool appends 1 for true, 0 for false.
func AppendBool(b []byte, v bool) []byte {
	if v {
		return append(b, 1)
	}
	return append(b, 0)
}

// AppendStr appends a uint16-length-prefixed string.
func AppendStr(b []byte, s string) []byte {
	b = AppendU16(b, uint16(len(s)))
	return append(b, s...)
}

// AppendStrBytes is AppendStr for a byte slice.
func AppendStrBytes(b []byte, s []byte) []byte {
	b = AppendU16(b, uint16(len(s)))
	return append(b, s...)
}

// AppendBytes appends a uint32-length-prefixed byte field.
func AppendBytes(b []byte, v []byte) []byte {
	b = AppendU32(b, uint32(len(v)))
	return append(b, v...)
}

// StartFrame appends a header with a zero length for a frame of type t and
// returns the grown buffer and the header's offset, to pass to EndFrame.
func StartFrame(b []byte, v Version, t Type, flags uint8) ([]byte, int) {
	start := len(b)
	b = AppendHeader(b, Header{Version: v, Type: t, Flags: flags})
	return b, start
}

// EndFrame patches the length of the frame that starts at start. extra counts
// body bytes that follow out of band (payloads sent by writev).
func EndFrame(b []byte, start int, extra int) {
	binary.BigEndian.PutUint32(b[start+8:], uint32(len(b)-start-HeaderSize+extra))
}
