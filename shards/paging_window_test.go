package shards

import (
	"bytes"
	"testing"
)

// TestPageReadPastWindow: a paged body read back from past the end of
// the read-ahead window that an earlier read loaded (the records in
// between were dropped, as a purge or another queue's reads leave them)
// is read from the file. It panicked with a slice out of range: the
// window was used whenever the offset was at or after its start.
func TestPageReadPastWindow(t *testing.T) {
	p := newPageFile(t.TempDir())
	defer p.close()
	payload := bytes.Repeat([]byte("x"), 64<<10)
	var locs []uint64
	for i := range 12 { // 768 KiB: past one window and one write buffer
		payload[0] = byte(i)
		loc, err := p.write(NewBody(nil, []byte("q"), nil, payload, false))
		if err != nil {
			t.Fatal(err)
		}
		locs = append(locs, loc)
	}
	p.flush()
	for _, i := range []int{0, 8, 1, 11} {
		b, err := p.read(locs[i])
		if err != nil {
			t.Fatalf("record %d: %v", i, err)
		}
		if b.Payload[0] != byte(i) || len(b.Payload) != len(payload) {
			t.Fatalf("record %d: read back payload %d of %d bytes", i, b.Payload[0], len(b.Payload))
		}
		b.Unref()
	}
}
