package groups

import (
	"github.com/berthmq/berth/journal"
	"github.com/berthmq/berth/replication/group"
)

// positions are the journal positions of the records of a group's log
// entries, from index first on. A broker over its memory budget keeps
// millions of paged entries whose data is only in the journal, so each
// entry's position costs 4 bytes, not 8: a group's records are appended
// in index order, so the positions only grow, and each chunk of
// posChunkLen entries holds them as offsets from its first one. An offset
// that does not fit (a group idle while 4 billion records of others went
// by) is kept in far instead. The node's goroutine owns it.
type positions struct {
	first  uint64 // the index of the entry at chunks[0].off[head]
	chunks []*posChunk
	head   int // entries before first in chunks[0]
	n      int // entries held
	far    map[uint64]journal.Pos
	spare  *posChunk // the last chunk let go, for the next one needed
}

const (
	// posChunkLen makes a chunk 8 KiB, a size class of the allocator
	// (1024 offsets and a base would take a 4,864-byte block).
	posChunkLen = (8<<10 - 8) / 4
	// posFar marks an offset kept in positions.far.
	posFar = ^uint32(0)
)

type posChunk struct {
	base journal.Pos // the position of the chunk's first entry
	off  [posChunkLen]uint32
}

// PositionBytes is what an entry's position costs in memory: its offset
// (and 1/posChunkLen of its chunk's base and pointer), as
// group.PositionBytes says.
const PositionBytes = group.PositionBytes

// reset drops every position; the next one pushed is the entry at first.
func (p *positions) reset(first uint64) {
	for _, c := range p.chunks {
		p.spare = c
	}
	*p = positions{first: first, spare: p.spare}
}

// end is the index of the entry after the last one held.
func (p *positions) end() uint64 { return p.first + uint64(p.n) }

// at is the position of the entry at index, false if none is held.
func (p *positions) at(index uint64) (journal.Pos, bool) {
	if index < p.first || index >= p.end() {
		return 0, false
	}
	k := p.head + int(index-p.first)
	c := p.chunks[k/posChunkLen]
	off := c.off[k%posChunkLen]
	if off == posFar {
		return p.far[index], true
	}
	return c.base + journal.Pos(off), true
}

// push adds the position of the entry at end().
func (p *positions) push(pos journal.Pos) {
	k := p.head + p.n
	if k/posChunkLen == len(p.chunks) {
		c := p.spare
		if c == nil {
			c = new(posChunk)
		}
		p.spare = nil
		c.base = pos
		p.chunks = append(p.chunks, c)
	}
	c := p.chunks[k/posChunkLen]
	if d := pos - c.base; pos >= c.base && d < journal.Pos(posFar) {
		c.off[k%posChunkLen] = uint32(d)
	} else {
		if p.far == nil {
			p.far = map[uint64]journal.Pos{}
		}
		p.far[p.end()] = pos
		c.off[k%posChunkLen] = posFar
	}
	p.n++
}

// appendRange appends the positions of the entries from index from to
// before to (both clamped to what is held) to dst.
func (p *positions) appendRange(dst []journal.Pos, from, to uint64) []journal.Pos {
	from, to = max(from, p.first), min(to, p.end())
	for i := from; i < to; i++ {
		pos, _ := p.at(i)
		dst = append(dst, pos)
	}
	return dst
}

// truncate drops the positions of the entries at end and after.
func (p *positions) truncate(end uint64) {
	if end >= p.end() {
		return
	}
	end = max(end, p.first)
	for i := range p.far {
		if i >= end {
			delete(p.far, i)
		}
	}
	p.n = int(end - p.first)
	keep := (p.head + p.n + posChunkLen - 1) / posChunkLen
	p.letGo(p.chunks[keep:])
	p.chunks = p.chunks[:keep]
}

// dropBefore drops the positions of the entries before index, which
// becomes the first.
func (p *positions) dropBefore(index uint64) {
	if index <= p.first {
		return
	}
	if index >= p.end() {
		p.reset(index)
		return
	}
	for i := range p.far {
		if i < index {
			delete(p.far, i)
		}
	}
	k := int(index - p.first)
	p.n -= k
	p.head += k
	gone := p.head / posChunkLen
	p.letGo(p.chunks[:gone])
	p.chunks = append(p.chunks[:0], p.chunks[gone:]...)
	p.head %= posChunkLen
	p.first = index
}

func (p *positions) letGo(cs []*posChunk) {
	for i, c := range cs {
		p.spare = c
		cs[i] = nil
	}
}
