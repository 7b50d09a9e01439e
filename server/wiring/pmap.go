package wiring

import (
	"hash/maphash"
	"math/bits"
	"slices"
)

// pmap is a persistent map from string to V: a hash array mapped trie
// (HAMT) of 32-way nodes. A change copies only the nodes on the path to
// its key (at most hashLevels of them, each at most 32 entries), so a
// snapshot that holds a pmap keeps seeing it unchanged while the next
// snapshot shares every other node with it. The zero value is empty.
//
// Reads never write, so any number of goroutines may read one pmap while
// another builds its successor. Get with a []byte key does not allocate.
//
// Written here rather than taken from a library: the publish path needs a
// lookup by []byte without allocating or converting, and lookups, the
// path-copying insert and delete and the iteration together are a page of
// code that the tests below compare against a Go map.
type pmap[V any] struct {
	root *hnode[V]
	n    int
}

// hnode is one level of the trie. In a node above the last level, bitmap
// says which of the 32 slots of the hash's next 5 bits are used, and
// entries holds them in slot order. A node at the last level (a hash
// collision over all 60 bits) keeps its entries unordered with bitmap 0.
type hnode[V any] struct {
	bitmap  uint32
	entries []hentry[V]
	// edit is the batch of changes that made this node (SetIn), nil for a
	// node made by Set: that batch may change it in place.
	edit *pmapEdit
}

// pmapEdit is one batch of changes to pmaps and topic tries that no
// snapshot holds yet (Restore builds its tables with one): a node it made
// is changed in place by its later changes instead of being copied again.
// A node made before the batch is copied once, as Set copies it; so the
// tables a published snapshot holds never change. Once the batch's
// result is published, the pmapEdit must not be used again.
type pmapEdit struct{ _ byte }

// hentry is a key, its hash and its value, or, when child is set, a
// subtree. The hash is kept so that pushing an entry a level down (when
// another key lands in its slot) need not hash its key again.
type hentry[V any] struct {
	key   string
	hash  uint64
	val   V
	child *hnode[V]
}

const (
	hashBitsPerLevel = 5
	hashLevels       = 12 // 60 bits of the 64-bit hash; below, collision lists
)

// hashSeed is fixed for the process: pmaps are never persisted.
var hashSeed = maphash.MakeSeed()

func hashString(s string) uint64 { return maphash.String(hashSeed, s) }
func hashBytes(b []byte) uint64  { return maphash.Bytes(hashSeed, b) }

// Len returns the number of keys.
func (m pmap[V]) Len() int { return m.n }

// Get returns the value of key.
func (m pmap[V]) Get(key string) (V, bool) { return m.lookup(hashString(key), key) }

// GetBytes returns the value of key without allocating.
func (m pmap[V]) GetBytes(key []byte) (V, bool) {
	var zero V
	n := m.root
	h := hashBytes(key)
	for level := 0; n != nil; level++ {
		if level == hashLevels {
			for i := range n.entries {
				if n.entries[i].key == string(key) {
					return n.entries[i].val, true
				}
			}
			return zero, false
		}
		bit := uint32(1) << (h >> (level * hashBitsPerLevel) & 31)
		if n.bitmap&bit == 0 {
			return zero, false
		}
		e := &n.entries[bits.OnesCount32(n.bitmap&(bit-1))]
		if e.child != nil {
			n = e.child
			continue
		}
		if e.key == string(key) {
			return e.val, true
		}
		return zero, false
	}
	return zero, false
}

func (m pmap[V]) lookup(h uint64, key string) (V, bool) {
	var zero V
	n := m.root
	for level := 0; n != nil; level++ {
		if level == hashLevels {
			for i := range n.entries {
				if n.entries[i].key == key {
					return n.entries[i].val, true
				}
			}
			return zero, false
		}
		bit := uint32(1) << (h >> (level * hashBitsPerLevel) & 31)
		if n.bitmap&bit == 0 {
			return zero, false
		}
		e := &n.entries[bits.OnesCount32(n.bitmap&(bit-1))]
		if e.child != nil {
			n = e.child
			continue
		}
		if e.key == key {
			return e.val, true
		}
		return zero, false
	}
	return zero, false
}

