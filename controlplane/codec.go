package controlplane

import "github.com/berthmq/berth/wire"

// The controller's encodings (events, results, snapshots, service bodies)
// are written with the wire package's codec: big-endian integers, strings
// as a uint16 length then bytes, counts as uint32, decoded by wire.Reader,
// whose first error sticks. Decoding never trusts a count: Reader.Count
// checks every count against the bytes left before anything is allocated.
// The helpers here add the controller's one string bound.

// stringLenMax bounds any string in a controller encoding.
const stringLenMax = 1024

// appendStr appends s as a wire string, cut to stringLenMax bytes so that
// whatever is encoded decodes. Validation keeps names and values shorter;
// only an unvalidated string (a refusal's message, say) is ever cut.
func appendStr(b []byte, s string) []byte {
	if len(s) > stringLenMax {
		s = s[:stringLenMax]
	}
	return wire.AppendStr(b, s)
}

// readStr reads a string of at most stringLenMax bytes into a new string.
func readStr(r *wire.Reader) string { return string(r.Str(stringLenMax)) }

// appendIDs appends a uint32 count, then the ids.
func appendIDs(b []byte, ids []uint32) []byte {
	b = wire.AppendU32(b, uint32(len(ids)))
	for _, id := range ids {
		b = wire.AppendU32(b, id)
	}
	return b
}

// readIDs reads what appendIDs wrote.
func readIDs(r *wire.Reader) []uint32 {
	ids := make([]uint32, r.Count(4))
	for i := range ids {
		ids[i] = r.U32()
	}
	return ids
}
