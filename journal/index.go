package journal

import (
	"iter"
	"sync/atomic"
	"unsafe"
)

// The index is touched several times per message (append, ref, free, and
// again when the segment goes), so it must not cost a hash lookup each
// time: a map of a few segments' worth of records spills out of the cache
// and dominated the broker's profile. Positions are dense and increasing,
// and records leave roughly in order, so the recent ones sit in a ring
// indexed by pos-base; the few that outlive the window (never consumed,
// or relocated by compaction) move to a map, where they no longer hold
// the window open.
const (
	// indexRingMin and indexRingMax bound the ring's slots; both are powers
	// of two. At the maximum (24 bytes a slot, 96 MiB) the oldest records
	// spill to the map instead of growing the ring further.
	indexRingMin = 1 << 10
	indexRingMax = 1 << 22
)

// index maps positions to entries. An entry with size 0 is an empty slot:
// every record, header included, has a size.
//
// Pointers returned by get stay valid only until the next insert or del;
// callers copy an entry before they delete it.
type index struct {
	ring []entry // power-of-two length; slots outside the window are zero
	head int     // ring slot of base
	base Pos     // first position of the window
	n    int     // the window is [base, base+n)
	// ringLive counts the occupied slots; growing only pays while the
	// window is mostly full.
	ringLive int
	// smallInserts counts the inserts since the window last exceeded an
	// eighth of the ring (trim).
	smallInserts int
	old          map[Pos]*entry // entries below base
	// pub, if not nil, is told the index's bytes (bytes) whenever they
	// change: the ring is resized, or the map gains or loses an entry.
	pub *atomic.Int64
	// farNext holds the next ref of the refs whose next is too far back
	// for entry.link (a billion records or more, or out of order): rare,
	// and not counted in bytes.
	farNext map[Pos]Pos
}

// next is the ref after the ref at pos (e, its entry) on its target's
// list of refs, 0 for none.
func (x *index) next(pos Pos, e *entry) Pos {
	switch d := e.link & linkDelta; d {
	case 0:
		return 0
	case linkFar:
		return x.farNext[pos]
	default:
		return pos - Pos(d)
	}
}

// setNext makes next the ref after the ref at pos on its target's list;
// e is its entry, in the index or about to be inserted at pos.
func (x *index) setNext(pos Pos, e *entry, next Pos) {
	if len(x.farNext) > 0 {
		delete(x.farNext, pos)
	}
	var d uint32
	switch {
	case next == 0:
	case next < pos && pos-next < linkFar:
		d = uint32(pos - next)
	default:
		if x.farNext == nil {
			x.farNext = make(map[Pos]Pos)
		}
		x.farNext[pos] = next
		d = linkFar
	}
	e.link = e.link&^linkDelta | d
}

// indexSlotBytes is what a ring slot costs; indexOldEntryBytes what an
// entry in the map costs: the entry on the heap and its map slot (key,
// pointer and control byte, at the map's load factor), rounded up.
const (
	indexSlotBytes     = int64(unsafe.Sizeof(entry{}))
	indexOldEntryBytes = indexSlotBytes + 24
)

func newIndex(pub *atomic.Int64) index {
	x := index{ring: make([]entry, indexRingMin), old: make(map[Pos]*entry), pub: pub}
	x.publish()
	return x
}

// bytes is the memory the index takes.
func (x *index) bytes() int64 {
	return int64(len(x.ring))*indexSlotBytes + int64(len(x.old))*indexOldEntryBytes
}

func (x *index) publish() {
	if x.pub != nil {
		x.pub.Store(x.bytes())
	}
}

func (x *index) len() int { return x.ringLive + len(x.old) }

// get returns the entry at pos, or nil.
func (x *index) get(pos Pos) *entry {
	if pos >= x.base {
		if d := pos - x.base; d < Pos(x.n) {
			e := &x.ring[(x.head+int(d))&(len(x.ring)-1)]
			if e.size != 0 {
				return e
			}
		}
		return nil
	}
	return x.old[pos]
}

// insert adds e at pos, which must not be in the index.
func (x *index) insert(pos Pos, e entry) {
	if e.size == 0 {
		panic("journal: index entry without a size") // a bug in the journal, never input
	}
	if x.n == 0 && pos >= x.base {
		// An empty window may start anywhere at or above the old entries.
		x.base, x.head = pos, 0
	}
	if pos < x.base {
		x.keepOld(pos, e)
		return
	}
	for pos-x.base >= Pos(len(x.ring)) {
		x.makeRoom(pos)
	}
	d := int(pos - x.base)
	x.n = max(x.n, d+1)
	x.ring[(x.head+d)&(len(x.ring)-1)] = e
	x.ringLive++
	if x.n > len(x.ring)/8 {
		x.smallInserts = 0
	} else {
		x.smallInserts++
	}
}

