package shards

import (
	"hash/maphash"
	"iter"
)

// queueSet is a shard's set of its queues: an open-addressing hash table
// of *Queue with linear probing, keyed by the pointer. A shard may hold a
// million idle queues, and a Go map[*Queue]struct{} costs about 32 bytes
// a queue there; this costs 8 bytes a slot at a load between 7/16 and
// 7/8, 9 to 18 bytes a queue (TestIdleQueueBytes). Linear probing at
// that load scans a few cache lines of pointers for an add or a miss,
// which only declares and deletes do. The zero value is empty. Only the
// shard's goroutine uses it.
type queueSet struct {
	slots []*Queue // len is 0 or a power of two; nil is a free slot
	n     int
}

// queueSetMinSlots is the smallest table; below it the set keeps its
// slots rather than shrinking.
const queueSetMinSlots = 16

var queueSetSeed = maphash.MakeSeed()

func (s *queueSet) home(q *Queue) int {
	return int(maphash.Comparable(queueSetSeed, q) & uint64(len(s.slots)-1))
}

// len returns the number of queues.
func (s *queueSet) len() int { return s.n }

// has reports whether q is in the set.
func (s *queueSet) has(q *Queue) bool {
	if s.n == 0 {
		return false
	}
	mask := len(s.slots) - 1
	for i := s.home(q); ; i = (i + 1) & mask {
		switch s.slots[i] {
		case q:
			return true
		case nil:
			return false
		}
	}
}

// add puts q in the set; adding a queue twice keeps it once.
func (s *queueSet) add(q *Queue) {
	if (s.n+1)*8 > len(s.slots)*7 {
		s.resize(max(queueSetMinSlots, len(s.slots)*2))
	}
	mask := len(s.slots) - 1
	i := s.home(q)
	for ; s.slots[i] != nil; i = (i + 1) & mask {
		if s.slots[i] == q {
			return
		}
	}
	s.slots[i] = q
	s.n++
}

// reserve sizes the table for n queues at once, so that adding them does
// not grow it through every doubling (a start-up's restore).
func (s *queueSet) reserve(n int) {
	want := queueSetMinSlots
	for n*8 > want*7 {
		want *= 2
	}
	if want > len(s.slots) {
		s.resize(want)
	}
}

// remove takes q out of the set, if it is there. The entries after it in
// its run shift back into the hole (no tombstones), so lookups stay as
// short as the load makes them however many queues come and go.
func (s *queueSet) remove(q *Queue) {
	if s.n == 0 {
		return
	}
	mask := len(s.slots) - 1
	i := s.home(q)
	for s.slots[i] != q {
		if s.slots[i] == nil {
			return
		}
		i = (i + 1) & mask
	}
	s.slots[i] = nil
	s.n--
	// Backward shift: move each later entry of the run whose home is not
	// cyclically within (hole, j] into the hole.
	hole := i
	for j := (i + 1) & mask; s.slots[j] != nil; j = (j + 1) & mask {
		h := s.home(s.slots[j])
		if (j-h)&mask >= (j-hole)&mask {
			s.slots[hole], s.slots[j] = s.slots[j], nil
			hole = j
		}
	}
	if len(s.slots) > queueSetMinSlots && s.n*8 < len(s.slots) {
		s.resize(len(s.slots) / 2)
	}
}

func (s *queueSet) resize(slots int) {
	old := s.slots
	s.slots = make([]*Queue, slots)
	mask := slots - 1
	for _, q := range old {
		if q == nil {
			continue
		}
		i := s.home(q)
		for s.slots[i] != nil {
			i = (i + 1) & mask
		}
		s.slots[i] = q
	}
}

// all yields every queue in no particular order. The set must not change
// while it runs.
func (s *queueSet) all() iter.Seq[*Queue] {
	return func(yield func(*Queue) bool) {
		for _, q := range s.slots {
			if q != nil && !yield(q) {
				return
			}
		}
	}
}