// Set returns a map with key set to val; m is unchanged.
func (m pmap[V]) Set(key string, val V) pmap[V] { return m.SetIn(nil, key, val) }

// SetIn is Set within the batch ed (nil: none): nodes ed made are changed
// in place, so a batch of n changes costs about n entries rather than n
// copied paths. m is unchanged unless its nodes are ed's.
func (m pmap[V]) SetIn(ed *pmapEdit, key string, val V) pmap[V] {
	root, added := set(m.root, 0, hashString(key), key, val, ed)
	if added {
		m.n++
	}
	m.root = root
	return m
}

// set returns n with key set, copied unless ed made it (nil: a new
// node), and whether the key is new.
func set[V any](n *hnode[V], level int, h uint64, key string, val V, ed *pmapEdit) (*hnode[V], bool) {
	owned := ed != nil && n != nil && n.edit == ed
	if level == hashLevels {
		c := n
		if !owned {
			c = &hnode[V]{edit: ed}
			if n != nil {
				c.entries = slices.Clone(n.entries)
			}
		}
		for i := range c.entries {
			if c.entries[i].key == key {
				c.entries[i] = hentry[V]{key: key, hash: h, val: val}
				return c, false
			}
		}
		c.entries = append(c.entries, hentry[V]{key: key, hash: h, val: val})
		return c, true
	}
	bit := uint32(1) << (h >> (level * hashBitsPerLevel) & 31)
	if n == nil {
		return &hnode[V]{bitmap: bit, entries: []hentry[V]{{key: key, hash: h, val: val}}, edit: ed}, true
	}
	pos := bits.OnesCount32(n.bitmap & (bit - 1))
	if n.bitmap&bit == 0 {
		if owned {
			n.bitmap |= bit
			n.entries = slices.Insert(n.entries, pos, hentry[V]{key: key, hash: h, val: val})
			return n, true
		}
		c := &hnode[V]{bitmap: n.bitmap | bit, entries: make([]hentry[V], len(n.entries)+1), edit: ed}
		copy(c.entries, n.entries[:pos])
		c.entries[pos] = hentry[V]{key: key, hash: h, val: val}
		copy(c.entries[pos+1:], n.entries[pos:])
		return c, true
	}
	c := n
	if !owned {
		c = &hnode[V]{bitmap: n.bitmap, entries: make([]hentry[V], len(n.entries)), edit: ed}
		copy(c.entries, n.entries)
	}
	e := &c.entries[pos]
	switch {
	case e.child != nil:
		child, added := set(e.child, level+1, h, key, val, ed)
		e.child = child
		return c, added
	case e.key == key:
		e.val = val
		return c, false
	default:
		// Two keys in one slot: push both one level down.
		old := *e
		child, _ := set[V](nil, level+1, old.hash, old.key, old.val, ed)
		child, _ = set(child, level+1, h, key, val, ed)
		*e = hentry[V]{child: child}
		return c, true
	}
}

// Delete returns a map without key; m is unchanged.
func (m pmap[V]) Delete(key string) pmap[V] {
	root, removed := del(m.root, 0, hashString(key), key)
	if removed {
		m.n--
		m.root = root
	}
	return m
}

// del returns a copy of n without key (nil when it becomes empty), and
// whether key was there. A subtree left with one key is pulled up into
// its parent's slot, so the trie stays as shallow as its keys need.
func del[V any](n *hnode[V], level int, h uint64, key string) (*hnode[V], bool) {
	if n == nil {
		return nil, false
	}
	if level == hashLevels {
		for i := range n.entries {
			if n.entries[i].key == key {
				if len(n.entries) == 1 {
					return nil, true
				}
				c := &hnode[V]{entries: make([]hentry[V], 0, len(n.entries)-1)}
				c.entries = append(append(c.entries, n.entries[:i]...), n.entries[i+1:]...)
				return c, true
			}
		}
		return n, false
	}
	bit := uint32(1) << (h >> (level * hashBitsPerLevel) & 31)
	if n.bitmap&bit == 0 {
		return n, false
	}
	pos := bits.OnesCount32(n.bitmap & (bit - 1))
	e := n.entries[pos]
	if e.child != nil {
		child, removed := del(e.child, level+1, h, key)
		if !removed {
			return n, false
		}
		c := &hnode[V]{bitmap: n.bitmap, entries: make([]hentry[V], len(n.entries))}
		copy(c.entries, n.entries)
		switch {
		case child == nil:
			return removeSlot(n, bit, pos), true
		case len(child.entries) == 1 && child.entries[0].child == nil:
			c.entries[pos] = child.entries[0]
		default:
			c.entries[pos].child = child
		}
		return c, true
	}
	if e.key != key {
		return n, false
	}
	return removeSlot(n, bit, pos), true
}

