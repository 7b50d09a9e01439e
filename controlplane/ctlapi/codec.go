package ctlapi

import "github.com/berthmq/berth/wire"

// The controller's encodings (events, results, snapshots, service bodies)
// are written with the wire package's codec: big-endian integers, strings
// as a uint16 length then bytes, counts as uint32, decoded by wire.Reader,
// whose first error sticks. Decoding never trusts a count: Reader.Count
// checks every count against the bytes left before anything is allocated.
// The helpers here add the controller's one string bound.

// StringLenMax bounds any string in a controller encoding.
const StringLenMax = 1024

// AppendString appends s as a wire string, cut to StringLenMax bytes so
// that whatever is encoded decodes. Validation keeps names and values
// shorter; only an unvalidated string (a refusal's message, say) is cut.
func AppendString(b []byte, s string) []byte {
	if len(s) > StringLenMax {
		s = s[:StringLenMax]
	}
	return wire.AppendStr(b, s)
}

// ReadString reads a string of at most StringLenMax bytes into a new
// string.
func ReadString(r *wire.Reader) string { return string(r.Str(StringLenMax)) }

// AppendIDs appends a uint32 count, then the ids.
func AppendIDs(b []byte, ids []uint32) []byte {
	b = wire.AppendU32(b, uint32(len(ids)))
	for _, id := range ids {
		b = wire.AppendU32(b, id)
	}
	return b
}

// ReadIDs reads what AppendIDs wrote.
func ReadIDs(r *wire.Reader) []uint32 {
	ids := make([]uint32, r.Count(4))
	for i := range ids {
		ids[i] = r.U32()
	}
	return ids
}
