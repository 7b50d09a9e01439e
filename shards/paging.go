package shards

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"os"
	"path/filepath"

	"github.com/berthmq/berth/wire"
)

// pageFile is a shard's paging file for transient message bodies: a set of
// segment files under <dir>, written sequentially, never fsynced, and
// removed at start (a transient message does not survive a restart, so
// neither does its page). It belongs to the shard goroutine.
//
// A record is [u32 length][u32 CRC32C of the data][data], where data is
// the body as the journal stores it (flags, exchange, routing key, props,
// payload), so a page is checked after the read as it was before the
// write. A location (pageLoc) is the segment id in the high 32 bits and
// the record's offset in the low; ids start at 1, so 0 means "not paged".
//
// Writes gather in wbuf and go out in one write(2) per pageWriteBufMax.
// A failed write is sticky: the unwritten bytes stay in wbuf (reads are
// served from there), nothing more is paged, and the bodies of later
// messages stay in memory, so nothing is lost; the memory budget then
// throttles publishers instead.
type pageFile struct {
	dir    string
	segs   map[uint32]*pageSeg
	active *pageSeg
	nextID uint32
	wbuf   []byte // bytes of active past active.flushed
	failed error

	// win is the last read window: delivery reads a paged queue front to
	// back, so one pread serves the records that follow.
	win struct {
		seg  *pageSeg
		off  int64
		data []byte
	}
	rbuf []byte
}

type pageSeg struct {
	id      uint32
	f       *os.File
	flushed int64 // bytes written to the file
	live    int   // records not yet read back or dropped
}

const (
	// pageSegmentBytes: a segment is sealed past this size and deleted
	// once every record in it was read back or dropped.
	pageSegmentBytes = 64 << 20
	// pageWriteBufMax bounds the bytes gathered before a write(2).
	pageWriteBufMax = 256 << 10
	// pageReadWindow is the size of one read-ahead pread.
	pageReadWindow   = 256 << 10
	pageRecordHeader = 8
)

var crcTable = crc32.MakeTable(crc32.Castagnoli)

var errPageCorrupt = errors.New("shards: paging file record is corrupt")

// resetPagingDir removes what an earlier run left in dir.
func resetPagingDir(dir string) error {
	if err := os.RemoveAll(dir); err != nil {
		return fmt.Errorf("shards: clear paging directory: %w", err)
	}
	return nil
}

func newPageFile(dir string) *pageFile {
	return &pageFile{dir: dir, segs: map[uint32]*pageSeg{}}
}

// appendBodyRecord appends b as the journal's enqueue record stores a
// body: flags, exchange, routing key, props, payload. A page also keeps
// the message's priority and deliver-at time, behind flags as a 1.2
// PUBLISH has them (a journal record keeps them before its flags
// instead), so that a paged message read back, for a dead letter say,
// still has them.
func appendBodyRecord(buf []byte, b *Body) []byte {
	flags := uint8(0)
	if b.Persistent {
		flags |= wire.MsgPersistent
	}
	if b.Priority != 0 {
		flags |= wire.MsgPriority
	}
	if b.DeliverAt != 0 {
		flags |= wire.MsgDeliverAt
	}
	buf = append(buf, flags)
	if b.Priority != 0 {
		buf = append(buf, b.Priority)
	}
	if b.DeliverAt != 0 {
		buf = binary.BigEndian.AppendUint64(buf, uint64(b.DeliverAt))
	}
	buf = wire.AppendStrBytes(buf, b.Exchange)
	buf = wire.AppendStrBytes(buf, b.RoutingKey)
	buf = wire.AppendBytes(buf, b.Props)
	return wire.AppendBytes(buf, b.Payload)
}

// parseBody reads what appendBodyRecord wrote, from r, into a new Body.
func parseBody(r *wire.Reader, dataMax int, trailer int) (*Body, error) {
	flags := r.U8()
	var prio uint8
	var at int64
	if flags&wire.MsgPriority != 0 {
		prio = r.U8()
	}
	if flags&wire.MsgDeliverAt != 0 {
		at = int64(r.U64())
	}
	ex := r.Str(wire.NameLenMax)
	key := r.Str(wire.RoutingKeyLenMax)
	props := r.Bytes(wire.PropsLenMax)
	payload := r.Bytes(dataMax)
	if trailer > 0 && r.Remaining() == trailer {
		r.Skip(trailer)
	}
	if err := r.Done(); err != nil {
		return nil, err
	}
	b := NewBody(ex, key, props, payload, flags&wire.MsgPersistent != 0)
	b.Priority, b.DeliverAt = prio, at
	return b, nil
}

// write pages b out and returns its location.
func (p *pageFile) write(b *Body) (uint64, error) {
	if p.failed != nil {
		return 0, p.failed
	}
	if p.active == nil || p.active.flushed+int64(len(p.wbuf)) >= pageSegmentBytes {
		if err := p.roll(); err != nil {
			return 0, err
		}
	}
	seg := p.active
	off := seg.flushed + int64(len(p.wbuf))
	start := len(p.wbuf)
	p.wbuf = append(p.wbuf, 0, 0, 0, 0, 0, 0, 0, 0) // length and CRC, filled below
	p.wbuf = appendBodyRecord(p.wbuf, b)
	data := p.wbuf[start+pageRecordHeader:]
	binary.BigEndian.PutUint32(p.wbuf[start:], uint32(len(data)))
	binary.BigEndian.PutUint32(p.wbuf[start+4:], crc32.Checksum(data, crcTable))
	seg.live++
	if len(p.wbuf) >= pageWriteBufMax {
		p.flush() // a failure is sticky; this record is safe in wbuf
	}
	return uint64(seg.id)<<32 | uint64(off), nil
}

