package shards

// waitTable is a table of values waiting for an outcome, each under a
// tag that is its slot's generation and index, with a free list: a wait
// costs no allocation once the table has grown, and a stale tag (its
// slot reused since) is refused.
type waitTable[T any] struct {
	slots []waitSlot[T]
	free  []uint32
}

type waitSlot[T any] struct {
	v    T
	gen  uint32 // bumped at each use of the slot
	used bool
}

// add takes a slot, growing the table up to max slots, and returns its
// tag and its value, as the slot's last take left it, for the caller to
// fill; false when max slots are in use.
func (w *waitTable[T]) add(max int) (uint64, *T, bool) {
	var i uint32
	if n := len(w.free); n > 0 {
		i = w.free[n-1]
		w.free = w.free[:n-1]
	} else {
		if len(w.slots) >= max {
			return 0, nil, false
		}
		w.slots = append(w.slots, waitSlot[T]{})
		i = uint32(len(w.slots) - 1)
	}
	sl := &w.slots[i]
	sl.gen++
	sl.used = true
	return uint64(sl.gen)<<32 | uint64(i), &sl.v, true
}

// at is the value under tag, which must be in use.
func (w *waitTable[T]) at(tag uint64) *T { return &w.slots[uint32(tag)].v }

// take frees the slot under tag and returns its value; reset then clears
// what the slot must not keep (references the garbage collector should
// be free to take). False for a tag not in use.
func (w *waitTable[T]) take(tag uint64, reset func(*T)) (T, bool) {
	var zero T
	i := uint32(tag)
	if int(i) >= len(w.slots) {
		return zero, false
	}
	sl := &w.slots[i]
	if !sl.used || sl.gen != uint32(tag>>32) {
		return zero, false
	}
	v := sl.v
	reset(&sl.v)
	sl.used = false
	w.free = append(w.free, i)
	return v, true
}

// peek is the value under tag, and whether tag is in use.
func (w *waitTable[T]) peek(tag uint64) (*T, bool) {
	i := uint32(tag)
	if int(i) >= len(w.slots) {
		return nil, false
	}
	sl := &w.slots[i]
	if !sl.used || sl.gen != uint32(tag>>32) {
		return nil, false
	}
	return &sl.v, true
}

// each calls f with the tag and value of every slot in use.
func (w *waitTable[T]) each(f func(tag uint64, v *T)) {
	for i := range w.slots {
		if sl := &w.slots[i]; sl.used {
			f(uint64(sl.gen)<<32|uint64(i), &sl.v)
		}
	}
}