// indexRingReserveMax bounds the ring reserve sizes at once.
const indexRingReserveMax = 1 << 25

// reserve gives an empty index a ring for positions base to base+span-1
// at once, when n entries will fill at least a quarter of it: recovery
// from a checkpoint knows both, and growing the ring step by step (and
// spilling past indexRingMax to the map) cost a third of it.
func (x *index) reserve(base Pos, span uint64, n int) {
	if x.n != 0 || len(x.old) != 0 || span == 0 {
		return
	}
	c := len(x.ring)
	for uint64(c) < span && c < indexRingReserveMax {
		c *= 2
	}
	if uint64(c) < span || uint64(n)*4 < uint64(c) || c == len(x.ring) {
		return
	}
	x.ring, x.head, x.base = make([]entry, c), 0, base
	x.publish()
}

// makeRoom grows the ring while it is mostly full, and otherwise moves the
// oldest quarter of it to the map. Either way the work is paid for by the
// slots it frees, so inserts stay O(1) amortized.
func (x *index) makeRoom(pos Pos) {
	if x.n == 0 {
		x.base, x.head = pos, 0
		return
	}
	if x.ringLive*2 > len(x.ring) && len(x.ring) < indexRingMax {
		x.resize(len(x.ring) * 2)
		return
	}
	for k := max(len(x.ring)/4, 1); k > 0 && x.n > 0; k-- {
		if x.ring[x.head].size != 0 {
			x.keepOld(x.base, x.ring[x.head])
			x.ringLive--
		}
		x.popHead()
	}
	x.trim()
}

// keepOld puts e in the map. It takes e by value so that only entries
// that go there are moved to the heap, not every inserted one.
func (x *index) keepOld(pos Pos, e entry) {
	p := new(entry)
	*p = e
	x.old[pos] = p
	x.publish()
}

func (x *index) popHead() {
	x.ring[x.head] = entry{}
	x.head = (x.head + 1) & (len(x.ring) - 1)
	x.base++
	x.n--
}

// trim drops empty slots from the front of the window, and shrinks a ring
// left mostly idle so a burst does not hold its memory for good: once the
// window has stayed at an eighth of the ring or less over as many inserts
// as the ring has slots. Counted in inserts, not in deletions: a journal
// whose records die in bulk (a group log's compaction frees thousands at
// once) or whose window swings between bursts and lulls keeps its ring
// instead of reallocating it, and spilling its records to the map, at
// every swing; and a shrink's copy is paid for by the inserts it waited
// out.
func (x *index) trim() {
	for x.n > 0 && x.ring[x.head].size == 0 {
		x.popHead()
	}
	c := len(x.ring)
	if c <= indexRingMin || x.n > c/8 || x.smallInserts < c {
		return
	}
	x.smallInserts = 0
	for c > indexRingMin && x.n <= c/8 {
		c /= 2
	}
	x.resize(c)
}

func (x *index) resize(c int) {
	ring := make([]entry, c)
	mask := len(x.ring) - 1
	for i := range x.n {
		ring[i] = x.ring[(x.head+i)&mask]
	}
	x.ring, x.head = ring, 0
	x.publish()
}

// del removes pos from the index, if it is there.
func (x *index) del(pos Pos) {
	if len(x.farNext) > 0 {
		delete(x.farNext, pos)
	}
	if pos < x.base {
		if _, ok := x.old[pos]; ok {
			delete(x.old, pos)
			x.publish()
		}
		return
	}
	d := pos - x.base
	if d >= Pos(x.n) {
		return
	}
	e := &x.ring[(x.head+int(d))&(len(x.ring)-1)]
	if e.size == 0 {
		return
	}
	*e = entry{}
	x.ringLive--
	if d == 0 {
		x.trim()
	}
}

// all yields every entry, the map's first. The index must not change
// during the walk.
func (x *index) all() iter.Seq2[Pos, *entry] {
	return func(yield func(Pos, *entry) bool) {
		for pos, e := range x.old {
			if !yield(pos, e) {
				return
			}
		}
		for i := range x.n {
			e := &x.ring[(x.head+i)&(len(x.ring)-1)]
			if e.size != 0 && !yield(x.base+Pos(i), e) {
				return
			}
		}
	}
}