func (p *pageFile) flush() {
	if p.failed != nil || p.active == nil || len(p.wbuf) == 0 {
		return
	}
	n, err := p.active.f.WriteAt(p.wbuf, p.active.flushed)
	p.active.flushed += int64(n)
	p.wbuf = p.wbuf[:copy(p.wbuf, p.wbuf[n:])]
	if err != nil {
		p.failed = fmt.Errorf("shards: write paging file: %w", err)
	}
}

// roll seals the active segment and starts a new one.
func (p *pageFile) roll() error {
	p.flush()
	if p.failed != nil {
		return p.failed
	}
	if p.active != nil && p.active.live == 0 {
		p.drop(p.active)
	}
	if err := os.MkdirAll(p.dir, 0o755); err != nil {
		p.failed = fmt.Errorf("shards: paging directory: %w", err)
		return p.failed
	}
	p.nextID++
	name := filepath.Join(p.dir, fmt.Sprintf("%08d.page", p.nextID))
	f, err := os.OpenFile(name, os.O_RDWR|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		p.failed = fmt.Errorf("shards: create paging file: %w", err)
		return p.failed
	}
	p.active = &pageSeg{id: p.nextID, f: f}
	p.segs[p.nextID] = p.active
	return nil
}

func (p *pageFile) drop(seg *pageSeg) {
	if p.win.seg == seg {
		p.win.seg, p.win.data = nil, nil
	}
	delete(p.segs, seg.id)
	_ = seg.f.Close()
	_ = os.Remove(seg.f.Name())
	if p.active == seg {
		p.active = nil
		p.wbuf = p.wbuf[:0]
	}
}

// read returns the body at loc and releases its record. The body is a
// new one with one reference.
func (p *pageFile) read(loc uint64) (*Body, error) {
	seg := p.segs[uint32(loc>>32)]
	if seg == nil {
		return nil, fmt.Errorf("%w: no segment for location %#x", errPageCorrupt, loc)
	}
	off := int64(uint32(loc))
	data, err := p.record(seg, off)
	if err != nil {
		return nil, err
	}
	var r wire.Reader
	r.Reset(data)
	b, err := parseBody(&r, len(data), 0)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", errPageCorrupt, err)
	}
	p.release(loc)
	return b, nil
}

// release forgets the record at loc: read back, or its message dropped.
func (p *pageFile) release(loc uint64) {
	seg := p.segs[uint32(loc>>32)]
	if seg == nil {
		return
	}
	seg.live--
	if seg.live == 0 {
		p.drop(seg) // nothing in it is needed, unwritten bytes included
	}
}

// record returns the checked data of the record at off; it aliases wbuf
// or the read window and is valid until the next call.
func (p *pageFile) record(seg *pageSeg, off int64) ([]byte, error) {
	if seg == p.active && off >= seg.flushed {
		return checkPage(p.wbuf[off-seg.flushed:])
	}
	w := &p.win
	if w.seg == seg && off >= w.off && off-w.off < int64(len(w.data)) {
		if rec, ok := wholeRecord(w.data[off-w.off:]); ok {
			return checkPage(rec)
		}
	}
	n := int64(pageReadWindow)
	for {
		n = min(n, seg.flushed-off)
		if n < pageRecordHeader {
			return nil, fmt.Errorf("%w: offset %d past the end of segment %d", errPageCorrupt, off, seg.id)
		}
		if int64(cap(p.rbuf)) < n {
			p.rbuf = make([]byte, n)
		}
		buf := p.rbuf[:n]
		got, err := seg.f.ReadAt(buf, off)
		if int64(got) < n {
			return nil, fmt.Errorf("shards: read paging file: %w", err)
		}
		w.seg, w.off, w.data = seg, off, buf
		if rec, ok := wholeRecord(buf); ok {
			return checkPage(rec)
		}
		need := pageRecordHeader + int64(binary.BigEndian.Uint32(buf))
		if need <= n || need > pageRecordHeader+wire.FrameSizeMax {
			return nil, fmt.Errorf("%w: length %d at offset %d", errPageCorrupt, need, off)
		}
		n = need
	}
}

// wholeRecord returns the record at the start of b if b holds all of it.
func wholeRecord(b []byte) ([]byte, bool) {
	if len(b) < pageRecordHeader {
		return nil, false
	}
	n := int(binary.BigEndian.Uint32(b))
	if len(b) < pageRecordHeader+n {
		return nil, false
	}
	return b[:pageRecordHeader+n], true
}

func checkPage(rec []byte) ([]byte, error) {
	rec, ok := wholeRecord(rec)
	if !ok {
		return nil, fmt.Errorf("%w: truncated", errPageCorrupt)
	}
	data := rec[pageRecordHeader:]
	if crc32.Checksum(data, crcTable) != binary.BigEndian.Uint32(rec[4:]) {
		return nil, fmt.Errorf("%w: checksum mismatch", errPageCorrupt)
	}
	return data, nil
}

// close removes every segment: pages do not outlive the process.
func (p *pageFile) close() {
	for _, seg := range p.segs {
		_ = seg.f.Close()
		_ = os.Remove(seg.f.Name())
	}
	p.segs, p.active, p.wbuf = map[uint32]*pageSeg{}, nil, nil
}
