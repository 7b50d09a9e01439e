package controlplane

import (
	"encoding/binary"
	"errors"
)

// The control plane's own binary codec: big-endian integers, strings as a
// uint16 length then bytes, counts as uint32. It is used for events, results,
// snapshots and service bodies. Decoding never trusts a count: every count is
// checked against the bytes left before anything is allocated.

var errCodec = errors.New("controlplane: malformed encoding")

const (
	// stringLenMax bounds any name or address carried in an event.
	stringLenMax = 1024
)

type encoder struct{ b []byte }

func (e *encoder) u8(v uint8)   { e.b = append(e.b, v) }
func (e *encoder) u16(v uint16) { e.b = binary.BigEndian.AppendUint16(e.b, v) }
func (e *encoder) u32(v uint32) { e.b = binary.BigEndian.AppendUint32(e.b, v) }
func (e *encoder) u64(v uint64) { e.b = binary.BigEndian.AppendUint64(e.b, v) }
func (e *encoder) boolean(v bool) {
	if v {
		e.u8(1)
	} else {
		e.u8(0)
	}
}
func (e *encoder) str(s string) {
	if len(s) > stringLenMax {
		s = s[:stringLenMax] // validated before encoding; never reached by valid input
	}
	e.u16(uint16(len(s)))
	e.b = append(e.b, s...)
}
func (e *encoder) bytes(v []byte) {
	e.u32(uint32(len(v)))
	e.b = append(e.b, v...)
}

type decoder struct {
	b   []byte
	err error
}

func (d *decoder) fail() { d.err = errCodec; d.b = nil }

func (d *decoder) u8() uint8 {
	if len(d.b) < 1 {
		d.fail()
		return 0
	}
	v := d.b[0]
	d.b = d.b[1:]
	return v
}
func (d *decoder) u16() uint16 {
	if len(d.b) < 2 {
		d.fail()
		return 0
	}
	v := binary.BigEndian.Uint16(d.b)
	d.b = d.b[2:]
	return v
}
func (d *decoder) u32() uint32 {
	if len(d.b) < 4 {
		d.fail()
		return 0
	}
	v := binary.BigEndian.Uint32(d.b)
	d.b = d.b[4:]
	return v
}
func (d *decoder) u64() uint64 {
	if len(d.b) < 8 {
		d.fail()
		return 0
	}
	v := binary.BigEndian.Uint64(d.b)
	d.b = d.b[8:]
	return v
}
func (d *decoder) boolean() bool {
	v := d.u8()
	if v > 1 {
		d.fail()
	}
	return v == 1
}
func (d *decoder) str() string {
	n := int(d.u16())
	if n > stringLenMax || len(d.b) < n {
		d.fail()
		return ""
	}
	s := string(d.b[:n])
	d.b = d.b[n:]
	return s
}
func (d *decoder) bytes() []byte {
	n := d.u32()
	if uint64(n) > uint64(len(d.b)) {
		d.fail()
		return nil
	}
	v := d.b[:n:n]
	d.b = d.b[n:]
	return v
}

// count reads a count of items each at least minSize bytes long, rejecting
// counts the remaining input cannot hold.
func (d *decoder) count(minSize int) int {
	n := d.u32()
	if minSize < 1 {
		minSize = 1
	}
	if uint64(n)*uint64(minSize) > uint64(len(d.b)) {
		d.fail()
		return 0
	}
	return int(n)
}

func (d *decoder) finish() error {
	if d.err == nil && len(d.b) != 0 {
		return errCodec
	}
	return d.err
}
