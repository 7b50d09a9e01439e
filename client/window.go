package client

import (
	"slices"
	"sync"

	"github.com/berthmq/berth/wire"
)

// Client-side bounds.
const (
	// WindowDefault is the most uncompleted commands a Conn keeps when
	// Config.Window is 0 (the server's WindowMax lowers it further). On
	// loopback 1024 gave the best throughput; deeper windows only added
	// latency (see bench_test.go). Links with a long round trip want more.
	WindowDefault = 1024
	// windowLimitMax bounds Config.Window, and so the pending ring.
	windowLimitMax = 1 << 16
	// writeBufferDefault is how many encoded bytes may wait for the writer
	// before callers block, when Config.WriteBufferSize is 0.
	writeBufferDefault = 1 << 20
	// consumerBufferMax bounds the deliveries one consumer buffers; credit
	// is clamped so that the server can never send more than this.
	consumerBufferMax = 1 << 16
	// readBufferInitial is the reader's starting buffer; it grows up to the
	// negotiated maximum frame size when a larger frame arrives.
	readBufferInitial = 256 << 10
)

// call is a synchronous waiter for one command (or a group of commands).
// It is pooled; it returns to the pool only after its result was received,
// so a slot can never point at a recycled call.
type call struct{ ch chan error }

var callPool = sync.Pool{New: func() any { return &call{ch: make(chan error, 1)} }}

func getCall() *call  { return callPool.Get().(*call) }
func putCall(c *call) { callPool.Put(c) }

// group joins several commands (a settle split over many frames) into one
// result: the first error, delivered once the last command finished.
type group struct {
	remaining int
	err       error
	fn        func(error)
	call      *call
}

// slotKind says what a reconnecting Conn does with an uncompleted command
// when its connection breaks (reconnect.go).
type slotKind uint8

const (
	kindLost      slotKind = iota // not resent: it fails with ErrConnectionLost
	kindPublish                   // resent from msg, under its own id
	kindResend                    // idempotent: build is run again for the new connection
	kindSubscribe                 // SUBSCRIBE of cons, encoded afresh
	kindCancel                    // CANCEL: done, since the consumer is not resubscribed
	kindSettle                    // a settle of deliveries of the dead connection
)

// slotMsgKeepMax is the largest resend buffer a slot keeps for its next
// command; bigger ones go to the collector once their command completed.
// The ring has twice the window's slots, so a reconnecting Conn keeps at
// most 2 × Window × 16 KiB (32 MiB at the default window) once a burst of
// large messages is over; messages above it cost an allocation each.
const slotMsgKeepMax = 16 << 10

// slot is one uncompleted command.
type slot struct {
	id   uint64
	used bool
	fn   func(error)
	call *call
	grp  *group
	// What a reconnecting Conn needs to send it again (kind); kept only
	// with Config.Reconnect.
	kind     slotKind
	exchange string                           // kindPublish
	msg      []byte                           // kindPublish: the encoded message; reused by the slot's next command
	build    func(b []byte, id uint64) []byte // kindResend
	cons     *Consumer                        // kindSubscribe
	// resent: sent on a connection that broke, then again: a refusal
	// now does not say the first copy was not carried out.
	resent bool
	pub    bool // a publish: counted in window.pubs
}

// completion is a finished command whose waiter or callback still has to be
// told; it is fired outside any lock.
type completion struct {
	fn   func(error)
	call *call
	err  error
}

func (c completion) fire() {
	if c.fn != nil {
		c.fn(c.err)
	}
	if c.call != nil {
		c.call.ch <- c.err // cap 1, told exactly once: never blocks
	}
}

// window is the ring of uncompleted commands, indexed by command id. Ids
// are handed out in order; completions come in any order. The ring is
// twice the window, so that a slow old command does not stop the session
// while newer ones complete. When the span from the oldest command out to
// the next id fills the ring, the oldest moves off it into old, a map
// (at most the window's size), and the ring's tail moves on: a command
// held out for long does not stop the ones after it, yet a slot is never
// reused while its command is out.
//
// Publishes may take all but windowReserve(max) of the window: the rest
// is kept for settles, subscribes and the other commands, so that a
// connection whose publishes a server holds back (a shard over its
// memory budget parks them) can still settle what its consumers took,
// which is what frees that memory.
type window struct {
	slots    []slot
	mask     uint64
	tail     uint64 // every id below tail is completed, or in old
	next     uint64 // the next id to hand out
	inflight int
	max      int
	pubs     int // publishes among inflight
	pubMax   int
	old      map[uint64]*slot
}

// windowReserve is how much of a window of max commands publishes leave
// to other commands: an eighth, at most 64.
func windowReserve(max int) int { return min(max/8, 64) }

func newWindow(max int) window {
	size := 1
	for size < 2*max {
		size <<= 1
	}
	return window{slots: make([]slot, size), mask: uint64(size - 1), tail: 1, next: 1, max: max, pubMax: max - windowReserve(max)}
}

// canAdd reports whether one more command fits.
func (w *window) canAdd() bool {
	return w.inflight < w.max && w.hasRoom()
}

// canAddPublish is canAdd for a publish.
func (w *window) canAddPublish() bool {
	return w.pubs < w.pubMax && w.canAdd()
}

