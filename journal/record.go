package journal

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
)

// On-disk format. A segment file is a 16-byte header followed by records.
//
//	segment header: magic "BJS1" | crc32c(basePos) uint32 | basePos uint64
//	record:         crc32c uint32 | length uint32 | kind uint8 | 3 zero bytes |
//	                pos uint64 | ref uint64 | data[length]
//
// Integers are little-endian. The record CRC covers every header byte after
// the CRC field, and the data. basePos is the first position the segment
// was opened for; it keeps positions increasing across restarts even when
// every record was reclaimed.
const (
	segmentHeaderSize = 16
	recordHeaderSize  = 28

	kindPlain = 1
	kindRef   = 2

	// RecordBytesMax bounds the data of one record.
	RecordBytesMax = 16 << 20
)

var segmentMagic = [4]byte{'B', 'J', 'S', '1'}

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

var errBadRecord = errors.New("journal: bad record")

type recordHeader struct {
	length uint32
	kind   uint8
	pos    Pos
	ref    Pos
}

// appendRecord encodes one record onto dst.
func appendRecord(dst []byte, kind uint8, pos, ref Pos, data []byte) []byte {
	start := len(dst)
	dst = append(dst, make([]byte, recordHeaderSize)...)
	h := dst[start:]
	binary.LittleEndian.PutUint32(h[4:], uint32(len(data)))
	h[8] = kind
	binary.LittleEndian.PutUint64(h[12:], uint64(pos))
	binary.LittleEndian.PutUint64(h[20:], uint64(ref))
	dst = append(dst, data...)
	crc := crc32.Checksum(dst[start+4:], castagnoli)
	binary.LittleEndian.PutUint32(dst[start:], crc)
	return dst
}

// parseHeader checks the fixed fields of a record header; the CRC is checked
// by checkRecord once the data is at hand.
func parseHeader(h []byte, dataMax int) (recordHeader, error) {
	var rh recordHeader
	rh.length = binary.LittleEndian.Uint32(h[4:])
	rh.kind = h[8]
	rh.pos = Pos(binary.LittleEndian.Uint64(h[12:]))
	rh.ref = Pos(binary.LittleEndian.Uint64(h[20:]))
	switch {
	case h[9] != 0 || h[10] != 0 || h[11] != 0:
		return rh, fmt.Errorf("%w: reserved bytes set", errBadRecord)
	case rh.kind != kindPlain && rh.kind != kindRef:
		return rh, fmt.Errorf("%w: kind %d", errBadRecord, rh.kind)
	case rh.pos == 0:
		return rh, fmt.Errorf("%w: zero position", errBadRecord)
	case (rh.kind == kindRef) != (rh.ref != 0) || (rh.kind == kindRef && rh.ref >= rh.pos):
		return rh, fmt.Errorf("%w: ref %d on a record at %d", errBadRecord, rh.ref, rh.pos)
	case int64(rh.length) > int64(dataMax):
		return rh, fmt.Errorf("%w: length %d over %d", errBadRecord, rh.length, dataMax)
	}
	return rh, nil
}

// checkRecord verifies the CRC of a whole record (header and data).
func checkRecord(rec []byte) error {
	want := binary.LittleEndian.Uint32(rec)
	if got := crc32.Checksum(rec[4:], castagnoli); got != want {
		return fmt.Errorf("%w: crc %08x, want %08x", errBadRecord, got, want)
	}
	return nil
}

func appendSegmentHeader(dst []byte, basePos Pos) []byte {
	var h [segmentHeaderSize]byte
	copy(h[:], segmentMagic[:])
	binary.LittleEndian.PutUint64(h[8:], uint64(basePos))
	binary.LittleEndian.PutUint32(h[4:], crc32.Checksum(h[8:], castagnoli))
	return append(dst, h[:]...)
}

func parseSegmentHeader(h []byte) (Pos, error) {
	if len(h) < segmentHeaderSize || [4]byte(h[:4]) != segmentMagic {
		return 0, fmt.Errorf("%w: bad segment magic", errBadRecord)
	}
	if crc32.Checksum(h[8:16], castagnoli) != binary.LittleEndian.Uint32(h[4:]) {
		return 0, fmt.Errorf("%w: bad segment header crc", errBadRecord)
	}
	return Pos(binary.LittleEndian.Uint64(h[8:])), nil
}