func removeSlot[V any](n *hnode[V], bit uint32, pos int) *hnode[V] {
	if len(n.entries) == 1 {
		return nil
	}
	c := &hnode[V]{bitmap: n.bitmap &^ bit, entries: make([]hentry[V], 0, len(n.entries)-1)}
	c.entries = append(append(c.entries, n.entries[:pos]...), n.entries[pos+1:]...)
	return c
}

// All calls f for every key and value, in no particular order, until f
// returns false.
func (m pmap[V]) All(f func(key string, val V) bool) {
	if m.root != nil {
		walk(m.root, f)
	}
}

func walk[V any](n *hnode[V], f func(string, V) bool) bool {
	for i := range n.entries {
		e := &n.entries[i]
		if e.child != nil {
			if !walk(e.child, f) {
				return false
			}
		} else if !f(e.key, e.val) {
			return false
		}
	}
	return true
}

// buildPmap returns a pmap of the given keys and values, built bottom-up
// in O(n x levels) with one allocation per node: inserting them one by
// one would copy a path of nodes per key and leave that much garbage. A
// key listed twice keeps its last value.
func buildPmap[V any](keys []string, vals []V) pmap[V] {
	entries := make([]hentry[V], len(keys))
	for i, k := range keys {
		entries[i] = hentry[V]{key: k, hash: hashString(k), val: vals[i]}
	}
	root, n := buildNode(entries, make([]hentry[V], len(entries)), 0)
	return pmap[V]{root: root, n: n}
}

// buildNode builds the node at level for entries, whose hashes agree on
// every level above. It returns the node (nil for
// none) and the number of distinct keys under it. scratch, as long as
// entries, is where it sorts them; entries then serve its children as
// theirs, so a build sorts within two arrays rather than one per level.
func buildNode[V any](entries, scratch []hentry[V], level int) (*hnode[V], int) {
	if len(entries) == 0 {
		return nil, 0
	}
	if level == hashLevels {
		c := &hnode[V]{}
		for _, e := range entries {
			i := slices.IndexFunc(c.entries, func(x hentry[V]) bool { return x.key == e.key })
			if i >= 0 {
				c.entries[i] = e
			} else {
				c.entries = append(c.entries, e)
			}
		}
		return c, len(c.entries)
	}
	slot := func(e *hentry[V]) int { return int(e.hash >> (level * hashBitsPerLevel) & 31) }
	// A stable counting sort by slot, so that of a key listed twice the
	// last stays last.
	var start [33]int
	for i := range entries {
		start[slot(&entries[i])+1]++
	}
	for i := 1; i < len(start); i++ {
		start[i] += start[i-1]
	}
	sorted := scratch
	for i := range entries {
		s := slot(&entries[i])
		sorted[start[s]] = entries[i]
		start[s]++
	}
	entries, scratch = sorted, entries
	c := &hnode[V]{}
	total := 0
	for i := 0; i < len(entries); {
		j := i + 1
		for j < len(entries) && slot(&entries[j]) == slot(&entries[i]) {
			j++
		}
		c.bitmap |= 1 << slot(&entries[i])
		run := entries[i:j]
		if len(run) == 1 || allSameKey(run) {
			c.entries = append(c.entries, run[len(run)-1])
			total++
		} else {
			child, n := buildNode(run, scratch[i:j], level+1)
			if len(child.entries) == 1 && child.entries[0].child == nil {
				c.entries = append(c.entries, child.entries[0])
			} else {
				c.entries = append(c.entries, hentry[V]{child: child})
			}
			total += n
		}
		i = j
	}
	c.entries = slices.Clip(c.entries)
	return c, total
}

func allSameKey[V any](run []hentry[V]) bool {
	for _, e := range run[1:] {
		if e.key != run[0].key {
			return false
		}
	}
	return true
}