// add hands out the next id. The caller checked canAdd.
func (w *window) add(fn func(error), cl *call, grp *group) uint64 {
	id := w.next
	w.next++
	s := &w.slots[id&w.mask]
	*s = slot{id: id, used: true, fn: fn, call: cl, grp: grp, msg: s.msg[:0]}
	w.inflight++
	return id
}

// addPublish is add for a publish; the caller checked canAddPublish.
func (w *window) addPublish(fn func(error), cl *call) uint64 {
	id := w.add(fn, cl, nil)
	w.slots[id&w.mask].pub = true
	w.pubs++
	return id
}

// at is the slot of command id, which the caller knows is out.
func (w *window) at(id uint64) *slot { return &w.slots[id&w.mask] }

// hasRoom makes room on the ring for one more id, moving the oldest
// command out, if the ring is full, into old. It reports false only when
// every slot of the ring is out, which the window's bound rules out.
func (w *window) hasRoom() bool {
	for w.next-w.tail >= uint64(len(w.slots)) {
		s := &w.slots[w.tail&w.mask]
		if s.used && s.id == w.tail {
			if len(w.old) >= w.max {
				return false
			}
			if w.old == nil {
				w.old = map[uint64]*slot{}
			}
			cp := *s
			w.old[cp.id] = &cp
			*s = slot{}
		}
		w.tail++
		w.advance()
	}
	return true
}

// advance moves the tail past completed ids.
func (w *window) advance() {
	for w.tail < w.next && !w.slots[w.tail&w.mask].used {
		w.tail++
	}
}

// lookup is the slot of command id if it is out, else nil.
func (w *window) lookup(id uint64) *slot {
	if id < w.tail {
		return w.old[id]
	}
	if id >= w.next {
		return nil
	}
	if s := &w.slots[id&w.mask]; s.used && s.id == id {
		return s
	}
	return nil
}

// outIDs appends the ids of the commands out, in increasing order.
func (w *window) outIDs(dst []uint64) []uint64 {
	start := len(dst)
	for id := range w.old {
		dst = append(dst, id)
	}
	slices.Sort(dst[start:])
	for id := w.tail; id < w.next; id++ {
		if s := &w.slots[id&w.mask]; s.used && s.id == id {
			dst = append(dst, id)
		}
	}
	return dst
}

// oldest is the lowest id out, or next when none is.
func (w *window) oldest() uint64 {
	lo := w.tail
	for id := range w.old {
		lo = min(lo, id)
	}
	return lo
}

// takeRange takes the commands out with ids first..last, passing each to
// f.
func (w *window) takeRange(first, last uint64, f func(slot)) {
	if len(w.old) > 0 && first < w.tail {
		for id := range w.old {
			if id >= first && id <= last {
				s, _ := w.take(id)
				f(s)
			}
		}
	}
	lo, hi := max(first, w.tail), min(last, w.next-1)
	for id := lo; id <= hi; id++ {
		if s, ok := w.take(id); ok {
			f(s)
		}
	}
}

// take removes command id and returns it; ok is false if id is not out.
func (w *window) take(id uint64) (slot, bool) {
	if id < w.tail {
		s, ok := w.old[id]
		if !ok {
			return slot{}, false
		}
		delete(w.old, id)
		out := *s
		out.msg = nil
		w.taken(&out)
		return out, true
	}
	if id >= w.next {
		return slot{}, false
	}
	s := &w.slots[id&w.mask]
	if !s.used || s.id != id {
		return slot{}, false
	}
	out := *s
	var keep []byte
	if cap(s.msg) <= slotMsgKeepMax {
		keep = s.msg[:0]
	}
	*s = slot{msg: keep}
	out.msg = nil
	w.taken(&out)
	w.advance()
	return out, true
}

func (w *window) taken(s *slot) {
	w.inflight--
	if s.pub {
		w.pubs--
	}
}

// resolve turns a finished slot into the completion to fire, if any: a
// grouped command only fires when its group's last command finishes.
func resolve(s slot, err error) (completion, bool) {
	if s.grp == nil {
		return completion{fn: s.fn, call: s.call, err: err}, true
	}
	g := s.grp
	if err != nil && g.err == nil {
		g.err = err
	}
	g.remaining--
	if g.remaining > 0 {
		return completion{}, false
	}
	return completion{fn: g.fn, call: g.call, err: g.err}, true
}

// buildRanges merges tags into sorted inclusive ranges, appended to dst.
// tags is not modified; duplicates collapse.
func buildRanges(dst []wire.Range, tags []uint64) []wire.Range {
	if len(tags) == 0 {
		return dst
	}
	if !slices.IsSorted(tags) {
		tags = slices.Clone(tags)
		slices.Sort(tags)
	}
	cur := wire.Range{First: tags[0], Last: tags[0]}
	for _, t := range tags[1:] {
		switch {
		case t <= cur.Last:
			// duplicate
		case t == cur.Last+1:
			cur.Last = t
		default:
			dst = append(dst, cur)
			cur = wire.Range{First: t, Last: t}
		}
	}
	return append(dst, cur)
}

// rangesPerFrame is how many tag ranges fit in one settle frame of the
// given maximum size, bounded by wire.RangesMax.
func rangesPerFrame(frameMax uint32) int {
	n := (int(frameMax) - wire.HeaderSize - 8 - 4 - 2) / 16
	return max(1, min(n, wire.RangesMax))
}
